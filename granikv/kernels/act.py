"""SwiGLU activation, `silu(gate) * up`, over the fused gate/up projection's output in one launch.

The MLP computes gate and up with one GEMM into [T, 2I] (gate | up); unfused, `F.silu(gate) * up`
is two launches and an intermediate [T, I] round trip. Here each program reads a BLOCK of gate
and the matching BLOCK of up and writes the product: float32 math, rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(X, Y, s_x, s_y, N, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    gate = tl.load(X + t * s_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + t * s_x + N + offs, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(Y + t * s_y + offs, y.to(Y.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None, block: int = 1024) -> torch.Tensor:
    """gate_up [T, 2I] (gate | up, unit last stride) -> silu(gate) * up [T, I] in its dtype."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"silu_mul: gate_up must be [T, 2I], got {tuple(gate_up.shape)}")
    if gate_up.stride(1) != 1:
        gate_up = gate_up.contiguous()
    t, n = gate_up.shape[0], gate_up.shape[1] // 2
    if out is None:
        out = torch.empty((t, n), dtype=gate_up.dtype, device=gate_up.device)
    if t == 0:
        return out
    block = min(block, triton.next_power_of_2(n))
    _silu_mul_kernel[(t, triton.cdiv(n, block))](gate_up, out, gate_up.stride(0), out.stride(0), n, BLOCK=block,
                                                  num_warps=4)
    return out
