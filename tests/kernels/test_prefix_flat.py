"""The flattened prefix pass (one launch over the classes of every level, one merge) against the
float64 reference of attention over each request's whole key set: random trees of classes over
2-4 levels, slab and row forms mixed in one launch, odd run lengths, empty runs and empty own
parts, requests in no class, split-K on and off, and padded layouts (a CUDA graph's static
buffers: empty classes, work items past every class). The PyTorch form (impl="torch") is checked
against the same reference."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from kernel_testutil import DEV, DTYPES, TOL, check_lse, gen, make_cache, randn, rel_err

from granikv.attention import torch_ops
from granikv.kernels import PrefixConfig
from granikv.kernels.prefix_flat import FlatClass, FlatClasses, flat_items_bound, flat_lists, prefix_flat_
from granikv.kernels.ref import decode_paged_ref

SMALL = PrefixConfig(block_m=16, block_n=16, num_warps=4, num_stages=2, min_split_len=32)


def _tree(seed: int, bsz: int, levels: int, hkv: int, d: int, dtype, g_ratio: int, columns: int = 400):
    """A random step: own keys per request (a slot-table row), and per level disjoint classes of
    requests reading a run that is a slab or a stretch of some member's row."""
    rng = random.Random(seed)
    g = gen(seed)
    num_slots = 1 + bsz * columns + 4096
    k, v = make_cache(num_slots, hkv, d, dtype, g)
    q = randn(bsz, hkv * g_ratio, d, g=g, dtype=dtype)
    perm = torch.randperm(bsz * columns, generator=g) + 1
    table = perm.view(bsz, columns).to(torch.int32)
    table = torch.cat([table, torch.zeros(1, columns, dtype=torch.int32)]).to(DEV)  # a spare row
    own = [rng.choice([0, 1, rng.randint(1, 60)]) for _ in range(bsz)]
    classes, slab_cursor = [], 1 + bsz * columns
    for lv in range(levels):
        reqs = list(range(bsz))
        rng.shuffle(reqs)
        reqs = reqs[:rng.randint(0, bsz)]  # some requests read nothing at this level
        while reqs:
            n = rng.randint(1, min(len(reqs), 9))
            members, reqs = sorted(reqs[:n]), reqs[n:]
            length = rng.choice([0, 1, 17, rng.randint(2, 150)])
            if rng.random() < 0.5:  # a slab
                where, rows = slab_cursor, False
                slab_cursor += length
                assert slab_cursor <= num_slots
            else:  # a stretch of a member's row, from a random start
                start = rng.randint(0, columns - length)
                where, rows = members[0] * columns + start, True
            classes.append(FlatClass(members, length, where, rows, lv))
    return q, k, v, table, own, classes


def _keys(table, own, classes, b):
    """Slots request b reads: its own part (row b from 0), then each of its classes' runs."""
    flat = table.reshape(-1).long().cpu()
    parts = [flat[b * table.shape[1]:b * table.shape[1] + own[b]]]
    for c in classes:
        if b in c.members:
            parts.append(flat[c.where:c.where + c.length] if c.rows else torch.arange(c.where, c.where + c.length))
    return torch.cat(parts)


def _reference(q, k, v, table, own, classes, sm):
    """Attention over every key a request reads: the decode reference over a table whose row b
    lists request b's slots."""
    keys = [_keys(table, own, classes, b) for b in range(q.shape[0])]
    rows = torch.zeros(len(keys), max(1, max(len(x) for x in keys)), dtype=torch.int32)
    for b, x in enumerate(keys):
        rows[b, :len(x)] = x.to(torch.int32)
    n = len(keys)
    return decode_paged_ref(q, k, v, rows, torch.arange(n), torch.zeros(n, dtype=torch.int32),
                            torch.tensor([len(x) for x in keys]), sm)


