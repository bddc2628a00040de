"""GPU sampling checks (skipped on CPU hosts): through CUDA-graph decode with the overlap
scheduler, the sampler's tokens are what the next step consumes (`tok_buf`) and the logprobs are
read from the graph's logits before a later replay overwrites them."""

from __future__ import annotations

import random

import pytest
import torch
from engine_testutil import tiny_config
from test_engine_correctness import hf_checkpoint
from test_sampling_engine import hf_logprobs, run_engine

from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("system", ["paged", "granikv"])
def test_graph_decode_logprobs_equal_transformers(tmp_path, system):
    """Each emitted token's logprob equals transformers' float32 log_softmax at the position
    after the tokens the engine emitted: a sampled token that did not reach `tok_buf` (the
    graph's argmax fed instead), or logits overwritten by the next (overlapped) replay before
    they were read, would break it. Greedy tokens with logprobs equal those without."""
    hf, path = hf_checkpoint(tmp_path, "tiny")
    cfg = tiny_config(system, model="tiny", load_format="safetensors", model_path=str(path), device="cuda",
                      dtype="float32", kernel_impl="triton", cuda_graphs=True, overlap_schedule=True)
    rng = random.Random(0)
    shared = [rng.randrange(1024) for _ in range(40)]
    prompts = [shared + [rng.randrange(1024) for _ in range(n)] for n in (3, 11, 7, 5)]
    params = [SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=5),
              SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=0, temperature=1.0, seed=1),
              SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=3, temperature=0.7, top_p=0.9, seed=2),
              SamplingParams(max_new_tokens=16, ignore_eos=True)]
    eng = Engine(cfg)
    outs = run_engine(eng, prompts, params)
    assert eng.runner.graphs.replays > 0
    for i, (p, sp) in enumerate(zip(prompts, params)):
        got = outs[str(i)]
        if sp.logprobs is None:
            assert all(o.logprobs is None for o in got)
            continue
        ref = hf_logprobs(hf, p, [o.token for o in got])
        for j, o in enumerate(got):
            assert o.logprobs.logprob == pytest.approx(ref[j, o.token].item(), abs=2e-3), (i, j)
            assert len(o.logprobs.top) == sp.logprobs
    # greedy with logprobs (overlapped) and without: the same graph logits, the same tokens
    plain = [SamplingParams(max_new_tokens=16, ignore_eos=True)] * 2
    lp = [SamplingParams(max_new_tokens=16, ignore_eos=True, logprobs=2)] * 2
    a = Engine(cfg).generate(prompts[:2], plain)
    b = Engine(cfg).generate(prompts[:2], lp)
    torch.cuda.synchronize()
    assert a == b
