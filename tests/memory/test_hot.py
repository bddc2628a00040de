import numpy as np
import pytest

from granikv.memory import HotPool


def test_first_fit_and_exact_fill():
    h = HotPool(1, 100)
    a = h.alloc_slab(40)
    b = h.alloc_slab(60)  # exactly fills the region
    assert (a.base, a.end) == (1, 41) and (b.base, b.end) == (41, 101)
    assert h.num_free == 0 and h.free_ranges() == []
    assert h.alloc_slab(1) is None
    assert h.alloc_slab(101) is None


def test_release_coalesces_and_reuses_without_fragmentation():
    h = HotPool(1, 90)
    a, b, c = h.alloc_slab(30), h.alloc_slab(30), h.alloc_slab(30)
    h.release(a)
    h.release(c)
    assert h.free_ranges() == [(1, 31), (61, 91)]
    assert h.alloc_slab(40) is None  # 60 free but fragmented
    h.release(b)
    assert h.free_ranges() == [(1, 91)]  # all three merged
    d = h.alloc_slab(90)
    assert d.base == 1 and d.length == 90


def test_first_fit_picks_lowest_hole():
    h = HotPool(1, 100)
    s = [h.alloc_slab(10) for _ in range(10)]
    h.release(s[7])
    h.release(s[2])
    assert h.alloc_slab(10).base == s[2].base


def test_cached_slab_stays_until_evicted_lru():
    h = HotPool(1, 30)
    a, b, c = h.alloc_slab(10), h.alloc_slab(10), h.alloc_slab(10)
    for s in (a, b, c):
        h.add_node_ref(s)  # a radix node holds each prefix
    h.release(b)
    h.release(a)
    h.release(c)
    assert {s.id for s in h.cached_lru()} == {a.id, b.id, c.id}
    assert [s.id for s in h.cached_lru()] == [b.id, a.id, c.id]
    h.touch(c)
    assert [s.id for s in h.cached_lru()] == [b.id, a.id, c.id]
    h.touch(b)
    assert [s.id for s in h.cached_lru()] == [a.id, c.id, b.id]
    h.touch(c)
    assert h.num_free == 0
    evicted = []

    def evict(slab):
        evicted.append(slab.id)
        h.drop_node_ref(slab)

    d = h.alloc_slab(15, evict=evict)
    # a (LRU) goes first; 10 slots are not enough; b next is adjacent to a -> 20 contiguous.
    assert evicted == [a.id, b.id]
    assert d.base == 1 and d.length == 15
    assert h.num_cached == 1


def test_no_eviction_of_held_slabs_means_fallback():
    h = HotPool(1, 20)
    a = h.alloc_slab(20)
    h.add_node_ref(a)
    assert h.alloc_slab(5, evict=lambda s: h.drop_node_ref(s)) is None  # held: no demotion
    assert a.id in h.slabs


def test_evict_callback_must_release():
    h = HotPool(1, 10)
    a = h.alloc_slab(10)
    h.add_node_ref(a)
    h.release(a)
    with pytest.raises(RuntimeError):
        h.alloc_slab(5, evict=lambda s: None)


def test_split_refs_release_only_when_last_node_goes():
    h = HotPool(1, 10)
    a = h.alloc_slab(10)
    h.add_node_ref(a)
    h.add_node_ref(a)  # a node split inside the slab
    h.release(a)
    assert h.drop_node_ref(a) == 0 and a.id in h.slabs
    assert h.drop_node_ref(a) == 10 and a.id not in h.slabs
    assert h.free_ranges() == [(1, 11)]


def test_lend_from_top_and_take_back():
    h = HotPool(1, 20)
    s = h.alloc_slab(5)  # [1, 6)
    lent = h.lend(4)
    assert sorted(lent.tolist()) == [17, 18, 19, 20]
    assert h.num_lent == 4 and h.free_ranges() == [(6, 17)]
    assert h.alloc_slab(12) is None  # lent slots are never slab space
    assert h.alloc_slab(11).base == 6
    assert h.lend(1) is None
    h.take_back(np.array([19, 17]))
    assert h.num_lent == 2 and h.free_ranges() == [(17, 18), (19, 20)]
    h.take_back(np.array([20, 18]))
    assert h.free_ranges() == [(17, 21)]
    with pytest.raises(ValueError):
        h.take_back(np.array([18]))  # not lent any more
    h.release(s)
    assert h.free_ranges() == [(1, 6), (17, 21)]


def test_lend_spans_ranges():
    h = HotPool(1, 10)
    a = h.alloc_slab(3)
    b = h.alloc_slab(3)  # [4,7)
    h.release(a)
    out = h.lend(6)  # [7,11) and then [2,4)... from the top: 4 from [7,11), 2 from [1,4)
    assert sorted(out.tolist()) == [2, 3, 7, 8, 9, 10]
    assert h.free_ranges() == [(1, 2)]
    h.take_back(out)
    h.release(b)
    assert h.free_ranges() == [(1, 11)] and h.num_lent == 0


def test_over_release_rejected():
    h = HotPool(1, 4)
    a = h.alloc_slab(2)
    h.release(a)
    with pytest.raises(ValueError):
        h.release(a)
