import numpy as np
import pytest

from granikv.memory import ColdPool, HotPool


def test_alloc_free_roundtrip_and_exhaustion():
    c = ColdPool(1, 11, check=True)
    a = c.alloc(4)
    assert a.dtype == np.int32 and a.tolist() == [1, 2, 3, 4]
    b = c.alloc(6)
    assert c.num_free == 0 and c.alloc(1) is None
    assert 0 not in np.concatenate([a, b])
    c.free(a)
    assert c.num_free == 4 and c.num_used == 6
    got = c.alloc(4)
    assert sorted(got.tolist()) == [1, 2, 3, 4]


def test_failed_alloc_changes_nothing():
    c = ColdPool(5, 9)
    assert c.alloc(5) is None
    assert c.num_free == 4


def test_double_free_detected():
    c = ColdPool(1, 5, check=True)
    a = c.alloc(2)
    c.free(a)
    with pytest.raises(AssertionError):
        c.free(a[:1])


def test_region_must_exclude_slot_zero():
    with pytest.raises(ValueError):
        ColdPool(0, 5)


def test_borrows_from_hot_and_gives_back():
    hot = HotPool(1, 10)
    c = ColdPool(11, 14, lender=hot, check=True)
    assert c.available == 13
    got = c.alloc(5)  # 3 own + 2 lent from the top of HOT
    assert sorted(got.tolist()) == [9, 10, 11, 12, 13]
    assert hot.num_lent == 2 and hot.num_free == 8
    assert hot.free_ranges() == [(1, 9)]
    c.free(got)
    assert hot.num_lent == 0 and hot.free_ranges() == [(1, 11)]
    assert c.num_free == 3


def test_lending_fails_whole():
    hot = HotPool(1, 2)
    c = ColdPool(3, 4, lender=hot)
    assert c.alloc(4) is None
    assert c.num_free == 1 and hot.num_free == 2 and hot.num_lent == 0
