"""Storage: the one object the scheduler talks to about KV slots, one implementation per system.

`paged`/`cascade`: a PagedPool of P-slot pages over every slot, prefixes shared page-aligned
through the radix cache. `granikv`: a HotPool of contiguous slabs over `[1, 1+N_hot)` and a
token-level ColdPool over the rest; explicit or promoted shared prefixes go to slabs. With
`cold_page_size` > 1 (the Table 18 ablation) COLD is a PagedPool over its region instead: no
lending, no promotion, and only HOT prefixes are cached.

The facade keeps a host slot table `table[row, pos]` (int32, `max_running × max_context`) — the
host mirror of the engine's `req_to_slot` — plus, per row, the flat table index of its last
position (`seq_lens` is derived from it). Decode growth for a whole batch (`grow_batch`) is a
handful of numpy operations on these arrays, with no per-request Python work; an admission costs
one compare of the prompt against the cached prefix and one write of its private slots (the
prefix part of a row is rewritten only when it differs from what the row already holds).

Slot ownership (checked by `audit`): every usable slot is free, or owned by exactly one of a radix
node (HOT nodes: their slab owns the whole range), a request (its private positions), a retired
promotion source still read by live requests, or a slab.

Lifecycle of a request:
    adm = storage.admit(prompt, shared_prefix_len)    # None: wait or retract something
    ... prefill writes positions adm.cached_len.. of adm.slots ...
    storage.cache_prompt(adm, prompt)                  # optional: let later requests reuse it now
    slots = storage.grow_batch(rows)                   # one decode slot per running row
    storage.finish(adm, tokens_with_kv)                # or storage.abort(adm)
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from granikv.memory.admission import AdmissionConfig, HotAdmission, PromotionPlan, hot_run
from granikv.memory.cold import ColdPool
from granikv.memory.hot import HotPool, Slab
from granikv.memory.paged import PagedPool
from granikv.memory.radix import COLD, HOT, PAGED, Node, RadixCache, Segment

if TYPE_CHECKING:
    from granikv.config import EngineConfig


# One-segment layouts of any inserted length (RadixCache.insert clips segments to the tokens).
_ALL_PAGED = [Segment(0, 1 << 62, PAGED)]
_ALL_COLD = [Segment(0, 1 << 62, COLD)]


@dataclass(frozen=True)
class PrefixInfo:
    """The request's prefix is `prefix_len` tokens in one contiguous HOT range from `hot_base`."""

    hot_base: int
    prefix_len: int
    slab_id: int


@dataclass
class RetiredBlock:
    """COLD slots of a promoted prefix, kept until the requests that still read them end."""

    slots: np.ndarray
    readers: int


@dataclass(eq=False)
class Admission:
    """Handle of one admitted request. `slots` are the prompt's slots; positions `< cached_len`
    already hold KV, so prefill starts at `cached_len`."""

    row: int
    # A view of the host slot-table row (do not write to it), valid until finish/abort: the row
    # is reused by the next admission then. Not a copy on purpose: 256 live 64 KB copies cost more host time
    # per admission (allocation, page faults) than the whole decode step's bookkeeping.
    slots: np.ndarray
    cached_len: int
    prefix: PrefixInfo | None
    prompt_len: int
    # bookkeeping (private to the storage policy)
    node: Node = field(repr=False, default=None)  # deepest locked radix node
    node_end: int = 0  # sequence position just past `node` (splits never move it)
    slab: Slab | None = field(repr=False, default=None)  # slab held privately (not yet cached)
    closed: list[tuple[int, int]] = field(repr=False, default_factory=list)  # private ranges
    tail_start: int = 0  # positions [tail_start, seq_len) are private too
    retired: list[RetiredBlock] = field(repr=False, default_factory=list)
    done: bool = False


@dataclass
class StorageStats:
    admits: int = 0
    admit_failures: int = 0
    cached_tokens: int = 0
    hot_admits: int = 0  # slabs allocated for explicit prefixes
    hot_hits: int = 0  # admissions whose prefix was already in a slab
    hot_fallbacks: int = 0  # explicit prefixes that could not get a slab (placed in COLD, B.10)
    promotions_planned: int = 0
    evictions: int = 0  # eviction calls that freed something
    evicted_slots: int = 0


