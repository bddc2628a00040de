"""`granikv` storage (storage/granikv.py): named prefixes in HOT slabs and their fallback to COLD,
slab eviction, HOT slots lent to COLD, and the COLD page-size ablation."""

import numpy as np
from storage_testutil import drain, gk, seq


def test_granikv_explicit_prefix_goes_to_a_slab_and_is_shared():
    st = gk()
    P = seq(5000, 64)
    a = st.admit(P + [1, 2, 3], shared_prefix_len=64)
    assert a.prefix is not None and a.cached_len == 0
    base = a.prefix.hot_base
    assert a.slots[:64].tolist() == seq(base, 64)
    assert st.hot.start <= base and base + 64 <= st.hot.end
    assert all(s >= st.hot.end for s in a.slots[64:])  # suffix in COLD
    st.cache_prompt(a, P + [1, 2, 3])
    b = st.admit(P + [7, 8], shared_prefix_len=64)
    assert b.cached_len == 64 and b.prefix == a.prefix
    c = st.admit(P + [9])  # no explicit boundary: still reads the slab
    assert c.prefix is not None and c.prefix.hot_base == base
    assert st.counters.hot_admits == 1 and st.counters.hot_hits == 2
    st.audit()
    st.finish(a, P + [1, 2, 3, 4])
    st.finish(b, P + [7, 8])
    st.abort(c)
    st.audit()
    assert st.hot.num_cached == 1  # refcount 0, prefix kept for reuse
    d = st.admit(P + [11], shared_prefix_len=64)
    assert d.prefix.hot_base == base and d.cached_len == 64
    st.abort(d)
    drain(st)
    assert st.hot.free_ranges() == [(1, 1 + st.hot.size)]


def test_slab_exactly_filling_hot_region():
    st = gk(num_slots=201, hot_fraction=0.5)  # HOT = [1, 101)
    P = seq(0, 100)
    a = st.admit(P + [1], shared_prefix_len=100)
    assert a.prefix.hot_base == 1 and a.prefix.prefix_len == 100
    assert st.hot.num_free == 0
    b = st.admit(seq(300, 50) + [1], shared_prefix_len=50)  # no room: falls back to COLD
    assert b is not None and b.prefix is None and st.counters.hot_fallbacks == 1
    assert all(s >= st.hot.end for s in b.slots)
    st.audit()
    drain(st)


def test_fallback_when_hot_region_too_small_still_correct():
    st = gk(num_slots=201, hot_fraction=0.1)
    a = st.admit(seq(0, 40), shared_prefix_len=30)
    assert a.prefix is None and st.counters.hot_fallbacks == 1
    st.finish(a, seq(0, 40))
    b = st.admit(seq(0, 35), shared_prefix_len=30)
    assert b.cached_len == 34 and b.prefix is None
    st.audit()
    drain(st)


def test_cached_slab_evicted_lru_for_a_new_prefix():
    st = gk(num_slots=201, hot_fraction=0.5)  # HOT holds 100
    a = st.admit(seq(0, 60) + [1], shared_prefix_len=60)
    st.finish(a, seq(0, 60) + [1])
    assert st.hot.num_cached == 1
    b = st.admit(seq(1000, 70) + [1], shared_prefix_len=70)
    assert b.prefix is not None and b.prefix.hot_base == 1  # the old slab was evicted, reused
    assert st.radix.match_prefix(np.array(seq(0, 60))).length == 0
    st.audit()
    drain(st)


def test_hot_slots_lent_to_cold_and_taken_back():
    st = gk(num_slots=101, hot_fraction=0.5)  # HOT [1,51), COLD [51,101)
    a = st.admit(seq(0, 50))
    assert st.pool.num_free == 0
    b = st.admit(seq(100, 20))  # all 20 slots lent from HOT
    assert b is not None and st.hot.num_lent == 20
    assert all(s < st.hot.end for s in b.slots)
    s = st.grow(b, 5)
    assert st.hot.num_lent == 25 and all(x < st.hot.end for x in s)
    st.audit()
    st.abort(b)
    assert st.hot.num_lent == 0 and st.hot.free_ranges() == [(1, 51)]
    st.audit()
    st.abort(a)
    drain(st)


