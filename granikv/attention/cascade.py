"""`cascade`: the SGLang-Cascade equivalent (FlashInfer-cascade-style), on 16-token pages.

Per decode step the prefix common to *every* request of the batch is found (the longest run
of slot-table positions all requests share, i.e. the shared radix pages); a multi-query pass
reads it once for the whole batch, each request's suffix is read by the paged decode kernel,
and the two partial results are merged by log-sum-exp. With several distinct prefixes in one
batch the batch-global common prefix is (nearly) empty and this degenerates to paged decode —
the behaviour the paper reports for heterogeneous prefixes (Table 21).
"""

from __future__ import annotations

import numpy as np

from granikv.attention.base import AttentionBackend
from granikv.attention.batch import StepBatch
from granikv.attention.plan import CASCADE, ClassLists, DecodePlan, _pow2


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    neq = np.flatnonzero(a[:n] != b[:n])
    return int(neq[0]) if len(neq) else n


class CascadeBackend(AttentionBackend):
    name = "cascade"

    def __init__(self, *args, min_prefix_len: int = 256, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.min_prefix_len = min_prefix_len
        self._lcp_cache: dict[tuple, int] = {}
        self.decode_steps = 0
        self.cascade_steps = 0
        self.plain_steps = 0

    def _batch_common_prefix(self, batch: StepBatch) -> int:
        """Min over requests of the common slot run with the first request (cached per pair:
        a running request's prompt slots never change)."""
        reqs = batch.reqs
        ref = reqs[0]
        common = ref.seq_len - 1
        cache: dict[tuple, int] = {}
        for r in reqs[1:]:
            key = (ref.key, r.key)
            lcp = self._lcp_cache.get(key)
            if lcp is None:
                lcp = common_prefix_len(ref.slots, r.slots)
            cache[key] = lcp
            common = min(common, lcp, r.seq_len - 1)
            if common < self.min_prefix_len:
                break
        self._lcp_cache = cache
        return common

    def plan_decode(self, batch: StepBatch) -> DecodePlan:
        self.decode_steps += 1
        n = batch.num_reqs
        common = self._batch_common_prefix(batch) if n >= 2 else 0
        if common < self.min_prefix_len:
            self.plain_steps += 1
            return DecodePlan()
        self.cascade_steps += 1
        cls = ClassLists(members=[list(range(n))], lens=[common], page_rows=[batch.reqs[0].row])
        return DecodePlan(kv_start=[common] * n, passes={CASCADE: cls})

    def warm_signatures(self, n: int) -> list[tuple]:
        return [(), ((CASCADE, 1, _pow2(n), False),)] if n >= 2 else [()]

    def stats(self) -> dict:
        return {"decode_steps": self.decode_steps, "cascade_steps": self.cascade_steps, "dense_steps": 0,
                "paged_steps": self.plain_steps}
