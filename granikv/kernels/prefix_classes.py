"""Prefix classes: which requests of a decode batch share which prefix, and where it lives.

A class c holds the requests `reqs[indptr[c]:indptr[c+1]]` (indices into the batch's q) and
one prefix of `prefix_len[c]` tokens, stored either
- as a contiguous HOT slab: slots `[slab_base[c], slab_base[c] + prefix_len[c])` (granikv), or
- through a slot table: the first `prefix_len[c]` positions of row `page_rows[c]` of
  `slot_table` (the `cascade` baseline reads the shared pages of a representative request).
Everything is an int32 device tensor; `max_class_size` is a host-side upper bound on the
requests per class that only sizes the launch grid (defaults to the number of requests, so no
sync is needed). `host_*` mirrors are optional and used only by the unfused cuBLAS dense form,
whose matrix shapes must be known on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrefixClasses:
    indptr: torch.Tensor
    reqs: torch.Tensor
    prefix_len: torch.Tensor
    slab_base: torch.Tensor | None = None
    page_rows: torch.Tensor | None = None
    slot_table: torch.Tensor | None = None
    max_class_size: int | None = None
    host_indptr: tuple[int, ...] | None = None
    host_prefix_len: tuple[int, ...] | None = None
    host_slab_base: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (self.slab_base is None) == (self.page_rows is None):
            raise ValueError("give exactly one of slab_base (HOT slab) or page_rows (slot-table prefix)")
        if self.page_rows is not None and self.slot_table is None:
            raise ValueError("the page-list form needs slot_table")

    @property
    def num_classes(self) -> int:
        return self.indptr.numel() - 1

    @property
    def is_slab(self) -> bool:
        return self.slab_base is not None

    def grid_class_size(self) -> int:
        return self.max_class_size if self.max_class_size is not None else max(1, self.reqs.numel())

    @staticmethod
    def from_lists(
        members: list[list[int]], prefix_len: list[int], device, slab_base: list[int] | None = None,
        page_rows: list[int] | None = None, slot_table: torch.Tensor | None = None,
    ) -> PrefixClasses:
        """Build from host lists (tests, benchmarks, the engine's planner); keeps host mirrors."""
        indptr = [0]
        for m in members:
            indptr.append(indptr[-1] + len(m))
        flat = [r for m in members for r in m]

        def i32(xs):
            return torch.tensor(xs, dtype=torch.int32, device=device)

        return PrefixClasses(
            indptr=i32(indptr), reqs=i32(flat if flat else [0])[: len(flat)], prefix_len=i32(prefix_len),
            slab_base=i32(slab_base) if slab_base is not None else None,
            page_rows=i32(page_rows) if page_rows is not None else None,
            slot_table=slot_table, max_class_size=max([len(m) for m in members] + [1]),
            host_indptr=tuple(indptr), host_prefix_len=tuple(prefix_len),
            host_slab_base=tuple(slab_base) if slab_base is not None else None,
        )
