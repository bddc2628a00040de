"""Nothing compiles inside a serving run (GPU; skipped on CPU hosts).

The engine compiles its Triton variants at start (`capture_at_start`: every batch bucket's
single-prefix decode graph, the extend variants). A variant first met inside a run costs a
compile of 0.5-2 s in one step, but only on a machine whose Triton cache lacks it, so the same
cell measured twice on one machine gives two numbers (the slow one the first cell of its kind
on its machine: `tables/h200/repetitions.md`, A/B label coldcache-before). Triton specializes an int
argument equal to 1 (compiled in as a constant) or divisible by 16, so a value that depends on
how a batch splits into prefix classes (tiles per class, splits, the number of classes) makes a
new variant unless the kernel is told not to specialize it.

This runs an engine with Llama-3.1-8B's attention shapes (32 query heads, 8 KV heads, d=128,
bf16; one layer, so it is quick) through a warm-up request, as a serving cell does, then through
multi-prefix batches of the sizes the paper's sweeps meet (with and without the prefix hint),
and asserts that no kernel of granikv.kernels gained a compiled variant after the warm-up and
that the multi-class graphs of the steady batch were captured at start.
"""

from __future__ import annotations

import importlib
import pkgutil
import random

import pytest
import torch

import granikv.kernels
from granikv.config import EngineConfig
from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels need CUDA")]

LLAMA8B_ATTENTION = """\
name: llama8b-attention-1layer
arch: llama
vocab_size: 1024
hidden_size: 4096
intermediate_size: 1024
num_layers: 1
num_heads: 32
num_kv_heads: 8
head_dim: 128
rope_theta: 500000.0
rope_scaling: null
rms_norm_eps: 1.0e-5
max_position_embeddings: 8192
eos_token_ids: []
"""


def compiled_variants() -> dict[str, int]:
    """Compiled variants per launched Triton kernel of granikv.kernels (this process)."""
    from triton.runtime.jit import JITFunction

    out = {}
    for info in pkgutil.iter_modules(granikv.kernels.__path__):
        mod = importlib.import_module(f"granikv.kernels.{info.name}")
        for name, obj in vars(mod).items():
            if isinstance(obj, JITFunction):
                out[f"{info.name}.{name}"] = sum(len(c[0]) for c in obj.device_caches.values())
    return out


