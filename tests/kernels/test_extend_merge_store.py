"""extend, merge_lse_ and store_kv against their references, and the composition the
backends rely on: prefix pass + suffix decode merged by LSE equals one decode over the whole
context (empty suffix included)."""

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

from granikv.kernels import (
    DecodeConfig,
    ExtendConfig,
    ExtendSplitPolicy,
    PrefixClasses,
    PrefixConfig,
    decode_paged,
    extend,
    extend_splits,
    merge_lse_,
    prefix_cascade,
    store_kv,
)
from granikv.kernels.ref import decode_paged_ref, extend_ref, merge_ref, store_kv_ref

SMALL_EXT = ExtendConfig(block_m=16, block_n=16, num_warps=4, num_stages=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv(dtype):
    g = gen(0)
    k_cache, v_cache = make_cache(50, 2, 64, dtype, g)
    rk, rv = k_cache.clone(), v_cache.clone()
    slots = torch.randperm(49, generator=g)[:13] + 1
    k = randn(13, 2, 64, g=g, dtype=dtype)
    v = randn(13, 2, 64, g=g, dtype=dtype)
    store_kv(k_cache, v_cache, slots.to(DEV), k, v)
    store_kv_ref(rk, rv, slots, k, v)
    assert torch.equal(k_cache, rk) and torch.equal(v_cache, rv)


@pytest.mark.parametrize("dtype", DTYPES)
def test_merge(dtype):
    g = gen(1)
    r, h, d = 5, 6, 64
    oa, ob = randn(r, h, d, g=g, dtype=dtype), randn(r, h, d, g=g, dtype=dtype)
    la, lb = randn(r, h, g=g) * 3, randn(r, h, g=g) * 3
    la[0, :] = float("-inf")  # empty prefix side
    lb[1, :] = float("-inf")  # empty suffix side
    la[2, 0] = lb[2, 0] = float("-inf")  # both empty
    ro, rl = merge_ref(oa.float(), la, ob.float(), lb)
    oa2, la2 = oa.clone(), la.clone()
    merge_lse_(oa2, la2, ob, lb)
    ro[2, 0] = 0.0
    oa2 = oa2.float()
    oa2[2, 0] = torch.nan_to_num(oa2[2, 0])  # both-empty row: any finite value, lse -inf
    assert rel_err(oa2, ro) < TOL[dtype]
    check_lse(la2, rl, 1e-5)
    assert torch.equal(oa2[1].to(dtype), oa[1])  # empty suffix returns the prefix side exactly


def _extend_case(g_ratio, d, prefix, new, dtype, seed, cfg=SMALL_EXT, splits=None):
    g = gen(seed)
    hkv = 2
    hq = hkv * g_ratio
    totals = [p + n for p, n in zip(prefix, new)]
    num_slots = sum(totals) + 40
    k_cache, v_cache = make_cache(num_slots, hkv, d, dtype, g)
    table = scattered_table(totals, num_slots, g)
    n = len(prefix)
    rows = i32(list(range(n))[::-1])
    table = table[list(range(n))[::-1] + [n]].contiguous()
    indptr = [0]
    for x in new:
        indptr.append(indptr[-1] + x)
    t = indptr[-1]
    q = randn(t, hq, d, g=g, dtype=dtype)
    out = poisoned((t, hq, d), dtype)
    sm = d ** -0.5
    o = extend(q, k_cache, v_cache, table, rows, i32(indptr), i32(prefix), sm, out=out, max_qo_len=max(new),
               cfg=cfg, splits=splits)
    ref = extend_ref(q.float(), k_cache.float(), v_cache.float(), table, rows, i32(indptr), i32(prefix), sm)
    assert rel_err(o, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("g_ratio", [1, 4, 5, 7, 8])
def test_extend_gqa(g_ratio, dtype):
    # no prefix, odd prefix, a prefix that is a multiple of the tile, a request with no new tokens
    _extend_case(g_ratio, 64, [0, 19, 32, 5], [7, 3, 5, 0], dtype, seed=g_ratio)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_extend_single_request_default_config(d, dtype):
    _extend_case(4, d, [37], [21], dtype, seed=d, cfg=ExtendConfig(block_m=32, block_n=32, num_warps=4))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [2, 3, 8, 16, 33])
def test_extend_split_keys_equal_reference(splits, dtype):
    # long and short prefixes in one step (some splits of the short request are empty), a
    # request with no new tokens, one with no prefix, odd lengths, more splits than key tiles;
    # 16 (LSE rows exactly one pad of 16) and 33 (past the policy's 32: the fold pads to 64)
    _extend_case(4, 64, [45, 3, 0, 70, 16], [9, 20, 5, 0, 1], dtype, seed=splits, splits=splits)


@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_split_keys_single_request_default_tile(dtype):
    _extend_case(4, 128, [97], [13], dtype, seed=11, cfg=ExtendConfig(block_m=32, block_n=32, num_warps=4),
                 splits=5)


def test_extend_splits_policy():
    pol = ExtendSplitPolicy(target_waves=2.0, min_split_len=512, max_splits=32, workspace_bytes=64 << 20)
    kw = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, block_m=128, sms=132, policy=pol)
    # one 20-token request behind a 16K prefix: 1 tile x 8 KV heads; splits fill the GPU
    assert extend_splits(20, 1, max_kv_len=16404, **kw) == 32
    # three 160-token suffixes: 15 tiles x 8 heads = 120 programs -> 3 splits reach 264
    assert extend_splits(480, 3, max_kv_len=16544, **kw) == 3
    # a full prefill step already fills the GPU
    assert extend_splits(8192, 50, max_kv_len=16544, **kw) == 1
    # short contexts never split below min_split_len keys
    assert extend_splits(20, 1, max_kv_len=700, **kw) == 1
    assert extend_splits(20, 1, max_kv_len=2048, **kw) == 4
    # the float32 partials stay within the workspace bound
    small = ExtendSplitPolicy(workspace_bytes=4 << 20)
    s = extend_splits(200, 2, max_kv_len=16544, **{**kw, "policy": small})
    assert s >= 1 and 200 * 32 * s * 129 * 4 <= 4 << 20
    assert extend_splits(0, 0, max_kv_len=0, **kw) == 1


