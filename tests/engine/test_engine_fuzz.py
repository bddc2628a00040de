"""The engine under randomized operation sequences (hypothesis): requests of four prefix classes (two nested in one)
and none, with and without the shared-prefix hint, empty suffixes (a prompt that is exactly a
cached prefix), aborts at any point (waiting, mid-prefill, decoding, finished), cache flushes and a
KV budget tight enough to retract. What must hold whatever the sequence:

- every request that was not aborted finishes with exactly its `max_new_tokens` greedy tokens
  (or up to its first stop token), and those tokens are the same in the three systems, with and
  without overlap scheduling (which runs a stopped request one step too far and drops that
  step), and under KV pressure as with room;
- the storage's ownership audit passes after every step (granikv: promotions that commit while
  their readers decode re-point them, prefixes without a hint or HOT space form COLD classes);
- after the run nothing leaks: no request holds KV, and once the cache is flushed every slot
  (and, for granikv, every HOT slab) is free again.
"""

from __future__ import annotations

import random

from engine_testutil import tiny_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from granikv.engine.request import SamplingParams, Status
from granikv.runtime.tp import create_engine

PREFIX_LENS = (33, 17, 52, 53)  # class 4 = no shared prefix
# prefixes 2 and 3 are prefix 0 plus 19 and 20 tokens of their own: two agents' roles after a shared
# system prompt, so a batch holding both reads the head through one class and each role through an
# extension class (EXT pass; tests/engine/test_hint_free.py checks the classes themselves)
NESTED = {2: 0, 3: 0}
VOCAB = 1024
ROOMY, TIGHT = 4096, 200  # TIGHT: a few requests' KV, so admission waits and decode retracts

# ("add", prefix class, suffix length, max_new_tokens, hint, how many such requests at once,
#  stops: whether the requests stop on STOP_IDS — a tenth of the vocabulary, so most stop early)
add_op = st.tuples(st.just("add"), st.integers(0, len(PREFIX_LENS)), st.integers(0, 14),
                   st.integers(1, 24), st.booleans(), st.integers(1, 5), st.booleans())
STOP_IDS = tuple(range(0, VOCAB, 10))
ops_strategy = st.lists(st.one_of(add_op, add_op, st.tuples(st.just("step"), st.integers(1, 4)),
                                  st.tuples(st.just("abort"), st.integers(0, 63)), st.just(("flush",))),
                        min_size=1, max_size=28)


def _params(op) -> SamplingParams:
    stops = op[6]
    return SamplingParams(max_new_tokens=op[3], ignore_eos=not stops, stop_token_ids=STOP_IDS if stops else ())


