"""`granikv`: HOT slabs + COLD token slots, with the per-step dense/cascade dispatcher.

Requests reading one HOT slab form prefix classes by the run of the slab they read (a request
re-pointed by a promotion or admitted after it reads the slab's head; `classes.py` picks each
class's common length). Requests without a slab that share a long COLD run of slot-table
positions (no HOT space, a prefix not yet promoted) form COLD classes, read once per class
through a representative member's slot-table row (the `rows` pass, the cascade kernel's page-row
form). Per class the dispatcher (dispatch.py) picks the dense pass (one fat contraction against
the contiguous slab), the cascade pass, or the plain path; a COLD class takes the rows pass
whenever the rule picks a prefix pass.

Nested sharing (agents share a system prompt, each agent's requests also share
its role prompt): after the head classes, the members of head classes that share the next run too
(the same slot at their class's end, then a common run of slots) form extension classes, read once
per class through a representative's row from the head's end on (the EXT pass), wherever those
slots live (the tail of a slab promoted with one agent's prompt, or COLD). So the head is read
once per step and each agent's extension once per step, with no second copy of either.

Deeper sharing (a tree of runs: a system prompt, a debate's transcript, an agent's role) repeats
the step: the members of extension classes that share the run after theirs form level-2 classes
(`ext2`), and so on up to `share_depth` levels (EngineConfig.share_depth; 2 = a head and one
extension level), one launch per level, while a level's launch pays for itself.

Every request's own tokens are read by the paged decode kernel from the end of its classes on;
the partial results are merged by log-sum-exp. A step with classes at two or more levels reads
all of them in one flattened launch and merges them in one pass (`flat`, EngineConfig.flat_prefix;
granikv/kernels/prefix_flat.py) instead of one launch and one merge per level. Requests in no
class read everything on the plain path, exactly as the paged system would.
"""

from __future__ import annotations

import numpy as np

from granikv.attention.base import AttentionBackend
from granikv.attention.batch import ReqView, StepBatch
from granikv.attention.cascade import common_prefix_len
from granikv.attention.classes import partition_runs
from granikv.attention.dispatch import PLAIN, DispatchCounters, DispatchPolicy
from granikv.attention.plan import (
    EXT,
    FLAT,
    FLAT_LEVEL,
    MAX_SHARE_DEPTH,
    ROWS,
    ClassLists,
    DecodePlan,
    _pow2,
    ext_kind,
    is_ext,
)


