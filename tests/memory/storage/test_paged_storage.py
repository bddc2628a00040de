"""`paged` and `cascade` storage (storage/paged.py): page-aligned sharing, pages filled in order,
LRU eviction, all-or-nothing growth, a prompt that ends inside its last page."""

import numpy as np
import pytest
from storage_testutil import drain, seq

from granikv.systems import make_storage


def test_paged_prefix_sharing_is_page_aligned():
    st = make_storage("paged", 400, page_size=4, max_running=4, max_context=100, check=True)
    prefix = seq(1000, 10)
    a = st.admit(prefix + [1, 2])
    assert a.cached_len == 0 and a.prefix is None
    assert st.cache_prompt(a, prefix + [1, 2]) == 12
    b = st.admit(prefix + [7, 7, 7])
    assert b.cached_len == 8  # 10 shared tokens, rounded down to pages
    assert b.slots[:8].tolist() == a.slots[:8].tolist()
    assert b.slots[8] % 4 == 0  # the rest starts on a fresh page
    st.audit()
    drain(st)
    assert st.available() == st.pool.capacity


def test_paged_grow_fills_pages_in_order():
    st = make_storage("cascade", 400, page_size=4, max_running=4, max_context=100, check=True)
    a = st.admit(seq(0, 5))  # 2 pages, 3 slots of room
    b = st.admit(seq(50, 4))  # 1 page, full
    base = a.slots[4]
    s = st.grow_batch(np.array([a.row, b.row]))
    assert s[0] == base + 1 and s[1] % 4 == 0
    s2 = st.grow(a, 4)
    assert s2.tolist()[:2] == [base + 2, base + 3] and s2[2] % 4 == 0
    st.audit()
    st.finish(a, seq(0, 5) + [9] * 5)  # 10 tokens: 8 cached, the tail page freed
    assert st.radix.cached_slots == 8
    st.abort(b)
    st.audit()


def test_paged_admission_evicts_lru_cache_and_fails_when_locked():
    st = make_storage("paged", 65, page_size=4, max_running=4, max_context=64, check=True)
    cap = st.pool.capacity  # 15 pages = 60 slots
    a = st.admit(seq(0, 40))
    st.finish(a, seq(0, 40))
    assert st.radix.cached_slots == 40 and st.available() == cap - 40
    b = st.admit(seq(500, 40))  # needs eviction of the cached prompt
    assert b is not None and st.counters.evicted_slots >= 20
    st.audit()
    assert st.admit(seq(900, 40)) is None  # b is locked: nothing more to evict
    st.audit()
    st.abort(b)
    drain(st)


def test_grow_batch_all_or_nothing():
    st = make_storage("paged", 33, page_size=4, max_running=4, max_context=64, check=True)
    a = st.admit(seq(0, 16))
    b = st.admit(seq(100, 12))
    assert st.pool.num_free_pages == 0
    assert st.grow_batch(np.array([a.row, b.row])) is None
    assert st.seq_len(a) == 16 and st.seq_len(b) == 12
    st.audit()


def test_paged_prompt_up_to_max_context_not_a_page_multiple():
    st = make_storage("paged", 401, page_size=4, max_running=2, max_context=42, check=True)
    a = st.admit(seq(0, 42))  # 11 pages, the last one only half inside the row
    s = a.slots.tolist()
    assert len(s) == 42 and all(x % 4 == 0 for x in s[::4])
    assert all(y == x + 1 for i, (x, y) in enumerate(zip(s, s[1:])) if (i + 1) % 4)
    with pytest.raises(ValueError):
        st.grow(a, 1)
    with pytest.raises(ValueError):
        st.grow_batch(np.array([a.row]))
    st.finish(a, seq(0, 42))
    assert st.radix.cached_slots == 40
    st.audit()
