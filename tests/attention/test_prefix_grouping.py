"""Prefix classes by shared run (granikv/attention/classes.py, GraniKVBackend.plan_decode): a
class is the requests reading one run, its length their common run; a request sharing one more
token never splits a class; COLD runs form classes read through a member's slot-table row."""

from __future__ import annotations

import numpy as np

from granikv.attention.batch import ReqView, StepBatch
from granikv.attention.classes import best_class, partition_runs
from granikv.attention.dispatch import DispatchPolicy
from granikv.attention.granikv import GraniKVBackend
from granikv.attention.ops import KernelOps
from granikv.attention.plan import CASCADE, EXT, ROWS


def test_one_shared_suffix_token_does_not_split_a_class():
    runs = [(0, 1000), (1, 1000), (2, 1001), (3, 1001), (4, 1000)]
    assert best_class(runs) == ([0, 1, 2, 3, 4], 1000)


def test_a_short_run_does_not_shorten_a_long_class():
    runs = [(0, 8000), (1, 8000), (2, 8000), (3, 300)]
    assert best_class(runs) == ([0, 1, 2], 8000)
    assert partition_runs(runs) == [([0, 1, 2], 8000)]  # a lone leftover forms no class


def test_nested_runs_take_the_class_that_saves_most_then_the_rest():
    # 4 requests share 10K (agent A), 4 share only the 8K system prompt with them
    runs = [(i, 10_000) for i in range(4)] + [(i, 8_000) for i in range(4, 8)]
    assert best_class(runs) == (list(range(8)), 8000)  # 7 x 8000 > 3 x 10000
    runs = [(i, 10_000) for i in range(6)] + [(6, 2_000), (7, 2_000)]
    assert partition_runs(runs) == [(list(range(6)), 10_000), ([6, 7], 2_000)]


def test_no_class_without_two_requests_or_a_run():
    assert best_class([(0, 500)]) is None
    assert best_class([(0, 0), (1, 0)]) is None


def _backend(m_sat=10_000):
    args = ([], [], None, 32, 8, 128, KernelOps("torch"))
    return GraniKVBackend(*args, policy=DispatchPolicy(group_size=4, m_sat=m_sat, min_prefix_len=256))


def _view(i, slots, slab=None):
    slots = np.asarray(slots, dtype=np.int32)
    return ReqView(row=i, seq_len=len(slots) + 1, prefix_len=len(slots), slab=slab, slots=slots, key=f"r{i}")


def _batch(views):
    return StepBatch(mode="decode", reqs=views, num_tokens=len(views), out_slots=None, rows=None,
                     prefix_lens=None, qo_indptr=None, seq_lens=None)


def test_hot_requests_group_by_slab_with_their_common_run():
    """Requests re-pointed to a slab read shorter runs of it than those admitted later: one class."""
    base = 1
    views = [_view(i, np.r_[np.arange(base, base + lp), 5000 + 100 * i + np.arange(5)], slab=(base, lp))
             for i, lp in enumerate([600, 600, 601, 600])]
    plan = _backend().plan_decode(_batch(views))
    c = plan.passes[CASCADE]
    assert c.members == [[0, 1, 2, 3]] and c.lens == [600] and c.bases == [base]
    assert plan.kv_start == [600] * 4


def test_cold_requests_sharing_a_run_form_a_rows_class():
    shared = 3000 + 2 * np.arange(700)  # scattered slots: read through a member's row
    views = [_view(i, np.r_[shared, 9000 + 50 * i + np.arange(10)]) for i in range(3)]
    views.append(_view(3, np.r_[np.arange(20000, 20700), [1, 2]]))  # its own COLD prompt
    views.append(_view(4, np.r_[shared[:100], 30000 + np.arange(600)]))  # shares 100: plain
    plan = _backend().plan_decode(_batch(views))
    assert set(plan.passes) == {ROWS}
    c = plan.passes[ROWS]
    assert c.members == [[0, 1, 2]] and c.lens == [700] and c.page_rows == [0] and c.bases is None
    assert plan.kv_start == [700, 700, 700, 0, 0]
    # the cached common runs are reused while the rows are unchanged, and not after a re-point
    b = _backend()
    assert b.plan_decode(_batch(views)).passes[ROWS].lens == [700]
    assert b.plan_decode(_batch(views)).passes[ROWS].lens == [700]


