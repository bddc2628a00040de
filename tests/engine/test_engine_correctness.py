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


@pytest.mark.parametrize("extend_graphs", [False, True])
def test_tp2_equals_tp1(extend_graphs):
    """With extend graphs every rank pads its extend steps the same way (padded eager on CPU)."""
    from granikv.runtime.tp import create_engine

    prompts = multi_prefix_prompts(seed=7, prefix_lens=(32,), per_prefix=(4,))
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    ref = Engine(tiny_config("granikv", kernel_impl="torch")).generate(
        [p for p, _ in prompts], params, shared_prefix_lens=[lp for _, lp in prompts])
    extra = dict(extend_graph_tokens=(64, 256), extend_graph_reqs=(2, 8)) if extend_graphs else {}
    eng = create_engine(tiny_config("granikv", kernel_impl="torch", tp=2, **extra))
    try:
        got = eng.generate([p for p, _ in prompts], params, shared_prefix_lens=[lp for _, lp in prompts])
        if extend_graphs:
            assert eng.stats()["graphs"]["extend_graphs"]["runs"] > 0
    finally:
        eng.close()
    assert got == ref


def test_tp4_equals_tp1_qwen_shape():
    """TP=4 over gloo (the paper's Qwen-2.5-32B configuration, GQA group 5): four ranks, one KV
    head each, give the TP=1 tokens."""
    from granikv.runtime.tp import create_engine

    prompts = multi_prefix_prompts(seed=8, prefix_lens=(32, 20), per_prefix=(3, 2))
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    kw = dict(model="tiny-qwen-tp4", kernel_impl="torch")
    ids, hints = [p for p, _ in prompts], [lp for _, lp in prompts]
    ref = Engine(tiny_config("granikv", **kw)).generate(ids, params, shared_prefix_lens=hints)
    eng = create_engine(tiny_config("granikv", tp=4, **kw))
    try:
        got = eng.generate(ids, params, shared_prefix_lens=hints)
    finally:
        eng.close()
    assert got == ref


def test_overlap_schedule_matches_synchronous_steps_including_stops():
    """Queuing step N+1 before reading step N changes nothing observable: same tokens, same
    stop points (a stop token found one step late is dropped), same counts."""
    prompts = multi_prefix_prompts(seed=11, prefix_lens=(30,), per_prefix=(6,))
    ids = [p for p, _ in prompts]
    base = Engine(tiny_config("granikv", kernel_impl="torch", overlap_schedule=False)).generate(
        ids, SamplingParams(max_new_tokens=30, ignore_eos=True))
    # stop on a token that really occurs mid-stream in some outputs
    stop = base[0][7]
    params = SamplingParams(max_new_tokens=30, stop_token_ids=(stop,))
    outs = {}
    for overlap in (False, True):
        eng = Engine(tiny_config("granikv", kernel_impl="torch", overlap_schedule=overlap))
        outs[overlap] = eng.generate(ids, params)
        assert not eng.has_work() and eng.storage.stats()["live_requests"] == 0
    assert outs[True] == outs[False]
    assert any(len(o) < 30 and o[-1] == stop for o in outs[True])
    for o in outs[True]:
        assert -1 not in o


def test_temperature_sampling_is_seeded_and_runs_synchronously():
    prompts = [p for p, _ in multi_prefix_prompts(seed=2, prefix_lens=(20,), per_prefix=(3,))]
    params = SamplingParams(max_new_tokens=10, temperature=0.8, ignore_eos=True)
    a = Engine(tiny_config("paged", kernel_impl="torch")).generate(prompts, params)
    b = Engine(tiny_config("paged", kernel_impl="torch")).generate(prompts, params)
    assert a == b and all(len(x) == 10 for x in a)


def test_profiler_sees_named_engine_phases():
    from torch.profiler import ProfilerActivity, profile

    eng = Engine(tiny_config("granikv", kernel_impl="torch"))
    prompts = [p for p, _ in multi_prefix_prompts(seed=9, prefix_lens=(24,), per_prefix=(3,))]
    for p in prompts:
        eng.add_request(p, SamplingParams(max_new_tokens=6, ignore_eos=True), shared_prefix_len=24)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        while eng.has_work():
            eng.step()
    names = {e.name for e in prof.events()}
    for phase in ("schedule", "plan", "dispatch", "forward", "sample"):
        assert f"granikv::{phase}" in names, phase
