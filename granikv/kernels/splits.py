"""Split-K workspace and the second stage that folds the splits of one row together.

Why split: a decode or prefix pass over few rows launches few programs (8 KV heads x one tile
is 8 programs on 132 SMs), so the key range is cut into splits that run side by side, each
writing a partial output and its LSE; this stage merges them. The number of splits of a row
is decided on the device (from its length) and written to `num_splits[row]`; 0 there means
"no pass touched this row" and the row's output is left as it was. The launch grid depends
only on shapes and the host-chosen `max_splits`, so the two launches are graph-capturable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from granikv.kernels._common import LN2, next_pow2


@dataclass(frozen=True)
class SplitWorkspace:
    """Partial results of a split pass: o [rows, heads, max_splits, d] and base-2 lse
    [rows, heads, max_splits] in float32, plus the per-row split count (int32 [rows]).
    Allocate once per (rows, heads, max_splits, d) bucket and reuse it under CUDA graphs."""

    o: torch.Tensor
    lse: torch.Tensor
    num_splits: torch.Tensor

    @staticmethod
    def allocate(rows: int, heads: int, max_splits: int, d: int, device) -> SplitWorkspace:
        return SplitWorkspace(
            o=torch.empty(rows, heads, max_splits, d, dtype=torch.float32, device=device),
            lse=torch.empty(rows, heads, max_splits, dtype=torch.float32, device=device),
            num_splits=torch.zeros(rows, dtype=torch.int32, device=device),
        )

    @staticmethod
    def nbytes(rows: int, heads: int, max_splits: int, d: int) -> int:
        """Device bytes that `allocate` takes, for sizing the engine's buffers."""
        return rows * heads * max_splits * (d + 1) * 4 + rows * 4

    def fits(self, rows: int, heads: int, max_splits: int, d: int) -> bool:
        r, h, s, dd = self.o.shape
        return r >= rows and h == heads and s >= max_splits and dd == d


@triton.jit
def _combine_kernel(
    PartO, PartLse, NumSplits, O, Lse,
    s_po_r, s_po_h, s_po_s,
    s_pl_r, s_pl_h,
    s_o_r, s_o_h, s_l_r, s_l_h,
    D: tl.constexpr, S_PAD: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    n = tl.load(NumSplits + r)
    if n > 0:
        offs_s = tl.arange(0, S_PAD)
        offs_d = tl.arange(0, D)
        smask = offs_s < n
        lse = tl.load(PartLse + r * s_pl_r + h * s_pl_h + offs_s, mask=smask, other=float("-inf"))
        m = tl.max(lse, 0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp2(lse - m_safe)
        po = tl.load(
            PartO + r * s_po_r + h * s_po_h + offs_s[:, None] * s_po_s + offs_d[None, :],
            mask=smask[:, None], other=0.0,
        )
        total = tl.sum(w, 0)
        o = tl.sum(po * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
        out_lse = tl.where(total == 0.0, float("-inf"), (m_safe + tl.log2(total)) * 0.6931471805599453)
        tl.store(O + r * s_o_r + h * s_o_h + offs_d, o.to(O.dtype.element_ty))
        tl.store(Lse + r * s_l_r + h * s_l_h, out_lse)


def combine_splits(ws: SplitWorkspace, rows: int, heads: int, max_splits: int,
                   out: torch.Tensor, lse: torch.Tensor) -> None:
    """Fold ws's partials of rows [0, rows) into out [rows, heads, d] and lse [rows, heads]
    (natural log); rows with num_splits == 0 are left untouched."""
    assert LN2 == 0.6931471805599453
    d = out.shape[-1]
    _combine_kernel[(rows, heads)](
        ws.o, ws.lse, ws.num_splits, out, lse,
        ws.o.stride(0), ws.o.stride(1), ws.o.stride(2),
        ws.lse.stride(0), ws.lse.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        D=d, S_PAD=max(2, next_pow2(max_splits)),
    )