def test_cold_class_takes_the_plain_path_under_the_saved_bytes_rule():
    shared = np.arange(3000, 3700)
    views = [_view(i, np.r_[shared, 9000 + 50 * i + np.arange(10)]) for i in range(3)]
    args = ([], [], None, 32, 8, 128, KernelOps("torch"))
    b = GraniKVBackend(*args, policy=DispatchPolicy(group_size=4, min_prefix_len=256, kv_bytes_per_token=4096,
                                                    min_saved_bytes=128 << 20))
    plan = b.plan_decode(_batch(views))
    assert plan.passes == {} and plan.kv_start is None
    assert b.stats()["class_decisions"]["plain"] == 1


def _agents_views(k=3, per_agent=3, lp=600, la=300, hot_base=1):
    """k agents: a head of lp slots (a slab from `hot_base`, or COLD when None), an extension of la
    COLD slots per agent, a private suffix per request."""
    views = []
    for a in range(k):
        ext = 40_000 + 1000 * a + np.arange(la)
        for _ in range(per_agent):
            i = len(views)
            head = np.arange(hot_base, hot_base + lp) if hot_base else 20_000 + 3 * np.arange(lp)
            slots = np.r_[head, ext, 60_000 + 50 * i + np.arange(7)]
            views.append(_view(i, slots, slab=(hot_base, lp) if hot_base else None))
    return views


def test_nested_runs_form_a_head_class_then_one_extension_class_per_agent():
    """Nested sharing (agents share a system prompt, each agent's requests its role prompt): the head
    once for everyone, each agent's extension once for its requests."""
    for hot_base in (1, None):
        views = _agents_views(hot_base=hot_base)
        b = _backend()
        plan = b.plan_decode(_batch(views))
        head = plan.passes[CASCADE if hot_base else ROWS]
        assert head.members == [list(range(9))] and head.lens == [600]
        ext = plan.passes[EXT]
        assert sorted(ext.members) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
        assert ext.lens == [300] * 3 and ext.starts == [600] * 3 and ext.bases is None
        assert all(row in m for row, m in zip(ext.page_rows, ext.members, strict=True))  # a member's row
        assert plan.kv_start == [900] * 9
        assert ext.where(1000) == [r * 1000 + 600 for r in ext.page_rows]
        st = b.stats()
        assert st["ext_steps"] == 1 and st["class_sizes"][EXT] == {"3": 3}
        # cached common runs are reused on the next step
        assert b.plan_decode(_batch(views)).passes[EXT].lens == [300] * 3


def test_extension_of_one_agent_inside_the_head_slab():
    """An agent whose whole prompt was promoted into one slab reads the head with everyone and
    its extension (the slab's tail) with its own requests."""
    lp, la = 600, 300
    views = []
    for i in range(3):  # agent A: head and extension in one slab [1, 901)
        views.append(_view(i, np.r_[np.arange(1, 1 + lp + la), 60_000 + 50 * i + np.arange(5)], slab=(1, lp + la)))
    for i in range(3, 6):  # agent B: the head of that slab, its own COLD extension
        views.append(_view(i, np.r_[np.arange(1, 1 + lp), 40_000 + np.arange(la), 60_000 + 50 * i + np.arange(5)],
                           slab=(1, lp)))
    plan = _backend().plan_decode(_batch(views))
    assert plan.passes[CASCADE].members == [list(range(6))] and plan.passes[CASCADE].lens == [lp]
    ext = plan.passes[EXT]
    assert sorted(ext.members) == [[0, 1, 2], [3, 4, 5]] and ext.lens == [la, la]
    assert plan.kv_start == [lp + la] * 6