def test_extend_auto_splits_from_max_kv_len():
    """The host bound alone turns splitting on (the engine's path): same result as one split."""
    g = gen(5)
    hkv, hq, d = 2, 8, 64
    prefix, new = [600, 33], [3, 4]
    totals = [p + n for p, n in zip(prefix, new)]
    k_cache, v_cache = make_cache(sum(totals) + 8, hkv, d, torch.float32, g)
    table = scattered_table(totals, sum(totals) + 8, g)
    rows = i32([0, 1])
    indptr = i32([0, 3, 7])
    q = randn(7, hq, d, g=g, dtype=torch.float32)
    pol = ExtendSplitPolicy(min_split_len=128)
    assert extend_splits(7, 2, hq, hkv, d, max(totals), SMALL_EXT.block_m, 132, pol) > 1
    auto = extend(q, k_cache, v_cache, table, rows, indptr, i32(prefix), d ** -0.5, max_qo_len=4, cfg=SMALL_EXT,
                  max_kv_len=max(totals), policy=pol)
    one = extend(q, k_cache, v_cache, table, rows, indptr, i32(prefix), d ** -0.5, max_qo_len=4, cfg=SMALL_EXT,
                 splits=1)
    ref = extend_ref(q, k_cache, v_cache, table, rows, indptr, i32(prefix), d ** -0.5)
    assert rel_err(auto, ref) < TOL[torch.float32]
    assert rel_err(one, ref) < TOL[torch.float32]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels need CUDA")
def test_extend_compiles_one_variant_for_any_number_of_tiles():
    """Prefill steps meet every TILES value; 1 and multiples of 16 must not each compile a
    variant (a compile costs seconds inside a serving run)."""
    from granikv.kernels.extend import _extend_kernel

    cfg = ExtendConfig(block_m=16, block_n=16, num_warps=4, num_stages=2)
    before = sum(len(c[0]) for c in _extend_kernel.device_caches.values())
    for new in ([4], [64], [21], [256, 3]):  # TILES = 1, 16, 6, 64 at G=4, BLOCK_M=16
        _extend_case(4, 64, [5] * len(new), new, torch.bfloat16, seed=len(new), cfg=cfg)
    after = sum(len(c[0]) for c in _extend_kernel.device_caches.values())
    assert after - before <= 1


@pytest.mark.parametrize("split_extend", [True, False])
def test_warm_extend_runs_every_variant_on_the_padding_row(split_extend):
    """Start-up compile of the extend variants: reads only the all-zero padding row (slot 0),
    leaves the cache untouched, and runs the split variant only when key splits are on."""
    from granikv.attention.ops import KernelOps

    g = gen(3)
    k_cache, v_cache = make_cache(64, 2, 64, torch.float32, g)
    table = torch.zeros(5, 300, dtype=torch.int32, device=DEV)
    table[:4] = torch.randint(1, 64, (4, 300), generator=g).to(DEV, torch.int32)
    before = (k_cache.clone(), v_cache.clone(), table.clone())
    ops = KernelOps("triton", split_extend=split_extend)
    assert ops.warm_extend(k_cache, v_cache, table, 8, 0.125) == (2 if split_extend else 1)
    assert all(torch.equal(a, b) for a, b in zip(before, (k_cache, v_cache, table)))
    assert KernelOps("torch").warm_extend(k_cache, v_cache, table, 8, 0.125) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels need CUDA")