def waves(k: int, n: int, prefix_len: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """n requests over k shared prefixes (request i has prefix i mod k, as the multiprefix
    workload), suffixes of 3-40 tokens."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1024) for _ in range(prefix_len)] for _ in range(k)]
    prompts = [prefixes[i % k] + [rng.randrange(1024) for _ in range(rng.randint(3, 40))] for i in range(n)]
    return prompts, [prefix_len] * n


def agent_waves(k: int, n: int, prefix_len: int, role_len: int, seed: int) -> list[list[int]]:
    """n requests of k agents (the agents workload): one shared head, a role prompt per agent
    (request i is agent i mod k), suffixes of 3-40 tokens."""
    rng = random.Random(seed)
    head = [rng.randrange(1024) for _ in range(prefix_len)]
    roles = [[rng.randrange(1024) for _ in range(role_len)] for _ in range(k)]
    return [head + roles[i % k] + [rng.randrange(1024) for _ in range(rng.randint(3, 40))] for i in range(n)]


@pytest.mark.parametrize("system", ["granikv", "cascade"])
def test_multi_prefix_batches_compile_nothing_after_start(system, tmp_path):
    spec = tmp_path / "llama8b-attention-1layer.yaml"
    spec.write_text(LLAMA8B_ATTENTION)
    eng = Engine(EngineConfig(
        model=str(spec), system=system, device="cuda", dtype="bfloat16", num_slots=1 << 16,
        max_running=256, max_context=2048, min_prefix_for_hot=64, hot_fraction=0.5,
        m_sat=2048,  # conf/hardware/h200.yaml's fit for g = 4
        prefix_pass_min_saved_mib=0))  # short test prefixes still take the prefix passes
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    eng.generate([[7] * 300], SamplingParams(max_new_tokens=32, ignore_eos=True))  # the cell's warm-up
    before = compiled_variants()
    at_start = set(eng.runner.graphs.graphs)
    # (k prefixes, requests): Table 20's k sweep and Table 21's heterogeneous k at B=256, a
    # draining wave, odd class counts and sizes
    # the last waves send no hint: COLD classes through the rows pass until a
    # promotion commits, then re-pointed readers in slab classes, mixed in one step
    for i, (k, n, hint) in enumerate([(16, 256, True), (4, 256, True), (64, 256, True), (8, 256, True),
                                      (2, 256, True), (3, 100, True), (5, 40, True), (16, 200, True),
                                      (4, 130, True), (1, 100, True), (1, 256, False), (16, 256, False),
                                      (4, 100, False)]):
        prompts, hints = waves(k, n, prefix_len=320 + 16 * i, seed=i)
        eng.generate(prompts, params, shared_prefix_lens=hints if hint else None)
    # nested sharing without hints: a head class and one extension class per
    # agent (the EXT pass over the flat slot table), odd agent counts and batch sizes
    for i, (k, n) in enumerate([(8, 256), (3, 100), (5, 37)]):
        eng.generate(agent_waves(k, n, prefix_len=320 + 16 * i, role_len=96, seed=100 + i), params)
    torch.cuda.synchronize()
    after = compiled_variants()
    grew = {name: (before.get(name, 0), n) for name, n in after.items() if n > before.get(name, 0)}
    assert not grew, f"compiled inside the run (kernel: variants after warm-up -> after the batches): {grew}"
    # the waves of 256 sit at the top bucket split over k prefixes: one pass of k classes there
    # replays a graph captured at start (DecodeGraphs.ahead_keys); uneven ramp-up and mixed-pass
    # steps may still capture
    top = eng.runner.graphs.bucket_for(256)
    late = sorted(key for key in set(eng.runner.graphs.graphs) - at_start if key[0] == top and len(key[1]) == 1
                  and key[1][0][1] > 1)
    assert not late, f"multi-class graphs at the top bucket captured inside the run: {late}"
    if system == "granikv":
        assert eng.backend.stats()["cascade_steps"] > 0  # the multi-class prefix pass did run
        assert eng.backend.stats()["ext_steps"] > 0  # and the extension pass


def tree_waves(levels, n: int, seed: int) -> list[list[int]]:
    """n requests over a tree of runs (the tree workload: request i on leaf i mod leaves), suffixes
    of 3-40 tokens."""
    rng = random.Random(seed)
    runs, count = [], 1
    for fanout, length in levels:
        count *= fanout
        runs.append([[rng.randrange(1024) for _ in range(length)] for _ in range(count)])
    out = []
    for i in range(n):
        leaf, path, below = i % count, [], count
        for d, (fanout, _) in enumerate(levels):
            below //= fanout
            path += runs[d][leaf // below]
        out.append(path + [rng.randrange(1024) for _ in range(rng.randint(3, 40))])
    return out


def test_tree_batches_at_share_depth_3_compile_nothing_after_start(tmp_path):
    """Sharing at any depth on the GPU: a three-level tree read level by level (head, EXT, ext2) compiles no
    kernel variant after start, and its full-batch graph was captured at start. (Its tokens
    against the two-level engine's: tests/engine/test_engine_gpu.py, in float32.)"""
    spec = tmp_path / "llama8b-attention-1layer.yaml"
    spec.write_text(LLAMA8B_ATTENTION)
    eng = Engine(EngineConfig(
        model=str(spec), system="granikv", device="cuda", dtype="bfloat16", num_slots=1 << 17,
        max_running=256, max_context=4096, min_prefix_for_hot=64, hot_fraction=0.5, m_sat=2048,
        prefix_pass_min_saved_mib=0, share_depth=3))
    eng.generate([[7] * 300], SamplingParams(max_new_tokens=32, ignore_eos=True))  # the cell's warm-up
    before, at_start = compiled_variants(), set(eng.runner.graphs.graphs)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    for i, (levels, n) in enumerate([(((1, 512), (4, 256), (4, 128)), 256), (((1, 384), (2, 256), (3, 96)), 100)]):
        prompts = tree_waves(levels, n, seed=200 + i)
        eng.generate(prompts[: n // 2], params)  # the prompts cached first, as a run's first requests
        eng.generate(prompts, params)
    torch.cuda.synchronize()
    grew = {k: (before.get(k, 0), v) for k, v in compiled_variants().items() if v > before.get(k, 0)}
    assert not grew, f"compiled inside the run: {grew}"
    st = eng.backend.stats()
    assert st.get("deep_ext_steps", 0) > 0, st
    top = eng.runner.graphs.bucket_for(256)
    deep = [key for key in eng.runner.graphs.graphs if key[0] == top and any(p[0] == "ext2" for p in key[1])]
    assert deep and set(deep) <= at_start, f"level-2 graphs at the top bucket captured in the run: {deep}"
