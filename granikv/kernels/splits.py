"""Split-K workspace and the second stage that folds the splits of one row together.

Why split: a decode or prefix pass over few rows launches few programs (8 KV heads x one tile
is 8 programs on 132 SMs), so the key range is cut into splits that run side by side, each
writing a partial output and its base-2 LSE; this stage merges them. The number of splits of a
row is a pure function of its key count (`num_splits_for`), so this stage recomputes it from
the same device data instead of reading a per-row counter: no buffer to reset between calls,
and rows that no pass touched (requests in no prefix class) get no program at all. The grids
depend only on shapes and the host-chosen `max_splits`, so both launches are graph-capturable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from granikv.kernels._common import next_pow2, num_splits_for


@dataclass(frozen=True)
class SplitWorkspace:
    """Partial results of a split pass: o [rows, heads, max_splits, d] and base-2 lse
    [rows, heads, max_splits], float32. Allocate once per (rows, heads, max_splits, d) bucket
    and reuse it under CUDA graphs (its contents never need resetting)."""

    o: torch.Tensor
    lse: torch.Tensor

    @staticmethod
    def allocate(rows: int, heads: int, max_splits: int, d: int, device) -> SplitWorkspace:
        return SplitWorkspace(
            o=torch.empty(rows, heads, max_splits, d, dtype=torch.float32, device=device),
            lse=torch.empty(rows, heads, max_splits, dtype=torch.float32, device=device),
        )

    @staticmethod
    def nbytes(rows: int, heads: int, max_splits: int, d: int) -> int:
        """Device bytes that `allocate` takes, for sizing the engine's buffers."""
        return rows * heads * max_splits * (d + 1) * 4

    def fits(self, rows: int, heads: int, max_splits: int, d: int) -> bool:
        r, h, s, dd = self.o.shape
        return r >= rows and h == heads and s >= max_splits and dd == d


@triton.jit
def _fold(PartO, PartLse, O, Lse, r, h, n,
          s_po_r, s_po_h, s_po_s, s_pl_r, s_pl_h, s_o_r, s_o_h, s_l_r, s_l_h,
          D: tl.constexpr, S_PAD: tl.constexpr):
    """Merge the n splits of (row r, head h) into O and Lse (natural log)."""
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D)
    smask = offs_s < n
    lse = tl.load(PartLse + r * s_pl_r + h * s_pl_h + offs_s, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)
    po = tl.load(PartO + r * s_po_r + h * s_po_h + offs_s[:, None] * s_po_s + offs_d[None, :],
                 mask=smask[:, None], other=0.0)
    total = tl.sum(w, 0)
    empty = total == 0.0
    o = tl.sum(po * w[:, None], 0) / tl.where(empty, 1.0, total)
    log_total = tl.log2(tl.where(empty, 1.0, total))
    out_lse = tl.where(empty, float("-inf"), (m_safe + log_total) * 0.6931471805599453)
    tl.store(O + r * s_o_r + h * s_o_h + offs_d, o.to(O.dtype.element_ty))
    tl.store(Lse + r * s_l_r + h * s_l_h, out_lse)


@triton.jit
def _combine_decode_kernel(PartO, PartLse, KvLen, O, Lse, max_splits,
                           s_po_r, s_po_h, s_po_s, s_pl_r, s_pl_h, s_o_r, s_o_h, s_l_r, s_l_h,
                           D: tl.constexpr, S_PAD: tl.constexpr, MIN_SPLIT_LEN: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    n = num_splits_for(tl.load(KvLen + r), MIN_SPLIT_LEN, max_splits)
    _fold(PartO, PartLse, O, Lse, r, h, n, s_po_r, s_po_h, s_po_s, s_pl_r, s_pl_h, s_o_r, s_o_h, s_l_r, s_l_h,
          D, S_PAD)


# num_classes is 1 in every step the engine's start-up captures and 2..64 in multi-prefix runs;
# specialized (1 is compiled in as a constant, multiples of 16 as aligned), it compiled a new
# fold variant inside the first multi-prefix run on each machine. max_splits likewise.
@triton.jit(do_not_specialize=["num_classes", "max_splits"])
def _combine_prefix_kernel(PartO, PartLse, Indptr, Reqs, PrefixLen, O, Lse, num_classes, max_splits,
                           s_po_r, s_po_h, s_po_s, s_pl_r, s_pl_h, s_o_r, s_o_h, s_l_r, s_l_h,
                           D: tl.constexpr, S_PAD: tl.constexpr, MIN_SPLIT_LEN: tl.constexpr):
    i = tl.program_id(0)  # index into the classes' request list
    h = tl.program_id(1)
    # A CUDA graph launches one program per entry of the bucket-sized request buffer; entries
    # past the classes' total are padding (request 0) and must not fold anything: they would
    # rewrite request 0's output with another class's split count, racing with its real fold.
    if i < tl.load(Indptr + num_classes):
        c = 0
        for j in range(1, num_classes):  # class of entry i: how many later classes start at or before i
            c += (tl.load(Indptr + j) <= i).to(tl.int32)
        r = tl.load(Reqs + i).to(tl.int64)
        n = num_splits_for(tl.load(PrefixLen + c), MIN_SPLIT_LEN, max_splits)
        _fold(PartO, PartLse, O, Lse, r, h, n, s_po_r, s_po_h, s_po_s, s_pl_r, s_pl_h, s_o_r, s_o_h, s_l_r,
              s_l_h, D, S_PAD)


def _strides(ws: SplitWorkspace, out: torch.Tensor, lse: torch.Tensor) -> tuple[int, ...]:
    return (ws.o.stride(0), ws.o.stride(1), ws.o.stride(2), ws.lse.stride(0), ws.lse.stride(1),
            out.stride(0), out.stride(1), lse.stride(0), lse.stride(1))


def combine_decode(ws: SplitWorkspace, kv_len: torch.Tensor, max_splits: int, min_split_len: int,
                   out: torch.Tensor, lse: torch.Tensor) -> None:
    """Fold the decode partials of every row into out [B, H, d] and lse [B, H] (natural log)."""
    rows, heads, d = out.shape
    _combine_decode_kernel[(rows, heads)](
        ws.o, ws.lse, kv_len, out, lse, max_splits, *_strides(ws, out, lse),
        D=d, S_PAD=max(2, next_pow2(max_splits)), MIN_SPLIT_LEN=min_split_len,
    )


def combine_prefix(ws: SplitWorkspace, indptr: torch.Tensor, reqs: torch.Tensor, prefix_len: torch.Tensor,
                   max_splits: int, min_split_len: int, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Fold the prefix-pass partials of the requests listed in the classes (others untouched)."""
    n = reqs.numel()
    if n == 0:
        return
    heads, d = out.shape[1], out.shape[2]
    _combine_prefix_kernel[(n, heads)](
        ws.o, ws.lse, indptr, reqs, prefix_len, out, lse, indptr.numel() - 1, max_splits,
        *_strides(ws, out, lse),
        D=d, S_PAD=max(2, next_pow2(max_splits)), MIN_SPLIT_LEN=min_split_len,
    )
