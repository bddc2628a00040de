"""LSE merge of two partial attention results over disjoint key sets (prefix and suffix).

O = (e^{l_a-m} O_a + e^{l_b-m} O_b) / (e^{l_a-m} + e^{l_b-m}), m = max(l_a, l_b), l = m + log(sum).
Float32 math, natural-log LSE, written in place into (o_a, lse_a). A side with lse = -inf (no
keys) contributes nothing, so merging with an empty suffix returns the prefix side exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
