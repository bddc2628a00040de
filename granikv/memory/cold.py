"""COLD pool: token-granular free list for per-request suffixes and decoded tokens (paper §3.3).

Suffix tokens are unique per request, so pages larger than one token buy no reuse and only add
internal fragmentation; each token gets exactly one slot. The free list is an int32 numpy stack,
so allocating the 256 decode slots of a batch is one slice, not 256 Python operations.

Under suffix pressure the pool borrows free slots of the HOT region through a `SlotLender` (the
HotPool); slots below `start` are borrowed ones and go straight back to the lender when freed.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class SlotLender(Protocol):
    def lend(self, n: int) -> np.ndarray | None: ...

    def take_back(self, slots: np.ndarray) -> None: ...

    @property
    def lendable(self) -> int: ...


class ColdPool:
    """Token-level allocator over slots `[start, end)`.

    `alloc_pages`/`free_pages` are the page-size-1 spelling of `alloc`/`free`, so a storage policy
    can drive this pool and a `PagedPool` through one interface (page id == slot here).
    """

    page_size = 1

    def __init__(self, start: int, end: int, lender: SlotLender | None = None, check: bool = False):
        if not 1 <= start <= end:
            raise ValueError(f"bad COLD region [{start}, {end}) (slot 0 is reserved)")
        self.start, self.end = start, end
        self.lender = lender
        # Descending, so that the top of the stack (the end) holds the lowest slots: the first
        # allocations come out in ascending order, which keeps small tests readable.
        self._stack = np.arange(end - 1, start - 1, -1, dtype=np.int32)
        self._top = end - start
        self._check = check
        self._used = np.zeros(end - start, dtype=bool) if check else None

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.end - self.start

    @property
    def num_free(self) -> int:
        """Free slots of the COLD region itself (not counting what HOT could lend)."""
        return self._top

    @property
    def num_used(self) -> int:
        return self.capacity - self._top

    @property
    def available(self) -> int:
        """Slots an `alloc` can hand out right now, borrowing from HOT included."""
        return self._top + (self.lender.lendable if self.lender is not None else 0)

    # ---- allocation --------------------------------------------------------------------------
    def alloc(self, n: int) -> np.ndarray | None:
        """`n` free slots as an int32 array, or None (and nothing changes) if they do not exist."""
        if n <= self._top:
            out = self._stack[self._top - n : self._top][::-1].copy()
            self._top -= n
        else:
            if self.lender is None:
                return None
            borrowed = self.lender.lend(n - self._top)
            if borrowed is None:
                return None
            out = np.concatenate([self._stack[: self._top][::-1], borrowed.astype(np.int32)])
            self._top = 0
        if self._used is not None:
            self._mark_used(out)
        return out

    def alloc_into(self, dst: np.ndarray) -> bool:
        """`alloc(len(dst))` written into `dst` (a 1-D int32 view) instead of a new array; False
        and nothing changes if the slots do not exist."""
        n = dst.size
        if n > self._top:  # borrowing from HOT: the general path
            out = self.alloc(n)
            if out is None:
                return False
            dst[:] = out
            return True
        dst[:] = self._stack[self._top - n : self._top][::-1]
        self._top -= n
        if self._used is not None:
            self._mark_used(dst)
        return True

    def _mark_used(self, out: np.ndarray) -> None:
        own = out[(out >= self.start) & (out < self.end)] - self.start
        assert not self._used[own].any(), "COLD double allocation"
        self._used[own] = True

    def free(self, slots: np.ndarray) -> None:
        """Return slots; borrowed HOT slots (below `start`) go back to the lender at once."""
        slots = np.asarray(slots, dtype=np.int32)
        if slots.size == 0:
            return
        below = slots < self.start
        if below.any():
            if self.lender is None:
                raise ValueError("freeing slots below the COLD region without a lender")
            self.lender.take_back(slots[below])
            slots = slots[~below]
        if self._used is not None:  # validation costs a few µs per call: only in checked mode
            if slots.size and int(slots.max()) >= self.end:
                raise ValueError("freeing slots above the COLD region")
            own = slots - self.start
            assert self._used[own].all(), "COLD double free"
            assert np.unique(own).size == own.size, "COLD double free within one call"
            self._used[own] = False
        k = slots.size
        self._stack[self._top : self._top + k] = slots
        self._top += k

    alloc_pages = alloc
    free_pages = free

    def free_slots(self) -> np.ndarray:
        """The free COLD-region slots (a copy; for invariant checks and stats)."""
        return self._stack[: self._top].copy()
