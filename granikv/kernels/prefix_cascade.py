"""Prefix pass: all queries of a prefix class against the class's shared prefix, the prefix
streamed once in BLOCK_N tiles with online softmax (cascade inference's level-0 kernel).

The M dimension of a program is BLOCK_M rows of the class's (request, query head) pairs that
share one KV head: row r is request `reqs[indptr[c] + r // g]`, head `h*g + r % g`. Each K/V
tile is therefore read once per M tile instead of once per request. Several classes of
different lengths and sizes go in one launch: the grid is (class x M tile, H_kv, split) and
programs past a class's rows or splits return at once. The prefix is a contiguous slab
(`granikv`, no gather) or a slot-table row (`cascade` baseline, one index load per key).

`prefix_dense` (fused form) runs the same kernel with large tiles and few splits; this module
uses small M tiles and split-K, which suits small classes (few rows per KV head).
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
    interpreted,
    num_sms,
    num_splits_for,
    online_softmax_step,
    stages_for,
    upcast_flag,
)
from granikv.kernels.prefix_classes import PrefixClasses
from granikv.kernels.splits import SplitWorkspace, combine_prefix


@dataclass(frozen=True)
class PrefixConfig:
    """Tile policy of a prefix pass (tuned on an H200 by harness/microbench/kernels.py)."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    min_split_len: int = 256
    target_programs: int = 2  # x SMs
    max_splits_cap: int = 32
    tma: bool = False  # slab tiles via TMA descriptors (bf16/fp16 on the GPU, and the interpreter)


# measured best on an H200 at B=32, Lp=8K (results/h200/microbench/kernels.json, "tuning")
CASCADE_CONFIG = PrefixConfig(block_m=64, block_n=128, num_warps=4, num_stages=3, min_split_len=256,
                              target_programs=1)


