"""The decode-step K/V floor over a tree of shared runs (harness.microbench.tree_floor): readers
per node under round-robin, each depth of sharing against hand-computed bytes, and the floor never
rising as more levels are read once (for a GQA group below the machine's FLOP/byte balance)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.microbench.tree_floor import TreeNode, system_depth, tree_kv_floor_ms, tree_nodes


def test_readers_follow_round_robin_over_the_leaves():
    nodes = tree_nodes([(1, 10), (2, 5), (2, 3)], 5)  # leaves 0..3; request 4 on leaf 0
    assert [(n.level, n.length, n.readers) for n in nodes] == [
        (0, 10, 5), (1, 5, 3), (1, 5, 2), (2, 3, 2), (2, 3, 1), (2, 3, 1), (2, 3, 1)]
    with pytest.raises(ValueError):
        tree_nodes([(0, 4)], 2)


def _floor(nodes, depth, own=0):
    return tree_kv_floor_ms(nodes, own, per_tok_bytes=1, flops_per_tok_reader=0, bw=1000.0, peak=1.0,
                            shared_depth=depth)


def test_each_depth_of_sharing_reads_what_it_can_once():
    nodes = tree_nodes([(1, 10), (2, 5)], 4)  # root read by 4, each child by 2
    assert _floor(nodes, 0) == pytest.approx(60.0)  # 4*10 + 4*5 bytes at 1000 B/s
    assert _floor(nodes, system_depth("cascade")) == pytest.approx(30.0)  # root once + 4*5
    assert _floor(nodes, 2) == pytest.approx(20.0) == _floor(nodes, system_depth("granikv"))
    assert _floor(nodes, None, own=7) == pytest.approx(27.0)  # the requests' own tokens per request
    roots = tree_nodes([(2, 10)], 4)  # two roots: no batch-wide prefix for cascade
    assert _floor(roots, 1) == pytest.approx(40.0) and _floor(roots, None) == pytest.approx(20.0)
    alone = [TreeNode(0, 10, 1)]  # one reader: read per request at any depth
    assert _floor(alone, None) == _floor(alone, 0)


def test_compute_bound_shared_runs_cost_their_flops():
    nodes = [TreeNode(0, 100, 50)]
    t = tree_kv_floor_ms(nodes, 0, per_tok_bytes=2, flops_per_tok_reader=8, bw=1.0, peak=2.0)
    assert t == pytest.approx(max(100 * 2 / 1.0, 50 * 100 * 8 / 2.0) * 1e3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 64)), min_size=1, max_size=5),
       st.integers(0, 300), st.integers(0, 5000), st.integers(1, 8))
def test_reading_more_levels_once_never_raises_the_floor(levels, requests, own, group):
    if math.prod(f for f, _ in levels) > 256:
        return
    nodes = tree_nodes(levels, requests)
    assert [sum(n.readers for n in nodes if n.level == d) for d in range(len(levels))] == [requests] * len(levels)
    per_tok, bw, peak = 2 * 32 * 8 * 128 * 2, 4.48e12, 779e12
    flops = 4 * 8 * group * 128 * 32  # g = group query heads per KV head, below peak / bw
    floors = [tree_kv_floor_ms(nodes, own, per_tok, flops, bw, peak, d) for d in (0, 1, 2, 3, 4, 5, None)]
    assert all(a >= b - 1e-12 for a, b in zip(floors, floors[1:]))


def test_decode_step_page_lists_tree_cells_by_depth():
    from harness.docs.engine import tree_floor_rows

    rec = {"system": "granikv", "tree": [[1, 4096], [4, 4096], [4, 2048]], "B": 256, "step_ms": 20.0,
           "floor_ms": 16.0, "step_over_floor": 1.25,
           "floor_kv_ms_by_depth": {"paged": 9.0, "root": 5.0, "two_level": 4.0, "any_depth": 3.5}}
    text = "\n".join(tree_floor_rows([rec]))
    assert "| granikv | 1×4096 4×4096 4×2048 | 256 | 9.00 | 5.00 | 4.00 | 3.50 | 16.00 | 20.00 | 1.25 |" in text
    assert tree_floor_rows([]) == []