class Storage:
    """Shared machinery; `PagedStorage` and `GraniKVStorage` choose pools and prefix placement."""

    system = "base"

    def __init__(self, num_slots: int, max_running: int, max_context: int, page_size: int,
                 alloc_pool: ColdPool | PagedPool, radix: RadixCache):
        self.num_slots = num_slots
        self.max_running = max_running
        self.max_context = max_context
        self.P = page_size
        self.pool = alloc_pool
        self.radix = radix
        self.table = np.zeros((max_running, max_context), dtype=np.int32)
        self.table.fill(0)  # touch every page now, not on a request's first admission (page faults)
        # Per row, the flat table index of its last position: row·max_context + seq_len - 1 (a
        # free row: row·max_context - 1). grow_batch gathers, bumps and scatters this one array,
        # and reads each row's last slot from the table itself (the row's next slot is the one
        # after it, on the same page unless that page is full), so no separate length or
        # next-slot arrays need updating per step. `seq_lens` is derived from it.
        self._rowbase = np.arange(max_running, dtype=np.int64) * max_context
        self._lastpos = self._rowbase - 1
        self._flat = self.table.reshape(-1)  # a view
        self._lane = np.arange(page_size, dtype=np.int32)
        self._one = np.int32(1)
        self._pow2 = page_size & (page_size - 1) == 0
        self._page_mask = np.int32(page_size - 1)
        # An upper bound on every row's seq_len (free rows: 0), so grow_batch checks max_context
        # with one comparison instead of a max over the batch; recomputed when it reaches the limit.
        self._len_bound = 0
        # What the previous admission wrote into each row's prefix positions: (part arrays, their
        # total length). The next admission whose matched prefix is the very same node slot arrays
        # (a shared prefix, admitted into a row freed by a request that shared it) finds those
        # positions already holding its slots and does not rewrite them (64 KB for 16K tokens).
        # Positions below the private range are written nowhere else, and slot arrays of nodes are
        # never modified in place (splits and promotions assign new arrays), so identity suffices.
        self._row_prefix: list[tuple[tuple[np.ndarray, ...], int] | None] = [None] * max_running
        self._free_rows = list(range(max_running - 1, -1, -1))
        self.live: dict[int, Admission] = {}
        self.counters = StorageStats()
        self._evict_frees_tokens = True  # evicting cached nodes returns slots to `pool`

    # ---- pool plumbing -------------------------------------------------------------------------
    def _release(self, kind: str, slots: np.ndarray) -> int:
        """Radix callback: slots of an evicted COLD/PAGED node go back to their pool."""
        if kind == PAGED:
            pages = slots[:: self.P] // self.P
            self.pool.free_pages(pages)
            return pages.size * self.P
        self.pool.free(slots)  # COLD (granikv): lent HOT slots go home
        return len(slots)

    def _free_positions(self, row: int, ranges: list[tuple[int, int]]) -> None:
        """Free the private slots of positions [a, b) of a row. Every private range starts on a
        page boundary, so its pages are the slots at every P-th position."""
        parts = [self.table[row, a : b : self.P] for a, b in ranges if a < b]
        if not parts:
            return
        first = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if self.P == 1:
            self.pool.free_pages(first)  # page id == slot
        else:
            self.pool.free_pages_of(first)

    def _alloc_pages(self, n: int) -> np.ndarray | None:
        if n == 0:
            return np.empty(0, dtype=np.int32)
        pages = self.pool.alloc_pages(n)
        if pages is None and self._evict_frees_tokens:
            self.evict(n * self.P - self.pool.available)
            pages = self.pool.alloc_pages(n)
        return pages

    def _alloc_tokens(self, n: int) -> np.ndarray | None:
        """Slots for n tokens on fresh pages, filled in page order."""
        pages = self._alloc_pages(-(-n // self.P))
        if pages is None:
            return None
        if self.P == 1:
            return pages
        return (pages[:, None] * self.P + np.arange(self.P, dtype=np.int32)).ravel()[:n]

    # ---- public API ----------------------------------------------------------------------------
    def evict(self, n: int) -> int:
        """Free at least n slots from the unlocked cache if possible; returns slots freed."""
        if n <= 0:
            return 0
        freed = self.radix.evict(n)
        if freed:
            self.counters.evictions += 1
            self.counters.evicted_slots += freed
        return freed

    def flush(self) -> int:
        """Drop every unlocked cached prefix (POST /flush_cache)."""
        return self.evict(self.num_slots)

    def available(self) -> int:
        """Slots `grow`/`admit` can take right now without evicting."""
        return self.pool.available

    def evictable(self) -> int:
        return self.radix.evictable_slots()

    def admit(self, tokens, shared_prefix_len: int | None = None) -> Admission | None:
        """Match the prompt's cached prefix, lock it, allocate slots for the rest.

        None when there is no free row or no space even after evicting unlocked cache; nothing
        is changed then (apart from what the eviction dropped).
        """
        tokens = np.asarray(tokens, dtype=np.int32)
        L = len(tokens)
        if not 1 <= L <= self.max_context:
            raise ValueError(f"prompt length {L} outside [1, {self.max_context}]")
        if not self._free_rows:
            self.counters.admit_failures += 1
            return None
        adm = self._admit(tokens, shared_prefix_len)
        if adm is None:
            self.counters.admit_failures += 1
            return None
        self.counters.admits += 1
        self.counters.cached_tokens += adm.cached_len
        self.live[adm.row] = adm
        return adm

    def _place(self, tokens: np.ndarray, node: Node, prefix_parts: list[np.ndarray], start: int,
               prefix: PrefixInfo | None, slab: Slab | None) -> Admission | None:
        """Lock `node`, allocate positions [start, L), fill the row. Undoes the lock on failure."""
        L = len(tokens)
        self.radix.lock(node)
        row = self._free_rows[-1]
        if not self._fill_private(row, start, L):  # never empty: start <= L-1
            self.radix.unlock(node)
            return None
        self._free_rows.pop()
        parts = tuple(prefix_parts)
        prev = self._row_prefix[row]
        if (prev is None or prev[1] != start or len(prev[0]) != len(parts)
                or not all(map(operator.is_, prev[0], parts))):
            pos = 0
            for part in parts:
                self.table[row, pos : pos + len(part)] = part
                pos += len(part)
            self._row_prefix[row] = (parts, start)
        self._lastpos[row] = row * self.max_context + L - 1
        if L > self._len_bound:
            self._len_bound = L
        cached = start if slab is None else 0
        # positional: row, slots, cached_len, prefix, prompt_len, node, node_end, slab, closed, tail_start
        return Admission(row, self.table[row, :L], cached, prefix, L, node, cached, slab, [], start)

    def _fill_private(self, row: int, start: int, L: int) -> bool:
        """Fresh pages for positions [start, L) of `row`, written into the table in page order
        (sets the row's next slot); False, with nothing changed, when there is no space. With
        P > 1 the last page is written whole: table positions past L are unspecified until grown
        into, and growth writes exactly these slots there."""
        n, P = L - start, self.P
        k = -(-n // P)
        end = start + k * P
        if end <= self.max_context:  # the pool writes the slots straight into the row
            dst = self.table[row, start:end]
            if self.pool.alloc_into(dst):
                return True
            if not self._evict_frees_tokens:
                return False
            self.evict(k * P - self.pool.available)
            return self.pool.alloc_into(dst)
        pages = self._alloc_pages(k)  # the last page reaches past max_context
        if pages is None:
            return False
        self.table[row, start:L] = (pages[:, None] * P + self._lane).ravel()[:n]
        return True

    def _admit(self, tokens: np.ndarray, shared_prefix_len: int | None) -> Admission | None:
        m = self.radix.match_prefix(tokens[: len(tokens) - 1])  # prefill computes >= 1 token
        return self._place(tokens, m.node, m.parts, m.length, None, None)

    def grow(self, adm: Admission, n: int) -> np.ndarray | None:
        """n more slots at the end of one request (decode or a chunk); None if out of space."""
        r = adm.row
        L = self._seq_len(r)
        if L + n > self.max_context:
            raise ValueError(f"request would exceed max_context={self.max_context}")
        nxt = int(self.table[r, L - 1]) + 1 if L and self.P > 1 else 0  # after the row's last slot
        take = min((-nxt) % self.P, n)  # room left in the last page
        head = np.arange(nxt, nxt + take, dtype=np.int32)
        if n > take:
            tail = self._alloc_tokens(n - take)
            if tail is None:
                return None
            slots = np.concatenate([head, tail])
        else:
            slots = head
        self.table[r, L : L + n] = slots
        self._lastpos[r] += n
        if L + n > self._len_bound:
            self._len_bound = L + n
        return slots

    def grow_batch(self, rows: np.ndarray) -> np.ndarray | None:
        """One decode slot for each row in `rows` (int array); all or nothing. Returns the slots
        (int32) in the order of `rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._len_bound >= self.max_context:  # some row may be full: check exactly
            lens = self.seq_lens
            self._len_bound = int(lens.max())
            if rows.size and int(lens[rows].max()) >= self.max_context:
                raise ValueError(f"a request would exceed max_context={self.max_context}")
        w = self._lastpos[rows]
        if self.P == 1:
            slots = self._alloc_pages(rows.size)
            if slots is None:
                return None
        else:
            # In-place numpy ops with numpy scalars: a Python int operand or a fresh result array
            # costs about a microsecond more per operation on 256 elements.
            slots = self._flat[w]  # each row's last slot; the next one follows it on its page
            slots += self._one
            need = np.logical_not(slots & self._page_mask if self._pow2 else slots % self.P)
            pages = self._alloc_pages(int(np.count_nonzero(need)))  # rows whose page is full
            if pages is None:
                return None
            pages *= self.P
            slots[need] = pages
        w += 1
        self._flat[w] = slots  # table[rows, seq_lens[rows]]
        self._lastpos[rows] = w
        self._len_bound += 1
        return slots

    @property
    def seq_lens(self) -> np.ndarray:
        """Every row's sequence length (0: free row), a fresh array."""
        out = self._lastpos - self._rowbase
        out += 1
        return out

    def _seq_len(self, row: int) -> int:
        return int(self._lastpos[row]) - row * self.max_context + 1

    def seq_len(self, adm: Admission) -> int:
        return self._seq_len(adm.row)

    def _segments(self, adm: Admission, n: int) -> list[Segment]:
        return _ALL_PAGED  # insert clips segments to the inserted length

    def _cacheable(self, adm: Admission, n: int) -> int:
        """How many of the first n positions go into the radix tree (paged: whole pages)."""
        return n - n % self.P

    def cache_prompt(self, adm: Admission, tokens) -> int:
        """Insert the first len(tokens) positions (their KV must be written) into the radix tree
        now, so requests admitted later reuse them; the request keeps reading its own slots.
        Returns the number of positions now cached (page-aligned)."""
        tokens = np.asarray(tokens, dtype=np.int32)
        n = self._cacheable(adm, min(len(tokens), self._seq_len(adm.row)))
        if n <= adm.node_end:
            return 0
        # radix._insert: int32 arrays of equal length, n page-aligned by _cacheable
        dup, node = self.radix._insert(tokens[:n], self.table[adm.row, :n], self._segments(adm, n),
                                       adm.node, adm.node_end)
        if dup > adm.tail_start:  # our copies of positions someone else cached meanwhile stay ours
            adm.closed.append((adm.tail_start, dup))
        if n > adm.tail_start:
            adm.tail_start = n
        # Move the request's lock down to `node` (below adm.node: insert started there): the
        # path root..adm.node stays locked as it was, only the nodes below it get a reference.
        self.radix.lock(node, above=adm.node)
        adm.node, adm.node_end = node, n
        return n

    def finish(self, adm: Admission, tokens) -> None:
        """The request ended: cache the KV of `tokens` (those whose KV exists: prompt + outputs
        already forwarded; paged: the page-aligned part), unlock, free everything else."""
        if adm.done:
            raise ValueError("request already finished")
        tokens = np.asarray(tokens, dtype=np.int32)
        r = adm.row
        L = self._seq_len(r)
        n = self._cacheable(adm, min(len(tokens), L))
        dup = n  # n <= node_end: all of it is cached already (the locked path holds it)
        if n > adm.node_end:
            dup, _ = self.radix._insert(tokens[:n], self.table[r, :n], self._segments(adm, n),
                                        adm.node, adm.node_end)
        # Private positions below `dup` duplicate the tree; those >= n are not cached.
        frees = []
        for a, b in (adm.closed + [(adm.tail_start, L)] if adm.closed else ((adm.tail_start, L),)):
            frees += [(a, min(b, dup)), (max(a, n), b)]
        self._free_positions(r, frees)
        self._end(adm)

    def abort(self, adm: Admission) -> None:
        """Drop a request (retracted or cancelled): free all it owns, cache nothing."""
        if adm.done:
            raise ValueError("request already finished")
        r = adm.row
        self._free_positions(r, adm.closed + [(adm.tail_start, self._seq_len(r))])
        self._end(adm)

    def _end(self, adm: Admission) -> None:
        self.radix.unlock(adm.node)
        if adm.slab is not None:
            self._hot().release(adm.slab)
            adm.slab = None
        if adm.retired:
            for blk in adm.retired:
                blk.readers -= 1
                if blk.readers == 0:
                    self.pool.free(blk.slots)
            adm.retired.clear()
        adm.done = True
        r = adm.row
        del self.live[r]
        self._lastpos[r] = r * self.max_context - 1  # seq_len 0
        self._free_rows.append(r)

    def _hot(self) -> HotPool:
        raise RuntimeError(f"{self.system} has no HOT pool")

    # ---- promotions (granikv only; no-ops elsewhere) --------------------------------------------
    def take_promotions(self) -> list[PromotionPlan]:
        return []

    # ---- introspection -------------------------------------------------------------------------
    def stats(self) -> dict:
        c = self.counters
        return {
            "system": self.system,
            "num_slots": self.num_slots,
            "live_requests": len(self.live),
            "cached_slots": self.radix.cached_slots,
            **{k: getattr(c, k) for k in c.__dataclass_fields__},
        }

    def audit(self) -> None:
        """Check every ownership and reference-count invariant; raises AssertionError. O(slots):
        for tests and debugging, never on the hot path."""
        owner = np.zeros(self.num_slots, dtype=np.int32)  # how many owners each slot has
        usable = self._usable_mask()

        def own(slots):
            np.add.at(owner, np.asarray(slots, dtype=np.int64), 1)

        expected_locks: dict[int, int] = {}
        for adm in self.live.values():
            r = adm.row
            L = self._seq_len(r)
            priv = [self.table[r, a:b] for a, b in adm.closed + [(adm.tail_start, L)]]
            priv = np.concatenate(priv)
            if self.P > 1:
                if priv.size:
                    own(self.pool.slots_of(np.unique(priv // self.P)))
            else:
                own(priv)
            x = adm.node
            while x is not self.radix.root:
                expected_locks[x.id] = expected_locks.get(x.id, 0) + 1
                x = x.parent
            seen = set()
            for blk in adm.retired:
                assert id(blk) not in seen
                seen.add(id(blk))
        for x in self.radix.nodes():
            if x.kind != HOT:
                own(x.slots)
        own(self._free_slots())
        self._audit_extra(own, expected_locks)
        for x in self.radix.nodes():
            assert x.lock_ref == expected_locks.get(x.id, 0), f"{x}: expected {expected_locks.get(x.id, 0)}"
            assert len(x.slots) == len(x.key) > 0
            if x.kind == PAGED:
                assert len(x) % self.P == 0 and int(x.slots[0]) % self.P == 0
        assert owner[0] == 0, "slot 0 handed out"
        bad = np.flatnonzero(owner[usable] != 1)
        assert bad.size == 0, f"slots owned {owner[usable][bad[:5]]} times: {np.flatnonzero(usable)[bad[:5]]}"
        assert not owner[~usable].any(), "unusable slot handed out"
        assert len(self._free_rows) + len(self.live) == self.max_running

    def _usable_mask(self) -> np.ndarray:
        m = np.zeros(self.num_slots, dtype=bool)
        m[self.pool.first_page * self.P : self.pool.end_page * self.P] = True
        return m

    def _free_slots(self) -> np.ndarray:
        return self.pool.free_slots()

    def _audit_extra(self, own, expected_locks) -> None:
        pass


class PagedStorage(Storage):
    """`paged` and `cascade`: P-slot pages everywhere, page-aligned prefix sharing."""

    def __init__(self, system: str, num_slots: int, page_size: int = 16, max_running: int = 256,
                 max_context: int = 32768, check: bool = False):
        pool = PagedPool(1, num_slots, page_size, check=check)
        radix = RadixCache(free=self._release, page_size=page_size)
        super().__init__(num_slots, max_running, max_context, page_size, pool, radix)
        self.system = system

    def stats(self) -> dict:
        s = super().stats()
        s.update(page_size=self.P, pages_total=self.pool.num_pages, pages_free=self.pool.num_free_pages,
                 paged_used_slots=self.pool.num_used)
        return s


class GraniKVStorage(Storage):
    """HOT slabs for shared prefixes + token-level COLD for everything else."""

    system = "granikv"

    def __init__(self, num_slots: int, hot_fraction: float = 0.2, max_running: int = 256,
                 max_context: int = 32768, admission: AdmissionConfig | None = None, check: bool = False,
                 cold_page_size: int = 1):
        n_hot = int(hot_fraction * (num_slots - 1))
        self.hot = HotPool(1, n_hot)
        # cold_page_size > 1 is the COLD page-size ablation (paper Table 18): COLD hands out
        # P-slot pages, borrows nothing from HOT, and only HOT prefixes are cached (a page may
        # hold tokens of a cached node and of a request, which token-level eviction cannot split).
        self.cold_page_size = cold_page_size
        if cold_page_size == 1:
            pool = ColdPool(1 + n_hot, num_slots, lender=self.hot, check=check)
        else:
            pool = PagedPool(1 + n_hot, num_slots, cold_page_size, check=check)
        radix = RadixCache(free=self._release, hot=self.hot, page_size=1)
        super().__init__(num_slots, max_running, max_context, cold_page_size, pool, radix)
        self._evict_frees_tokens = cold_page_size == 1  # else the tree holds HOT slabs only
        self.policy = HotAdmission(admission or AdmissionConfig(), radix, self.hot, self._evict_slab)
        self._new_plans: list[PromotionPlan] = []

    def _hot(self) -> HotPool:
        return self.hot

    def _evict_slab(self, slab: Slab) -> None:
        freed = self.radix.evict_slab(slab)
        self.counters.evictions += 1
        self.counters.evicted_slots += freed

    def _admit(self, tokens: np.ndarray, shared_prefix_len: int | None) -> Admission | None:
        L = len(tokens)
        m = self.radix.match_prefix(tokens[: L - 1])
        run, run_slab = hot_run(self.radix, m)
        Lp = None if shared_prefix_len is None else min(int(shared_prefix_len), L - 1)
        if Lp is not None and Lp < 1:
            Lp = None
        if Lp is not None and run < Lp and m.length < Lp:
            # The named prefix is not cached whole: give it a fresh slab (recomputing any partly
            # cached head, so the prefix is one contiguous range), or fall back to COLD (B.10).
            self.radix.lock(m.node)  # evicting cached slabs must not take the match we may fall back on
            slab = self.policy.alloc_slab(Lp)
            self.radix.unlock(m.node)
            if slab is not None:
                slab_slots = np.arange(slab.base, slab.end, dtype=np.int32)
                adm = self._place(tokens, self.radix.root, [slab_slots], Lp,
                                  PrefixInfo(slab.base, Lp, slab.id), slab)
                if adm is None:
                    self.hot.release(slab)
                    return None
                self.counters.hot_admits += 1
                return adm
            self.counters.hot_fallbacks += 1
        # A HOT run counts as this request's prefix when it covers the named prefix, or (no name)
        # when it is long enough to be worth a prefix pass; a few tokens shared by accident (a BOS)
        # are read through the slot table like any other cached token.
        worth = Lp if Lp is not None else self.policy.cfg.min_prefix_for_hot
        prefix = PrefixInfo(int(m.parts[0][0]), run, run_slab.id) if run > 0 and run >= worth else None
        adm = self._place(tokens, m.node, m.parts, m.length, prefix, None)
        if adm is None:
            return None
        if prefix is not None:
            self.counters.hot_hits += 1
        elif Lp is None or m.length >= Lp:
            plan = self.policy.consider(m, Lp if Lp is not None and m.length >= Lp else None)
            if plan is not None:
                self.counters.promotions_planned += 1
                self._new_plans.append(plan)
        return adm

    def _cacheable(self, adm: Admission, n: int) -> int:
        if self.cold_page_size == 1:
            return n
        # ablation mode: only a prefix this request placed in its own slab gets cached
        return min(n, adm.prefix.prefix_len) if adm.slab is not None and adm.prefix is not None else 0

    def _segments(self, adm: Admission, n: int) -> list[Segment]:
        if adm.slab is not None and adm.prefix is not None:
            lp = adm.prefix.prefix_len
            return [Segment(0, min(lp, n), HOT, adm.slab, 0), Segment(min(lp, n), n, COLD)]
        return _ALL_COLD  # insert clips segments to the inserted length

    # ---- promotions ----------------------------------------------------------------------------
    def take_promotions(self) -> list[PromotionPlan]:
        """Plans made since the last call; the engine copies src -> dst in every layer, then
        calls `commit_promotion` (or `cancel_promotion`)."""
        out, self._new_plans = self._new_plans, []
        return out

    def commit_promotion(self, plan: PromotionPlan) -> None:
        old = self.policy.commit(plan)
        rows = np.fromiter(self.live.keys(), dtype=np.int64, count=len(self.live))
        for pos, slots in old:
            readers = []
            if rows.size:
                hit = (self.seq_lens[rows] > pos) & (self.table[rows, pos] == slots[0])
                readers = rows[hit].tolist()
            if not readers:
                self.pool.free(slots)
                continue
            blk = RetiredBlock(slots, len(readers))
            for r in readers:
                self.live[r].retired.append(blk)

    def cancel_promotion(self, plan: PromotionPlan) -> None:
        self.policy.cancel(plan)

    # ---- introspection -------------------------------------------------------------------------
    def stats(self) -> dict:
        s = super().stats()
        s.update(
            hot_slots=self.hot.size, hot_free=self.hot.num_free, hot_slab_slots=self.hot.slab_slots,
            hot_largest_free=self.hot.largest_free, slabs=len(self.hot.slabs),
            cached_slabs=self.hot.num_cached, lent_slots=self.hot.num_lent,
            cold_slots=self.pool.capacity, cold_free=self.pool.num_free,
            promotions_pending=len(self.policy.pending),
            promotions_committed=self.policy.promotions_committed,
            promotions_failed=self.policy.promotions_failed,
        )
        return s

    def _usable_mask(self) -> np.ndarray:
        m = np.zeros(self.num_slots, dtype=bool)
        m[1 : self.hot.end] = True
        if self.cold_page_size == 1:
            m[self.hot.end :] = True
        else:
            m[self.pool.first_page * self.P : self.pool.end_page * self.P] = True
        return m

    def _free_slots(self) -> np.ndarray:
        hot_free = [np.arange(s, e) for s, e in self.hot.free_ranges()]
        return np.concatenate([self.pool.free_slots(), *hot_free]).astype(np.int64)

    def _audit_extra(self, own, expected_locks) -> None:
        hot = self.hot
        for slab in hot.slabs.values():
            own(np.arange(slab.base, slab.end))
        blocks = {id(b): b for adm in self.live.values() for b in adm.retired}
        for b in blocks.values():
            own(b.slots)
            readers = sum(1 for adm in self.live.values() for x in adm.retired if x is b)
            assert b.readers == readers
        holders = {sid: 0 for sid in hot.slabs}
        node_refs = {sid: 0 for sid in hot.slabs}
        for adm in self.live.values():
            if adm.slab is not None:
                holders[adm.slab.id] += 1
        for plan in self.policy.pending.values():
            holders[plan.slab.id] += 1
            x = plan.node
            while x is not self.radix.root:
                expected_locks[x.id] = expected_locks.get(x.id, 0) + 1
                x = x.parent
        for x in self.radix.nodes():
            if x.kind == HOT:
                assert x.slab.id in hot.slabs, f"{x} points into a released slab"
                node_refs[x.slab.id] += 1
                assert np.array_equal(x.slots, np.arange(x.slab.base + x.offset,
                                                         x.slab.base + x.offset + len(x)))
                assert x.offset + len(x) <= x.slab.length
                if expected_locks.get(x.id, 0) > 0:
                    holders[x.slab.id] += 1
            else:
                assert x.slab is None
        for sid, slab in hot.slabs.items():
            assert slab.refcount == holders[sid], f"slab {sid}: refcount {slab.refcount} != {holders[sid]}"
            assert slab.node_refs == node_refs[sid]
            assert slab.node_refs > 0 or slab.refcount > 0, "unreferenced slab not released"
            assert (sid in {s.id for s in hot.cached_lru()}) == (slab.refcount == 0)
        # Lent slots are exactly the COLD-owned slots inside the HOT region.
        lent = set(hot.lent_slots().tolist())
        cold_in_hot = set()
        for adm in self.live.values():
            r = adm.row
            for a, b in adm.closed + [(adm.tail_start, self._seq_len(r))]:
                cold_in_hot.update(int(s) for s in self.table[r, a:b] if s < hot.end)
        for x in self.radix.nodes():
            if x.kind == COLD:
                cold_in_hot.update(int(s) for s in x.slots if s < hot.end)
        for b in blocks.values():
            cold_in_hot.update(int(s) for s in b.slots if s < hot.end)
        assert lent == cold_in_hot, "lent HOT slots do not match COLD-owned slots in the HOT region"
        # Ranges: free ranges sorted, disjoint, coalesced.
        fr = hot.free_ranges()
        for (_s0, e0), (s1, _e1) in zip(fr, fr[1:]):
            assert e0 < s1
        # A request's HOT prefix is contiguous.
        for adm in self.live.values():
            if adm.prefix is not None:
                got = self.table[adm.row, : adm.prefix.prefix_len]
                assert np.array_equal(got, np.arange(adm.prefix.hot_base,
                                                     adm.prefix.hot_base + adm.prefix.prefix_len))


def make_storage(system: str, num_slots: int, *, page_size: int = 16, hot_fraction: float = 0.2,
                 max_running: int = 256, max_context: int = 32768, min_prefix_for_hot: int = 256,
                 promote_min_refs: int = 2, cold_page_size: int = 1, check: bool = False) -> Storage:
    """The storage policy of `system` over `num_slots` slots (slot 0 reserved)."""
    if system in ("paged", "cascade"):
        return PagedStorage(system, num_slots, page_size, max_running, max_context, check=check)
    if system == "granikv":
        adm = AdmissionConfig(min_prefix_for_hot, promote_min_refs)
        return GraniKVStorage(num_slots, hot_fraction, max_running, max_context, adm, check=check,
                              cold_page_size=cold_page_size)
    raise ValueError(f"unknown system {system!r}")


def storage_from_config(cfg: EngineConfig, num_slots: int, check: bool = False) -> Storage:
    """`make_storage` from an EngineConfig; `num_slots` comes from the KV budget (KVCache)."""
    return make_storage(cfg.system, num_slots, page_size=cfg.page_size, hot_fraction=cfg.hot_fraction,
                        max_running=cfg.max_running, max_context=cfg.max_context,
                        min_prefix_for_hot=cfg.min_prefix_for_hot, promote_min_refs=cfg.promote_min_refs,
                        cold_page_size=cfg.cold_page_size, check=check)
