"""The per-step batch description every attention backend plans from.

The runner fills one `StepBatch` per forward: host-side lists (what the planner needs to
group requests into prefix classes) and device tensors (what the kernels read). Device
tensors live in static buffers owned by the runner for decode, so a planned step can be
replayed from a CUDA graph without host syncs inside the forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ReqView:
    """What a backend may know about one request of the step (host side)."""

    row: int  # slot-table row
    seq_len: int  # context length after this step's tokens are stored
    prefix_len: int  # tokens already cached before this step (extend) / seq_len - 1 (decode)
    slab: tuple[int, int] | None = None  # (hot_base, Lp) when the request's prefix is a HOT slab
    slots: object = None  # host copy of the request's slot list (numpy int32), for cascade
    key: object = None  # stable identity of the request while it runs (caches per-request plans)


@dataclass
class StepBatch:
    mode: str  # "extend" | "decode"
    reqs: list[ReqView]
    num_tokens: int
    # device tensors
    out_slots: torch.Tensor  # [T] int64: where each new token's K/V is written
    rows: torch.Tensor  # [N] int32
    prefix_lens: torch.Tensor  # [N] int32 (extend: cached tokens before the chunk)
    qo_indptr: torch.Tensor  # [N+1] int32 (extend)
    seq_lens: torch.Tensor  # [N] int32 (decode: context incl. the current token)
    _bounds: tuple[int, int] | None = field(default=None, repr=False, compare=False)
    # extend: the kernel's key splits, fixed (a captured extend graph's); None lets the policy pick
    split_count: int | None = None

    @property
    def num_reqs(self) -> int:
        return len(self.reqs)

    def extend_bounds(self) -> tuple[int, int]:
        """(most new tokens of one request, longest context) of an extend step, from the host
        views: they size the extend kernel's grid and key splits without a device read.
        Computed once per step (the model calls the backend once per layer)."""
        if self._bounds is None:
            self._bounds = (max((v.seq_len - v.prefix_len for v in self.reqs), default=0),
                            max((v.seq_len for v in self.reqs), default=0))
        return self._bounds
