"""Engine-level correctness: greedy tokens equal Hugging Face transformers' generate on a tiny
random checkpoint; KV pressure (retraction + recompute) changes nothing but the counters."""

from __future__ import annotations

import random

import pytest
import torch
from engine_testutil import multi_prefix_prompts, tiny_config

from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams
from granikv.model import load_spec


def hf_checkpoint(tmp_path, name: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = load_spec(name)
    cfg_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if spec.arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    torch.manual_seed(0)
    model = model_cls(cfg_cls(**spec.to_hf_config())).float().eval()
    with torch.no_grad():  # peaked attention, so RoPE/masking errors cannot hide
        for n, p in model.named_parameters():
            if "q_proj" in n or "k_proj" in n:
                p.mul_(4.0)
    path = tmp_path / name
    model.save_pretrained(path)
    return model, path


@pytest.mark.parametrize("system", ["paged", "granikv"])
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen"])
def test_greedy_tokens_match_transformers(tmp_path, name, system):
    hf, path = hf_checkpoint(tmp_path, name)
    eng = Engine(tiny_config(system, model=name, load_format="safetensors", model_path=str(path),
                             kernel_impl="torch"))
    rng = random.Random(0)
    shared = [rng.randrange(1024) for _ in range(30)]
    prompts = [shared + [rng.randrange(1024) for _ in range(n)] for n in (3, 11, 7)]
    steps = 24
    ours = eng.generate(prompts, SamplingParams(max_new_tokens=steps, ignore_eos=True),
                        shared_prefix_lens=[30, 30, 30])
    for p, got in zip(prompts, ours):
        ids = torch.tensor([p])
        with torch.no_grad():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False,
                              min_new_tokens=steps, pad_token_id=0, eos_token_id=None)
        assert got == ref[0, len(p):].tolist()


def test_kv_pressure_retracts_and_recomputes_same_tokens():
    prompts = multi_prefix_prompts(seed=5, prefix_lens=(40, 24), per_prefix=(4, 4))
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    outs = {}
    for label, slots in (("roomy", 4096), ("tight", 260)):
        eng = Engine(tiny_config("granikv", num_slots=slots, hot_fraction=0.2, kernel_impl="torch"))
        outs[label] = eng.generate([p for p, _ in prompts], params, shared_prefix_lens=[lp for _, lp in prompts])
        outs[label + "_stats"] = eng.stats()
    assert outs["tight"] == outs["roomy"]
    assert outs["roomy_stats"]["retractions"] == 0
    assert outs["tight_stats"]["retractions"] > 0
    for system in ("paged", "cascade"):
        eng = Engine(tiny_config(system, num_slots=320, kernel_impl="torch"))
        got = eng.generate([p for p, _ in prompts], params)
        assert got == outs["roomy"]
        assert eng.stats()["retractions"] > 0


def test_tp2_equals_tp1():
    from granikv.engine.factory import create_engine

    prompts = multi_prefix_prompts(seed=7, prefix_lens=(32,), per_prefix=(4,))
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    ref = Engine(tiny_config("granikv", kernel_impl="torch")).generate(
        [p for p, _ in prompts], params, shared_prefix_lens=[lp for _, lp in prompts])
    eng = create_engine(tiny_config("granikv", kernel_impl="torch", tp=2))
    try:
        got = eng.generate([p for p, _ in prompts], params, shared_prefix_lens=[lp for _, lp in prompts])
    finally:
        eng.close()
    assert got == ref