class GraniKVBackend(AttentionBackend):
    name = "granikv"

    def __init__(self, *args, policy: DispatchPolicy | None = None, cold_classes: bool = True,
                 nested: bool = True, cold_range_as_slab: bool = True, share_depth: int = 2, flat: bool = True,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.policy = policy or DispatchPolicy(group_size=self.group_size)
        self.cold_classes = cold_classes
        if not 1 <= share_depth <= MAX_SHARE_DEPTH:
            raise ValueError(f"share_depth must be in 1..{MAX_SHARE_DEPTH}, got {share_depth}")
        # shared levels read once per step: the head classes, then extension levels (EXT, ext2, ...)
        self.share_depth = share_depth if nested else 1
        self.nested = self.share_depth >= 2  # extension classes after the head classes (EXT pass)
        self.cold_range_as_slab = cold_range_as_slab  # EngineConfig.cold_range_as_slab
        self.flat = flat  # EngineConfig.flat_prefix
        self.counters = DispatchCounters()
        # (representative key, member key, start) -> (their slot views, slot at start, common run
        # from start): a running request's prompt slots change only when a promotion re-points a
        # run [0, n) of them, which changes the slot at every position it covers, so the entry is
        # valid while both views and the slot at start match
        self._lcp: dict[tuple, tuple] = {}
        # representative key -> (its slot view, run length, slab base or None): whether the first
        # `length` slots of its row are one ascending range (checked once while the view holds)
        self._contig: dict[tuple, tuple] = {}

    def plan_decode(self, batch: StepBatch) -> DecodePlan:
        hot: dict[int, list[tuple[int, int]]] = {}
        cold: dict[int, list[int]] = {}
        min_len = self.policy.min_prefix_len
        for i, r in enumerate(batch.reqs):
            if r.slab is not None:
                hot.setdefault(r.slab[0], []).append((i, min(r.slab[1], r.seq_len - 1)))
            elif self.cold_classes and r.slots is not None and r.seq_len - 1 >= min_len and len(r.slots):
                cold.setdefault(int(r.slots[0]), []).append(i)
        kv_start = None
        passes: dict[str, ClassLists] = {}
        decisions, sizes = [], []

        def add(kind: str, members: list[int], length: int, where: int, slab: bool, start: int = 0,
                slab_at: int | None = None) -> None:
            nonlocal kv_start
            decisions.append(kind)
            sizes.append(len(members))
            if kind == PLAIN:
                return
            c = passes.get(kind)
            if c is None:
                c = passes[kind] = ClassLists(members=[], lens=[], bases=[] if slab else None,
                                              page_rows=None if slab else [],
                                              starts=[] if is_ext(kind) else None,
                                              slabs=[] if is_ext(kind) else None)
            c.members.append(members)
            c.lens.append(length)
            (c.bases if slab else c.page_rows).append(where)
            if is_ext(kind):
                c.starts.append(start)
                c.slabs.append(slab_at)
            if kv_start is None:
                kv_start = [0] * batch.num_reqs
            for i in members:
                kv_start[i] = start + length

        def settle(cands: list[tuple]) -> set[str]:
            """Per pass kind, its classes take the pass together when the launch pays for itself
            (DispatchPolicy.pays: re-reads avoided summed over the launch's classes). Returns the
            kinds that run."""
            by_kind: dict[str, list[tuple]] = {}
            for c in cands:
                by_kind.setdefault(c[0], []).append(c)
            paid = set()
            for kind, cs in by_kind.items():
                ok = kind != PLAIN and self.policy.pays((len(c[1]), c[2]) for c in cs)
                if ok:
                    paid.add(kind)
                for c in cs:
                    add(c[0] if ok else PLAIN, *c[1:])
            return paid

        min_size = self.policy.min_class_size
        heads: list[tuple] = []
        for base, runs in hot.items():
            for members, length in partition_runs(runs, min_size):
                heads.append((self.policy.kind(len(members), length), members, length, base, True))
        lcp: dict[tuple, tuple] = {}
        contig: dict[tuple, tuple] = {}
        cold_slab_kinds: list[str] = []  # the kind of each COLD class read as a slab
        for first, idx in cold.items():
            if len(idx) < min_size:
                continue
            for members, length, rep in self._row_classes(batch.reqs, idx, 0, first, lcp):
                kind = self.policy.kind(len(members), length)
                base = (self._contiguous_base(batch.reqs[rep], length, contig)
                        if kind != PLAIN and self.cold_range_as_slab else None)
                if base is not None:  # one contiguous range of slots: read it as a slab
                    cold_slab_kinds.append(kind)
                    heads.append((kind, members, length, base, True))
                else:
                    heads.append((PLAIN if kind == PLAIN else ROWS, members, length, batch.reqs[rep].row, False))
        paid = settle(heads)
        self.counters.contiguous_cold += sum(k in paid for k in cold_slab_kinds)
        # extension levels: the members of the classes so far that share the next run too, level
        # by level, each level one pass kind (EXT, ext2, ...) while a level's launch pays for itself
        for level in range(1, self.share_depth):
            if kv_start is None:
                break
            kind_l = ext_kind(level)
            ext: dict[tuple[int, int], list[int]] = {}
            for i, start in enumerate(kv_start):
                r = batch.reqs[i]
                if start > 0 and r.slots is not None and min(len(r.slots), r.seq_len - 1) - start >= min_len:
                    ext.setdefault((start, int(r.slots[start])), []).append(i)
            exts: list[tuple] = []
            for (start, first), idx in ext.items():
                if len(idx) < min_size:
                    continue
                for members, length, rep in self._row_classes(batch.reqs, idx, start, first, lcp):
                    kind = self.policy.kind(len(members), length)
                    # a run that is one slot range: the flattened launch reads it as a slab
                    at = (self._contiguous_base(batch.reqs[rep], length, contig, start)
                          if kind != PLAIN and self.flat and self.cold_range_as_slab else None)
                    exts.append((PLAIN if kind == PLAIN else kind_l, members, length, batch.reqs[rep].row, False,
                                 start, at))
            if kind_l not in settle(exts):
                break  # nothing read once at this level: no deeper level starts from it
        self._lcp = lcp
        self._contig = contig
        self.counters.record(decisions or [PLAIN], sizes)
        flat = self._flat(passes)
        self.counters.flat_steps += flat
        return DecodePlan(kv_start=kv_start, passes=passes, flat=flat)

    def _flat(self, kinds) -> bool:
        """Whether a step's classes run as one flattened launch: when they span two levels or
        more (one level alone is one launch either way)."""
        return self.flat and sum(k in FLAT_LEVEL for k in kinds) >= 2

    def _sig(self, *entries: tuple) -> tuple:
        return entries + ((FLAT,),) if self._flat([e[0] for e in entries]) else entries

    def _contiguous_base(self, rep: ReqView, length: int, cache: dict, start: int = 0) -> int | None:
        """The first slot of the representative's run [start, start + length) when its slots
        are the ascending range [s, s + length), else None. The COLD pool hands a prompt's slots out in one slice of
        its free stack, so a prefix prefilled while the pool is unfragmented sits in one range: the
        slab form of the pass reads it with contiguous loads, where the page-row form gathers every
        token through the slot table at a lower bandwidth (the kernel sweep's two forms,
        docs/generated/prefix-rule.md)."""
        key = (rep.key, start)
        hit = self._contig.get(key) or cache.get(key)
        if hit is not None and hit[0] is rep.slots and hit[1] == length:
            cache[key] = hit
            return hit[2]
        run = np.asarray(rep.slots[start:start + length])
        s0 = int(run[0])
        ok = int(run[-1]) - s0 == length - 1 and bool(np.all(np.diff(run) == 1))
        cache[key] = (rep.slots, length, s0 if ok else None)
        return s0 if ok else None

    def _row_classes(self, reqs: list[ReqView], idx: list[int], start: int, first: int, cache: dict,
                     tries: int = 4) -> list[tuple[list[int], int, int]]:
        """Classes among requests whose rows hold the same slot `first` at position `start` (0: a
        COLD head; > 0: the run after a head class): runs are common slot runs from `start` with a
        representative (the first request left), which every member then reads through the
        representative's row. At most `tries` representatives per group (host time)."""
        out = []
        rest = idx
        min_size = self.policy.min_class_size
        while len(rest) >= min_size and tries > 0:
            tries -= 1
            rep = reqs[rest[0]]
            runs = [(rest[0], min(len(rep.slots), rep.seq_len - 1) - start)]
            for i in rest[1:]:
                r = reqs[i]
                key = (rep.key, r.key, start)
                hit = self._lcp.get(key) or cache.get(key)
                if hit is not None and hit[0] is rep.slots and hit[1] is r.slots and hit[2] == first:
                    n = hit[3]
                else:
                    n = common_prefix_len(rep.slots[start:], r.slots[start:])
                cache[key] = (rep.slots, r.slots, first, n)
                runs.append((i, min(n, r.seq_len - 1 - start)))
            got = partition_runs(runs, min_size, max_classes=1)
            if not got or got[0][1] < self.policy.min_prefix_len:
                rest = rest[1:]  # the representative shares little: try the next one
                continue
            members, length = got[0]
            out.append((members, length, rest[0]))  # every member's run is common with its row
            taken = set(members)
            rest = [i for i in rest if i not in taken]
        return out

    def warm_signatures(self, n: int) -> list[tuple]:
        kind = self.policy.choose(n, max(self.policy.min_prefix_len, 1 << 20))
        if kind == PLAIN:
            return [()]
        sigs = [(), self._sig((kind, 1, _pow2(n), True))]
        if self.cold_classes:
            sigs.append(self._sig((ROWS, 1, _pow2(n), False)))
        if self.nested:  # one head class, its requests in 1, 2, 4 or 8 agents' extension classes
            for c in (1, 2, 4, 8):
                if 2 * c <= n:  # an extension class has two requests at least
                    sigs.append(self._sig((kind, 1, _pow2(n), True), (EXT, c, _pow2(-(-n // c)), False)))
        if self.share_depth >= 3:  # a tree: c1 extension classes, each split c2 / c1 ways again
            for c1 in (1, 2, 4, 8):
                for c2 in (2 * c1, 4 * c1, 8 * c1):
                    if 2 * c2 <= n:
                        sigs.append(self._sig((kind, 1, _pow2(n), True), (EXT, c1, _pow2(-(-n // c1)), False),
                                              (ext_kind(2), c2, _pow2(-(-n // c2)), False)))
        return sigs

    def warm_class_signatures(self, n: int, max_classes: int) -> list[tuple]:
        """C classes of about n/C requests each (C = 2, 4, ..., while a class keeps two
        requests), at the padded class size and at twice it (a real run's classes are uneven: k=3
        pads to 4 classes, a hetero class outgrows n/C), in the slab form and in the rows form
        (COLD classes before a promotion commits)."""
        sigs: list[tuple] = []
        c = 2
        while c <= max_classes and 2 * c <= n:
            size = -(-n // c)
            kind = self.policy.kind(size, max(self.policy.min_prefix_len, 1 << 20))
            if kind != PLAIN:
                for s in dict.fromkeys((_pow2(size), min(2 * _pow2(size), _pow2(n)))):
                    sigs.append(((kind, c, s, True),))
                    if self.cold_classes:
                        sigs.append(((ROWS, c, s, False),))
            c *= 2
        return sigs

    def stats(self) -> dict:
        return self.counters.as_dict()
