"""`paged` and `cascade` storage: a PagedPool of P-slot pages over every slot, prefixes shared
page-aligned through the radix cache."""

from __future__ import annotations

import numpy as np

from granikv.memory.paged import PagedPool
from granikv.memory.radix import RadixCache
from granikv.memory.storage.audit import SlotAudit
from granikv.memory.storage.base import Storage


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

    def audit(self) -> None:
        """The shared invariants (`SlotAudit`) over the pool's whole pages: one pool, no slabs."""
        usable = np.zeros(self.num_slots, dtype=bool)
        usable[self.pool.first_page * self.P : self.pool.end_page * self.P] = True
        SlotAudit(self, usable, self.pool.free_slots()).check()
