"""Rotate-half (neox) RoPE applied in place to q and k heads together, in one launch.

The qkv projection writes [T, (Hq + 2 Hkv) * d]; its q and k parts, viewed as [T, Hq + Hkv, d]
(token stride (Hq + 2 Hkv) * d), are rotated in place, so attention reads q and k straight out of
the projection's output. The cos/sin table is RotaryEmbedding's `cos_sin` [P, d]: cos of the
d/2 frequencies in the first half, sin in the second (Llama-3 scaling is already folded into the
frequencies). With x = (x1 | x2) halves of a head:
    out1 = x1 cos - x2 sin,    out2 = x2 cos + x1 sin.
One program per (token, BLOCK_H heads): it gathers its position's table row once for all heads;
float32 math, rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_kernel(X, Pos, CS, s_t, s_h, s_cs, H, HALF, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ds = tl.arange(0, BLOCK_D)
    dmask = ds < HALF
    pos = tl.load(Pos + t).to(tl.int64)
    cos = tl.load(CS + pos * s_cs + ds, mask=dmask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(CS + pos * s_cs + HALF + ds, mask=dmask, other=0.0).to(tl.float32)[None, :]
    mask = (hs < H)[:, None] & dmask[None, :]
    p1 = X + t * s_t + hs[:, None].to(tl.int64) * s_h + ds[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(p1, (x1 * cos - x2 * sin).to(X.dtype.element_ty), mask=mask)
    tl.store(p1 + HALF, (x2 * cos + x1 * sin).to(X.dtype.element_ty), mask=mask)


def rope_(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, d] in place (any token/head strides, unit last stride; e.g. the q|k view of
    a fused qkv output) at `positions` [T] (int, on x's device) with the table cos_sin [P, d].
    Returns x. Positions are not bounds-checked on the device (no host sync): they must be < P."""
    if x.dim() != 3 or x.stride(2) != 1:
        raise ValueError(f"rope_: x must be [T, H, d] with a unit last stride, got {tuple(x.shape)} {x.stride()}")
    t, h, d = x.shape
    if d % 2 or cos_sin.dim() != 2 or cos_sin.shape[1] != d or cos_sin.stride(1) != 1:
        raise ValueError(f"rope_: cos_sin must be [P, {d}] (cos | sin), got {tuple(cos_sin.shape)}")
    if positions.shape != (t,):
        raise ValueError(f"rope_: positions must be [{t}], got {tuple(positions.shape)}")
    if t == 0 or h == 0:
        return x
    if positions.stride(0) != 1:
        positions = positions.contiguous()
    half = d // 2
    # 8 heads x d a program (Llama/Qwen q|k head counts are multiples of 8): no masked rows
    block_h = 8 if h % 8 == 0 else min(16, triton.next_power_of_2(h))
    _rope_kernel[(t, triton.cdiv(h, block_h))](x, positions, cos_sin, x.stride(0), x.stride(1), cos_sin.stride(0),
                                               h, half, BLOCK_H=block_h, BLOCK_D=triton.next_power_of_2(half),
                                               num_warps=4)
    return x
