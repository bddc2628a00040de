"""Storage invariants (`Storage.audit`): slot ownership, radix locks, slab references, lent slots.

O(slots) numpy work: for tests and debugging, never on the hot path. Every usable slot is free, or
owned by exactly one of a radix node (HOT nodes: their slab owns the whole range), a request (its
private positions), or a slab. A committed promotion leaves no COLD copy behind: every live
reader of the promoted path reads the slab (`GraniKVStorage.commit_promotion`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from granikv.memory.radix import COLD, HOT, PAGED

if TYPE_CHECKING:
    from granikv.memory.storage import Storage
    from granikv.memory.storage_granikv import GraniKVStorage


def audit_storage(st: Storage) -> None:
    """Raise AssertionError unless every invariant shared by both systems holds (the policy adds
    its own through `_audit_extra`)."""
    owner = np.zeros(st.num_slots, dtype=np.int32)  # how many owners each slot has
    usable = st._usable_mask()

    def own(slots):
        np.add.at(owner, np.asarray(slots, dtype=np.int64), 1)

    expected_locks: dict[int, int] = {}
    for adm in st.live.values():
        r = adm.row
        L = st._seq_len(r)
        priv = [st.table[r, a:b] for a, b in adm.closed + [(adm.tail_start, L)]]
        priv = np.concatenate(priv)
        if st.P > 1:
            if priv.size:
                own(st.pool.slots_of(np.unique(priv // st.P)))
        else:
            own(priv)
        x = adm.node
        while x is not st.radix.root:
            expected_locks[x.id] = expected_locks.get(x.id, 0) + 1
            x = x.parent
        _check_row_reads_its_path(st, adm)
    for x in st.radix.nodes():
        if x.kind != HOT:
            own(x.slots)
    own(st._free_slots())
    st._audit_extra(own, expected_locks)
    for x in st.radix.nodes():
        assert x.lock_ref == expected_locks.get(x.id, 0), f"{x}: expected {expected_locks.get(x.id, 0)}"
        assert len(x.slots) == len(x.key) > 0
        if x.kind == PAGED or (x.kind == COLD and st.P > 1):  # whole pages (paged COLD: granikv)
            assert len(x) % st.P == 0 and int(x.slots[0]) % st.P == 0
    assert owner[0] == 0, "slot 0 handed out"
    bad = np.flatnonzero(owner[usable] != 1)
    assert bad.size == 0, f"slots owned {owner[usable][bad[:5]]} times: {np.flatnonzero(usable)[bad[:5]]}"
    assert not owner[~usable].any(), "unusable slot handed out"
    assert len(st._free_rows) + len(st.live) == st.max_running


def _check_row_reads_its_path(st: Storage, adm) -> None:
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


def audit_granikv(st: GraniKVStorage, own, expected_locks: dict[int, int]) -> None:
    """The HOT side: slabs, slab reference counts, lent slots, contiguous prefixes, and no live row
    reading a promoted path's freed COLD copy (a HOT node's positions in a row that locks it hold
    the node's slab slots)."""
    hot = st.hot
    for slab in hot.slabs.values():
        own(np.arange(slab.base, slab.end))
    holders = {sid: 0 for sid in hot.slabs}
    node_refs = {sid: 0 for sid in hot.slabs}
    for adm in st.live.values():
        if adm.slab is not None:
            holders[adm.slab.id] += 1
    for plan in st.policy.pending.values():
        holders[plan.slab.id] += 1
        x = plan.node
        while x is not st.radix.root:
            expected_locks[x.id] = expected_locks.get(x.id, 0) + 1
            x = x.parent
    for x in st.radix.nodes():
        if x.kind == HOT:
            assert x.slab.id in hot.slabs, f"{x} points into a released slab"
            node_refs[x.slab.id] += 1
            assert np.array_equal(x.slots, np.arange(x.slab.base + x.offset,
                                                     x.slab.base + x.offset + len(x)))
            assert x.offset + len(x) <= x.slab.length
            if expected_locks.get(x.id, 0) > 0:
                holders[x.slab.id] += 1
        else:
            assert x.slab is None
    for sid, slab in hot.slabs.items():
        assert slab.refcount == holders[sid], f"slab {sid}: refcount {slab.refcount} != {holders[sid]}"
        assert slab.node_refs == node_refs[sid]
        assert slab.node_refs > 0 or slab.refcount > 0, "unreferenced slab not released"
        assert (sid in {s.id for s in hot.cached_lru()}) == (slab.refcount == 0)
    # Lent slots are exactly the COLD-owned slots inside the HOT region.
    lent = set(hot.lent_slots().tolist())
    cold_in_hot = set()
    for adm in st.live.values():
        r = adm.row
        for a, b in adm.closed + [(adm.tail_start, st._seq_len(r))]:
            cold_in_hot.update(int(s) for s in st.table[r, a:b] if s < hot.end)
    for x in st.radix.nodes():
        if x.kind == COLD:
            cold_in_hot.update(int(s) for s in x.slots if s < hot.end)
    assert lent == cold_in_hot, "lent HOT slots do not match COLD-owned slots in the HOT region"
    # Ranges: free ranges sorted, disjoint, coalesced.
    fr = hot.free_ranges()
    for (_s0, e0), (s1, _e1) in zip(fr, fr[1:]):
        assert e0 < s1
    # A request's HOT prefix is contiguous.
    for adm in st.live.values():
        if adm.prefix is not None:
            got = st.table[adm.row, : adm.prefix.prefix_len]
            assert np.array_equal(got, np.arange(adm.prefix.hot_base,
                                                 adm.prefix.hot_base + adm.prefix.prefix_len))
