"""TP=2 over NCCL on two GPUs (skipped unless two are visible): the same greedy tokens as TP=1.

The CPU suite checks TP=2 over gloo (test_engine_correctness.test_tp2_equals_tp1); this is the
same check on the real transport, with CUDA graphs and overlap scheduling on, for each system.
Float32: the row-parallel partial sums are added in a different order than the TP=1 GEMM, so
the first tokens must agree (a wrong shard or a missing all-reduce diverges at once).
"""

from __future__ import annotations

import pytest
import torch
from engine_testutil import multi_prefix_prompts, tiny_config

from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams
from granikv.runtime.tp import create_engine

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]


@pytest.fixture(autouse=True)
def _stacks_on_hang():
    """On the H200 pair this test once hung with no output (pytest-timeout's signal cannot
    interrupt a main thread blocked inside NCCL or gloo): dump every thread's stack first."""
    import faulthandler

    faulthandler.dump_traceback_later(80, exit=False)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.parametrize("system", ["paged", "cascade", "granikv"])
def test_tp2_nccl_equals_tp1(system):
    prompts = multi_prefix_prompts(seed=9, prefix_lens=(300, 64), per_prefix=(6, 3))
    ids = [p for p, _ in prompts]
    hints = [lp for _, lp in prompts]
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    kw = dict(device="cuda", dtype="float32", kernel_impl="triton", cuda_graphs=True, overlap_schedule=True,
              min_prefix_for_hot=32, m_sat=16)
    ref = Engine(tiny_config(system, **kw)).generate(ids, params, shared_prefix_lens=hints)
    torch.cuda.synchronize()
    eng = create_engine(tiny_config(system, tp=2, **kw))
    try:
        got = eng.generate(ids, params, shared_prefix_lens=hints)
    finally:
        eng.close()
    for a, b in zip(got, ref):
        assert a[:8] == b[:8]
