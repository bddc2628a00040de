"""`paged`: the SGLang-default equivalent.

16-token pages, prefix pages shared through the radix cache, and a batched paged decode in
which every request reads its whole context, shared prefix included — B reads of the prefix
per step. This is the baseline every ratio is measured against, so it uses the fastest paged
decode kernel we have (split-K, GQA-packed), not a strawman.
"""

from __future__ import annotations

from granikv.attention.base import AttentionBackend
from granikv.attention.batch import StepBatch
from granikv.attention.plan import DecodePlan


class PagedBackend(AttentionBackend):
    name = "paged"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.decode_steps = 0

    def plan_decode(self, batch: StepBatch) -> DecodePlan:
        self.decode_steps += 1
        return DecodePlan()

    def stats(self) -> dict:
        return {"decode_steps": self.decode_steps, "dense_steps": 0, "cascade_steps": 0,
                "paged_steps": self.decode_steps}
