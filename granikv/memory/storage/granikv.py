"""`granikv` storage: a HotPool of contiguous slabs over `[1, 1+N_hot)` and a token-level ColdPool
over the rest; explicit or promoted shared prefixes go to slabs. With `cold_page_size` > 1 (the
Table 18 ablation) COLD is a PagedPool over its region instead, it lends nothing, and the radix
tree works in whole pages (as for `paged`), so a cached COLD node owns whole pages and prefixes
are found, shared and promoted exactly as with token-level COLD, a page at a time."""

from __future__ import annotations

import numpy as np

from granikv.memory.admission import AdmissionConfig, HotAdmission, PromotionPlan, hot_run
from granikv.memory.cold import ColdPool
from granikv.memory.hot import HotPool, Slab
from granikv.memory.paged import PagedPool
from granikv.memory.radix import COLD, HOT, Node, RadixCache, Segment
from granikv.memory.storage.audit import SlotAudit
from granikv.memory.storage.base import Admission, PrefixInfo, Storage

# One-segment layout of any inserted length (RadixCache.insert clips segments to the tokens).
_ALL_COLD = [Segment(0, 1 << 62, COLD)]


class GraniKVStorage(Storage):
    """HOT slabs for shared prefixes + token-level COLD for everything else."""

    system = "granikv"

    def __init__(self, num_slots: int, hot_fraction: float = 0.2, max_running: int = 256,
                 max_context: int = 32768, admission: AdmissionConfig | None = None, check: bool = False,
                 cold_page_size: int = 1):
        n_hot = int(hot_fraction * (num_slots - 1))
        self.hot = HotPool(1, n_hot)
        # cold_page_size > 1 is the COLD page-size ablation (paper Table 18): COLD hands out
        # P-slot pages and borrows nothing from HOT. Every node boundary, named prefix and private
        # range then sits on a page multiple (the radix tree matches whole pages, a named prefix is
        # rounded down to one), and a COLD slot's page offset is its position's: a cached COLD node
        # owns whole pages, so evicting or promoting it frees pages, never part of one. Without
        # that the tree could not cache COLD runs, and with no client hint nothing would be shared.
        self.cold_page_size = cold_page_size
        if cold_page_size == 1:
            pool = ColdPool(1 + n_hot, num_slots, lender=self.hot, check=check)
        else:
            pool = PagedPool(1 + n_hot, num_slots, cold_page_size, check=check)
        radix = RadixCache(free=self._release, hot=self.hot, page_size=cold_page_size)
        super().__init__(num_slots, max_running, max_context, cold_page_size, pool, radix)
        self.policy = HotAdmission(admission or AdmissionConfig(), radix, self.hot, self._evict_slab)
        self._new_plans: list[PromotionPlan] = []

    def _hot(self) -> HotPool:
        return self.hot

    def max_request_tokens(self) -> int:
        """Token-level COLD borrows free HOT slots, so a lone request can fill both regions;
        paged COLD (the Table 18 ablation) lends nothing and holds what its pages hold."""
        if self.cold_page_size == 1:
            return self.pool.capacity + self.hot.size
        return self.pool.capacity

    def _evict_slab(self, slab: Slab) -> None:
        freed = self.radix.evict_slab(slab)
        self.counters.evictions += 1
        self.counters.evicted_slots += freed

    def _admit(self, tokens: np.ndarray, shared_prefix_len: int | None) -> Admission | None:
        L = len(tokens)
        m = self.radix.match_prefix(tokens[: L - 1])
        run, run_slab = hot_run(self.radix, m)
        Lp = None if shared_prefix_len is None else min(int(shared_prefix_len), L - 1)
        if Lp is not None:
            Lp -= Lp % self.P  # paged COLD: a slab prefix ends on a page boundary (see __init__)
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

    def _segments(self, adm: Admission, n: int) -> list[Segment]:
        if adm.slab is not None and adm.prefix is not None:
            lp = adm.slab.length  # its named prefix (a promotion may re-point `prefix` elsewhere)
            return [Segment(0, min(lp, n), HOT, adm.slab, 0), Segment(min(lp, n), n, COLD)]
        return _ALL_COLD  # insert clips segments to the inserted length

    # ---- promotions ----------------------------------------------------------------------------
    def take_promotions(self) -> list[PromotionPlan]:
        """Plans made since the last call; the engine copies src -> dst in every layer, then
        calls `commit_promotion` (or `cancel_promotion`)."""
        out, self._new_plans = self._new_plans, []
        return out

    def commit_promotion(self, plan: PromotionPlan) -> list[tuple[int, int]]:
        """The copy into the slab is done (queued on the device): re-point the radix path, every
        live reader of it, and free the COLD copy now.

        A live row reads a promoted node when its table holds the node's COLD slots there (rows
        that matched the path hold them) or, the node being on its locked path, a copy of its own
        (`_own_copy`).
        Each reader's leading run of promoted positions [0, n) is rewritten to `base + arange(n)`
        in the host table (private copies among them are freed), and its prefix becomes the slab
        run when it is worth a prefix pass (`min_prefix_for_hot`), exactly as for a request
        admitted after the commit. K/V in the slab are bit-identical copies, so nothing a
        request computes changes.

        Returns (row, n) per re-pointed row: the caller mirrors the rewrite on the device slot
        table, stream-ordered after the copy (`Engine._run_promotions`). Freeing the COLD copy
        at once is safe on one device stream: a step already queued still reads the old slots,
        but any kernel that writes a reallocated slot is queued after it.
        """
        old = self.policy.commit(plan)
        path = self.radix.path(plan.node)  # the promoted nodes, in the order of `old`
        base, slab = plan.slab.base, plan.slab
        rows = np.fromiter(self.live.keys(), dtype=np.int64, count=len(self.live))
        runs = np.zeros(rows.size, dtype=np.int64)
        if rows.size:
            lens = self.seq_lens[rows]
            reading = np.ones(rows.size, dtype=bool)  # rows that read every node so far
            # rows that may read a node through a copy of their own (few): checked one by one
            own = np.fromiter((bool(a.closed) or a.slab is not None for a in self.live.values()),
                              dtype=bool, count=rows.size)
            for x, (pos, slots) in zip(path, old, strict=True):  # pos: the previous nodes' lengths
                n = len(slots)
                idx = np.flatnonzero(reading & (lens >= pos + n))
                same = self.table[rows[idx], pos] == slots[0]
                hit = idx[same]
                if hit.size:
                    whole = (self.table[rows[hit], pos : pos + n] == slots).all(axis=1)
                    if not whole.all():
                        raise RuntimeError("a row reads part of a radix node (storage invariant broken)")
                copies = [i for i in idx[~same & own[idx]].tolist() if self._own_copy(rows[i], x, pos, n)]
                if copies:
                    hit = np.concatenate([hit, np.asarray(copies, dtype=hit.dtype)])
                runs[hit] += n
                reading[:] = False
                reading[hit] = True
        self._release(COLD, np.concatenate([slots for _, slots in old]))
        out = []
        worth = self.policy.cfg.min_prefix_for_hot
        for r, n in zip(rows[runs > 0].tolist(), runs[runs > 0].tolist(), strict=True):
            adm = self.live[r]
            if adm.closed:  # private copies of promoted positions: the slab replaces them
                self._free_positions(r, [(a, min(b, n)) for a, b in adm.closed if a < n])
                adm.closed = [(max(a, n), b) for a, b in adm.closed if b > n]
            self.table[r, :n] = np.arange(base, base + n, dtype=np.int32)
            self._row_prefix[r] = None  # its prefix positions no longer hold the node arrays
            if n >= worth:
                adm.prefix = PrefixInfo(base, n, slab.id)
            out.append((r, n))
        self.counters.promoted_readers += len(out)
        return out

    def _own_copy(self, row: int, node: Node, pos: int, n: int) -> bool:
        """Whether a live row reads `node` (positions [pos, pos+n)) through a copy of its own:
        private slots (a `closed` range: someone cached these tokens after the row computed them)
        or the head of the slab the row placed its named prefix in. Such a row reads the node's
        tokens as much as one holding its slots does, so a promotion must re-point it too, or it
        would keep reading the node's later positions after the COLD copy is freed. Node
        boundaries only ever split, so a node is inside such a range or outside it.

        Only a node on the row's locked path qualifies: a copy of its own says nothing about
        which tokens the row holds there. A row placed on a fresh slab for its named prefix holds
        that slab's head at positions 0.. whatever prefix another request promotes (and before
        its prefill is cached it locks no node at all), and a `closed` range can cover positions
        where the promoted path has already left the row's. Re-pointing such a row would make it
        read another prompt's KV."""
        adm = self.live[row]
        if not self._locks(adm, node):
            return False
        if any(a <= pos and pos + n <= b for a, b in adm.closed):
            return True
        sl = adm.slab
        return sl is not None and pos + n <= sl.length and int(self.table[row, pos]) == sl.base + pos

    def _locks(self, adm: Admission, node: Node) -> bool:
        """Whether `node` is on the request's locked path root..adm.node."""
        x, root = adm.node, self.radix.root
        while x is not root:
            if x is node:
                return True
            x = x.parent
        return False

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

    # ---- invariants ----------------------------------------------------------------------------
    def audit(self) -> None:
        """The shared invariants (`SlotAudit`) over both regions, plus the HOT side's (`_audit_hot`)."""
        a = SlotAudit(self, self._usable_mask(), self._free_slots())
        self._audit_hot(a)
        a.check()

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

    def _audit_hot(self, a: SlotAudit) -> None:
        """The HOT side: slabs, slab reference counts, lent slots, contiguous prefixes, and no live row
        reading a promoted path's freed COLD copy (a HOT node's positions in a row that locks it hold
        the node's slab slots). Adds each slab as an owner of its range and each pending promotion's
        lock on its path to `a`."""
        hot = self.hot
        for slab in hot.slabs.values():
            a.own(np.arange(slab.base, slab.end))
        holders = {sid: 0 for sid in hot.slabs}
        node_refs = {sid: 0 for sid in hot.slabs}
        for adm in self.live.values():
            if adm.slab is not None:
                holders[adm.slab.id] += 1
        for plan in self.policy.pending.values():
            holders[plan.slab.id] += 1
            a.lock_path(plan.node)
        for x in self.radix.nodes():
            if x.kind == HOT:
                assert x.slab.id in hot.slabs, f"{x} points into a released slab"
                node_refs[x.slab.id] += 1
                assert np.array_equal(x.slots, np.arange(x.slab.base + x.offset,
                                                         x.slab.base + x.offset + len(x)))
                assert x.offset + len(x) <= x.slab.length
                if a.locks(x) > 0:
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
            for lo, hi in adm.closed + [(adm.tail_start, self._seq_len(r))]:
                cold_in_hot.update(int(s) for s in self.table[r, lo:hi] if s < hot.end)
        for x in self.radix.nodes():
            if x.kind == COLD:
                cold_in_hot.update(int(s) for s in x.slots if s < hot.end)
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
