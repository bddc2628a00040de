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
from granikv.kernels.prefix_flat import FLAT_CONFIG, FlatClass, FlatClasses, flat_items_bound, flat_lists

DENSE, CASCADE = "dense", "cascade"  # the two prefix-pass kinds over HOT slabs (dispatch.py chooses)
# granikv's prefix pass over a COLD shared run, read through a representative slot-table row
# (the cascade kernel's page-row form); a class whose rule says dense or cascade takes it
ROWS = "rows"
# granikv's extension pass (nested sharing): a class of requests that already read a shared head
# through a pass of the kinds above and share the next run too, positions [start, start + len) of
# a representative's slot-table row. It reads the slot table as a flat [rows * columns, 1] view,
# so a class's "page row" is the flat position row * columns + start (`ClassLists.where`).
EXT = "ext"
# sharing at any depth: extension level l (l = 1 after the head, 2 after that, ...) is a pass kind
# of its own, one launch per level, because a request reads one run per level and a pass writes
# one partial per request; the levels are merged by log-sum-exp like every other pass
EXT_KINDS = (EXT, "ext2", "ext3", "ext4")
MAX_SHARE_DEPTH = 1 + len(EXT_KINDS)  # the head plus every extension level


# the pass kinds whose classes the flattened launch reads together (every kind of the cascade
# kernel; DENSE keeps its own launch, tiles and TMA), and the level each reads at: a head class
# (cascade, rows) at 0, extension level l at l
FLAT_LEVEL = {CASCADE: 0, ROWS: 0, **{k: i + 1 for i, k in enumerate(EXT_KINDS)}}
FLAT = "flat"  # the signature entry of a plan whose levels run as one flat launch


def ext_kind(level: int) -> str:
    """The pass kind of extension level `level` (1 = the run right after a head class)."""
    if not 1 <= level <= len(EXT_KINDS):
        raise ValueError(f"extension level must be in 1..{len(EXT_KINDS)}, got {level}")
    return EXT_KINDS[level - 1]


def is_ext(kind: str) -> bool:
    return kind in EXT_KINDS


def pass_table(kind: str, slot_table: torch.Tensor) -> torch.Tensor:
    """The slot table a pass of `kind` reads: the extension passes read flat positions (see EXT)."""
    return slot_table.view(-1, 1) if is_ext(kind) else slot_table


@dataclass
class ClassLists:
    """Prefix classes of one pass kind, host side. Exactly one of bases / page_rows is set."""

    members: list[list[int]]  # batch indices per class
    lens: list[int]  # prefix length per class
    bases: list[int] | None = None  # HOT slab base per class (granikv)
    page_rows: list[int] | None = None  # a member's slot-table row per class (cascade baseline)
    starts: list[int] | None = None  # EXT: first position read in that row, per class
    # EXT: per class, the first slot of its run when the run is one slot range (else None); the
    # flattened launch reads such a run as a slab, a per-level launch through the row regardless
    slabs: list[int | None] | None = None

    def where(self, row_stride: int) -> list[int]:
        """Per class what the kernel indexes: the slab base, the slot-table row, or (EXT) the
        flat position `row * row_stride + start` in the slot table."""
        if self.bases is not None:
            return self.bases
        if self.starts is None:
            return self.page_rows
        return [r * row_stride + s for r, s in zip(self.page_rows, self.starts, strict=True)]

    @property
    def max_size(self) -> int:
        return max((len(m) for m in self.members), default=0)


@dataclass
class DecodePlan:
    kv_start: list[int] | None = None  # per request; None = every request reads from position 0
    passes: dict[str, ClassLists] = field(default_factory=dict)
    # the FLAT_LEVEL kinds run as one flattened launch and merge (granikv/kernels/prefix_flat.py),
    # not a launch and a merge each
    flat: bool = False

    def flat_kinds(self) -> list[str]:
        return [k for k in self.passes if k in FLAT_LEVEL] if self.flat else []

    def flat_classes(self, row_stride: int) -> tuple[list[FlatClass], int]:
        """The flattened launch's classes (levels renumbered 0.. over the levels present) and
        the level count."""
        return flat_classes_of({k: self.passes[k] for k in self.flat_kinds()}, row_stride)

    def signature(self) -> tuple:
        """What a captured graph must have been built for: pass kinds with padded class counts
        and padded largest-class sizes (the prefix kernels' grids depend on both)."""
        sig = tuple((k, _pow2(len(c.members)), _pow2(c.max_size), c.bases is not None)
                    for k, c in sorted(self.passes.items()))
        return sig + ((FLAT,),) if self.flat else sig


def flat_levels(kinds) -> dict[str, int]:
    """Level of each flat kind, renumbered 0.. over the levels present (a step whose heads are
    all dense has extension levels only)."""
    present = sorted({FLAT_LEVEL[k] for k in kinds})
    return {k: present.index(FLAT_LEVEL[k]) for k in kinds}


def flat_classes_of(passes: dict[str, ClassLists], row_stride: int) -> tuple[list[FlatClass], int]:
    level = flat_levels(passes)
    out = []
    for kind, c in passes.items():
        slab = c.bases is not None
        starts = c.starts or [0] * len(c.lens)
        wheres = c.bases if slab else [r * row_stride + s for r, s in zip(c.page_rows, starts, strict=True)]
        at = c.slabs or [None] * len(c.lens)
        out += [FlatClass(m, n, w if a is None else a, not slab and a is None, level[kind])
                for m, n, w, a in zip(c.members, c.lens, wheres, at, strict=True)]
    return out, len(set(level.values()))


def flat_sizes(sig: tuple, g: int) -> tuple[int, int, int]:
    """(classes, levels, work items) a graph's flat region holds for a plan signature."""
    kinds = [e for e in sig if len(e) == 4 and e[0] in FLAT_LEVEL]
    levels = len(set(flat_levels([e[0] for e in kinds]).values()))
    return (sum(e[1] for e in kinds), levels,
            flat_items_bound([(e[1], e[2]) for e in kinds], g, FLAT_CONFIG.block_m))


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass
class DecodeMeta:
    kv_start: torch.Tensor  # [B] int32
    kv_len: torch.Tensor  # [B] int32
    passes: dict[str, PrefixClasses] = field(default_factory=dict)  # the kinds not in `flat`
    flat: FlatClasses | None = None


def materialize(plan: DecodePlan, seq_lens: torch.Tensor, slot_table: torch.Tensor, group_size: int = 1) -> DecodeMeta:
    """Eager device form of a plan (`group_size`: query heads per KV head, which sizes the flat
    launch's M tiles)."""
    dev = seq_lens.device
    if plan.kv_start is None:
        kv_start = torch.zeros_like(seq_lens)
    else:
        kv_start = torch.tensor(plan.kv_start, dtype=torch.int32, device=dev)
    passes = {}
    flat = None
    if plan.flat_kinds():
        classes, levels = plan.flat_classes(slot_table.stride(0))
        flat = FlatClasses.from_lists(flat_lists(classes, len(seq_lens), levels, group_size,
                                                 FLAT_CONFIG.block_m), slot_table)
    for kind, c in plan.passes.items():
        if flat is not None and kind in FLAT_LEVEL:
            continue
        passes[kind] = PrefixClasses.from_lists(
            c.members, c.lens, dev, slab_base=c.bases,
            page_rows=c.where(slot_table.stride(0)) if c.page_rows is not None else None,
            slot_table=pass_table(kind, slot_table) if c.page_rows is not None else None)
    return DecodeMeta(kv_start=kv_start, kv_len=seq_lens - kv_start, passes=passes, flat=flat)
