"""`paged`: the SGLang-default equivalent.

16-token pages, prefix pages shared through the radix cache, and a batched paged decode in
which every request reads its whole context, shared prefix included — B reads of the prefix
per step. This is the baseline every ratio is measured against, so it uses the fastest paged
decode kernel we have (split-K, GQA-packed), not a strawman.
"""

from __future__ import annotations

from granikv.attention.base import AttentionBackend


class PagedBackend(AttentionBackend):
    name = "paged"
