"""Flattened prefix pass: the shared runs of every level of a step in one launch, one merge.

With sharing at any depth a request reads one shared run per level (a system prompt, a branch,
a leaf) plus its own tokens. Launching the prefix kernel once per level, each with its own
zero-filled output and LSE merge, costs four launches per level and layer and leaves each
level's launch to fill the GPU on its own. Here the classes of every level form one work list
of (class, M tile) items — the (node, reader-group) partition of DeFT and FastTree — read by
one launch of the prefix kernel (`FLAT` mode of `_prefix_kernel`): each class carries its
level, its prefix length and where its run lives (a HOT slab's first slot, or a flat position
in the slot table for a run read through a member's row), and writes its split partials to
workspace rows `level * B + request`. One merge (`merge_levels_`) then folds, per request, the
suffix decode's result with the partials of the levels the request reads (a bit mask per
request), by log-sum-exp. Items are ordered longest run first so the launch's tail is short.

The host side (`flat_lists`) is plain numpy so an eager step and a CUDA-graph replay (which
packs the same arrays into its static buffer, granikv/engine/graphs.py) build the same launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from granikv.kernels._common import LOG2E, check_cache, dot_precision, num_sms, stages_for, upcast_flag
from granikv.kernels.merge import merge_levels_
from granikv.kernels.prefix_cascade import PrefixConfig, _prefix_kernel, splits_for_units
from granikv.kernels.splits import SplitWorkspace

# the flat launch's tiles: small K/V tiles and two programs per SM (`target_programs`, which sets
# the splits), so a memory-bound deep level (few readers, a long run) keeps loads in flight beside
# the compute-bound head; fastest of harness.microbench.tree_passes' candidates on the
# [[1,4096],[4,4096],[4,2048]] tree at B = 256 (docs/generated/tree.md)
FLAT_CONFIG = PrefixConfig(block_m=64, block_n=64, num_warps=4, num_stages=2, min_split_len=256, target_programs=2)
PAD_TILE = 1 << 20  # a padding item's M tile: past every class's rows, so its program returns


@dataclass(frozen=True)
class FlatClass:
    """One class of the flat launch, host side."""

    members: list[int]  # batch indices
    length: int  # prefix tokens the class reads
    where: int  # HOT slab: first slot; row form: flat slot-table position (row * columns + start)
    rows: bool  # True: keys through the flat slot table; False: the slab [where, where + length)
    level: int  # 0 .. levels - 1


@dataclass(frozen=True)
class FlatLists:
    """The arrays the launch reads, host side (int64; the device form is int32)."""

    indptr: np.ndarray  # [C + 1]
    reqs: np.ndarray  # [R]
    lens: np.ndarray  # [C]
    where: np.ndarray  # [C]
    rows: np.ndarray  # [C] 1 = row form
    level: np.ndarray  # [C]
    item_class: np.ndarray  # [I]
    item_tile: np.ndarray  # [I]
    mask: np.ndarray  # [B] bit l: the request has a partial at level l
    levels: int


def flat_items_bound(class_sizes: list[tuple[int, int]], g: int, block_m: int) -> int:
    """Items a launch over (class count, largest class size) groups can have: the work-list
    length a CUDA graph is captured for."""
    return max(1, sum(c * -(-s * g // block_m) for c, s in class_sizes))


def flat_lists(classes: list[FlatClass], batch: int, levels: int, g: int, block_m: int,
               num_classes: int | None = None, num_reqs: int | None = None, num_items: int | None = None,
               pad_row_where: int = 0) -> FlatLists:
    """The launch's arrays for `classes`, padded to the given sizes (a graph's static layout):
    padding classes are empty (they read nothing), padding items point past every class's rows."""
    nc = max(1, len(classes)) if num_classes is None else num_classes
    if len(classes) > nc:
        raise ValueError(f"{len(classes)} classes do not fit a layout of {nc}")
    indptr = np.zeros(nc + 1, dtype=np.int64)
    sizes = [len(c.members) for c in classes]
    indptr[1:len(sizes) + 1] = np.cumsum(sizes)
    indptr[len(sizes) + 1:] = indptr[len(sizes)] if sizes else 0
    flat = [i for c in classes for i in c.members]
    nr = max(1, len(flat)) if num_reqs is None else num_reqs
    if len(flat) > nr:
        raise ValueError(f"{len(flat)} class members do not fit a layout of {nr}")
    reqs = np.zeros(nr, dtype=np.int64)
    reqs[:len(flat)] = flat
    lens = np.zeros(nc, dtype=np.int64)
    where = np.full(nc, pad_row_where, dtype=np.int64)
    rows = np.ones(nc, dtype=np.int64)
    level = np.zeros(nc, dtype=np.int64)
    mask = np.zeros(batch, dtype=np.int64)
    items: list[tuple[int, int, int]] = []
    for ci, c in enumerate(classes):
        if not 0 <= c.level < levels:
            raise ValueError(f"class level {c.level} outside 0..{levels - 1}")
        lens[ci], where[ci], rows[ci], level[ci] = c.length, c.where, int(c.rows), c.level
        for i in c.members:
            if mask[i] >> c.level & 1:
                raise ValueError(f"request {i} is in two classes of level {c.level}")
            mask[i] |= 1 << c.level
        items += [(-c.length, ci, t) for t in range(-(-len(c.members) * g // block_m))]
    items.sort()  # longest runs first: the launch ends on short items
    ni = max(1, len(items)) if num_items is None else num_items
    if len(items) > ni:
        raise ValueError(f"{len(items)} work items do not fit a layout of {ni}")
    item_class = np.zeros(ni, dtype=np.int64)
    item_tile = np.full(ni, PAD_TILE, dtype=np.int64)
    for j, (_, ci, t) in enumerate(items):
        item_class[j], item_tile[j] = ci, t
    return FlatLists(indptr, reqs, lens, where, rows, level, item_class, item_tile, mask, levels)


@dataclass(frozen=True)
class FlatClasses:
    """Device form of a flat launch (int32 tensors) and the flat [N, 1] view of the slot table
    the row-form classes read."""

    indptr: torch.Tensor
    reqs: torch.Tensor
    lens: torch.Tensor
    where: torch.Tensor
    rows: torch.Tensor
    level: torch.Tensor
    item_class: torch.Tensor
    item_tile: torch.Tensor
    mask: torch.Tensor
    slot_table: torch.Tensor
    levels: int

    @staticmethod
    def from_lists(lists: FlatLists, slot_table: torch.Tensor) -> FlatClasses:
        dev = slot_table.device

        def i32(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(dev)

        return FlatClasses(i32(lists.indptr), i32(lists.reqs), i32(lists.lens), i32(lists.where), i32(lists.rows),
                           i32(lists.level), i32(lists.item_class), i32(lists.item_tile), i32(lists.mask),
                           slot_table.reshape(-1, 1), lists.levels)

    @property
    def num_items(self) -> int:
        return self.item_class.numel()


def flat_max_splits(num_items: int, num_kv_heads: int, device, cfg: PrefixConfig = FLAT_CONFIG) -> int:
    """Split count of a flat launch from its work-list length (host, shapes only)."""
    return splits_for_units(max(1, num_items * num_kv_heads), cfg.target_programs * num_sms(device),
                            cfg.max_splits_cap)


def prefix_flat_(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, flat: FlatClasses,
                 sm_scale: float, out: torch.Tensor, lse: torch.Tensor, cfg: PrefixConfig | None = None,
                 max_splits: int | None = None) -> None:
    """Every flat class's members against its run, merged by LSE into (out, lse) in place — the
    suffix decode's result for every request of the batch (q [B, Hq, d])."""
    cfg = cfg or FLAT_CONFIG
    hkv, d = check_cache(k_cache, v_cache)
    bsz, hq, dq = q.shape
    if dq != d or hq % hkv:
        raise ValueError(f"q {tuple(q.shape)} does not match cache heads {hkv} / dim {d}")
    if bsz == 0 or flat.levels == 0:
        return
    if q.stride(2) != 1:
        q = q.contiguous()
    g = hq // hkv
    splits = max_splits or flat_max_splits(flat.num_items, hkv, q.device, cfg)
    ws = SplitWorkspace.allocate(flat.levels * bsz, hq, splits, d, q.device)
    table = flat.slot_table
    _prefix_kernel[(flat.num_items, hkv, splits)](
        q, k_cache, v_cache, k_cache, v_cache, flat.indptr, flat.reqs, flat.lens, flat.where, flat.rows, table,
        out, lse, ws.o, ws.lse, flat.item_class, flat.item_tile, flat.level,
        sm_scale * LOG2E, splits, 1, bsz,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        table.stride(0),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        ws.o.stride(0), ws.o.stride(1), ws.o.stride(2), ws.lse.stride(0), ws.lse.stride(1),
        G=g, D=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        MIN_SPLIT_LEN=cfg.min_split_len, DIRECT=False,
        SLAB=False, USE_TMA=False, UPCAST=upcast_flag(q), PREC=dot_precision(q), FLAT=True,
        num_warps=cfg.num_warps, num_stages=stages_for(cfg.num_stages, q),
    )
    merge_levels_(out, lse, ws, flat.mask, flat.levels, splits)


__all__ = ["FLAT_CONFIG", "FlatClass", "FlatClasses", "FlatLists", "flat_items_bound", "flat_lists", "flat_max_splits",
           "prefix_flat_"]
