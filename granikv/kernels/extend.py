"""Prefill/extend attention for a batch of requests, one kernel for all three systems.

Request n has new tokens q[qo_indptr[n]:qo_indptr[n+1]] at positions prefix_len[n] + i; their
K/V were already written by `store_kv`, so every key (cached prefix and new part alike) is
read through row rows[n] of the slot table — one gather path, whatever the pool (HOT slab,
COLD slots, pages). Query heads sharing a KV head are packed into the M dimension (row r of a
tile is token r // g, head r % g), so each K/V tile serves g heads. Keys below the tile's
first token are visible to every row and run unmasked; only the last few tiles apply the
causal mask.

Split keys (flash-decoding applied to prefill): a step that prefills a few short suffixes behind
a long cached prefix launches few programs (one 20-token request at G=4 is one tile x 8 KV heads
= 8 programs on 132 SMs), and each walks the whole prefix alone — at Lp=16K that serial walk,
x 32 layers, is a fixed cost of every small extend step of a serving run. `extend_splits` cuts
each request's key range into equal BLOCK_N-aligned splits when the grid would not fill the GPU;
each split writes a float32 partial output and its base-2 LSE, and a fold (splits._fold) merges
them. Large steps keep one split (no workspace, no fold).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from granikv.kernels._common import (
    LOG2E,
    check_cache,
    dot_precision,
    finish_rows,
    next_pow2,
    num_sms,
    online_softmax_step,
    stages_for,
    upcast_flag,
)
from granikv.kernels.splits import _fold


@dataclass(frozen=True)
class ExtendConfig:
    """Launch shape of the extend kernel (tuned on an H200 by harness/microbench/kernels.py)."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class ExtendSplitPolicy:
    """When to split the key range of an extend step (see the module docstring).

    Splits are added until the busy programs reach `target_waves` x the SM count, each split
    keeps at least `min_split_len` keys (a partial costs a q-tile load and a float32 store), at
    most `max_splits`, and the float32 partials stay within `workspace_bytes`."""

    target_waves: float = 2.0
    min_split_len: int = 512
    max_splits: int = 32
    workspace_bytes: int = 64 << 20
    # The long-key rule (off while long_keys == 0; `long_keys()` below). The kernel sweep
    # (results/h200/microbench/extend-steps.json) finds the fill rule above wrong at both
    # ends: behind >= 8K keys a program is long enough that wave-quantization tails matter, and
    # 3x160, 8x160 and 16x160 steps at Lp=16K ran 1.25x, 1.44x and 1.12x faster with 4 splits
    # than with the 3, 1 and 1 the fill rule picks; behind 2K keys a step whose one-split
    # programs already fill most of a wave (3x160: 120 programs) ran 18% slower split.
    long_keys: int = 0  # keys at and above which a step takes >= long_key_splits ...
    long_key_splits: int = 4
    long_key_waves: float = 6.0  # ... while its one-split programs are within this many waves
    full_wave: float = 0.0  # below long_keys: one split once one-split programs fill this share of a wave

    @staticmethod
    def named(rule: str) -> ExtendSplitPolicy:
        """`fill` (the default: the fill rule alone) or `long-keys` (the fill rule with the
        long-key rule and the short-key full-wave rule, and a workspace that holds 4 splits of
        a 16x160 step)."""
        if rule == "fill":
            return ExtendSplitPolicy()
        if rule == "long-keys":
            return ExtendSplitPolicy(long_keys=8192, full_wave=0.75, workspace_bytes=256 << 20)
        raise ValueError(f"extend split rule must be fill or long-keys, got {rule!r}")


def extend_splits(num_tokens: int, num_reqs: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                  max_kv_len: int, block_m: int, sms: int, policy: ExtendSplitPolicy | None = None) -> int:
    """Key splits for an extend step (host only, no device read). The busy programs of one split
    are at least cdiv(T * G, BLOCK_M) tiles per KV head; a step that already fills
    `target_waves` x `sms` programs, or whose keys are short, gets 1."""
    pol = policy or ExtendSplitPolicy()
    if num_tokens <= 0 or num_reqs <= 0:
        return 1
    g = num_q_heads // num_kv_heads
    busy = triton.cdiv(num_tokens * g, block_m) * num_kv_heads
    want = triton.cdiv(int(pol.target_waves * sms), busy)
    by_len = max_kv_len // pol.min_split_len
    by_mem = pol.workspace_bytes // (num_tokens * num_q_heads * (head_dim + 1) * 4)
    if pol.long_keys and max_kv_len >= pol.long_keys and busy <= pol.long_key_waves * sms:
        want = max(want, pol.long_key_splits)
    elif pol.full_wave and busy >= pol.full_wave * sms:  # (long keys past 6 waves: fill gives 1 too)
        return 1
    return max(1, min(want, by_len, by_mem, pol.max_splits))


