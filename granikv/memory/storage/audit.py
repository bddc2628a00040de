"""Storage invariants every storage shares (`SlotAudit`): slot ownership, radix locks, and each
live row reading its locked radix path. Each storage's `audit()` runs them and adds the checks of
its own pools (`GraniKVStorage`: slabs, slab references, lent slots); this module knows no
concrete storage.

O(slots) numpy work: for tests and debugging, never on the hot path. Every usable slot is free, or
owned by exactly one of a radix node (HOT nodes: their slab owns the whole range), a request (its
private positions), or a slab. A committed promotion leaves no COLD copy behind: every live
reader of the promoted path reads the slab (`GraniKVStorage.commit_promotion`).
"""

from __future__ import annotations

import numpy as np

from granikv.memory.radix import COLD, HOT, PAGED, Node
from granikv.memory.storage.base import Admission, Storage


class SlotAudit:
    """One audit of a storage. Construction collects what every storage has: the owners of each
    slot (live rows' private positions, non-HOT radix nodes, the free slots) and the locks each
    radix node must hold (one per live row whose locked path runs through it), and checks that
    every live row reads its locked path. The storage then adds owners and locks of its own pools
    (`own`, `lock_path`) and calls `check`."""

    def __init__(self, st: Storage, usable: np.ndarray, free: np.ndarray) -> None:
        """`usable`: a mask of the slots the storage's pools cover; `free`: the slots they hold free."""
        self.st = st
        self.usable = usable
        self.owner = np.zeros(st.num_slots, dtype=np.int32)  # how many owners each slot has
        self.expected_locks: dict[int, int] = {}
        for adm in st.live.values():
            r = adm.row
            L = st._seq_len(r)
            priv = np.concatenate([st.table[r, a:b] for a, b in adm.closed + [(adm.tail_start, L)]])
            if st.P > 1:
                if priv.size:
                    self.own(st.pool.slots_of(np.unique(priv // st.P)))
            else:
                self.own(priv)
            self.lock_path(adm.node)
            _check_row_reads_its_path(st, adm)
        for x in st.radix.nodes():
            if x.kind != HOT:
                self.own(x.slots)
        self.own(free)

    def own(self, slots) -> None:
        """One more owner for each of `slots`."""
        np.add.at(self.owner, np.asarray(slots, dtype=np.int64), 1)

    def lock_path(self, node: Node) -> None:
        """One more expected lock on every node of the radix path root..node."""
        root = self.st.radix.root
        while node is not root:
            self.expected_locks[node.id] = self.expected_locks.get(node.id, 0) + 1
            node = node.parent

    def locks(self, node: Node) -> int:
        """The locks `node` must hold (so far)."""
        return self.expected_locks.get(node.id, 0)

    def check(self) -> None:
        """Raise AssertionError unless the locks and owners collected match the storage."""
        st = self.st
        for x in st.radix.nodes():
            assert x.lock_ref == self.locks(x), f"{x}: expected {self.locks(x)}"
            assert len(x.slots) == len(x.key) > 0
            if x.kind == PAGED or (x.kind == COLD and st.P > 1):  # whole pages (paged COLD: granikv)
                assert len(x) % st.P == 0 and int(x.slots[0]) % st.P == 0
        owner, usable = self.owner, self.usable
        assert owner[0] == 0, "slot 0 handed out"
        bad = np.flatnonzero(owner[usable] != 1)
        assert bad.size == 0, f"slots owned {owner[usable][bad[:5]]} times: {np.flatnonzero(usable)[bad[:5]]}"
        assert not owner[~usable].any(), "unusable slot handed out"
        assert len(st._free_rows) + len(st.live) == st.max_running


def _check_row_reads_its_path(st: Storage, adm: Admission) -> None:
    """Positions [0, node_end) of a live row hold the slots of the radix path it locks, except
    its private copies (`closed` ranges: positions someone else cached meanwhile; the head of a
    slab it holds itself, when another request cached that prefix in COLD first: there a
    position holds the path's slot or its own slab's, `base + pos`). A row that read anything
    else (a promoted path's old COLD copy, freed at commit; another prompt's slab) would read
    the wrong KV. Past its locked path a slab it holds is its own: it prefilled it there."""
    path = st.radix.path(adm.node)
    want = np.concatenate([x.slots for x in path]) if path else np.empty(0, dtype=np.int32)
    if adm.slab is not None:
        mine = np.arange(adm.slab.base, adm.slab.end, dtype=np.int32)
        if len(want) < len(mine):
            want = np.concatenate([want, mine[len(want) :]])
    if not len(want):
        return
    got = st.table[adm.row, : len(want)].copy()
    for a, b in adm.closed:
        got[a:b] = want[a:b]
    if adm.slab is not None:
        k = min(adm.slab.length, len(want))
        own = got[:k] == mine[:k]
        got[:k][own] = want[:k][own]
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"row {adm.row} reads slots other than its locked path's at positions {bad[:5]}"
