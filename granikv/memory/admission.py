"""HOT admission: which prefix gets a slab (paper §3.2, B.10, and the promotion rule of
docs/design.md, "Storage").

Two ways into HOT:
- explicit: a request names its shared prefix (`shared_prefix_len`); if that prefix is not cached
  the storage policy allocates a slab for it at admission and the prefill writes it there;
- promotion: a COLD prefix (a radix path root..node) read by >= `promote_min_refs` live requests
  and at least `min_prefix_for_hot` tokens long is copied once into a slab of free HOT space. The
  paper keeps COLD prefixes in COLD (B.10 "no promotion"); promotion is the hotness-aware
  refinement its Limitations name, off when `promote_min_refs` is 0.

Neither way destroys cached KV that LRU eviction would keep: a promotion never evicts a cached
slab, and an explicit prefix evicts only cached slabs in the cache's LRU tail (`alloc_slab`).
When the slabs cannot hold the working set of prefixes, the rest are served from COLD.

This module only decides and keeps the books. The engine performs the copy from a returned
`PromotionPlan` (src COLD slots -> dst slab range, every layer) and then commits it; the commit
re-points the radix nodes into the slab, and the storage policy re-points the slot-table rows of
the requests that already read the old COLD slots and frees those slots at once
(`GraniKVStorage.commit_promotion`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from granikv.memory.hot import HotPool, Slab
from granikv.memory.radix import COLD, HOT, Match, Node, RadixCache


@dataclass(frozen=True)
class AdmissionConfig:
    min_prefix_for_hot: int = 256  # shorter prefixes are not worth a slab (nor a copy)
    promote_min_refs: int = 2  # live readers that make a COLD prefix worth copying; 0 disables


@dataclass
class PromotionPlan:
    """Copy `src` (COLD slots of positions 0..length-1) into the slab range `dst`, every layer."""

    id: int
    node: Node  # deepest node of the promoted path; locked by the plan until commit/cancel
    slab: Slab  # destination, held by the plan
    src: np.ndarray  # int32

    @property
    def length(self) -> int:
        return self.slab.length

    @property
    def dst(self) -> np.ndarray:
        return np.arange(self.slab.base, self.slab.end, dtype=np.int32)


def hot_run(radix: RadixCache, match: Match) -> tuple[int, Slab | None]:
    """Length of the matched prefix that is one contiguous HOT range starting at position 0, and
    the slab holding its first token. The dense prefix pass can read exactly that much as a
    strided view."""
    run, slab, nxt = 0, None, None
    for x in radix.path(match.node):
        if x.kind != HOT or (nxt is not None and int(x.slots[0]) != nxt):
            break
        if slab is None:
            slab = x.slab
        run += len(x)
        nxt = int(x.slots[-1]) + 1
    return run, slab


def lru_tail_slabs(radix: RadixCache, window: int) -> set[int]:
    """Ids of the cached slabs all of whose radix nodes are among the first `window` slots that
    `RadixCache.evict` would free (unlocked leaves, least recently used first; a parent becomes
    a leaf once its children are gone). A dry run: nothing changes."""
    heap = [(x.last_access, x.id, x) for x in radix.nodes() if not x.children and x.lock_ref == 0]
    heapq.heapify(heap)
    children_left: dict[int, int] = {}
    nodes_seen: dict[int, int] = {}
    out: set[int] = set()
    freed = 0
    while heap and freed < window:
        _, _, x = heapq.heappop(heap)
        freed += len(x)
        if x.kind == HOT:
            sid = x.slab.id
            nodes_seen[sid] = nodes_seen.get(sid, 0) + 1
            if nodes_seen[sid] == x.slab.node_refs:
                out.add(sid)
        parent = x.parent
        if parent is not radix.root and parent.lock_ref == 0:
            left = children_left.get(parent.id, len(parent.children)) - 1
            children_left[parent.id] = left
            if left == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
    return out


class HotAdmission:
    """Decides HOT placement and promotions; owns the pending promotion plans."""

    def __init__(self, cfg: AdmissionConfig, radix: RadixCache, hot: HotPool,
                 evict_slab: Callable[[Slab], None]):
        self.cfg = cfg
        self.radix = radix
        self.hot = hot
        self._evict_slab = evict_slab
        self._ids = itertools.count(1)
        self.pending: dict[int, PromotionPlan] = {}
        self.promotions_committed = 0
        self.promotions_failed = 0

    def alloc_slab(self, length: int) -> Slab | None:
        """A slab for an explicit prefix; None means: fall back to COLD (B.10).

        Free HOT space first. Otherwise a cached slab is evicted only when it lies in the cache's
        LRU tail, within the first `length` slots that LRU eviction (`RadixCache.evict`, over HOT
        and COLD alike) would free: the KV that placing this prefix anywhere would push out
        first. Evicting the least recently used *slab* instead, while older COLD KV stays, drops
        a prefix that is still being reused: with more prefixes than slabs and many requests
        per prefix (Table 20 at k=64) the victim's next request recomputes it into a new slab,
        evicting the next slab (at B=128 this cost 1.3x paged's prefill). A stale slab that
        nothing has read for longer than the rest of the cache is still replaced.
        """
        slab = self.hot.alloc_slab(length)
        if slab is not None or self.hot.num_cached == 0:
            return slab
        stale = lru_tail_slabs(self.radix, length)
        if not stale:
            return None
        return self.hot.alloc_slab(length, evict=self._evict_slab, may_evict=lambda s: s.id in stale)

    def promotion_slab(self, length: int) -> Slab | None:
        """A slab for a promotion from free HOT space only, never by evicting a cached slab.

        The prefix being promoted is already cached (in COLD) and is read from there until the
        copy commits, so evicting a cached slab to make room trades a reusable prefix for a
        faster read of one already served. Under KV pressure with many prefixes (Table 20, k=64: every
        request's prefix is in COLD or a cached slab when a batch drains) each such eviction
        forces a recompute of the evicted prefix, whose new slab evicts the next one: a cascade
        that more than doubled the evicted KV. A COLD prefix stays COLD (B.10) until HOT space
        frees up by itself (LRU eviction of stale slabs under COLD pressure, or released slabs).
        """
        return self.hot.alloc_slab(length)

    def consider(self, match: Match, explicit_len: int | None) -> PromotionPlan | None:
        """After a request locked `match`, decide whether a COLD prefix it reads should be copied.

        explicit_len: the request named its shared prefix and the whole of it is cached in COLD,
        so it is promoted on first sight (one live reader is enough).
        """
        if explicit_len is not None:
            if explicit_len < 1 or explicit_len > match.length:
                return None
            node, min_refs = self.radix.node_ending_at(match.node, explicit_len), 1
        else:
            if self.cfg.promote_min_refs <= 0:
                return None
            node, min_refs = match.node, self.cfg.promote_min_refs
        if node is self.radix.root or node.promoting or node.lock_ref < min_refs:
            return None
        path = self.radix.path(node)
        length = sum(len(x) for x in path)
        if length < max(1, self.cfg.min_prefix_for_hot if explicit_len is None else 1):
            return None
        if any(x.kind != COLD or x.promoting for x in path):
            return None
        slab = self.promotion_slab(length)
        if slab is None:
            self.promotions_failed += 1
            return None
        self.radix.lock(node)
        for x in path:
            x.promoting = True
        plan = PromotionPlan(next(self._ids), node, slab, np.concatenate([x.slots for x in path]))
        self.pending[plan.id] = plan
        return plan

    def commit(self, plan: PromotionPlan) -> list[tuple[int, np.ndarray]]:
        """The copy is done: the radix path now lives in the slab. Returns (position, old COLD
        slots) per node for the caller to re-point its readers and free."""
        del self.pending[plan.id]
        old = self.radix.repoint_to_slab(plan.node, plan.slab)
        self.radix.unlock(plan.node)
        self.hot.release(plan.slab)  # the nodes hold it now
        self.promotions_committed += 1
        return old

    def cancel(self, plan: PromotionPlan) -> None:
        del self.pending[plan.id]
        for x in self.radix.path(plan.node):
            x.promoting = False
        self.radix.unlock(plan.node)
        self.hot.release(plan.slab)