# TILES (M tiles per class) and max_splits change with how a decode batch splits into prefix
# classes. Left specialized, Triton compiles a new variant the first time a run meets TILES == 1
# or a multiple of 16 (a value of 1 is compiled in as a constant, multiples of 16 as aligned),
# so the engine's start-up captures, which see one class per step, cannot compile what a
# multi-prefix run needs: Table 20 k=16 (16 classes of 16: TILES = 1 with one split) compiled
# inside the first run on each machine (tests/engine/test_no_compile_gpu.py checks none does;
# docs/performance.md, "No int specialization in the prefix pass").
@triton.jit(do_not_specialize=["max_splits", "TILES", "NB"])
def _prefix_kernel(
    Q, K, V, KDesc, VDesc, Indptr, Reqs, PrefixLen, SlabBase, PageRows, SlotTable,
    O, Lse, PartO, PartLse, ItemClass, ItemTile, Level,
    qk_scale, max_splits, TILES, NB,
    s_q_b, s_q_h,
    s_k_s, s_k_h, s_v_s, s_v_h,
    s_t_r,
    s_o_b, s_o_h, s_l_b, s_l_h,
    s_po_r, s_po_h, s_po_s, s_pl_r, s_pl_h,
    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MIN_SPLIT_LEN: tl.constexpr, DIRECT: tl.constexpr,
    SLAB: tl.constexpr, USE_TMA: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
    FLAT: tl.constexpr,
):
    # FLAT (prefix_flat.py): program = one (class, M tile) item of a work list over the classes
    # of every level; per class a slab-or-row flag (in PageRows), its first slot or flat table
    # position (in SlabBase) and its level; partials go to rows level * NB + request
    if FLAT:
        c = tl.load(ItemClass + tl.program_id(0))
        mt = tl.load(ItemTile + tl.program_id(0))
    else:
        c = tl.program_id(0) // TILES
        mt = tl.program_id(0) % TILES
    h = tl.program_id(1)
    s = tl.program_id(2)
    r0 = tl.load(Indptr + c)
    nrows = (tl.load(Indptr + c + 1) - r0) * G
    L = tl.load(PrefixLen + c)
    nsplit = num_splits_for(L, MIN_SPLIT_LEN, max_splits)
    if (mt * BLOCK_M < nrows) & (s < nsplit):
        chunk = tl.cdiv(tl.cdiv(L, nsplit), BLOCK_N) * BLOCK_N
        lo = s * chunk
        hi = tl.minimum(lo + chunk, L)
        full_hi = lo + ((hi - lo) // BLOCK_N) * BLOCK_N

        offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        rmask = offs_m < nrows
        req = tl.load(Reqs + r0 + offs_m // G, mask=rmask, other=0).to(tl.int64)
        hq = h * G + offs_m % G
        q = tl.load(Q + req[:, None] * s_q_b + hq[:, None] * s_q_h + offs_d[None, :], mask=rmask[:, None],
                    other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        k_base = K + h * s_k_h
        v_base = V + h * s_v_h
        if SLAB:
            slab_row = tl.load(SlabBase + c)
            base = slab_row.to(tl.int64)
            k_base += base * s_k_s
            v_base += base * s_v_s
        elif FLAT:
            where = tl.load(SlabBase + c).to(tl.int64)
            is_rows = tl.load(PageRows + c) != 0
            base = tl.where(is_rows, 0, where)  # a slab's keys are slots base + position
            table = SlotTable + tl.where(is_rows, where, 0) * s_t_r  # a row's go through the table
        else:
            table = SlotTable + tl.load(PageRows + c).to(tl.int64) * s_t_r
        # full tiles: no masks
        for pos in tl.range(lo, full_hi, BLOCK_N):
            offs_n = pos + tl.arange(0, BLOCK_N)
            if USE_TMA:  # slab tiles through the bulk tensor copy engine (2-D view [slots, H_kv*d])
                k = KDesc.load([slab_row + pos, h * D])
                v = VDesc.load([slab_row + pos, h * D])
            else:
                if SLAB:
                    kp = k_base + offs_n[:, None] * s_k_s + offs_d[None, :]
                    vp = v_base + offs_n[:, None] * s_v_s + offs_d[None, :]
                else:
                    if FLAT:  # predicated off for a slab class: no table traffic
                        slots = tl.where(is_rows, tl.load(table + offs_n, mask=(offs_n >= 0) & is_rows, other=0),
                                         base + offs_n).to(tl.int64)
                    else:
                        slots = tl.load(table + offs_n).to(tl.int64)
                    kp = k_base + slots[:, None] * s_k_s + offs_d[None, :]
                    vp = v_base + slots[:, None] * s_v_s + offs_d[None, :]
                k = tl.load(kp)
                v = tl.load(vp)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            m_i, l_i, acc = online_softmax_step(q, k, v, m_i, l_i, acc, qk_scale, offs_n[None, :] < hi, False,
                                                PREC)
        # the ragged tail tile
        if full_hi < hi:
            offs_n = full_hi + tl.arange(0, BLOCK_N)
            nmask = offs_n < hi
            if SLAB:
                kp = k_base + offs_n[:, None] * s_k_s + offs_d[None, :]
                vp = v_base + offs_n[:, None] * s_v_s + offs_d[None, :]
            else:
                if FLAT:
                    slots = tl.where(is_rows, tl.load(table + offs_n, mask=nmask & is_rows, other=0),
                                     base + offs_n).to(tl.int64)
                else:
                    slots = tl.load(table + offs_n, mask=nmask, other=0).to(tl.int64)
                kp = k_base + slots[:, None] * s_k_s + offs_d[None, :]
                vp = v_base + slots[:, None] * s_v_s + offs_d[None, :]
            k = tl.load(kp, mask=nmask[:, None], other=0.0)
            v = tl.load(vp, mask=nmask[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            m_i, l_i, acc = online_softmax_step(q, k, v, m_i, l_i, acc, qk_scale, nmask[None, :], True, PREC)
        o, lse2 = finish_rows(m_i, l_i, acc)
        if DIRECT:
            tl.store(O + req[:, None] * s_o_b + hq[:, None] * s_o_h + offs_d[None, :],
                     o.to(O.dtype.element_ty), mask=rmask[:, None])
            tl.store(Lse + req * s_l_b + hq * s_l_h, lse2 * 0.6931471805599453, mask=rmask)
        else:
            if FLAT:
                req += tl.load(Level + c).to(tl.int64) * NB
            tl.store(PartO + req[:, None] * s_po_r + hq[:, None] * s_po_h + s * s_po_s + offs_d[None, :], o,
                     mask=rmask[:, None])
            tl.store(PartLse + req * s_pl_r + hq * s_pl_h + s, lse2, mask=rmask)
    if FLAT:
        # a class's unused splits hold no keys: say so, since the merge reads every split of a level
        if (mt * BLOCK_M < nrows) & (s >= nsplit):
            offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
            rmask = offs_m < nrows
            row = tl.load(Reqs + r0 + offs_m // G, mask=rmask, other=0).to(tl.int64)
            row += tl.load(Level + c).to(tl.int64) * NB
            tl.store(PartLse + row * s_pl_r + (h * G + offs_m % G) * s_pl_h + s,
                     tl.full([BLOCK_M], float("-inf"), tl.float32), mask=rmask)


def prefix_max_splits(classes: PrefixClasses, batch: int, g: int, num_kv_heads: int, device,
                      cfg: PrefixConfig) -> int:
    """Host heuristic from shapes alone. units = M tiles x KV heads programs per split; a wave is
    target_programs x SMs programs. Among split counts that keep the launch within about two
    waves (more splits only add partials to merge), pick the one that minimises the waves per
    unit of work, ceil(units * s / wave) / s (a partial last wave costs a whole one), the
    smallest on ties: 64 units on 132 SMs -> 2 splits (128 programs, one wave), not 3 (192
    programs, two waves)."""
    tiles = -(-max(1, batch) * g // cfg.block_m) + classes.num_classes - 1
    units = max(1, tiles * num_kv_heads)
    return splits_for_units(units, cfg.target_programs * num_sms(device), cfg.max_splits_cap)


def splits_for_units(units: int, wave: int, cap: int) -> int:
    """The split count that minimises waves per unit of work, ceil(units * s / wave) / s, among
    those keeping a launch of `units` programs per split within about two waves (the smallest
    on ties)."""
    best, best_cost = 1, float("inf")
    s_max = max(1, min(cap, -(-2 * wave // units)))
    for s in range(1, s_max + 1):
        cost = -(-units * s // wave) / s
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


def run_prefix_pass(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, classes: PrefixClasses, sm_scale: float,
    cfg: PrefixConfig, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
    max_splits: int | None = None, workspace: SplitWorkspace | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the prefix kernel with tile policy `cfg` (shared by cascade and fused dense)."""
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
    nc = classes.num_classes
    if bsz == 0 or nc == 0:
        return out, lse
    if max_splits is None:
        max_splits = prefix_max_splits(classes, classes.reqs.numel(), g, hkv, q.device, cfg)
    if max_splits > 1:
        if workspace is None:
            workspace = SplitWorkspace.allocate(bsz, hq, max_splits, d, q.device)
        elif not workspace.fits(bsz, hq, max_splits, d):
            raise ValueError("workspace too small for this launch")
        po, pl = workspace.o, workspace.lse
    else:
        po, pl = out, lse  # unused by the kernel in the direct path
    tiles = triton.cdiv(classes.grid_class_size() * g, cfg.block_m)
    slab = classes.is_slab
    table = classes.slot_table if classes.slot_table is not None else classes.indptr
    use_tma = (cfg.tma and slab and k_cache.is_contiguous() and v_cache.is_contiguous()
               and (interpreted() or q.element_size() == 2))
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        kd = TensorDescriptor.from_tensor(k_cache.view(k_cache.shape[0], hkv * d), [cfg.block_n, d])
        vd = TensorDescriptor.from_tensor(v_cache.view(v_cache.shape[0], hkv * d), [cfg.block_n, d])
    else:
        kd, vd = k_cache, v_cache
    _prefix_kernel[(nc * tiles, hkv, max_splits)](
        q, k_cache, v_cache, kd, vd, classes.indptr, classes.reqs, classes.prefix_len,
        classes.slab_base if slab else classes.indptr,
        classes.page_rows if not slab else classes.indptr, table,
        out, lse, po, pl, classes.indptr, classes.indptr, classes.indptr,
        sm_scale * LOG2E, max_splits, tiles, 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        table.stride(0),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        po.stride(0), po.stride(1), po.stride(2) if po.dim() == 4 else 0,
        pl.stride(0), pl.stride(1),
        G=g, D=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        MIN_SPLIT_LEN=cfg.min_split_len, DIRECT=max_splits == 1,
        SLAB=slab, USE_TMA=use_tma, UPCAST=upcast_flag(q), PREC=dot_precision(q), FLAT=False,
        num_warps=cfg.num_warps, num_stages=stages_for(cfg.num_stages, q),
    )
    if max_splits > 1:
        combine_prefix(workspace, classes.indptr, classes.reqs, classes.prefix_len, max_splits,
                       cfg.min_split_len, out, lse)
    return out, lse


def prefix_cascade(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, classes: PrefixClasses, sm_scale: float,
    out: torch.Tensor | None = None, lse: torch.Tensor | None = None, max_splits: int | None = None,
    workspace: SplitWorkspace | None = None, cfg: PrefixConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cascade prefix pass. q [B, Hq, d]; classes as in `PrefixClasses` (slab or slot-table
    form). Writes o [B, Hq, d] and lse [B, Hq] (float32, natural log) for every request in a
    class; rows of requests in no class are left untouched. A class with prefix_len 0 gives
    o = 0, lse = -inf. No host sync; see `decode_paged` for `max_splits`/`workspace`."""
    return run_prefix_pass(q, k_cache, v_cache, classes, sm_scale, cfg or CASCADE_CONFIG, out, lse,
                           max_splits, workspace)