def test_extend_split_counts_share_one_variant_after_warm_up():
    """After the start-up warm-up, no split count a serving run can meet (2..32) compiles a new
    extend or fold variant (a compile is seconds of one extend step on a cold Triton cache)."""
    from granikv.attention.ops import KernelOps
    from granikv.kernels.extend import _extend_kernel, _fold_extend_kernel

    g = gen(9)
    k_cache, v_cache = make_cache(2048, 8, 128, torch.bfloat16, g)
    table = torch.zeros(3, 2048, dtype=torch.int32, device=DEV)
    KernelOps("triton").warm_extend(k_cache, v_cache, table, 32, 128 ** -0.5)

    def variants():
        return sum(len(c[0]) for k in (_extend_kernel, _fold_extend_kernel) for c in k.device_caches.values())

    before = variants()
    table[0] = torch.randint(1, 2048, (2048,), generator=g).to(DEV, torch.int32)
    q = randn(20, 32, 128, g=g, dtype=torch.bfloat16)
    rows, indptr, prefix = i32([0]), i32([0, 20]), i32([1500])
    ref = extend_ref(q.float(), k_cache.float(), v_cache.float(), table, rows, indptr, prefix, 128 ** -0.5)
    for splits in (3, 4, 5, 9, 16, 17, 32):
        o = extend(q, k_cache, v_cache, table, rows, indptr, prefix, 128 ** -0.5, max_qo_len=20, splits=splits)
        assert rel_err(o, ref) < TOL[torch.bfloat16]
    assert variants() == before


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["slab", "pages"])
def test_cascade_plus_suffix_equals_full_decode(form, dtype):
    """The decomposition of every backend: prefix pass over the shared prefix, decode over each
    request's own suffix (kv_start = prefix length, maybe empty), merged by LSE."""
    g = gen(5)
    hkv, g_ratio, d = 2, 4, 64
    hq = hkv * g_ratio
    lp, suffix = 45, [9, 0, 23]
    bsz = len(suffix)
    num_slots = 400
    k_cache, v_cache = make_cache(num_slots, hkv, d, dtype, g)
    # the prefix: a slab at [1, 1+lp); every row points at it, then at its own suffix slots
    table = torch.zeros(bsz + 1, lp + max(suffix), dtype=torch.int32)
    free = (torch.randperm(num_slots - 1 - lp, generator=g) + 1 + lp).to(torch.int32)
    cur = 0
    for b, s in enumerate(suffix):
        table[b, :lp] = torch.arange(1, 1 + lp, dtype=torch.int32)
        table[b, lp:lp + s] = free[cur:cur + s]
        cur += s
    table = table.to(DEV)
    if form == "slab":
        classes = PrefixClasses.from_lists([list(range(bsz))], [lp], DEV, slab_base=[1])
    else:
        classes = PrefixClasses.from_lists([list(range(bsz))], [lp], DEV, page_rows=[0], slot_table=table)
    q = randn(bsz, hq, d, g=g, dtype=dtype)
    sm = d ** -0.5
    rows = i32(list(range(bsz)))
    op, lp_ = prefix_cascade(q, k_cache, v_cache, classes, sm,
                             cfg=PrefixConfig(block_m=16, block_n=16, min_split_len=16), max_splits=2)
    os_, ls_ = decode_paged(q, k_cache, v_cache, table, rows, i32([lp] * bsz), i32(suffix), sm,
                            cfg=DecodeConfig(block_n=16, min_split_len=16), max_splits=2)
    merge_lse_(op, lp_, os_, ls_)
    full = [lp + s for s in suffix]
    ro, rl = decode_paged_ref(q.float(), k_cache.float(), v_cache.float(), table, rows, i32([0] * bsz),
                              i32(full), sm)
    assert rel_err(op, ro) < TOL[dtype]
    check_lse(lp_, rl, TOL[dtype])


def test_extend_splits_long_key_rule():
    """`long-keys` (EngineConfig.extend_split_rule): the fill rule's picks at the kernel sweep's
    shapes (results/h200/microbench/extend-steps.json), except >= 4 splits behind >= 8K keys while
    the one-split programs fit in 6 waves, and one split behind shorter keys once they fill 3/4 of
    a wave. `fill` is unchanged."""
    fill, lk = ExtendSplitPolicy.named("fill"), ExtendSplitPolicy.named("long-keys")
    assert fill == ExtendSplitPolicy()
    kw = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, block_m=128, sms=132)
    cases = {  # (Lp, n, new): (fill, long-keys)
        (2048, 1, 20): (4, 4), (2048, 1, 160): (4, 4), (2048, 3, 160): (3, 1), (2048, 8, 160): (1, 1),
        (16384, 1, 20): (32, 32), (16384, 1, 160): (7, 7), (16384, 3, 160): (3, 4),
        (16384, 8, 160): (1, 4), (16384, 16, 160): (1, 4), (16384, 64, 256): (1, 1),
    }
    for (lp, n, new), want in cases.items():
        got = tuple(extend_splits(n * new, n, max_kv_len=lp + new, policy=p, **kw) for p in (fill, lk))
        assert got == want, (lp, n, new, got)
    # the long-key rule never exceeds the workspace: 4 splits of a 16x160 step need 169 MB
    assert 2560 * 32 * 4 * 129 * 4 <= lk.workspace_bytes
    with pytest.raises(ValueError, match="fill or long-keys"):
        ExtendSplitPolicy.named("fastest")
