"""Decode plans: what a backend decided for one decode step, on the host, and its device form.

Planning is split in two so the same decision can feed an eager step or a CUDA-graph replay:
`DecodePlan` holds plain host lists (where each request's own part of the context starts, and
the prefix classes per pass kind); `DecodeMeta` holds the device tensors the kernels read.
Eager steps build a fresh `DecodeMeta`; graph replays pack the plan into the static buffers a
captured graph reads (granikv/engine/graphs.py), so the replay needs one host-to-device copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from granikv.kernels.prefix_classes import PrefixClasses

DENSE, CASCADE = "dense", "cascade"  # the two prefix-pass kinds over HOT slabs (dispatch.py chooses)
# granikv's prefix pass over a COLD shared run, read through a representative slot-table row
# (the cascade kernel's page-row form); a class whose rule says dense or cascade takes it
ROWS = "rows"


@dataclass
class ClassLists:
    """Prefix classes of one pass kind, host side. Exactly one of bases / page_rows is set."""

    members: list[list[int]]  # batch indices per class
    lens: list[int]  # prefix length per class
    bases: list[int] | None = None  # HOT slab base per class (granikv)
    page_rows: list[int] | None = None  # a member's slot-table row per class (cascade baseline)

    @property
    def max_size(self) -> int:
        return max((len(m) for m in self.members), default=0)


@dataclass
class DecodePlan:
    kv_start: list[int] | None = None  # per request; None = every request reads from position 0
    passes: dict[str, ClassLists] = field(default_factory=dict)

    def signature(self) -> tuple:
        """What a captured graph must have been built for: pass kinds with padded class counts
        and padded largest-class sizes (the prefix kernels' grids depend on both)."""
        return tuple((k, _pow2(len(c.members)), _pow2(c.max_size), c.bases is not None)
                     for k, c in sorted(self.passes.items()))


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass
class DecodeMeta:
    kv_start: torch.Tensor  # [B] int32
    kv_len: torch.Tensor  # [B] int32
    passes: dict[str, PrefixClasses] = field(default_factory=dict)


def materialize(plan: DecodePlan, seq_lens: torch.Tensor, slot_table: torch.Tensor) -> DecodeMeta:
    """Eager device form of a plan."""
    dev = seq_lens.device
    if plan.kv_start is None:
        kv_start = torch.zeros_like(seq_lens)
    else:
        kv_start = torch.tensor(plan.kv_start, dtype=torch.int32, device=dev)
    passes = {}
    for kind, c in plan.passes.items():
        passes[kind] = PrefixClasses.from_lists(
            c.members, c.lens, dev, slab_base=c.bases, page_rows=c.page_rows,
            slot_table=slot_table if c.page_rows is not None else None)
    return DecodeMeta(kv_start=kv_start, kv_len=seq_lens - kv_start, passes=passes)