def test_short_extensions_and_lone_agents_stay_on_the_plain_path():
    views = _agents_views(k=2, per_agent=1) + _agents_views(k=1, per_agent=2, la=100)[0:2]
    for i, v in enumerate(views):
        v.row, v.key = i, f"r{i}"
    plan = _backend().plan_decode(_batch(views))
    assert EXT not in plan.passes  # one request per agent; two sharing only 100 (< min_prefix_len)
    assert plan.kv_start == [600] * 4
    assert _backend_flat(nested=False).plan_decode(_batch(_agents_views())).passes.keys() == {CASCADE}


def _backend_flat(nested):
    args = ([], [], None, 32, 8, 128, KernelOps("torch"))
    return GraniKVBackend(*args, policy=DispatchPolicy(group_size=4, m_sat=10_000, min_prefix_len=256), nested=nested)


def _kv_policy_backend(min_saved_bytes: int):
    args = ([], [], None, 32, 8, 128, KernelOps("torch"))
    pol = DispatchPolicy(group_size=4, m_sat=10_000, min_prefix_len=256, kv_bytes_per_token=1,
                         min_saved_bytes=min_saved_bytes)
    return GraniKVBackend(*args, policy=pol)


def _many_cold_classes(k: int, n: int, lp: int) -> list[ReqView]:
    """k COLD prefixes of lp slots, n requests each, each request with its own 3-slot suffix."""
    views = []
    for c in range(k):
        prefix = 1 + c + k * np.arange(lp)  # scattered (interleaved) slots: rows classes
        for _ in range(n):
            i = len(views)
            views.append(_view(i, np.r_[prefix, 10**6 + 10 * i + np.arange(3)]))
    return views


def test_many_small_classes_pay_as_one_launch():
    """The launch cost is per pass kind: 8 classes that each avoid 3 * 300 re-reads (under a
    threshold of 2000) take the pass together, since together they avoid 7200."""
    views = _many_cold_classes(k=8, n=4, lp=300)
    plan = _kv_policy_backend(2000).plan_decode(_batch(views))
    rows = plan.passes[ROWS]
    assert len(rows.members) == 8 and rows.lens == [300] * 8
    assert sorted(i for m in rows.members for i in m) == list(range(32))
    assert plan.kv_start == [300] * 32


def test_a_launch_that_cannot_pay_leaves_every_class_plain():
    views = _many_cold_classes(k=2, n=2, lp=300)  # 2 classes x 1 x 300 = 600 < 1000
    backend = _kv_policy_backend(1000)
    plan = backend.plan_decode(_batch(views))
    assert not plan.passes and plan.kv_start is None
    assert backend.counters.class_decisions["plain"] == 2


def test_a_cold_run_in_one_slot_range_is_read_as_a_slab():
    """A COLD prefix prefilled from an unfragmented pool holds one ascending slot range: its class
    takes the slab form of the pass (contiguous loads) with the range's first slot as its base;
    a scattered run keeps the page-row form. Tokens are the same either way (same slots)."""
    contiguous = np.arange(5000, 5700)
    scattered = 9000 + 2 * np.arange(700)
    views = [_view(i, np.r_[contiguous, 20_000 + 10 * i + np.arange(4)]) for i in range(3)]
    views += [_view(3 + i, np.r_[scattered, 30_000 + 10 * i + np.arange(4)]) for i in range(3)]
    b = _backend()
    plan = b.plan_decode(_batch(views))
    assert plan.passes[CASCADE].members == [[0, 1, 2]] and plan.passes[CASCADE].bases == [5000]
    assert plan.passes[ROWS].members == [[3, 4, 5]] and plan.passes[ROWS].page_rows == [3]
    assert plan.kv_start == [700] * 6
    assert b.stats()["contiguous_cold"] == 1
    # a run that is a permutation of a range is not a range
    perm = contiguous.copy()
    perm[[10, 11]] = perm[[11, 10]]
    views = [_view(i, np.r_[perm, 20_000 + 10 * i + np.arange(4)]) for i in range(3)]
    assert set(_backend().plan_decode(_batch(views)).passes) == {ROWS}


