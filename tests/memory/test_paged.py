import numpy as np
import pytest

from granikv.memory import PagedPool


def test_pages_never_touch_slot_zero():
    p = PagedPool(1, 64, page_size=16, check=True)
    assert p.first_page == 1 and p.end_page == 4 and p.num_pages == 3
    pages = p.alloc_pages(3)
    assert pages.tolist() == [1, 2, 3]
    assert 0 not in p.slots_of(pages)
    assert p.alloc_pages(1) is None


def test_slots_in_page_order():
    p = PagedPool(1, 100, page_size=4)
    s = p.alloc(6)
    assert s.tolist() == [4, 5, 6, 7, 8, 9]
    assert p.num_free_pages == p.num_pages - 2


def test_free_and_reuse():
    p = PagedPool(1, 33, page_size=8, check=True)
    a = p.alloc_pages(2)
    p.free_pages(a[:1])
    assert p.num_free_pages == p.num_pages - 1
    with pytest.raises(AssertionError):
        p.free_pages(a[:1])
    with pytest.raises(ValueError):
        p.free_pages(np.array([0]))


def test_pages_of():
    p = PagedPool(1, 100, page_size=4)
    assert p.pages_of(np.array([4, 7, 9, 8])).tolist() == [1, 2]
