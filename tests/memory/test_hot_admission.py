"""HOT admission never destroys cached KV it does not have to (Table 20, k=64: the cached-slab
evictions of promotions and of new explicit prefixes more than doubled the evicted KV and made
granikv recompute 1.39x paged's prefill; see harness/microbench/replay.py)."""

import numpy as np

from granikv.memory import HotPool
from granikv.memory.admission import lru_tail_slabs
from granikv.memory.radix import HOT
from granikv.systems import make_storage


def seq(start, n):
    return list(range(start, start + n))


def gk(num_slots=201, hot_fraction=0.5, **kw):
    kw.setdefault("max_running", 8)
    kw.setdefault("max_context", 200)
    kw.setdefault("min_prefix_for_hot", 16)
    return make_storage("granikv", num_slots, hot_fraction=hot_fraction, check=True, **kw)


def hot_run_len(st, tokens):
    m = st.radix.match_prefix(np.array(tokens, dtype=np.int32))
    return sum(len(x) for x in st.radix.path(m.node) if x.kind == HOT)


def test_promotion_never_evicts_a_cached_slab():
    st = gk()  # HOT [1, 101), COLD [101, 201)
    S, P = seq(0, 100), seq(5000, 40)
    a = st.admit(S + [1], shared_prefix_len=100)  # a slab filling HOT
    st.finish(a, S + [1])
    assert st.hot.num_cached == 1
    b = st.admit(P + [1])  # P cached in COLD
    st.finish(b, P + [1])
    c = st.admit(P + [2, 3], shared_prefix_len=40)  # named, cached whole in COLD: a promotion candidate
    assert c is not None and c.cached_len == 40 and c.prefix is None
    assert st.take_promotions() == []  # only free HOT space may hold a copy of cached KV
    assert st.policy.promotions_failed == 1
    assert hot_run_len(st, S) == 100  # the cached slab survived
    st.audit()
    st.abort(c)
    st.flush()
    st.audit()


def test_promotion_still_uses_free_hot_space():
    st = gk()
    P = seq(5000, 40)
    a = st.admit(P + [1])
    st.finish(a, P + [1])
    b = st.admit(P + [2], shared_prefix_len=40)
    (plan,) = st.take_promotions()
    assert plan.length == 40
    st.commit_promotion(plan)
    st.abort(b)
    assert hot_run_len(st, P) == 40
    st.audit()


def test_new_prefix_keeps_a_slab_newer_than_the_cold_lru_tail():
    st = gk()  # HOT [1, 101), COLD [101, 201)
    Z, S, N = seq(2000, 80), seq(0, 60), seq(1000, 70)
    z = st.admit(Z + [1])  # oldest: a COLD prompt nobody reads any more
    st.finish(z, Z + [1])
    s = st.admit(S + [1], shared_prefix_len=60)  # newer: a cached slab
    st.finish(s, S + [1])
    assert st.hot.num_cached == 1 and st.hot.largest_free == 40
    assert lru_tail_slabs(st.radix, 70) == set()  # LRU eviction of 70 slots takes Z, not the slab
    n = st.admit(N + [1], shared_prefix_len=70)
    assert n is not None and n.prefix is None  # COLD (B.10) rather than evicting the newer slab
    assert hot_run_len(st, S) == 60
    assert st.radix.match_prefix(np.array(Z, dtype=np.int32)).length == 0  # LRU took Z instead
    st.audit()
    st.abort(n)
    st.flush()
    st.audit()


def test_lru_tail_slabs_counts_a_slab_once_all_its_nodes_are_in():
    st = gk()
    S = seq(0, 60)
    a = st.admit(S + [1], shared_prefix_len=60)
    st.finish(a, S + [1])
    b = st.admit(S[:30] + [7, 7])  # splits the slab's node: two nodes point into it
    st.finish(b, S[:30] + [7, 7])
    slab = next(iter(st.hot.slabs.values()))
    assert slab.node_refs == 2
    assert lru_tail_slabs(st.radix, 1) == set()  # one leaf is not the whole slab
    assert lru_tail_slabs(st.radix, 200) == {slab.id}
    st.audit()


def test_slab_eviction_only_when_it_makes_room():
    h = HotPool(1, 30)
    a, b, c = h.alloc_slab(10), h.alloc_slab(10), h.alloc_slab(10)
    for s in (a, b, c):
        h.add_node_ref(s)
    h.release(b)  # cached, but between two live slabs: evicting it frees 10 contiguous slots
    evicted = []

    def evict(slab):
        evicted.append(slab.id)
        h.drop_node_ref(slab)

    assert h.alloc_slab(15, evict=evict) is None
    assert evicted == [] and b.id in h.slabs  # not destroyed for an allocation that fails anyway
    assert h.alloc_slab(10, evict=evict, may_evict=lambda s: False) is None and evicted == []
    d = h.alloc_slab(10, evict=evict)
    assert evicted == [b.id] and d.base == b.base
