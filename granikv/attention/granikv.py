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

import torch

from granikv.attention.base import AttentionBackend
from granikv.attention.batch import StepBatch
from granikv.attention.dispatch import CASCADE, DENSE, PLAIN, DispatchCounters, DispatchPolicy
from granikv.kernels.prefix_classes import PrefixClasses


class GraniKVBackend(AttentionBackend):
    name = "granikv"

    def __init__(self, *args, policy: DispatchPolicy | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.policy = policy or DispatchPolicy(group_size=self.group_size)
        self.counters = DispatchCounters()

    def plan_decode(self, batch: StepBatch) -> None:
        groups: dict[tuple[int, int], list[int]] = {}
        for i, r in enumerate(batch.reqs):
            if r.slab is not None:
                groups.setdefault(r.slab, []).append(i)
        kv_start = [0] * batch.num_reqs
        picked: dict[str, tuple[list, list, list]] = {DENSE: ([], [], []), CASCADE: ([], [], [])}
        decisions = []
        for (base, lp), members in groups.items():
            kind = self.policy.choose(len(members), lp)
            decisions.append(kind)
            if kind == PLAIN:
                continue
            m, lens, bases = picked[kind]
            m.append(members)
            lens.append(lp)
            bases.append(base)
            for i in members:
                kv_start[i] = lp
        if not groups:
            decisions.append(PLAIN)
        self.counters.record(decisions)
        dev = batch.seq_lens.device
        for kind in (DENSE, CASCADE):
            m, lens, bases = picked[kind]
            batch.extras[kind] = PrefixClasses.from_lists(m, lens, dev, slab_base=bases) if m else None
        if any(kv_start):
            start = torch.tensor(kv_start, dtype=torch.int32, device=dev)
            batch.extras["kv_start"] = start
            batch.extras["kv_len"] = batch.seq_lens - start
        else:
            super().plan_decode(batch)

    def forward_decode(self, layer: int, q, kc, vc) -> torch.Tensor:
        b = self.batch
        o, lse = self.ops.decode(
            q, kc, vc, self.slot_table, b.rows, b.extras["kv_start"], b.extras["kv_len"], self.sm_scale
        )
        dense, casc = b.extras.get(DENSE), b.extras.get(CASCADE)
        if dense is not None:
            op, lp = self.ops.prefix_dense(q, kc, vc, dense, self.sm_scale)
            self.ops.merge_(o, lse, op, lp)
        if casc is not None:
            op, lp = self.ops.prefix_cascade(q, kc, vc, casc, self.sm_scale)
            self.ops.merge_(o, lse, op, lp)
        return o

    def stats(self) -> dict:
        return self.counters.as_dict()