def _own_part(q, k, v, table, own, sm):
    """The suffix decode's result the flat pass merges into: attention over each own part."""
    bsz = q.shape[0]
    rows = torch.arange(bsz, dtype=torch.int32, device=DEV)
    start = torch.zeros(bsz, dtype=torch.int32, device=DEV)
    o, lse = decode_paged_ref(q, k, v, table, rows, start, torch.tensor(own, dtype=torch.int32, device=DEV), sm)
    return o.to(q.dtype).to(DEV), lse.to(DEV)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed,bsz,levels,g_ratio,splits", [
    (0, 5, 2, 2, None), (1, 9, 3, 4, 1), (2, 12, 4, 1, 3), (3, 7, 3, 4, 2), (4, 1, 2, 2, None),
])
def test_flat_pass_equals_attention_over_every_key(dtype, seed, bsz, levels, g_ratio, splits):
    hkv, d = 2, 32
    q, k, v, table, own, classes = _tree(seed, bsz, levels, hkv, d, dtype, g_ratio)
    sm = d ** -0.5
    ref_o, ref_lse = _reference(q, k, v, table, own, classes, sm)
    lists = flat_lists(classes, bsz, levels, g_ratio, SMALL.block_m)
    flat = FlatClasses.from_lists(lists, table)
    o, lse = _own_part(q, k, v, table, own, sm)
    prefix_flat_(q, k, v, flat, sm, o, lse, cfg=SMALL, max_splits=splits)
    assert rel_err(o, ref_o) < TOL[dtype]
    check_lse(lse, ref_lse, TOL[dtype])
    if dtype == torch.float32:  # the PyTorch form computes the same thing
        o2, lse2 = _own_part(q, k, v, table, own, sm)
        torch_ops.prefix_flat_(q, k, v, flat, sm, o2, lse2)
        assert rel_err(o2, ref_o) < TOL[dtype]
        check_lse(lse2, ref_lse, TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_padded_layout_reads_nothing_extra(dtype):
    """A graph's layout: more classes, members and items than the step has, one spare row as the
    padding classes' row; the result is the unpadded one."""
    hkv, d, bsz, levels, g_ratio = 2, 32, 8, 3, 2
    q, k, v, table, own, classes = _tree(11, bsz, levels, hkv, d, dtype, g_ratio)
    sm = d ** -0.5
    ref_o, ref_lse = _reference(q, k, v, table, own, classes, sm)
    bound = flat_items_bound([(len(classes), bsz)], g_ratio, SMALL.block_m)
    lists = flat_lists(classes, bsz, levels, g_ratio, SMALL.block_m, num_classes=len(classes) + 5,
                       num_reqs=bsz * levels + 3, num_items=bound + 7, pad_row_where=bsz * table.shape[1])
    assert (lists.item_tile[-7:] > 1000).all()
    o, lse = _own_part(q, k, v, table, own, sm)
    prefix_flat_(q, k, v, FlatClasses.from_lists(lists, table), sm, o, lse, cfg=SMALL)
    assert rel_err(o, ref_o) < TOL[dtype]
    check_lse(lse, ref_lse, TOL[dtype])


def test_work_list_is_longest_first_and_masks_say_which_levels():
    cs = [FlatClass([0, 1], 10, 0, True, 0), FlatClass([0], 50, 5, False, 1), FlatClass([1, 2, 3], 30, 9, True, 1)]
    lists = flat_lists(cs, 5, 2, 4, 8)
    assert list(lists.item_class) == [1, 2, 2, 0]  # 50, then 30 (two 8-row tiles of 12 rows), then 10
    assert list(lists.item_tile) == [0, 0, 1, 0]
    assert list(lists.mask) == [0b11, 0b11, 0b10, 0b10, 0]
    with pytest.raises(ValueError, match="two classes of level 1"):
        flat_lists(cs + [FlatClass([2], 5, 0, True, 1)], 5, 2, 4, 8)
    with pytest.raises(ValueError, match="do not fit"):
        flat_lists(cs, 5, 2, 4, 8, num_items=2)
    assert np.array_equal(lists.indptr, [0, 2, 3, 6])
