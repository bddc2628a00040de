"""The graphs captured at engine start cover every decode step of a single-prefix run.

`DecodeGraphs.ahead_keys` promises that a serving run whose requests share one long prefix
never captures a graph (or compiles a Triton variant) mid-run. Host-only check: for every batch
size up to max_running, the key of the plan each backend actually makes must be among them.
"""

from __future__ import annotations

import numpy as np
import pytest

from granikv.attention.batch import ReqView, StepBatch
from granikv.attention.cascade import CascadeBackend
from granikv.attention.dispatch import DispatchPolicy
from granikv.attention.granikv import GraniKVBackend
from granikv.attention.ops import KernelOps
from granikv.attention.paged import PagedBackend
from granikv.attention.plan import _pow2
from granikv.engine.graphs import DecodeGraphs

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512)
LP = 4096


def _backend(system: str, m_sat: int, min_saved_mib: int = 0):
    args = ([], [], None, 32, 8, 128, KernelOps("torch"))
    if system == "paged":
        return PagedBackend(*args)
    if system == "cascade":
        return CascadeBackend(*args, min_prefix_len=256)
    return GraniKVBackend(*args, policy=DispatchPolicy(group_size=4, m_sat=m_sat, min_prefix_len=256,
                                                       kv_bytes_per_token=4096, min_saved_bytes=min_saved_mib << 20))


def _batch(n: int) -> StepBatch:
    prefix = np.arange(1, LP + 1, dtype=np.int32)
    reqs = []
    for i in range(n):
        own = np.arange(100_000 + 1000 * i, 100_000 + 1000 * i + 20 + i % 7, dtype=np.int32)
        slots = np.concatenate([prefix, own])
        reqs.append(ReqView(row=i, seq_len=len(slots), prefix_len=len(slots) - 1, slab=(1, LP), slots=slots,
                            key=i))
    return StepBatch(mode="decode", reqs=reqs, num_tokens=n, out_slots=None, rows=None, prefix_lens=None,
                     qo_indptr=None, seq_lens=None)


@pytest.mark.parametrize("system,m_sat,min_saved_mib", [("paged", 2048, 0), ("cascade", 2048, 0), ("granikv", 2048, 0),
                                                        ("granikv", 1024, 0), ("granikv", 100, 0),
                                                        ("granikv", 2048, 128)])
def test_single_prefix_steps_use_graphs_captured_at_start(system, m_sat, min_saved_mib):
    """With the saved-bytes rule (128 MiB: classes under 9 requests at Lp=4K take the plain path)
    the plain graphs captured at start cover those steps too."""
    backend = _backend(system, m_sat, min_saved_mib)
    graphs = DecodeGraphs(model=None, backend=backend, slot_table=None, pad_row=0, buckets=BUCKETS)
    keys = set(graphs.ahead_keys(backend, 512))
    for n in range(1, 513):
        sig = backend.plan_decode(_batch(n)).signature()
        assert (graphs.bucket_for(n), sig) in keys, (n, sig)


def _cold_batch(n: int, contiguous: bool) -> StepBatch:
    """n requests reading one COLD run of LP slots (no slab), each with its own tail; the run is one
    slot range (read as a slab) or scattered (read through a member's row)."""
    b = _batch(n)
    for r in b.reqs:
        r.slab = None
        if not contiguous:
            r.slots = np.concatenate([1 + 2 * np.arange(LP, dtype=np.int32), r.slots[LP:]])
    return b


@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("m_sat,min_saved_mib", [(2048, 0), (100, 0), (2048, 128)])
def test_single_cold_prefix_steps_use_graphs_captured_at_start(m_sat, min_saved_mib, contiguous):
    backend = _backend("granikv", m_sat, min_saved_mib)
    graphs = DecodeGraphs(model=None, backend=backend, slot_table=None, pad_row=0, buckets=BUCKETS)
    keys = set(graphs.ahead_keys(backend, 512))
    for n in range(1, 513):
        sig = backend.plan_decode(_cold_batch(n, contiguous)).signature()
        assert (graphs.bucket_for(n), sig) in keys, (n, sig)
        if n >= 2 and min_saved_mib == 0:  # one class, read once
            assert len(sig) == 1 and sig[0][1] == 1, sig
            assert (sig[0][0], sig[0][3]) in ((("cascade", True), ("dense", True)) if contiguous
                                              else (("rows", False),)), sig


