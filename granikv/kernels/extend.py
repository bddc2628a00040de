"""Prefill/extend attention for a batch of requests, one kernel for all three systems.

Request n has new tokens q[qo_indptr[n]:qo_indptr[n+1]] at positions prefix_len[n] + i; their
K/V were already written by `store_kv`, so every key (cached prefix and new part alike) is
read through row rows[n] of the slot table — one gather path, whatever the pool (HOT slab,
COLD slots, pages). Query heads sharing a KV head are packed into the M dimension (row r of a
tile is token r // g, head r % g), so each K/V tile serves g heads. Keys below the tile's
first token are visible to every row and run unmasked; only the last few tiles apply the
causal mask.
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
    online_softmax_step,
    stages_for,
    upcast_flag,
)


@dataclass(frozen=True)
class ExtendConfig:
    """Launch shape of the extend kernel (tuned on an H200 by harness/microbench/kernels.py)."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


# TILES (the query tiles per request) changes with every prefill batch's longest request; left
# specialized, Triton compiles a new variant the first time it meets TILES == 1 or a multiple of
# 16 (seconds, inside a serving run: a 31-token suffix step of 1.85 s in an H200 cell).
@triton.jit(do_not_specialize=["TILES"])
def _extend_kernel(
    Q, K, V, SlotTable, Rows, QoIndptr, PrefixLen, O,
    qk_scale, TILES,
    s_q_t, s_q_h, s_k_s, s_k_h, s_v_s, s_v_h, s_t_r, s_o_t, s_o_h,
    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    n = tl.program_id(0) // TILES
    mt = tl.program_id(0) % TILES
    h = tl.program_id(1)
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
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        k_base = K + h * s_k_h
        v_base = V + h * s_v_h
        for pos in tl.range(0, full_hi, BLOCK_N):
            offs_n = pos + tl.arange(0, BLOCK_N)
            slots = tl.load(table + offs_n).to(tl.int64)
            k = tl.load(k_base + slots[:, None] * s_k_s + offs_d[None, :])
            v = tl.load(v_base + slots[:, None] * s_v_s + offs_d[None, :])
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            m_i, l_i, acc = online_softmax_step(q, k, v, m_i, l_i, acc, qk_scale, offs_n[None, :] < kv_hi,
                                                False, PREC)
        for pos in tl.range(full_hi, kv_hi, BLOCK_N):
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
        o, _ = finish_rows(m_i, l_i, acc)
        tl.store(O + (q0 + tok)[:, None].to(tl.int64) * s_o_t + hq[:, None] * s_o_h + offs_d[None, :],
                 o.to(O.dtype.element_ty), mask=rmask[:, None])


def extend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_table: torch.Tensor,
    rows: torch.Tensor,
    qo_indptr: torch.Tensor, prefix_len: torch.Tensor, sm_scale: float, out: torch.Tensor | None = None,
    max_qo_len: int | None = None, cfg: ExtendConfig | None = None,
) -> torch.Tensor:
    """Extend attention. q [T, Hq, d]; rows int32 [N]; qo_indptr int32 [N+1]; prefix_len int32
    [N]. Token i of request n (position prefix_len[n] + i) attends to positions
    [0, prefix_len[n] + i] of row rows[n]. `max_qo_len` (host bound on new tokens per request,
    default T) sizes the grid without a device read. Returns o [T, Hq, d] in q's dtype."""
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
    _extend_kernel[(nreq * tiles, hkv)](
        q, k_cache, v_cache, slot_table, rows, qo_indptr, prefix_len, out,
        sm_scale * LOG2E, tiles,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        slot_table.stride(0), out.stride(0), out.stride(1),
        G=g, D=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        UPCAST=upcast_flag(q), PREC=dot_precision(q),
        num_warps=cfg.num_warps, num_stages=stages_for(cfg.num_stages, q),
    )
    return out