# TILES (the query tiles per request) changes with every prefill batch's longest request; left
# specialized, Triton compiles a new variant the first time it meets TILES == 1 or a multiple of
# 16 (seconds, inside a serving run: a 31-token suffix step of 1.85 s in an H200 cell).
# NSPLIT likewise (1 and 16 would specialize).
@triton.jit(do_not_specialize=["TILES", "NSPLIT"])
def _extend_kernel(
    Q, K, V, SlotTable, Rows, QoIndptr, PrefixLen, O, PartO, PartLse,
    qk_scale, TILES, NSPLIT,
    s_q_t, s_q_h, s_k_s, s_k_h, s_v_s, s_v_h, s_t_r, s_o_t, s_o_h,
    s_po_t, s_po_h, s_po_s, s_pl_t, s_pl_h,
    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr,
):
    n = tl.program_id(0) // TILES
    mt = tl.program_id(0) % TILES
    h = tl.program_id(1)
    sp = tl.program_id(2)
    q0 = tl.load(QoIndptr + n)
    nq = tl.load(QoIndptr + n + 1) - q0
    if mt * BLOCK_M < nq * G:
        p = tl.load(PrefixLen + n)
        table = SlotTable + tl.load(Rows + n).to(tl.int64) * s_t_r
        offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        rmask = offs_m < nq * G
        tok = offs_m // G
        hq = h * G + offs_m % G
        q = tl.load(Q + (q0 + tok)[:, None].to(tl.int64) * s_q_t + hq[:, None] * s_q_h + offs_d[None, :],
                    mask=rmask[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        qpos = p + tok
        tok_lo = (mt * BLOCK_M) // G
        tok_hi = tl.minimum((mt * BLOCK_M + BLOCK_M - 1) // G, nq - 1)
        full_hi = ((p + tok_lo + 1) // BLOCK_N) * BLOCK_N  # keys every row of the tile may see
        kv_hi = p + tok_hi + 1
        if SPLIT:
            # split sp of the request's keys [0, p + nq): equal BLOCK_N-aligned chunks, so no
            # key tile straddles two splits; the tile's own causal limit clips the last ones
            chunk = tl.cdiv(tl.cdiv(p + nq, NSPLIT), BLOCK_N) * BLOCK_N
            lo = sp * chunk
            hi = tl.minimum(lo + chunk, kv_hi)
        else:
            lo = 0
            hi = kv_hi
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        k_base = K + h * s_k_h
        v_base = V + h * s_v_h
        for pos in tl.range(lo, tl.minimum(hi, full_hi), BLOCK_N):
            offs_n = pos + tl.arange(0, BLOCK_N)
            slots = tl.load(table + offs_n).to(tl.int64)
            k = tl.load(k_base + slots[:, None] * s_k_s + offs_d[None, :])
            v = tl.load(v_base + slots[:, None] * s_v_s + offs_d[None, :])
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            m_i, l_i, acc = online_softmax_step(q, k, v, m_i, l_i, acc, qk_scale, offs_n[None, :] < kv_hi,
                                                False, PREC)
        for pos in tl.range(tl.maximum(lo, full_hi), hi, BLOCK_N):
            offs_n = pos + tl.arange(0, BLOCK_N)
            nmask = offs_n < kv_hi
            slots = tl.load(table + offs_n, mask=nmask, other=0).to(tl.int64)
            k = tl.load(k_base + slots[:, None] * s_k_s + offs_d[None, :], mask=nmask[:, None], other=0.0)
            v = tl.load(v_base + slots[:, None] * s_v_s + offs_d[None, :], mask=nmask[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            valid = nmask[None, :] & (offs_n[None, :] <= qpos[:, None])
            m_i, l_i, acc = online_softmax_step(q, k, v, m_i, l_i, acc, qk_scale, valid, True, PREC)
        o, lse2 = finish_rows(m_i, l_i, acc)
        if SPLIT:
            row = (q0 + tok).to(tl.int64)
            tl.store(PartO + row[:, None] * s_po_t + hq[:, None] * s_po_h + sp * s_po_s + offs_d[None, :], o,
                     mask=rmask[:, None])
            tl.store(PartLse + row * s_pl_t + hq * s_pl_h + sp, lse2, mask=rmask)
        else:
            tl.store(O + (q0 + tok)[:, None].to(tl.int64) * s_o_t + hq[:, None] * s_o_h + offs_d[None, :],
                     o.to(O.dtype.element_ty), mask=rmask[:, None])


# NSPLIT would specialize at 16 and 32; S_PAD is fixed per policy (below) for the same reason.
@triton.jit(do_not_specialize=["NSPLIT"])
def _fold_extend_kernel(PartO, PartLse, O, Lse, NSPLIT,
                        s_po_t, s_po_h, s_po_s, s_pl_t, s_pl_h, s_o_t, s_o_h, s_l_t, s_l_h,
                        D: tl.constexpr, S_PAD: tl.constexpr):
    _fold(PartO, PartLse, O, Lse, tl.program_id(0).to(tl.int64), tl.program_id(1), NSPLIT,
          s_po_t, s_po_h, s_po_s, s_pl_t, s_pl_h, s_o_t, s_o_h, s_l_t, s_l_h, D, S_PAD)


def extend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_table: torch.Tensor,
    rows: torch.Tensor,
    qo_indptr: torch.Tensor, prefix_len: torch.Tensor, sm_scale: float, out: torch.Tensor | None = None,
    max_qo_len: int | None = None, cfg: ExtendConfig | None = None,
    max_kv_len: int | None = None, splits: int | None = None, policy: ExtendSplitPolicy | None = None,
) -> torch.Tensor:
    """Extend attention. q [T, Hq, d]; rows int32 [N]; qo_indptr int32 [N+1]; prefix_len int32
    [N]. Token i of request n (position prefix_len[n] + i) attends to positions
    [0, prefix_len[n] + i] of row rows[n]. `max_qo_len` (host bound on new tokens per request,
    default T) sizes the grid without a device read. `splits` cuts each request's keys into that
    many splits; left None, `extend_splits` picks it from `max_kv_len` (host bound on
    prefix_len + new tokens; without it, 1). Returns o [T, Hq, d] in q's dtype."""
    cfg = cfg or ExtendConfig()
    hkv, d = check_cache(k_cache, v_cache)
    t, hq, dq = q.shape
    if dq != d or hq % hkv:
        raise ValueError(f"q {tuple(q.shape)} does not match cache heads {hkv} / dim {d}")
    g = hq // hkv
    if q.stride(2) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty_like(q)
    nreq = rows.numel()
    if t == 0 or nreq == 0:
        return out
    tiles = triton.cdiv(max(1, max_qo_len if max_qo_len is not None else t) * g, cfg.block_m)
    if splits is None:
        splits = 1 if max_kv_len is None else extend_splits(
            t, nreq, hq, hkv, d, max_kv_len, cfg.block_m, num_sms(q.device), policy)
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    split = splits > 1
    if split:
        # One compiled variant whatever the split count: a serving run meets counts 2..32 one by
        # one, and a variant per count (the LSE stride `splits` specializes at 16 and 32, the
        # fold's S_PAD at every power of two) is a Triton compile inside the run on a machine
        # whose kernel cache is cold (seconds of one extend step in an H200 cell). The LSE
        # rows are padded to a multiple of 16; the fold pads to the policy's largest count.
        part_o = torch.empty(t, hq, splits, d, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(t, hq, triton.cdiv(splits, 16) * 16, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # unused
    _extend_kernel[(nreq * tiles, hkv, splits)](
        q, k_cache, v_cache, slot_table, rows, qo_indptr, prefix_len, out, part_o, part_lse,
        sm_scale * LOG2E, tiles, splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        slot_table.stride(0), out.stride(0), out.stride(1),
        *(part_o.stride()[:3] if split else (0, 0, 0)), *(part_lse.stride()[:2] if split else (0, 0)),
        G=g, D=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        UPCAST=upcast_flag(q), PREC=dot_precision(q), SPLIT=split,
        num_warps=cfg.num_warps, num_stages=stages_for(cfg.num_stages, q),
    )
    if split:
        lse = torch.empty(t, hq, dtype=torch.float32, device=q.device)  # the fold's LSE, unused
        _fold_extend_kernel[(t, hq)](
            part_o, part_lse, out, lse, splits,
            *part_o.stride()[:3], *part_lse.stride()[:2], out.stride(0), out.stride(1), *lse.stride(),
            D=d, S_PAD=max(2, next_pow2(max(splits, (policy or ExtendSplitPolicy()).max_splits))),
        )
    return out
