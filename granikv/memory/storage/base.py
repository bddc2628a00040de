"""Storage: the one object the scheduler talks to about KV slots (the shared facade).

This module holds the machinery every storage shares; `paged` and `granikv` (this package)
choose the pools and where prefixes go and check their invariants (`audit`: the shared checks
of `audit.SlotAudit`, plus their own); `granikv.systems` builds the storage of a system.

`paged`/`cascade`: a PagedPool of P-slot pages over every slot, prefixes shared page-aligned
through the radix cache. `granikv`: a HotPool of contiguous slabs over `[1, 1+N_hot)` and a
token-level ColdPool over the rest; explicit or promoted shared prefixes go to slabs. With
`cold_page_size` > 1 (the Table 18 ablation) COLD is a PagedPool over its region instead: no
lending, and the radix tree matches whole pages, so cached COLD nodes own whole pages.

The facade keeps a host slot table `table[row, pos]` (int32, `max_running × max_context`) — the
host mirror of the engine's `req_to_slot` — plus, per row, the flat table index of its last
position (`seq_lens` is derived from it). Decode growth for a whole batch (`grow_batch`) is a
handful of numpy operations on these arrays, with no per-request Python work; an admission costs
one compare of the prompt against the cached prefix and one write of its private slots (the
prefix part of a row is rewritten only when it differs from what the row already holds).

Slot ownership (checked by each storage's `audit`): every usable slot is free, or owned by exactly one of a radix
node (HOT nodes: their slab owns the whole range), a request (its private positions), or a slab.

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

import numpy as np

from granikv.memory.admission import PromotionPlan
from granikv.memory.cold import ColdPool
from granikv.memory.hot import HotPool, Slab
from granikv.memory.paged import PagedPool
from granikv.memory.radix import PAGED, Node, RadixCache, Segment

# One-segment layout of any inserted length (RadixCache.insert clips segments to the tokens).
_ALL_PAGED = [Segment(0, 1 << 62, PAGED)]


@dataclass(frozen=True)
class PrefixInfo:
    """The request's prefix is `prefix_len` tokens in one contiguous HOT range from `hot_base`."""

    hot_base: int
    prefix_len: int
    slab_id: int


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
    promoted_readers: int = 0  # live requests re-pointed from a COLD prefix to its new slab
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
        """Radix callback: slots of an evicted COLD/PAGED node go back to their pool (whole pages
        when pages are bigger than a slot: the paged systems, and granikv's paged COLD)."""
        if kind == PAGED or self.P > 1:
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

    def max_request_tokens(self) -> int:
        """The most tokens one request can hold when it runs alone: every page of the pool
        (a lone request can evict the whole unlocked cache). A request that needs more can never
        run, so the engine refuses it at admission instead of failing it mid-decode."""
        return self.pool.capacity

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
        for tests and debugging, never on the hot path. Each storage implements it: the checks
        every storage shares (`audit.SlotAudit`) plus those of its own pools."""
        raise NotImplementedError(f"{type(self).__name__} does not audit itself")
