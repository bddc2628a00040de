"""LSE merge of partial attention results over disjoint key sets (prefix and suffix).

O = (e^{l_a-m} O_a + e^{l_b-m} O_b) / (e^{l_a-m} + e^{l_b-m}), m = max(l_a, l_b), l = m + log(sum).
Float32 math, natural-log LSE, written in place into (o_a, lse_a). A side with lse = -inf (no
keys) contributes nothing, so merging with an empty suffix returns the prefix side exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from granikv.kernels._common import next_pow2


@triton.jit
def _merge_kernel(OA, LA, OB, LB, s_oa_r, s_oa_h, s_la_r, s_la_h, s_ob_r, s_ob_h, s_lb_r, s_lb_h,
                  H: tl.constexpr, D: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    offs = tl.arange(0, D)
    la = tl.load(LA + r * s_la_r + h * s_la_h)
    lb = tl.load(LB + r * s_lb_r + h * s_lb_h)
    m = tl.maximum(la, lb)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(la - m_safe)
    wb = tl.exp(lb - m_safe)
    tot = wa + wb
    oa = tl.load(OA + r * s_oa_r + h * s_oa_h + offs).to(tl.float32)
    ob = tl.load(OB + r * s_ob_r + h * s_ob_h + offs).to(tl.float32)
    o = (oa * wa + ob * wb) / tl.where(tot == 0.0, 1.0, tot)
    tl.store(OA + r * s_oa_r + h * s_oa_h + offs, o.to(OA.dtype.element_ty))
    tl.store(LA + r * s_la_r + h * s_la_h, tl.where(tot == 0.0, float("-inf"), m_safe + tl.log(tot)))


def merge_lse_(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """Merge (o_b, lse_b) into (o_a, lse_a) in place. o [R, H, d], lse [R, H] float32."""
    if o_a.shape != o_b.shape or lse_a.shape != lse_b.shape or o_a.shape[:2] != lse_a.shape:
        raise ValueError("merge_lse_: shapes of the two sides differ")
    if lse_a.dtype != torch.float32 or lse_b.dtype != torch.float32:
        raise ValueError("merge_lse_: LSE must be float32")
    r, h, d = o_a.shape
    if r == 0:
        return
    if o_a.stride(2) != 1 or o_b.stride(2) != 1:
        raise ValueError("merge_lse_: head dim must be contiguous")
    _merge_kernel[(r, h)](
        o_a, lse_a, o_b, lse_b,
        o_a.stride(0), o_a.stride(1), lse_a.stride(0), lse_a.stride(1),
        o_b.stride(0), o_b.stride(1), lse_b.stride(0), lse_b.stride(1),
        H=h, D=d,
    )


# LEVELS and NB change with the plan and the batch bucket; specialized, a new merge variant would
# compile inside a run the first time a tree with another depth meets it
@triton.jit(do_not_specialize=["LEVELS", "NB", "max_splits"])
def _merge_levels_kernel(O, Lse, PartO, PartLse, Mask, LEVELS, NB, max_splits,
                         s_o_r, s_o_h, s_l_r, s_l_h, s_po_r, s_po_h, s_po_s, s_pl_r, s_pl_h,
                         D: tl.constexpr, S_PAD: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    bits = tl.load(Mask + b)
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D)
    l0 = tl.load(Lse + b * s_l_r + h * s_l_h) * 1.4426950408889634  # natural -> base 2, as the partials
    m = l0
    for lv in range(LEVELS):  # the largest LSE over the request's own part and its levels' splits
        on = ((bits >> lv) & 1) != 0
        lp = tl.load(PartLse + (lv * NB + b) * s_pl_r + h * s_pl_h + offs_s, mask=(offs_s < max_splits) & on,
                     other=float("-inf"))
        m = tl.maximum(m, tl.max(lp, 0))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w0 = tl.exp2(l0 - m_safe)
    acc = tl.load(O + b * s_o_r + h * s_o_h + offs_d).to(tl.float32) * w0
    tot = w0
    for lv in range(LEVELS):
        on = ((bits >> lv) & 1) != 0
        smask = (offs_s < max_splits) & on
        row = lv * NB + b
        lp = tl.load(PartLse + row * s_pl_r + h * s_pl_h + offs_s, mask=smask, other=float("-inf"))
        w = tl.exp2(lp - m_safe)
        po = tl.load(PartO + row * s_po_r + h * s_po_h + offs_s[:, None] * s_po_s + offs_d[None, :],
                     mask=smask[:, None] & (w[:, None] > 0.0), other=0.0)
        acc += tl.sum(po * w[:, None], 0)
        tot += tl.sum(w, 0)
    empty = tot == 0.0
    o = acc / tl.where(empty, 1.0, tot)
    tl.store(O + b * s_o_r + h * s_o_h + offs_d, o.to(O.dtype.element_ty))
    tl.store(Lse + b * s_l_r + h * s_l_h,
             tl.where(empty, float("-inf"), (m_safe + tl.log2(tl.where(empty, 1.0, tot))) * 0.6931471805599453))


def merge_levels_(o: torch.Tensor, lse: torch.Tensor, ws, mask: torch.Tensor, levels: int, max_splits: int) -> None:
    """Fold into (o [B, H, d], lse [B, H] natural log) every partial of the levels set in a
    request's `mask` bits: workspace rows level * B + request, splits 0 .. max_splits - 1, base-2
    LSE (an unused split has LSE -inf and its output is never read)."""
    b, h, d = o.shape
    if b == 0 or levels == 0:
        return
    if ws.o.shape[0] < levels * b or ws.o.shape[2] < max_splits:
        raise ValueError("merge_levels_: workspace smaller than levels x batch x splits")
    _merge_levels_kernel[(b, h)](
        o, lse, ws.o, ws.lse, mask, levels, b, max_splits,
        o.stride(0), o.stride(1), lse.stride(0), lse.stride(1),
        ws.o.stride(0), ws.o.stride(1), ws.o.stride(2), ws.lse.stride(0), ws.lse.stride(1),
        D=d, S_PAD=max(2, next_pow2(max_splits)),
    )