def test_lent_slots_block_slabs_until_returned():
    st = gk(num_slots=101, hot_fraction=0.5)
    a = st.admit(seq(0, 50))
    b = st.admit(seq(100, 30))  # lent from the top of HOT: [21, 51)
    c = st.admit(seq(300, 30) + [1], shared_prefix_len=30)  # only 20 HOT slots left -> fallback
    assert c is None or c.prefix is None
    st.abort(b)
    d = st.admit(seq(600, 30) + [1], shared_prefix_len=30)
    assert d is not None and d.prefix is not None
    st.audit()
    for x in (a, c, d):
        if x is not None:
            st.abort(x)
    drain(st)


def test_accidental_short_hot_match_is_not_a_prefix():
    st = gk(min_prefix_for_hot=16)
    P = seq(5000, 64)
    a = st.admit(P + [1], shared_prefix_len=64)
    st.cache_prompt(a, P + [1])
    b = st.admit(P[:3] + [9, 9, 9])  # shares 3 slab tokens by accident (think: a BOS)
    assert b.cached_len == 3 and b.prefix is None
    c = st.admit(P[:20] + [9])  # 20 >= min_prefix_for_hot: worth a prefix pass over the slab
    assert c.prefix is not None and c.prefix.prefix_len == 20
    st.audit()
    drain(st)


def test_stats_keys():
    s = gk().stats()
    for k in ("hot_admits", "hot_fallbacks", "lent_slots", "cached_slabs", "cold_free", "hot_free"):
        assert k in s


def test_cold_page_size_ablation():
    st = gk(num_slots=1001, cold_page_size=4)
    P = seq(5000, 64)
    a = st.admit(P + [1, 2, 3, 4, 5], shared_prefix_len=64)
    assert a.prefix is not None and a.slots[64] % 4 == 0  # COLD part starts on a fresh 4-slot page
    assert a.slots[64:].tolist() == list(range(a.slots[64], a.slots[64] + 5))
    s = st.grow(a, 4)
    assert s.tolist()[:3] == [a.slots[68] + 1, a.slots[68] + 2, a.slots[68] + 3] and s[3] % 4 == 0
    st.cache_prompt(a, P + [1, 2, 3, 4, 5])  # whole pages of the prompt are cached
    assert st.radix.cached_slots == 68
    b = st.admit(P + [7], shared_prefix_len=64)
    assert b.cached_len == 64 and b.prefix == a.prefix
    st.audit()
    st.finish(a, P + [1, 2, 3, 4, 5] + [0] * 4)
    st.finish(b, P + [7])
    st.audit()
    assert st.pool.num_free == st.pool.capacity - 8 and st.hot.num_cached == 1  # 2 cached pages
    drain(st)


def test_cold_page_size_ablation_shares_without_a_hint():
    """Paged COLD caches whole pages of un-named prefixes, so later requests share them and the
    shared run is promoted to a slab as with token-level COLD; named prefixes end on a page."""
    st = gk(num_slots=4001, cold_page_size=4)
    P = seq(5000, 66)
    a = st.admit(P + [1])
    st.cache_prompt(a, P + [1])
    assert st.radix.cached_slots == 64  # 67 tokens: 16 whole pages
    b = st.admit(P + [2])
    assert b.cached_len == 64 and b.slots[:64].tolist() == a.slots[:64].tolist()
    assert b.slots[64] % 4 == 0  # its own part starts on a fresh page
    plans = st.take_promotions()
    assert len(plans) == 1 and plans[0].length == 64
    st.commit_promotion(plans[0])
    st.audit()
    assert a.prefix is not None and a.prefix.prefix_len == 64 and b.prefix == a.prefix
    c = st.admit(P + [3], shared_prefix_len=66)  # a named prefix is rounded down to pages
    assert c.prefix == a.prefix and c.cached_len == 64
    st.audit()
    for x, t in ((a, P + [1]), (b, P + [2]), (c, P + [3])):
        st.finish(x, t)
    st.audit()
    drain(st)
