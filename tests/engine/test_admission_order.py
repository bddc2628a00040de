"""Prefix-affinity admission (EngineConfig.admission_order, Scheduler._admit_affine): waiting
requests sharing a running request's prefix go first, so the decode batch reads fewer distinct
prefixes per step; the queue's head is passed over only within the window; tokens do not change.

Why it matters: with k prefixes assigned round-robin and arrival-order admission, every wave of B
requests spans all k prefixes (B/k per class), so each decode step reads k prefixes; admitting a
cached prefix's requests together halves that at k=64, B=256 (docs/ARCHITECTURE.md, Scheduler)."""

from __future__ import annotations

import random

import pytest
from engine_testutil import tiny_config

from granikv.config import EngineConfig
from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams, Status


def _round_robin(k: int, per: int, lp: int = 80, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1024) for _ in range(lp)] for _ in range(k)]
    return [prefixes[i % k] + [rng.randrange(1024) for _ in range(rng.randrange(2, 9))] for i in range(k * per)]


# prompts longer than the 64-token prefix key; a prefill step's budget holds about one new
# prefix (as at Lp=8K with 8K-token chunks on the GPU), so a wave is admitted over several steps
# and a prefix prefilled early is live while it fills
CHUNK = 96


def _run(order: str, prompts, max_running: int = 8, new: int = 6, **kw):
    eng = Engine(tiny_config("granikv", kernel_impl="torch", max_running=max_running, admission_order=order,
                             chunked_prefill_tokens=CHUNK, **kw))
    params = SamplingParams(max_new_tokens=new, ignore_eos=True)
    reqs = [eng.add_request(p, params) for p in prompts]  # no hint: the engine finds the sharing
    distinct = []
    while any(r.status != Status.FINISHED for r in reqs):
        eng.step()
        dec = [r for r in eng.scheduler.running if r.kv_len >= r.prefill_target]
        if dec:
            distinct.append(len({tuple(r.input_ids[:80]) for r in dec}))
    return eng, [r.output_ids for r in reqs], distinct


def test_defaults_per_system():
    assert EngineConfig(system="granikv").resolved_admission_order == "prefix"
    assert EngineConfig(system="paged").resolved_admission_order == "fcfs"
    assert EngineConfig(system="cascade").resolved_admission_order == "fcfs"
    assert EngineConfig(system="paged", admission_order="prefix").resolved_admission_order == "prefix"
    with pytest.raises(ValueError, match="admission_order"):
        EngineConfig(admission_order="lpm")


def test_affinity_reads_fewer_prefixes_per_step_with_the_same_tokens():
    prompts = _round_robin(k=4, per=6)
    fcfs_eng, fcfs_out, fcfs_distinct = _run("fcfs", prompts)
    aff_eng, aff_out, aff_distinct = _run("prefix", prompts)
    assert aff_out == fcfs_out
    assert fcfs_eng.stats()["affinity_admits"] == 0 < aff_eng.stats()["affinity_admits"]
    assert sum(aff_distinct) / len(aff_distinct) < sum(fcfs_distinct) / len(fcfs_distinct)
    aff_eng.storage.audit()  # raises on an inconsistent pool


def test_paged_with_affinity_matches_granikv_tokens():
    prompts = _round_robin(k=3, per=4, seed=3)
    _, g, _ = _run("prefix", prompts)
    eng = Engine(tiny_config("paged", kernel_impl="torch", max_running=8, admission_order="prefix",
                             chunked_prefill_tokens=CHUNK))
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    reqs = [eng.add_request(p, params) for p in prompts]
    while any(r.status != Status.FINISHED for r in reqs):
        eng.step()
    assert [r.output_ids for r in reqs] == g


@pytest.mark.parametrize(("window", "a3_jumps"), [(3, False), (5, True)])
def test_affinity_jumps_only_within_the_window(window, a3_jumps):
    """Queue B1 B2 A2 C1 A3 behind a running, prefilled A1: affinity admits A2 (position 2) ahead of
    B1 and B2, and A3 (position 4) only when the window reaches it."""
    k = _round_robin(k=3, per=3, seed=7)  # A, B, C, A, B, C, ...
    a1, b1, c1, a2, b2, _, a3 = k[:7]
    eng = Engine(tiny_config("granikv", kernel_impl="torch", admission_window=window, chunked_prefill_tokens=CHUNK))
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    first = eng.add_request(a1, params)
    eng.step()  # A1's prefill (one chunk)
    assert first.prefill_target > 0 and first.kv_len >= first.prefill_target
    queued = [eng.add_request(p, params) for p in (b1, b2, a2, c1, a3)]
    eng.step()
    waiting = set(map(id, eng.scheduler.waiting))
    assert id(queued[2]) not in waiting  # A2 jumped
    assert (id(queued[4]) not in waiting) == a3_jumps
    assert id(queued[0]) not in waiting  # the head is still admitted in the same step (FCFS scan)
    while any(r.status != Status.FINISHED for r in [first, *queued]):
        eng.step()
