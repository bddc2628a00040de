"""`granikv`: HOT slabs + COLD token slots, with the per-step dense/cascade dispatcher.

Requests whose shared prefix sits in a HOT slab form one prefix class per slab. Per step and
per class the dispatcher (dispatch.py) picks the dense pass (one fat contraction of the class's
queries against the contiguous slab), the cascade pass (slab streamed once in tiles), or the
plain path. Every request's own tokens (suffix and decoded tokens, in COLD) are read by the
paged decode kernel from position Lp on; the partial results are merged by log-sum-exp.
Requests without a slab (fallback to COLD, or a prefix too short) read everything on the plain
path, exactly as the paged system would.
"""

from __future__ import annotations

from granikv.attention.base import AttentionBackend
from granikv.attention.batch import StepBatch
from granikv.attention.dispatch import PLAIN, DispatchCounters, DispatchPolicy
from granikv.attention.plan import ClassLists, DecodePlan, _pow2


class GraniKVBackend(AttentionBackend):
    name = "granikv"

    def __init__(self, *args, policy: DispatchPolicy | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.policy = policy or DispatchPolicy(group_size=self.group_size)
        self.counters = DispatchCounters()

    def plan_decode(self, batch: StepBatch) -> DecodePlan:
        groups: dict[tuple[int, int], list[int]] = {}
        for i, r in enumerate(batch.reqs):
            if r.slab is not None:
                groups.setdefault(r.slab, []).append(i)
        kv_start = None
        passes: dict[str, ClassLists] = {}
        decisions, sizes = [], []
        for (base, lp), members in groups.items():
            kind = self.policy.choose(len(members), lp)
            decisions.append(kind)
            sizes.append(len(members))
            if kind == PLAIN:
                continue
            c = passes.setdefault(kind, ClassLists(members=[], lens=[], bases=[]))
            c.members.append(members)
            c.lens.append(lp)
            c.bases.append(base)
            if kv_start is None:
                kv_start = [0] * batch.num_reqs
            for i in members:
                kv_start[i] = lp
        self.counters.record(decisions or [PLAIN], sizes)
        return DecodePlan(kv_start=kv_start, passes=passes)

    def warm_signatures(self, n: int) -> list[tuple]:
        kind = self.policy.choose(n, max(self.policy.min_prefix_len, 1 << 20))
        return [()] if kind == PLAIN else [(), ((kind, 1, _pow2(n), True),)]

    def stats(self) -> dict:
        return self.counters.as_dict()

