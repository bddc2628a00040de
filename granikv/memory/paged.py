"""PagedPool: fixed-size pages over the slot space, for the `paged` and `cascade` systems.

Page p covers slots `[p·P, (p+1)·P)`; only pages wholly inside the region are used, so the page
holding slot 0 is never handed out. A request fills its last page slot by slot, in order, before
it gets a new one (the storage policy does that bookkeeping; this pool deals in whole pages).
The same class serves the COLD page-size ablation of granikv (paper Table 18) over the COLD region.
"""

from __future__ import annotations

import numpy as np


class PagedPool:
    def __init__(self, start: int, end: int, page_size: int = 16, check: bool = False):
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if not 1 <= start <= end:
            raise ValueError(f"bad paged region [{start}, {end}) (slot 0 is reserved)")
        self.page_size = page_size
        self.start, self.end = start, end
        self.first_page = -(-start // page_size)
        self.end_page = max(end // page_size, self.first_page)
        self.num_pages = self.end_page - self.first_page
        self._stack = np.arange(self.end_page - 1, self.first_page - 1, -1, dtype=np.int32)
        self._top = self.num_pages
        self._used = np.zeros(self.num_pages, dtype=bool) if check else None
        self._P = np.int32(page_size)
        self._lane = np.arange(page_size, dtype=np.int32)

    @property
    def capacity(self) -> int:
        """Usable slots (whole pages)."""
        return self.num_pages * self.page_size

    @property
    def num_free_pages(self) -> int:
        return self._top

    @property
    def num_free(self) -> int:
        return self._top * self.page_size

    @property
    def num_used(self) -> int:
        return self.capacity - self.num_free

    @property
    def available(self) -> int:
        return self.num_free

    def alloc_pages(self, n: int) -> np.ndarray | None:
        """`n` free page ids (int32), or None and nothing changes."""
        if n > self._top:
            return None
        out = self._stack[self._top - n : self._top][::-1].copy()
        self._top -= n
        if self._used is not None:
            idx = out - self.first_page
            assert not self._used[idx].any(), "page double allocation"
            self._used[idx] = True
        return out

    def free_pages(self, pages: np.ndarray) -> None:
        pages = np.asarray(pages, dtype=np.int32)
        if pages.size == 0:
            return
        if self._used is not None:  # validation costs a few µs per call: only in checked mode
            if int(pages.min()) < self.first_page or int(pages.max()) >= self.end_page:
                raise ValueError("freeing a page outside the pool")
            idx = pages - self.first_page
            assert self._used[idx].all(), "page double free"
            assert np.unique(idx).size == idx.size, "page double free within one call"
            self._used[idx] = False
        k = pages.size
        self._stack[self._top : self._top + k] = pages
        self._top += k

    def alloc_into(self, dst: np.ndarray) -> bool:
        """Allocate len(dst) / P pages (the ones `alloc_pages` would return, in that order) and
        write their slots into `dst` (a contiguous 1-D int32 view, a whole number of pages);
        False and nothing changes if there are not that many free pages. Saves the temporary
        page and slot arrays."""
        dst = dst.reshape(-1, self.page_size)  # a view: one page per row
        k = dst.shape[0]
        if k > self._top:
            return False
        pages = self._stack[self._top - k : self._top][::-1]
        if self._used is not None:
            idx = pages - self.first_page
            assert not self._used[idx].any(), "page double allocation"
            self._used[idx] = True
        np.multiply(pages[:, None], self._P, out=dst)
        dst += self._lane
        self._top -= k
        return True

    def free_pages_of(self, first_slots: np.ndarray) -> None:
        """Free the pages whose first slots are `first_slots` (pages = first_slots // P), written
        straight onto the free stack: no temporary page array."""
        k = first_slots.size
        if k == 0:
            return
        if self._used is not None:
            self.free_pages(first_slots // self.page_size)
            return
        np.floor_divide(first_slots, self._P, out=self._stack[self._top : self._top + k])
        self._top += k

    def alloc(self, n: int) -> np.ndarray | None:
        """Slots of ceil(n/P) fresh pages, the first `n` of them in page order."""
        pages = self.alloc_pages(-(-n // self.page_size))
        if pages is None:
            return None
        return self.slots_of(pages)[:n]

    def slots_of(self, pages: np.ndarray) -> np.ndarray:
        P = self.page_size
        return (np.asarray(pages, dtype=np.int32)[:, None] * P + np.arange(P, dtype=np.int32)).ravel()

    def pages_of(self, slots: np.ndarray) -> np.ndarray:
        """The distinct pages that hold `slots` (order of first appearance is not kept)."""
        return np.unique(np.asarray(slots, dtype=np.int32) // self.page_size)

    def free_slots(self) -> np.ndarray:
        return self.slots_of(self._stack[: self._top])