def test_ahead_keys_stop_at_max_running():
    backend = _backend("granikv", 2048)
    graphs = DecodeGraphs(model=None, backend=backend, slot_table=None, pad_row=0, buckets=BUCKETS)
    assert max(b for b, _ in graphs.ahead_keys(backend, 200)) == 256
    # a lone request takes the plain path; 2..8 requests the cascade pass (2..8 x g < m_sat) over
    # a slab, or the rows pass over a COLD run (no hint, nothing promoted yet); a head class with
    # 1, 2, 4 or 8 agents' extension classes of two requests at least (nested sharing: two levels,
    # one flattened launch)
    # and at the steady batch of 8, two or four prefixes' classes (padded size and twice it, slab
    # and rows form)
    assert graphs.ahead_keys(backend, 8) == [
        (1, ()), (2, ()), (2, (("cascade", 1, 2, True),)), (2, (("rows", 1, 2, False),)),
        (2, (("cascade", 1, 2, True), ("ext", 1, 2, False), ("flat",))),
        (4, ()), (4, (("cascade", 1, 4, True),)), (4, (("rows", 1, 4, False),)),
        (4, (("cascade", 1, 4, True), ("ext", 1, 4, False), ("flat",))),
        (4, (("cascade", 1, 4, True), ("ext", 2, 2, False), ("flat",))),
        (8, ()), (8, (("cascade", 1, 8, True),)), (8, (("rows", 1, 8, False),)),
        (8, (("cascade", 1, 8, True), ("ext", 1, 8, False), ("flat",))),
        (8, (("cascade", 1, 8, True), ("ext", 2, 4, False), ("flat",))),
        (8, (("cascade", 1, 8, True), ("ext", 4, 2, False), ("flat",))),
        (8, (("cascade", 2, 4, True),)), (8, (("rows", 2, 4, False),)), (8, (("cascade", 2, 8, True),)),
        (8, (("rows", 2, 8, False),)), (8, (("cascade", 4, 2, True),)), (8, (("rows", 4, 2, False),)),
        (8, (("cascade", 4, 4, True),)), (8, (("rows", 4, 4, False),))]


def _multi_batch(sizes: list[int], form: str) -> StepBatch:
    """One request per entry of `sizes` summed: len(sizes) prefixes of LP tokens, prefix j read by
    sizes[j] requests, from a HOT slab (`slab`), a COLD slot range (`range`) or scattered COLD
    slots (`scattered`)."""
    reqs = []
    for j, size in enumerate(sizes):
        start = 1 + j * 2 * LP
        prefix = (start + 2 * np.arange(LP) if form == "scattered" else start + np.arange(LP)).astype(np.int32)
        for _ in range(size):
            i = len(reqs)
            own = np.arange(10_000_000 + 1000 * i, 10_000_000 + 1000 * i + 20 + i % 7, dtype=np.int32)
            slots = np.concatenate([prefix, own])
            reqs.append(ReqView(row=i, seq_len=len(slots), prefix_len=len(slots) - 1,
                                slab=(start, LP) if form == "slab" else None, slots=slots, key=i))
    return StepBatch(mode="decode", reqs=reqs, num_tokens=len(reqs), out_slots=None, rows=None,
                     prefix_lens=None, qo_indptr=None, seq_lens=None)


def _split(n: int, k: int, skew: int) -> list[int]:
    """n requests over k prefixes, as even as n allows, then `skew` requests moved from the
    last prefix to the first (a heterogeneous run's classes are uneven)."""
    sizes = [n // k + (j < n % k) for j in range(k)]
    moved = min(skew, sizes[-1] - 2)
    sizes[0] += moved
    sizes[-1] -= moved
    return sizes


@pytest.mark.parametrize("form", ["slab", "range", "scattered"])
@pytest.mark.parametrize("min_saved_mib", [0, 192])
def test_multi_prefix_steady_batches_use_graphs_captured_at_start(form, min_saved_mib):
    """A closed-loop run at max_running over k prefixes (Table 20's k, Table 21's uneven hetero
    classes, the agents' heads) sits at one batch size for most of its steps: its graph is
    captured at start, not when the run first meets it."""
    backend = _backend("granikv", 2048, min_saved_mib)
    graphs = DecodeGraphs(model=None, backend=backend, slot_table=None, pad_row=0, buckets=BUCKETS)
    for max_running in (256, 200, 512):
        keys = set(graphs.ahead_keys(backend, max_running))
        for k in (2, 3, 4, 5, 8, 16, 32, 64):
            for skew in (0, 1, max_running // (4 * k)):
                sizes = _split(max_running, k, skew)
                sig = backend.plan_decode(_multi_batch(sizes, form)).signature()
                assert len(sig) == 1 and sig[0][1] == _pow2(k), (k, sizes, sig)  # one pass, k classes
                assert (graphs.bucket_for(max_running), sig) in keys, (max_running, k, sizes, sig)
