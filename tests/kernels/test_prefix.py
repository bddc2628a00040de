"""prefix_cascade (slab and page-list forms) and prefix_dense (fused and cuBLAS forms) against
the float32 reference: several classes of different sizes and prefix lengths in one call, a
prefix length not a multiple of the tile, an empty prefix, requests in no class left untouched,
GQA ratios and head dims, split-K on and off."""

from __future__ import annotations

import pytest
import torch
from kernel_testutil import (
    DEV,
    DTYPES,
    TOL,
    check_lse,
    gen,
    make_cache,
    poisoned,
    randn,
    rel_err,
    scattered_table,
)

from granikv.kernels import PrefixClasses, PrefixConfig, prefix_cascade, prefix_dense
from granikv.kernels.ref import prefix_attention_ref

SMALL = PrefixConfig(block_m=16, block_n=16, num_warps=4, num_stages=2, min_split_len=32)


def _classes(form, members, lens, hkv, d, dtype, g, page=16):
    """Prefixes laid out as slabs (with gaps between them) or as scattered pages of rows."""
    num_slots = sum(lens) + 64 + 16 * (len(lens) + 4) * 4
    num_slots += 16 * (len(lens) + sum(lens) // 16 + 4)
    k_cache, v_cache = make_cache(num_slots, hkv, d, dtype, g)
    if form == "slab":
        bases, cur = [], 3
        for n in lens:
            bases.append(cur)
            cur += n + 5  # a hole between slabs
        return k_cache, v_cache, PrefixClasses.from_lists(members, lens, DEV, slab_base=bases)
    table = scattered_table(lens, num_slots, g, page=page)
    rows = list(range(len(lens)))
    return k_cache, v_cache, PrefixClasses.from_lists(members, lens, DEV, page_rows=rows, slot_table=table)


def _check(op, form, g_ratio, d, members, lens, bsz, dtype, seed, **kw):
    g = gen(seed)
    hkv = 2
    hq = hkv * g_ratio
    k_cache, v_cache, classes = _classes(form, members, lens, hkv, d, dtype, g)
    q = randn(bsz, hq, d, g=g, dtype=dtype)
    sm = d ** -0.5
    out = poisoned((bsz, hq, d), dtype)
    lse = poisoned((bsz, hq), torch.float32)
    o, l = op(q, k_cache, v_cache, classes, sm, out=out, lse=lse, **kw)
    ro, rl, touched = prefix_attention_ref(q.float(), k_cache.float(), v_cache.float(), classes, sm)
    t = touched.to(DEV)
    assert rel_err(o[t], ro[touched]) < TOL[dtype]
    check_lse(l[t], rl[touched], TOL[dtype])
    # requests in no class keep their (poisoned) rows
    assert torch.isnan(o[~t].float()).all() and torch.isnan(l[~t]).all()


MEMBERS = [[0, 3, 5], [1], [6, 2, 7, 8]]  # request 4 is in no class
LENS = [37, 70, 21]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["slab", "pages"])
@pytest.mark.parametrize("g_ratio", [1, 4, 5, 7, 8])
def test_cascade_classes(g_ratio, form, dtype):
    _check(prefix_cascade, form, g_ratio, 64, MEMBERS, LENS, 9, dtype, seed=g_ratio, cfg=SMALL, max_splits=3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_cascade_direct_and_empty_prefix(d, dtype):
    _check(prefix_cascade, "slab", 4, d, [[2], [0, 1]], [0, 45], 3, dtype, seed=d, cfg=SMALL, max_splits=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cascade_single_request_default_config(dtype):
    _check(prefix_cascade, "pages", 5, 128, [[0]], [150], 1, dtype, seed=7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("g_ratio", [4, 7])
def test_dense_fused(g_ratio, dtype):
    _check(prefix_dense, "slab", g_ratio, 64, MEMBERS, LENS, 9, dtype, seed=20 + g_ratio, impl="fused",
           cfg=PrefixConfig(block_m=32, block_n=16, min_split_len=32), max_splits=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_slab_tiles_through_tma_descriptors(d, dtype):
    """The TMA path reads full slab tiles by descriptor, the ragged tail by pointers."""
    cfg = PrefixConfig(block_m=32, block_n=16, min_split_len=32, tma=True)
    _check(prefix_dense, "slab", 4, d, MEMBERS, LENS, 9, dtype, seed=50 + d, impl="fused", cfg=cfg,
           max_splits=2)
    _check(prefix_cascade, "slab", 5, d, MEMBERS, [0, 33, 16], 9, dtype, seed=60 + d, cfg=cfg, max_splits=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_fused_default_config(dtype):
    _check(prefix_dense, "slab", 8, 128, [[1, 0], [2]], [131, 64], 3, dtype, seed=30, impl="fused")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_dense_cublas(d, dtype):
    _check(prefix_dense, "slab", 5, d, MEMBERS, LENS, 9, dtype, seed=40 + d, impl="cublas")


def test_dense_rejects_pages():
    g = gen(1)
    k_cache, v_cache, classes = _classes("pages", [[0]], [20], 1, 64, torch.float32, g)
    with pytest.raises(ValueError):
        prefix_dense(randn(1, 4, 64, g=g), k_cache, v_cache, classes, 0.1)


def test_combine_prefix_ignores_padding_entries_of_a_graph_bucket():
    """Under a CUDA graph the request list is bucket-sized and padded with 0s: padding entries
    must not fold request 0 again (with the last class's split count, which differs here)."""
    from granikv.kernels.splits import SplitWorkspace, combine_prefix

    torch.manual_seed(0)
    rows, heads, d, max_splits, min_split = 4, 2, 16, 4, 8
    ws = SplitWorkspace.allocate(rows, heads, max_splits, d, "cpu")
    ws.o.normal_()
    ws.lse.normal_()
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32)  # class 0: requests 0, 1; class 1: request 2
    prefix_len = torch.tensor([32, 8], dtype=torch.int32)  # 4 splits vs 1 split
    reqs = torch.tensor([0, 1, 2], dtype=torch.int32)
    ref_o, ref_lse = torch.zeros(rows, heads, d), torch.zeros(rows, heads)
    combine_prefix(ws, indptr, reqs, prefix_len, max_splits, min_split, ref_o, ref_lse)
    padded = torch.tensor([0, 1, 2, 0, 0, 0, 0, 0], dtype=torch.int32)
    o, lse = torch.zeros(rows, heads, d), torch.zeros(rows, heads)
    combine_prefix(ws, indptr, padded, prefix_len, max_splits, min_split, o, lse)
    torch.testing.assert_close(o, ref_o)
    torch.testing.assert_close(lse, ref_lse)


# the unique layout of Table 5: the dense kernel over B one-request classes, each with its own
# contiguous copy of the prefix (one slab per request), the tile far taller than a class's g rows
UNIQUE_DTYPES = [*DTYPES, pytest.param(torch.float16, id="fp16")]


@pytest.mark.parametrize("dtype", UNIQUE_DTYPES)
@pytest.mark.parametrize("bsz, length, splits, tma", [(3, 37, 1, True), (5, 53, 2, False), (7, 129, 3, True)])
def test_dense_one_request_classes_each_with_its_own_slab(bsz, length, splits, tma, dtype):
    cfg = PrefixConfig(block_m=32, block_n=16, min_split_len=32, tma=tma)
    tol = TOL.get(dtype, 1e-2)
    g = gen(70 + bsz)
    hkv, g_ratio, d = 2, 4, 64
    k_cache, v_cache = make_cache(3 + bsz * (length + 5), hkv, d, dtype, g)
    bases = [3 + r * (length + 5) for r in range(bsz)]  # a hole between slabs
    classes = PrefixClasses.from_lists([[r] for r in range(bsz)], [length] * bsz, DEV, slab_base=bases)
    q = randn(bsz, hkv * g_ratio, d, g=g, dtype=dtype)
    sm = d ** -0.5
    o, lse = prefix_dense(q, k_cache, v_cache, classes, sm, impl="fused", cfg=cfg, max_splits=splits)
    ro, rl, touched = prefix_attention_ref(q.float(), k_cache.float(), v_cache.float(), classes, sm)
    assert bool(touched.all())
    assert rel_err(o, ro) < tol
    check_lse(lse, rl, tol)