def _tree_views(levels=((1, 600), (2, 400), (2, 300)), per_leaf=2, hot_base=1):
    """Requests over a tree of runs: the root a slab from `hot_base` (or COLD when None), every
    deeper node a COLD run of its own, then a private suffix per request; leaf j gets `per_leaf`
    requests (request i on leaf i mod leaves, as the tree workload assigns them)."""
    runs, count, base = [], 1, 40_000
    for fanout, length in levels:
        count *= fanout
        runs.append([base + 1000 * j + np.arange(length) for j in range(count)])
        base += 1000 * count
    # a COLD root of scattered slots (read through a row; a contiguous one would be read as a slab)
    root = 20_000 + 3 * np.arange(levels[0][1]) if not hot_base else np.arange(hot_base, hot_base + levels[0][1])
    views = []
    for i in range(per_leaf * count):
        leaf, parts, below = i % count, [root], count
        for d, (fanout, _) in enumerate(levels[1:], start=1):
            below //= fanout
            parts.append(runs[d][leaf // below])
        slab = (hot_base, levels[0][1]) if hot_base else None
        views.append(_view(i, np.r_[(*parts, 90_000 + 50 * i + np.arange(5))], slab=slab))
    return views


def _deep_backend(depth):
    args = ([], [], None, 32, 8, 128, KernelOps("torch"))
    return GraniKVBackend(*args, policy=DispatchPolicy(group_size=4, m_sat=10_000, min_prefix_len=256),
                          share_depth=depth)


def test_a_tree_is_read_level_by_level_up_to_the_share_depth():
    """Sharing at any depth: every shared level read once per step, one pass kind per level; the cap stops
    at two levels (the head and one extension), the rest read by each request's own decode."""
    for hot_base in (1, None):
        views = _tree_views(hot_base=hot_base)  # root 600 (8 readers), 2 x 400 (4 each), 4 x 300 (2 each)
        deep = _deep_backend(3).plan_decode(_batch(views))
        head = deep.passes[CASCADE if hot_base else ROWS]
        assert head.members == [list(range(8))] and head.lens == [600]
        ext, ext2 = deep.passes[EXT], deep.passes["ext2"]
        assert sorted(ext.members) == [[0, 1, 4, 5], [2, 3, 6, 7]] and ext.lens == [400, 400]
        assert ext.starts == [600, 600]
        assert sorted(ext2.members) == [[0, 4], [1, 5], [2, 6], [3, 7]] and ext2.lens == [300] * 4
        assert ext2.starts == [1000] * 4
        assert all(row in m for row, m in zip(ext2.page_rows, ext2.members, strict=True))
        assert deep.kv_start == [1300] * 8
        capped = _deep_backend(2).plan_decode(_batch(views))
        assert "ext2" not in capped.passes and capped.kv_start == [1000] * 8
        assert _deep_backend(4).plan_decode(_batch(views)).passes.keys() == deep.passes.keys()  # no 4th level
    b = _deep_backend(3)
    b.plan_decode(_batch(_tree_views()))
    st = b.stats()
    assert st["deep_ext_steps"] == 1 and st["class_sizes"]["ext2"] == {"2": 4}
    assert "deep_ext_steps" not in _deep_backend(2).stats()  # a two-level engine's stats are unchanged


def test_share_depth_bounds_and_warm_signatures():
    import pytest

    with pytest.raises(ValueError):
        _deep_backend(0)
    with pytest.raises(ValueError):
        _deep_backend(6)
    two, three = _deep_backend(2).warm_signatures(256), _deep_backend(3).warm_signatures(256)
    assert set(two) < set(three)
    plan = _deep_backend(3).plan_decode(_batch(_tree_views(levels=((1, 600), (4, 400), (4, 300)), per_leaf=16)))
    # the tree sweep's three-level tree (scaled down): its graph is captured at start
    assert plan.signature() in three
