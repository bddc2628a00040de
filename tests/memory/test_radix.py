import numpy as np
import pytest

from granikv.memory import ColdPool, HotPool, PagedPool, RadixCache, Segment
from granikv.memory.radix import COLD, HOT, PAGED


def make(page_size=1, hot_size=0):
    hot = HotPool(1, hot_size) if hot_size else None
    cold = ColdPool(1 + hot_size, 1000, lender=hot, check=True)
    paged = PagedPool(1, 1000, page_size, check=True) if page_size > 1 else None
    freed = []

    def free(kind, slots):
        freed.append((kind, slots.tolist()))
        if kind == PAGED:
            paged.free_pages(slots[::page_size] // page_size)
        else:
            cold.free(slots)
        return len(slots)

    return RadixCache(free, hot=hot, page_size=page_size), cold, hot, paged, freed


def test_match_insert_split_cold():
    r, cold, *_ = make()
    t = np.array([1, 2, 3, 4, 5])
    s = cold.alloc(5)
    dup, last = r.insert(t, s, [Segment(0, 5, COLD)])
    assert dup == 0 and len(last) == 5
    m = r.match_prefix(np.array([1, 2, 3, 9]))
    assert m.length == 3 and m.slots.tolist() == s[:3].tolist()
    # the match split the node so it ends on a node boundary
    assert len(m.node) == 3 and len(last) == 2 and last.parent is m.node
    assert m.node.slots.tolist() == s[:3].tolist() and last.slots.tolist() == s[3:].tolist()
    assert r.match_prefix(np.array([7])).length == 0


def test_insert_returns_duplicate_length():
    r, cold, *_ = make()
    s1 = cold.alloc(4)
    r.insert(np.array([1, 2, 3, 4]), s1, [Segment(0, 4, COLD)])
    s2 = cold.alloc(6)
    dup, last = r.insert(np.array([1, 2, 3, 4, 5, 6]), s2, [Segment(0, 6, COLD)])
    assert dup == 4 and last.slots.tolist() == s2[4:].tolist()
    assert r.match_prefix(np.array([1, 2, 3, 4, 5, 6])).slots.tolist() == s1.tolist() + s2[4:].tolist()


def test_split_inside_slab_keeps_offsets_and_refs():
    r, cold, hot, *_ = make(hot_size=50)
    slab = hot.alloc_slab(10)
    toks = np.arange(100, 110)
    slots = np.arange(slab.base, slab.end, dtype=np.int32)
    r.insert(toks, slots, [Segment(0, 10, HOT, slab, 0)])
    hot.release(slab)  # only the node holds it now: cached
    assert slab.node_refs == 1 and slab.refcount == 0 and hot.num_cached == 1
    m = r.match_prefix(np.array([100, 101, 102, 103, 7]))
    up, low = m.node, next(iter(m.node.children.values()))
    assert (up.slab, up.offset, len(up)) == (slab, 0, 4)
    assert (low.slab, low.offset, len(low)) == (slab, 4, 6)
    assert low.slots.tolist() == list(range(slab.base + 4, slab.end))
    assert slab.node_refs == 2
    # evicting the lower half does not release the slab; the upper half still points into it
    r.lock(up)
    assert r.evict(6) == 0 and slab.id in hot.slabs and not up.children
    r.unlock(up)
    assert r.evict(1) == 10 and slab.id not in hot.slabs
    assert hot.free_ranges() == [(1, 51)]


def test_lock_protects_from_eviction_and_lru_order():
    r, cold, *_ = make()
    a = cold.alloc(3)
    b = cold.alloc(3)
    _, na = r.insert(np.array([1, 2, 3]), a, [Segment(0, 3, COLD)])
    _, nb = r.insert(np.array([4, 5, 6]), b, [Segment(0, 3, COLD)])
    r.match_prefix(np.array([1, 2, 3]))  # a used more recently than b
    assert r.evict(1) == 3 and r.match_prefix(np.array([4])).length == 0
    r.lock(na)
    assert r.evict(100) == 0 and r.match_prefix(np.array([1, 2, 3])).length == 3
    r.unlock(na)
    assert r.evict(100) == 3 and r.cached_slots == 0
    assert cold.num_free == cold.capacity
    with pytest.raises(ValueError):
        r.unlock(na)


def test_eviction_walks_up_to_parents():
    r, cold, *_ = make()
    r.insert(np.array([1, 2, 3, 4]), cold.alloc(4), [Segment(0, 4, COLD)])
    r.insert(np.array([1, 2, 9, 9]), cold.alloc(4), [Segment(0, 4, COLD)])  # splits at 2
    assert r.evict(6) == 6  # both leaves (2+2) then the parent (2)
    assert r.cached_slots == 0


def test_split_of_locked_node_copies_lock():
    r, cold, hot, *_ = make(hot_size=20)
    slab = hot.alloc_slab(8)
    _, n = r.insert(np.arange(8), np.arange(slab.base, slab.end), [Segment(0, 8, HOT, slab, 0)])
    hot.release(slab)
    r.lock(n)
    assert slab.refcount == 1
    m = r.match_prefix(np.array([0, 1, 2, 5]))
    assert m.node.lock_ref == 1 and slab.refcount == 2  # both halves locked
    r.unlock(n)
    assert slab.refcount == 0 and hot.num_cached == 1


def test_page_aligned_matching():
    r, _, _, paged, _ = make(page_size=4)
    pages = paged.alloc_pages(3)
    slots = paged.slots_of(pages)
    r.insert(np.arange(12), slots, [Segment(0, 12, PAGED)])
    m = r.match_prefix(np.r_[np.arange(7), 99])
    assert m.length == 4 and m.slots.tolist() == slots[:4].tolist()
    assert r.match_prefix(np.arange(3)).length == 0
    with pytest.raises(ValueError):
        r.insert(np.arange(5), np.arange(5), [Segment(0, 5, PAGED)])
    # divergence inside the second page: split at the page boundary only
    dup, last = r.insert(np.r_[np.arange(6), 50, 51], paged.slots_of(paged.alloc_pages(2)),
                         [Segment(0, 8, PAGED)])
    assert dup == 4 and len(last) == 4
    assert r.evict(100) == 12 + 4
    assert paged.num_free_pages == paged.num_pages - 1  # the duplicate first page is the caller's


def test_evict_slab_drops_subtree():
    r, cold, hot, *_ = make(hot_size=20)
    slab = hot.alloc_slab(5)
    r.insert(np.arange(5), np.arange(slab.base, slab.end), [Segment(0, 5, HOT, slab, 0)])
    tail = cold.alloc(3)
    r.insert(np.arange(8), np.r_[np.arange(slab.base, slab.end), tail], [Segment(0, 8, COLD)])
    hot.release(slab)
    freed = r.evict_slab(slab)
    assert freed == 5 + 3 and r.cached_slots == 0 and not hot.slabs


def test_node_ending_at_and_repoint():
    r, cold, hot, *_ = make(hot_size=20)
    s = cold.alloc(6)
    _, n = r.insert(np.arange(6), s, [Segment(0, 6, COLD)])
    r.lock(n)
    x = r.node_ending_at(n, 4)
    assert len(x) == 4 and r.position(x) == 0 and x.lock_ref == 1
    slab = hot.alloc_slab(4)
    old = r.repoint_to_slab(x, slab)
    assert old[0][0] == 0 and old[0][1].tolist() == s[:4].tolist()
    assert x.kind == HOT and x.slots.tolist() == list(range(slab.base, slab.end))
    assert slab.refcount == 2 and slab.node_refs == 1  # allocator's hold + the locked node
    with pytest.raises(ValueError):
        r.repoint_to_slab(n, slab)  # the path now holds a HOT node
