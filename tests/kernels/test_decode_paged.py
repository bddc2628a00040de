"""decode_paged against its float32 reference: GQA ratios, head dims, odd lengths, empty
ranges, a single request, suffix offsets (kv_start), page-16 and token layouts, with and
without split-K."""

from __future__ import annotations

import pytest
import torch
from kernel_testutil import (
    DEV,
    DTYPES,
    TOL,
    check_lse,
    gen,
    i32,
    make_cache,
    poisoned,
    randn,
    rel_err,
    scattered_table,
)

from granikv.kernels import DecodeConfig, SplitWorkspace, decode_paged
from granikv.kernels.ref import decode_paged_ref

SMALL = DecodeConfig(block_n=16, min_split_len=32)


def _run(g_ratio, d, lengths, starts, dtype, seed, max_splits=None, page=1, cfg=SMALL):
    g = gen(seed)
    hkv = 2
    hq = hkv * g_ratio
    bsz = len(lengths)
    totals = [s + n for s, n in zip(starts, lengths)]
    num_slots = sum(-(-t // page) * page for t in totals) + 64 * page
    k_cache, v_cache = make_cache(num_slots, hkv, d, dtype, g)
    table = scattered_table(totals, num_slots, g, page=page)
    # rows in reverse order, so row index != batch index
    rows = i32(list(reversed(range(bsz))))
    table = table[list(reversed(range(bsz))) + [bsz]].contiguous()
    q = randn(bsz, hq, d, g=g, dtype=dtype)
    sm = d ** -0.5
    out = poisoned((bsz, hq, d), dtype)
    lse = poisoned((bsz, hq), torch.float32)
    o, l = decode_paged(q, k_cache, v_cache, table, rows, i32(starts), i32(lengths), sm, out=out, lse=lse,
                        max_splits=max_splits, cfg=cfg)
    ro, rl = decode_paged_ref(q.float(), k_cache.float(), v_cache.float(), table, rows, i32(starts),
                              i32(lengths), sm)
    assert o.data_ptr() == out.data_ptr()
    assert rel_err(o, ro) < TOL[dtype]
    check_lse(l, rl, TOL[dtype])
    empty = torch.tensor(lengths) == 0
    if empty.any():
        assert (o[empty.to(DEV)].float() == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("g_ratio", [1, 4, 5, 7, 8])
def test_gqa_ratios_split(g_ratio, dtype):
    _run(g_ratio, 64, [37, 1, 0, 101], [0, 5, 3, 0], dtype, seed=g_ratio, max_splits=3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_head_dims_direct(d, dtype):
    _run(4, d, [45, 17, 0], [0, 0, 7], dtype, seed=d, max_splits=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_single_request_page16_layout(dtype):
    _run(5, 128, [77], [16], dtype, seed=11, page=16, max_splits=4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_default_config_and_heuristic_splits(dtype):
    # default tile sizes, split count from shapes (few rows -> splits)
    _run(8, 64, [300, 129], [0, 33], dtype, seed=12, cfg=DecodeConfig(min_split_len=64))


def test_workspace_reuse_and_too_small():
    g = gen(3)
    k_cache, v_cache = make_cache(200, 1, 64, torch.float32, g)
    table = scattered_table([50, 60], 200, g)
    q = randn(2, 4, 64, g=g)
    ws = SplitWorkspace.allocate(4, 4, 4, 64, DEV)
    args = (q, k_cache, v_cache, table, i32([0, 1]), i32([0, 0]), i32([50, 60]), 0.125)
    o1, l1 = decode_paged(*args, max_splits=4, workspace=ws, cfg=SMALL)
    o2, l2 = decode_paged(*args, max_splits=4, workspace=ws, cfg=SMALL)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    with pytest.raises(ValueError):
        decode_paged(*args, max_splits=8, workspace=ws, cfg=SMALL)
