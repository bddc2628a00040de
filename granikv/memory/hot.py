"""HOT pool: one contiguous slab per shared prefix (paper §3.2).

A prefix of length Lp lives in slots `[base, base+Lp)`, so per layer its K is the strided view
`K[layer][base:base+Lp]` and the dense prefix pass reads it with no gather. Placement is first-fit
over a sorted list of free ranges; a released slab's range is merged with its free neighbours, so
free space never splinters into unusable pieces by itself, and a slab is exactly Lp slots (no
internal fragmentation).

Two counts keep a slab alive:
- `refcount`: holders that read it now (a request admitted onto it, a locked radix node, a pending
  promotion). At zero the slab is *cached*: it still holds a prefix a later request may reuse.
- `node_refs`: radix nodes pointing into it. A node split inside a slab makes two nodes point into
  the same slab; the range is released only when no node and no holder is left.
Cached slabs are evicted LRU under pressure through a callback that drops their radix nodes.

Free HOT slots are lent one by one to the COLD pool under suffix pressure (from the top of the
region, so the low end stays contiguous for slabs) and recorded as lent, so they are never handed
out as slab space; they come back when COLD frees them.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class Slab:
    id: int
    base: int
    length: int
    refcount: int = 0
    node_refs: int = 0

    @property
    def end(self) -> int:
        return self.base + self.length

    def contains(self, slot: int) -> bool:
        return self.base <= slot < self.end


class HotPool:
    """Contiguous-slab allocator over slots `[start, start+size)`."""

    def __init__(self, start: int, size: int):
        if start < 1 or size < 0:
            raise ValueError(f"bad HOT region start={start} size={size} (slot 0 is reserved)")
        self.start, self.size = start, size
        self.end = start + size
        # Free ranges [fs[i], fe[i]), sorted, disjoint, never adjacent (always coalesced).
        self._fs = np.array([start] if size else [], dtype=np.int64)
        self._fe = np.array([self.end] if size else [], dtype=np.int64)
        self._lent = np.zeros(size, dtype=bool)
        self._num_lent = 0
        self.slabs: dict[int, Slab] = {}
        self._cached: OrderedDict[int, Slab] = OrderedDict()  # refcount 0, LRU first
        self._ids = itertools.count(1)

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return int((self._fe - self._fs).sum())

    @property
    def num_lent(self) -> int:
        return self._num_lent

    @property
    def lendable(self) -> int:
        return self.num_free

    @property
    def slab_slots(self) -> int:
        return sum(s.length for s in self.slabs.values())

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def largest_free(self) -> int:
        return int((self._fe - self._fs).max()) if self._fs.size else 0

    def free_ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._fs.tolist(), self._fe.tolist()))

    def lent_slots(self) -> np.ndarray:
        return (np.flatnonzero(self._lent) + self.start).astype(np.int32)

    # ---- slabs -------------------------------------------------------------------------------
    def alloc_slab(self, length: int, evict: Callable[[Slab], None] | None = None,
                   may_evict: Callable[[Slab], bool] | None = None) -> Slab | None:
        """A slab of exactly `length` contiguous slots, held once by the caller (refcount 1).

        First-fit; if nothing fits, cached slabs (those `may_evict` accepts; default: all) are
        evicted LRU through `evict` (which must drop every radix node of the slab, releasing it)
        until one fits — but only when evicting them can make room: cached KV is never destroyed
        for an allocation that fails anyway. None if it does not fit: the caller places the prefix
        in COLD instead (paper B.10), no live slab is ever demoted.
        """
        if length < 1:
            raise ValueError("a slab holds at least one slot")
        if length > self.size:
            return None
        base = self._first_fit(length)
        if base is None and evict is not None:
            for victim in self._victims(length, may_evict):
                evict(victim)
                if victim.id in self.slabs:  # the callback did not release it: stop, never loop forever
                    raise RuntimeError(f"evict callback left slab {victim.id} allocated")
                base = self._first_fit(length)
                if base is not None:
                    break
        if base is None:
            return None
        self._take_range(base, base + length)
        slab = Slab(next(self._ids), base, length, refcount=1)
        self.slabs[slab.id] = slab
        return slab

    def acquire(self, slab: Slab) -> None:
        if slab.refcount == 0:
            self._cached.pop(slab.id, None)
        slab.refcount += 1

    def release(self, slab: Slab) -> int:
        """Drop one holder; returns the slots freed (the slab's length if this released it)."""
        if slab.refcount <= 0:
            raise ValueError(f"slab {slab.id} released more often than acquired")
        slab.refcount -= 1
        return self._settle(slab)

    def add_node_ref(self, slab: Slab) -> None:
        slab.node_refs += 1

    def drop_node_ref(self, slab: Slab) -> int:
        """A radix node stopped pointing into the slab; returns the slots freed (0 or its length)."""
        if slab.node_refs <= 0:
            raise ValueError(f"slab {slab.id} has no node reference to drop")
        slab.node_refs -= 1
        return self._settle(slab)

    def touch(self, slab: Slab) -> None:
        """Mark a cached slab as recently used (a radix match read it)."""
        if slab.id in self._cached:
            self._cached.move_to_end(slab.id)

    def cached_lru(self) -> list[Slab]:
        return list(self._cached.values())

    def slab_of(self, slot: int) -> Slab | None:
        for s in self.slabs.values():
            if s.contains(slot):
                return s
        return None

    def _settle(self, slab: Slab) -> int:
        if slab.refcount > 0:
            return 0
        if slab.node_refs > 0:
            if slab.id not in self._cached:  # newly cached: most recently used
                self._cached[slab.id] = slab
            return 0
        self._cached.pop(slab.id, None)
        del self.slabs[slab.id]
        self._insert_ranges(np.array([slab.base]), np.array([slab.end]))
        return slab.length

    # ---- lending to COLD ---------------------------------------------------------------------
    def lend(self, n: int) -> np.ndarray | None:
        """`n` individual free slots for the COLD pool, taken from the top of the region."""
        if n <= 0:
            return np.empty(0, dtype=np.int32)
        if n > self.num_free:
            return None
        parts = []
        need = n
        while need:
            s, e = int(self._fs[-1]), int(self._fe[-1])
            take = min(need, e - s)
            parts.append(np.arange(e - take, e, dtype=np.int32))
            if take == e - s:
                self._fs, self._fe = self._fs[:-1], self._fe[:-1]
            else:
                self._fe[-1] = e - take
            need -= take
        out = np.concatenate(parts)
        self._lent[out - self.start] = True
        self._num_lent += n
        return out

    def take_back(self, slots: np.ndarray) -> None:
        """COLD freed these lent slots: they are HOT free space again."""
        slots = np.sort(np.asarray(slots, dtype=np.int64))
        if slots.size == 0:
            return
        idx = slots - self.start
        if idx[0] < 0 or idx[-1] >= self.size or not self._lent[idx].all():
            raise ValueError("taking back slots that were not lent")
        if np.any(slots[1:] == slots[:-1]):
            raise ValueError("taking back the same slot twice")
        self._lent[idx] = False
        self._num_lent -= slots.size
        # Runs of consecutive slots become ranges.
        brk = np.flatnonzero(np.diff(slots) != 1) + 1
        starts = slots[np.r_[0, brk]]
        ends = slots[np.r_[brk - 1, slots.size - 1]] + 1
        self._insert_ranges(starts, ends)

    def _victims(self, length: int, may_evict: Callable[[Slab], bool] | None) -> list[Slab]:
        """The shortest LRU-first run of evictable cached slabs whose ranges, once free, leave a
        free range of `length` slots; empty when evicting all of them would not (a slab between
        two live ones frees nothing usable). A dry run over the free list: nothing changes."""
        starts, ends = self._fs.tolist(), self._fe.tolist()
        out: list[Slab] = []
        for slab in self._cached.values():
            if may_evict is not None and not may_evict(slab):
                continue
            out.append(slab)
            starts.append(slab.base)
            ends.append(slab.end)
            if _longest_run(starts, ends) >= length:
                return out
        return []

    # ---- free-range list ---------------------------------------------------------------------
    def _first_fit(self, length: int) -> int | None:
        ok = np.flatnonzero(self._fe - self._fs >= length)
        return int(self._fs[ok[0]]) if ok.size else None

    def _take_range(self, s: int, e: int) -> None:
        i = int(np.searchsorted(self._fs, s, side="right")) - 1
        fs, fe = int(self._fs[i]), int(self._fe[i])
        assert fs <= s and e <= fe, "taking a range that is not free"
        new_s, new_e = [], []
        if fs < s:
            new_s.append(fs)
            new_e.append(s)
        if e < fe:
            new_s.append(e)
            new_e.append(fe)
        self._fs = np.concatenate([self._fs[:i], np.array(new_s, dtype=np.int64), self._fs[i + 1 :]])
        self._fe = np.concatenate([self._fe[:i], np.array(new_e, dtype=np.int64), self._fe[i + 1 :]])

    def _insert_ranges(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Merge freed ranges into the free list, coalescing adjacent ones."""
        fs = np.concatenate([self._fs, starts.astype(np.int64)])
        fe = np.concatenate([self._fe, ends.astype(np.int64)])
        order = np.argsort(fs, kind="stable")
        fs, fe = fs[order], fe[order]
        if np.any(fs[1:] < fe[:-1]):
            raise ValueError("freeing a HOT range that is already free")
        keep = np.r_[True, fs[1:] != fe[:-1]]  # a range starting where the previous ends merges
        first = np.flatnonzero(keep)
        last = np.r_[first[1:] - 1, fs.size - 1]  # each merged group ends where its last range ends
        self._fs, self._fe = fs[first], fe[last]


def _longest_run(starts: list[int], ends: list[int]) -> int:
    """Longest contiguous run covered by disjoint ranges [starts[i], ends[i]) (adjacent ones merge)."""
    best, run_s, run_e = 0, None, None
    for s, e in sorted(zip(starts, ends)):
        if run_e is not None and s == run_e:
            run_e = e
        else:
            run_s, run_e = s, e
        best = max(best, run_e - run_s)
    return best
