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
from granikv.attention.plan import CASCADE, ROWS


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
    shared = np.arange(3000, 3700)
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
