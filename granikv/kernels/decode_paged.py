"""Batched decode over per-request slot tables (the `paged` system's attention, and the
suffix pass of `cascade`/`granikv`).

One program handles one (request, KV head, split): the g query heads that share the KV head
are packed as the M dimension of `tl.dot` (GQA packing, padded to 16 rows), so each K/V tile
is loaded once for the whole group. Positions [kv_start, kv_start + kv_len) of the request's
slot-table row are read, key tile by key tile, through the slot indices; a page-16 layout is
just a slot table whose runs of 16 are contiguous, so one kernel serves pages and tokens.

Split-K: the host picks `max_splits` from shapes alone (few rows -> more splits, so the GPU
fills); each request then uses `min(max_splits, ceil(kv_len / min_split_len))` splits,
decided on the device. With `max_splits == 1` the kernel writes the output directly and the
second stage is skipped.
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
    num_sms,
    num_splits_for,
    online_softmax_step,
    stages_for,
    upcast_flag,
)
from granikv.kernels.splits import SplitWorkspace, combine_decode


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape of the decode kernel (tuned on an H200 by harness/microbench/kernels.py)."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    min_split_len: int = 512  # a split reads at least this many keys
    target_programs: int = 4  # x SMs: below this many (request, head) programs, split


@triton.jit
def _decode_kernel(
    Q, K, V, SlotTable, Rows, KvStart, KvLen,
    O, Lse, PartO, PartLse,
    qk_scale, max_splits,
    s_q_b, s_q_h,
    s_k_s, s_k_h, s_v_s, s_v_h,
    s_t_r,
    s_o_b, s_o_h, s_l_b, s_l_h,
    s_po_r, s_po_h, s_po_s, s_pl_r, s_pl_h,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    MIN_SPLIT_LEN: tl.constexpr, DIRECT: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    n = tl.load(KvLen + b)
    nsplit = num_splits_for(n, MIN_SPLIT_LEN, max_splits)
    if s < nsplit:
        row = tl.load(Rows + b).to(tl.int64)
        start = tl.load(KvStart + b)
        chunk = tl.cdiv(tl.cdiv(n, nsplit), BLOCK_N) * BLOCK_N
        lo = s * chunk
        hi = tl.minimum(lo + chunk, n)

        offs_g = tl.arange(0, G_PAD)
        offs_d = tl.arange(0, D)
        gmask = offs_g < G
        hq = h * G + offs_g
        q = tl.load(Q + b * s_q_b + hq[:, None] * s_q_h + offs_d[None, :], mask=gmask[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([G_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([G_PAD], tl.float32)
        acc = tl.zeros([G_PAD, D], tl.float32)
        table = SlotTable + row * s_t_r + start
        k_base = K + h * s_k_h
        v_base = V + h * s_v_h
        for pos in tl.range(lo, hi, BLOCK_N):
            offs_n = pos + tl.arange(0, BLOCK_N)
            nmask = offs_n < hi
            slots = tl.load(table + offs_n, mask=nmask, other=0).to(tl.int64)
            k = tl.load(k_base + slots[:, None] * s_k_s + offs_d[None, :], mask=nmask[:, None], other=0.0)
            v = tl.load(v_base + slots[:, None] * s_v_s + offs_d[None, :], mask=nmask[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            m_i, l_i, acc = online_softmax_step(q, k, v, m_i, l_i, acc, qk_scale, nmask[None, :], True, PREC)
        o, lse2 = finish_rows(m_i, l_i, acc)
        if DIRECT:
            tl.store(O + b * s_o_b + hq[:, None] * s_o_h + offs_d[None, :], o.to(O.dtype.element_ty),
                     mask=gmask[:, None])
            tl.store(Lse + b * s_l_b + hq * s_l_h, lse2 * 0.6931471805599453, mask=gmask)
        else:
            tl.store(PartO + b * s_po_r + hq[:, None] * s_po_h + s * s_po_s + offs_d[None, :], o,
                     mask=gmask[:, None])
            tl.store(PartLse + b * s_pl_r + hq * s_pl_h + s, lse2, mask=gmask)


def decode_max_splits(batch: int, num_kv_heads: int, device: torch.device, cfg: DecodeConfig | None = None,
                      cap: int = 32) -> int:
    """Host heuristic from shapes only: enough splits that batch*H_kv*splits fills the GPU."""
    cfg = cfg or DecodeConfig()
    units = max(1, batch * num_kv_heads)
    target = cfg.target_programs * num_sms(device)
    return int(max(1, min(cap, -(-target // units))))


def decode_paged(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_table: torch.Tensor,
    rows: torch.Tensor,
    kv_start: torch.Tensor,
    kv_len: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    max_splits: int | None = None,
    workspace: SplitWorkspace | None = None,
    cfg: DecodeConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention of one query token per request over its slot-table row.

    q [B, Hq, d]; k_cache/v_cache [num_slots, H_kv, d]; slot_table int32 [max_rows, max_ctx];
    rows, kv_start, kv_len int32 [B]. Request b reads positions [kv_start[b], kv_start[b] +
    kv_len[b]) of row rows[b]. kv_len 0 gives o = 0, lse = -inf. Returns (o [B, Hq, d] in q's
    dtype, lse [B, Hq] float32, natural log). No host sync: `max_splits` (default: from shapes)
    fixes the grid; pass a `workspace` sized by `SplitWorkspace.allocate(B, Hq, max_splits, d)`
    to run under a CUDA graph with fixed buffers.
    """
    cfg = cfg or DecodeConfig()
    hkv, d = check_cache(k_cache, v_cache)
    bsz, hq, dq = q.shape
    if dq != d or hq % hkv:
        raise ValueError(f"q {tuple(q.shape)} does not match cache heads {hkv} / dim {d}")
    g = hq // hkv
    if q.stride(2) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty_like(q)
    if lse is None:
        lse = torch.empty(bsz, hq, dtype=torch.float32, device=q.device)
    if bsz == 0:
        return out, lse
    if max_splits is None:
        max_splits = decode_max_splits(bsz, hkv, q.device, cfg)
    if max_splits > 1:
        if workspace is None:
            workspace = SplitWorkspace.allocate(bsz, hq, max_splits, d, q.device)
        elif not workspace.fits(bsz, hq, max_splits, d):
            raise ValueError("workspace too small for this launch")
        po, pl = workspace.o, workspace.lse
    else:
        po, pl = out, lse  # unused by the kernel in the direct path
    _decode_kernel[(bsz, hkv, max_splits)](
        q, k_cache, v_cache, slot_table, rows, kv_start, kv_len,
        out, lse, po, pl,
        sm_scale * LOG2E, max_splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        slot_table.stride(0),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        po.stride(0), po.stride(1), po.stride(2) if po.dim() == 4 else 0,
        pl.stride(0), pl.stride(1),
        G=g, G_PAD=max(16, triton.next_power_of_2(g)), D=d, BLOCK_N=cfg.block_n,
        MIN_SPLIT_LEN=cfg.min_split_len, DIRECT=max_splits == 1,
        UPCAST=upcast_flag(q), PREC=dot_precision(q),
        num_warps=cfg.num_warps, num_stages=stages_for(cfg.num_stages, q),
    )
    if max_splits > 1:
        combine_decode(workspace, kv_len, max_splits, cfg.min_split_len, out, lse)
    return out, lse