def _prompts(ops, seed: int) -> dict[str, tuple[list[int], int | None, int]]:
    """Request id -> (prompt, hint, max_new) for every request of every "add" op, the same for
    every system; a batch's requests differ in their suffix tokens."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB) for _ in range(n)] for n in PREFIX_LENS]
    for child, parent in NESTED.items():
        head = prefixes[parent]
        prefixes[child] = head + prefixes[child][len(head):]
    out = {}
    for i, op in enumerate(ops):
        if op[0] != "add":
            continue
        _, cls, n_suffix, max_new, hint, count, _stops = op
        prefix = prefixes[cls] if cls < len(prefixes) else []
        for j in range(count):
            suffix = [rng.randrange(VOCAB) for _ in range(n_suffix if prefix else max(1, n_suffix))]
            out[f"q{i}.{j}"] = (prefix + suffix, len(prefix) if hint and prefix else None, max_new)
    return out


# engine knobs drawn per example for the systems under test (the reference keeps the defaults):
# small prefill chunks (multi-chunk prompts, in-batch prefix sharing waits), paged page size,
# COLD pages, a HOT pool too small for most slabs (fallbacks), extend graphs (eager on the CPU)
knobs_strategy = st.fixed_dictionaries({
    "chunked_prefill_tokens": st.sampled_from([256, 24]), "page_size": st.sampled_from([16, 4]),
    "cold_page_size": st.sampled_from([1, 1, 4]), "hot_fraction": st.sampled_from([0.3, 0.05]),
    "extend_graph_tokens": st.sampled_from([(), (16, 64)]),
    # every class takes a prefix pass (dense, cascade or COLD rows) or the measured default rule
    "prefix_pass_min_saved_mib": st.sampled_from([None, 0]), "promote_min_refs": st.sampled_from([2, 0]),
    # COLD classes in one slot range read by the slab form of the pass, or always through a row
    "cold_range_as_slab": st.booleans()})


def _replay(system: str, slots: int, ops, prompts, overlap: bool = True,
            knobs: dict | None = None, tp: int = 1) -> tuple[dict[str, list[int]], set[str]]:
    cfg = tiny_config(system, num_slots=slots, kernel_impl="torch", overlap_schedule=overlap, tp=tp, **(knobs or {}))
    engine = create_engine(cfg)
    try:
        return _drive(engine, system, ops, prompts)
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()


def _drive(engine, system: str, ops, prompts) -> tuple[dict[str, list[int]], set[str]]:
    free_at_start = engine.storage.available()
    reqs, aborted = {}, set()
    for i, op in enumerate(ops):
        if op[0] == "add":
            for j in range(op[5]):
                rid = f"q{i}.{j}"
                ids, hint, _ = prompts[rid]
                reqs[rid] = engine.add_request(ids, _params(op), rid=rid, shared_prefix_len=hint)
        elif op[0] == "step":
            for _ in range(op[1]):
                engine.step()
                engine.storage.audit()
        elif op[0] == "abort" and reqs:
            rid = sorted(reqs)[op[1] % len(reqs)]
            if reqs[rid].status != Status.FINISHED:
                aborted.add(rid)
            engine.abort(rid)
        elif op[0] == "flush":
            engine.flush_cache()  # refused (False) while requests run: that is part of the test
    guard = 0
    while engine.has_work():
        engine.step()
        engine.storage.audit()
        guard += 1
        assert guard < 5000, "the engine does not drain"
    outs = {}
    for rid, req in reqs.items():
        if rid in aborted:
            continue
        assert req.status == Status.FINISHED, (system, rid, req.status)
        n, out = req.params.max_new_tokens, req.output_ids
        if req.params.ignore_eos:
            assert len(out) == n, (system, rid)
        else:  # stopped on its first stop token, or ran to its length without one
            first = next((i for i, t in enumerate(out) if t in STOP_IDS or t in engine.eos_ids), None)
            assert len(out) == (n if first is None or first >= n else first + 1), (system, rid, out)
        outs[rid] = list(req.output_ids)
    st_ = engine.storage.stats()
    engine.storage.audit()
    assert st_["live_requests"] == 0 and not engine.scheduler.running and not engine.scheduler.waiting
    assert engine.flush_cache()
    after = engine.storage.stats()
    assert after["cached_slots"] == 0 and engine.storage.available() == free_at_start, (system, after)
    if system == "granikv":
        assert after["slabs"] == 0 and after["hot_free"] == after["hot_slots"], after
    engine.storage.audit()
    return outs, aborted


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy, seed=st.integers(0, 2**16), tight=st.booleans(), overlap=st.booleans(),
       knobs=knobs_strategy)
def test_random_operation_sequences_same_tokens_and_no_leaks(ops, seed, tight, overlap, knobs):
    """The reference is paged with room, default knobs and synchronous steps; each system runs the
    sequence with the drawn KV budget, overlap scheduling and knobs."""
    prompts = _prompts(ops, seed)
    ref, ref_aborted = _replay("paged", ROOMY, ops, prompts, overlap=False)
    for system in ("paged", "cascade", "granikv"):
        outs, aborted = _replay(system, TIGHT if tight else ROOMY, ops, prompts, overlap=overlap, knobs=knobs)
        # an abort lands on a finished request in one run and a running one in another; those
        # requests are compared nowhere, every other request everywhere
        common = set(outs) & set(ref)
        assert set(outs) | aborted == set(ref) | ref_aborted
        assert {r: outs[r] for r in common} == {r: ref[r] for r in common}, system


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy, seed=st.integers(0, 2**16), tight=st.booleans())
def test_random_operation_sequences_at_tp2_equal_tp1(ops, seed, tight):
    """TP=2 over gloo: rank 0 broadcasts each step's adds, aborts and flushes and every rank runs
    the same scheduler; whatever the sequence, the tokens are TP=1's (granikv, the system with the
    most host state: slabs, promotions, dispatch)."""
    prompts = _prompts(ops, seed)
    slots = TIGHT if tight else ROOMY
    ref, ref_aborted = _replay("granikv", slots, ops, prompts)
    outs, aborted = _replay("granikv", slots, ops, prompts, tp=2)
    assert set(outs) | aborted == set(ref) | ref_aborted
    common = set(outs) & set(ref)
    assert {r: outs[r] for r in common} == {r: ref[r] for r in common}


# random trees of shared runs (sharing at any depth, EngineConfig.share_depth): up to 5 levels of
# (fanout, run length); an "add" picks a leaf (index mod leaves) or, at 16, no shared prefix
tree_strategy = st.lists(st.tuples(st.integers(1, 3), st.integers(6, 20)), min_size=1, max_size=5).filter(
    lambda lv: _leaves(lv) <= 16)
tree_add_op = st.tuples(st.just("add"), st.integers(0, 16), st.integers(0, 14), st.integers(1, 24), st.booleans(),
                        st.integers(1, 5), st.booleans())
tree_ops_strategy = st.lists(st.one_of(tree_add_op, tree_add_op, st.tuples(st.just("step"), st.integers(1, 4)),
                                       st.tuples(st.just("abort"), st.integers(0, 63)), st.just(("flush",))),
                             min_size=1, max_size=24)


def _leaves(levels) -> int:
    n = 1
    for fanout, _ in levels:
        n *= fanout
    return n


def _tree_prompts(ops, levels, seed: int) -> dict[str, tuple[list[int], int | None, int]]:
    """As _prompts, over the root-to-leaf paths of a tree of seeded runs."""
    rng = random.Random(seed)
    runs, count = [], 1
    for fanout, length in levels:
        count *= fanout
        runs.append([[rng.randrange(VOCAB) for _ in range(length)] for _ in range(count)])
    paths = []
    for leaf in range(count):
        path, below = [], count
        for d, (fanout, _) in enumerate(levels):
            below //= fanout
            path += runs[d][leaf // below]
        paths.append(path)
    out = {}
    for i, op in enumerate(ops):
        if op[0] != "add":
            continue
        _, leaf, n_suffix, max_new, hint, count_, _stops = op
        prefix = paths[leaf % count] if leaf < 16 else []
        for j in range(count_):
            suffix = [rng.randrange(VOCAB) for _ in range(n_suffix if prefix else max(1, n_suffix))]
            out[f"q{i}.{j}"] = (prefix + suffix, len(prefix) if hint and prefix else None, max_new)
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=tree_ops_strategy, levels=tree_strategy, seed=st.integers(0, 2**16), tight=st.booleans(),
       overlap=st.booleans(), depth=st.integers(2, 5), knobs=knobs_strategy)
def test_random_trees_at_any_share_depth_same_tokens_and_no_leaks(ops, levels, seed, tight, overlap, depth, knobs):
    """Requests over a random tree of shared runs (up to depth 5), with promotions, retractions,
    aborts and flushes, audit after every step: granikv reading up to `depth` levels once per step
    gives paged's tokens and leaks nothing."""
    prompts = _tree_prompts(ops, levels, seed)
    ref, ref_aborted = _replay("paged", ROOMY, ops, prompts, overlap=False)
    outs, aborted = _replay("granikv", TIGHT if tight else ROOMY, ops, prompts, overlap=overlap,
                            knobs={**knobs, "share_depth": depth, "min_prefix_for_hot": 6})
    common = set(outs) & set(ref)
    assert set(outs) | aborted == set(ref) | ref_aborted
    assert {r: outs[r] for r in common} == {r: ref[r] for r in common}
