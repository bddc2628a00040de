"""RMSNorm, optionally fused with the residual add that precedes it (one launch instead of two).

In a decoder layer every norm but the first follows a residual add, `h = h + x; y = norm(h)`.
Fused, one program per token reads x and h once, writes the new h in place and writes y:
4 row reads/writes of the hidden size in one launch instead of 5 in two. The add is rounded to
h's dtype before the statistics are taken, as the unfused torch path does; the statistics and
the scaling run in float32 and y is rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(X, R, W, Y, s_x, s_r, s_y, N, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(X + t * s_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        h = (tl.load(R + t * s_r + offs, mask=mask, other=0.0).to(tl.float32) + x.to(tl.float32))
        h = h.to(R.dtype.element_ty)
        tl.store(R + t * s_r + offs, h, mask=mask)
        x = h
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + t * s_y + offs, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
            out: torch.Tensor | None) -> torch.Tensor:
    if x.dim() != 2 or weight.dim() != 1 or x.shape[1] != weight.shape[0]:
        raise ValueError(f"rms_norm: x must be [T, N] and weight [N], got {tuple(x.shape)}, {tuple(weight.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if not weight.is_contiguous():
        weight = weight.contiguous()
    t, n = x.shape
    if residual is not None and (residual.shape != x.shape or residual.stride(1) != 1):
        raise ValueError(f"rms_norm: residual {tuple(residual.shape)} must match x {tuple(x.shape)}, unit last stride")
    if out is None:
        out = torch.empty((t, n), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    block = triton.next_power_of_2(n)
    r = residual if residual is not None else x
    _rms_norm_kernel[(t,)](x, r, weight, out, x.stride(0), r.stride(0), out.stride(0), n, float(eps),
                           HAS_RESIDUAL=residual is not None, BLOCK=block,
                           num_warps=max(1, min(16, block // 512)))
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, N] -> x * rsqrt(mean(x^2) + eps) * weight, in x's dtype (float32 math)."""
    return _launch(x, None, weight, eps, out)


def add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """residual += x (in place, rounded to residual's dtype), then return rms_norm(residual) * weight.
    x, residual: [T, N] with a unit last stride."""
    return _launch(x, residual, weight, eps, out)
