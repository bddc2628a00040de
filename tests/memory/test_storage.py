import numpy as np
import pytest
import torch

from granikv.config import EngineConfig
from granikv.memory import GraniKVStorage, KVCache, PagedStorage, make_storage, storage_from_config


def seq(start, n):
    return list(range(start, start + n))


def drain(st):
    for adm in list(st.live.values()):
        st.abort(adm)
    st.flush()
    st.audit()


# ---------------------------------------------------------------------------------------------- paged
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


# -------------------------------------------------------------------------------------------- granikv
def gk(num_slots=1001, hot_fraction=0.2, **kw):
    kw.setdefault("max_running", 8)
    kw.setdefault("max_context", 600)
    kw.setdefault("min_prefix_for_hot", 16)
    return make_storage("granikv", num_slots, hot_fraction=hot_fraction, check=True, **kw)


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


def test_promotion_commit_repoints_live_readers_and_frees_cold_copy():
    st = gk(num_slots=2001, min_prefix_for_hot=32, promote_min_refs=2, max_context=200)
    kv = KVCache(num_layers=2, num_slots=2001, num_kv_heads=1, head_dim=1)
    P = seq(7000, 40)
    a = st.admit(P + [1])
    kv.k[0][torch.as_tensor(a.slots, dtype=torch.long), 0, 0] = torch.as_tensor(P + [1]).float()
    st.cache_prompt(a, P + [1])
    b = st.admit(P + [2])
    assert b.cached_len == 40 and b.prefix is None
    # a (through cache_prompt) and b both read the 40-token COLD prefix: 2 live readers
    plans = st.take_promotions()
    assert len(plans) == 1 and plans[0].length == 40
    plan = plans[0]
    assert plan.src.tolist() == a.slots[:40].tolist()
    kv.copy_slots(torch.as_tensor(plan.src), torch.as_tensor(plan.dst))
    st.audit()
    old = a.slots[:40].copy()
    a_own = int(a.slots[40])
    repointed = st.commit_promotion(plan)
    st.audit()
    # both live readers now read the slab, as a request admitted after the commit does
    assert sorted(repointed) == sorted([(a.row, 40), (b.row, 40)])
    base = plan.slab.base
    for x in (a, b):
        assert x.slots[:40].tolist() == list(range(base, base + 40))
        assert x.prefix is not None and (x.prefix.hot_base, x.prefix.prefix_len) == (base, 40)
        got = kv.k[0][torch.as_tensor(x.slots[:40], dtype=torch.long), 0, 0]
        assert got.tolist() == [float(t) for t in P]
    assert int(a.slots[40]) == a_own  # private positions untouched
    assert np.isin(old, st.pool.free_slots()).all()  # the COLD copy is freed at the commit
    assert st.stats()["promoted_readers"] == 2
    c = st.admit(P + [3])
    assert c.prefix is not None and c.prefix.prefix_len == 40 and c.cached_len == 40
    st.finish(a, P + [1])
    st.finish(b, P + [2])
    st.audit()
    st.abort(c)
    drain(st)
    assert st.available() == 2000


def test_promotion_repoints_only_the_run_a_row_reads():
    """A row that matched only the head of the promoted path (a split node) gets that head
    re-pointed, its own continuation stays private; short runs get no prefix."""
    st = gk(num_slots=2001, min_prefix_for_hot=24, promote_min_refs=2, max_context=200)
    P = seq(7000, 40)
    a = st.admit(P + [1])
    st.cache_prompt(a, P + [1])
    head = st.admit(P[:20] + [5, 6, 7])  # splits the node at 20 (too short to promote)
    b = st.admit(P + [2])  # the second reader of the whole 40 (a promotion)
    (plan,) = [p for p in st.take_promotions() if p.length == 40]
    st.audit()
    rep = dict(st.commit_promotion(plan))
    st.audit()
    assert rep == {a.row: 40, b.row: 40, head.row: 20}
    assert head.slots[:20].tolist() == list(range(plan.slab.base, plan.slab.base + 20))
    assert head.prefix is None  # 20 < min_prefix_for_hot: read on the plain path
    assert a.prefix.prefix_len == 40 and b.prefix.prefix_len == 40
    for x in (a, b, head):
        st.abort(x)
    drain(st)
    assert st.available() == 2000


def test_explicit_prefix_cached_in_cold_is_promoted_on_first_sight():
    st = gk(num_slots=2001, min_prefix_for_hot=32, max_context=200)
    P = seq(7000, 40)
    a = st.admit(P + [1])
    st.finish(a, P + [1])
    b = st.admit(P + [2, 3], shared_prefix_len=40)
    assert b.cached_len == 40 and b.prefix is None
    (plan,) = st.take_promotions()
    assert plan.length == 40
    st.cancel_promotion(plan)
    st.audit()
    st.abort(b)
    drain(st)


def test_promotion_without_live_readers_frees_cold_copy():
    st = gk(num_slots=2001, min_prefix_for_hot=32, max_context=200)
    P = seq(7000, 40)
    a = st.admit(P + [1])
    st.finish(a, P + [1])
    b = st.admit(P + [2], shared_prefix_len=40)
    (plan,) = st.take_promotions()
    st.abort(b)
    st.commit_promotion(plan)
    st.audit()
    drain(st)
    assert st.available() == 2000


def test_no_free_row_means_wait():
    st = gk(max_running=1)
    a = st.admit([1, 2])
    assert st.admit([3, 4]) is None
    st.abort(a)
    assert st.admit([3, 4]) is not None


def test_slot_zero_never_handed_out():
    for system in ("paged", "granikv"):
        st = make_storage(system, 64, page_size=4, hot_fraction=0.25, max_running=16, max_context=64)
        got = []
        while (a := st.admit([1, 2, 3])) is not None:
            got.extend(a.slots.tolist())
            if st.grow(a, 1) is not None:
                got.append(int(st.table[a.row, 3]))
        assert 0 not in got


def test_from_engine_config():
    cfg = EngineConfig(system="granikv", hot_fraction=0.3, max_running=8, max_context=128)
    st = storage_from_config(cfg, 1001)
    assert isinstance(st, GraniKVStorage) and st.hot.size == 300
    st = storage_from_config(cfg.replace(system="cascade", page_size=8), 1001)
    assert isinstance(st, PagedStorage) and st.P == 8 and st.system == "cascade"
    with pytest.raises(ValueError):
        make_storage("vllm", 10)


def test_double_finish_rejected():
    st = gk()
    a = st.admit([1, 2, 3])
    st.finish(a, [1, 2, 3])
    with pytest.raises(ValueError):
        st.abort(a)


def test_stats_keys():
    s = gk().stats()
    for k in ("hot_admits", "hot_fallbacks", "lent_slots", "cached_slabs", "cold_free", "hot_free"):
        assert k in s


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


def test_promotion_repoints_a_reader_holding_a_private_copy_of_the_path_head():
    """A row that computed a prefix's head itself (someone cached those tokens first, so the row
    keeps a private copy) still reads the rest of the path through the node slots: a promotion of
    the path must re-point it as well (and free its copy), or it reads freed COLD slots."""
    st = gk(num_slots=400, min_prefix_for_hot=4)
    P = seq(100, 8)
    a = st.admit(P[:1] + [0])
    b = st.admit(P + [0])
    st.cache_prompt(a, P[:1] + [0])  # caches P[0]: b's slot of position 0 is now a private copy
    st.abort(a)
    st.cache_prompt(b, P + [0])
    assert b.closed == [(0, 1)]
    st.admit(P + [5])  # reads b's cached path: positions 1..7 are b's slots
    (plan,) = st.take_promotions()
    assert plan.length == 8
    st.commit_promotion(plan)
    base = plan.slab.base
    assert st.table[b.row, :8].tolist() == list(range(base, base + 8)) and b.closed == []
    assert b.prefix is not None and b.prefix.prefix_len == 8
    st.audit()  # also: every live row reads its locked path (none reads the freed COLD copy)
    drain(st)


class TokenKV:
    """A one-layer KV cache whose K at a slot is the token whose prefill wrote it: a row reads
    the right KV exactly when the K at its slots spells its own tokens."""

    def __init__(self, num_slots):
        self.kv = KVCache(num_layers=1, num_slots=num_slots, num_kv_heads=1, head_dim=1)

    def prefill(self, adm, tokens, start=None):
        """The request's prefill: positions [start (default cached_len), len(tokens))."""
        start = adm.cached_len if start is None else start
        slots = torch.as_tensor(adm.slots[start : len(tokens)], dtype=torch.long)
        self.kv.k[0][slots, 0, 0] = torch.as_tensor(tokens[start:], dtype=torch.float32)

    def promote(self, st):
        """Copy and commit every planned promotion, as the engine does after a step."""
        for plan in st.take_promotions():
            self.kv.copy_slots(torch.as_tensor(plan.src), torch.as_tensor(plan.dst))
            st.commit_promotion(plan)

    def reads(self, adm, tokens):
        got = self.kv.k[0][torch.as_tensor(adm.slots[: len(tokens)], dtype=torch.long), 0, 0]
        return [int(t) for t in got.tolist()]


def test_promotion_of_another_prefix_leaves_a_named_prefix_slab_alone():
    """A request whose named prefix sits in its own slab keeps reading that slab when another
    prompt's prefix is promoted, even one as long as it: the head of its slab is a copy of its
    own only of the nodes on its own path (before the fix it was moved onto the other slab)."""
    st, kv = gk(num_slots=2001, min_prefix_for_hot=16, promote_min_refs=2), TokenKV(2001)
    P, Q = seq(100, 32), seq(500, 16)
    a = st.admit(P + [1], shared_prefix_len=32)
    kv.prefill(a, P + [1])
    st.cache_prompt(a, P + [1])
    readers = []
    for _ in range(2):  # two readers of Q: the second plans a promotion of its 16 tokens
        b = st.admit(Q + [2])
        kv.prefill(b, Q + [2])
        st.cache_prompt(b, Q + [2])
        readers.append(b)
    kv.promote(st)
    assert st.stats()["promotions_committed"] == 1
    st.audit()
    assert kv.reads(a, P + [1]) == P + [1]
    for b in readers:
        assert kv.reads(b, Q + [2]) == Q + [2]
    drain(st)


def test_promotion_of_a_sibling_path_leaves_a_named_prefix_slab_alone_before_its_prefill_is_cached():
    """A request placed on a fresh slab for its named prefix locks no radix node until its prompt
    is cached; a promotion of a path that shares its head (two agents of one system prompt) must
    not re-point it, or it prefills and reads the other agent's role prompt."""
    st, kv = gk(num_slots=2001, min_prefix_for_hot=16, promote_min_refs=2), TokenKV(2001)
    S = seq(100, 33)  # the shared head
    A, B = S + seq(300, 19), S + seq(600, 20)  # two role prompts behind it
    a = st.admit(A + [1])
    kv.prefill(a, A + [1])
    st.cache_prompt(a, A + [1])
    a2 = st.admit(A + [2])  # the second reader of A: a promotion of A's 52 tokens is planned
    kv.prefill(a2, A + [2])
    b = st.admit(B + [3], shared_prefix_len=53)  # B is not cached: a fresh slab; splits A at 33
    assert b.prefix is not None and b.cached_len == 0
    kv.promote(st)  # commits before b's prefill is cached
    assert st.stats()["promotions_committed"] == 1
    st.audit()
    kv.prefill(b, B + [3])
    st.cache_prompt(b, B + [3])
    st.audit()
    assert kv.reads(b, B + [3]) == B + [3]
    assert kv.reads(a, A + [1]) == A + [1] and kv.reads(a2, A + [2]) == A + [2]
    c = st.admit(B + [4])  # a later request finds B's prompt as b cached it
    assert c.cached_len == 53 and kv.reads(c, B) == B
    drain(st)


def test_promotion_of_a_sibling_path_leaves_a_private_copy_of_the_shared_head_alone():
    """A row that holds a private copy of positions someone else cached first (a `closed` range)
    re-points only the promoted nodes on its own path: where the promoted path leaves the row's
    inside that range, the row's tokens are other tokens."""
    st, kv = gk(num_slots=400, min_prefix_for_hot=4, promote_min_refs=2), TokenKV(400)
    P = seq(100, 8)
    Z = P[:2] + [900, 901, 902]  # leaves P after 2 tokens
    a = st.admit(P[:5] + [0])
    b = st.admit(P + [0])
    kv.prefill(a, P[:5] + [0])
    kv.prefill(b, P + [0])
    st.cache_prompt(a, P[:5] + [0])
    st.cache_prompt(b, P + [0])  # b's positions 0..4 are now a private copy of a's
    assert b.closed == [(0, 5)]
    c = st.admit(Z + [7])
    kv.prefill(c, Z + [7])
    st.cache_prompt(c, Z + [7])
    d = st.admit(Z + [8])  # the second reader of Z's 5 tokens: a promotion
    kv.prefill(d, Z + [8])
    kv.promote(st)
    assert st.stats()["promotions_committed"] == 1
    st.audit()
    assert kv.reads(b, P + [0]) == P + [0]
    assert kv.reads(a, P[:5] + [0]) == P[:5] + [0]
    assert kv.reads(c, Z + [7]) == Z + [7] and kv.reads(d, Z + [8]) == Z + [8]
    drain(st)


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


# ------------------------------------------------------------------------------ host fast paths
@pytest.mark.parametrize("system", ["paged", "granikv"])
def test_reused_row_holds_exactly_its_prefix(system):
    """A row's prefix positions are rewritten only when the matched prefix differs from what the
    row's previous admission wrote there; either way the row must read exactly the matched slots."""
    st = make_storage(system, 4001, page_size=4, max_running=1, max_context=200, min_prefix_for_hot=8)
    prefix = seq(1000, 40)

    def run(toks, shared=None):
        a = st.admit(toks, shared_prefix_len=shared)
        m = st.radix.match_prefix(np.asarray(toks[: a.cached_len], dtype=np.int32))
        assert m.length == a.cached_len
        assert a.slots[: a.cached_len].tolist() == m.slots.tolist()
        st.cache_prompt(a, toks)
        st.grow_batch(np.array([a.row]))
        st.finish(a, toks + [5])
        st.audit()
        return a

    first = run(prefix + [1, 2, 3], shared=40 if system == "granikv" else None)
    a = run(prefix + [4, 5, 6])  # same row, same prefix node: the row is not rewritten
    assert a.row == first.row and a.cached_len >= 40 - 3
    b = run(prefix[:20] + [9] * 30)  # splits the prefix node: other slot arrays, the row is rewritten
    assert b.cached_len >= 20 - 3
    c = run(prefix + [7, 7])  # the prefix is two nodes now
    assert c.cached_len >= 40 - 3
    other = seq(5000, 40)
    run(other + [1, 2, 3])
    x = run(prefix + [8, 8])
    y = run(other + [4, 5])  # as long a prefix as x's, other slots: the row is rewritten
    assert x.cached_len == y.cached_len == 40 and x.row == y.row
    st.flush()
    st.audit()


@pytest.mark.parametrize("system", ["paged", "granikv"])
def test_grow_batch_stops_at_max_context(system):
    st = make_storage(system, 2001, page_size=4, max_running=4, max_context=40)
    a = st.admit(seq(0, 30))
    b = st.admit(seq(100, 10))
    rows = np.array([a.row, b.row])
    for _ in range(10):
        assert st.grow_batch(rows) is not None
    assert st.seq_len(a) == 40 and st.seq_len(b) == 20
    with pytest.raises(ValueError):
        st.grow_batch(rows)
    assert st.seq_len(a) == 40 and st.seq_len(b) == 20
    assert st.grow_batch(np.array([b.row])) is not None  # the other row still grows
    st.finish(a, seq(0, 30))
    c = st.admit(seq(500, 5))
    for _ in range(19):
        st.grow_batch(np.array([b.row, c.row]))
    assert st.seq_len(b) == 40 and st.seq_len(c) == 24
    with pytest.raises(ValueError):
        st.grow_batch(np.array([c.row, b.row]))
    st.audit()


@pytest.mark.parametrize("system,page_size", [("paged", 4), ("paged", 1), ("cascade", 3), ("granikv", 1)])
def test_unchecked_pools_behave_like_checked(system, page_size):
    """The pools skip their validation when not in checked mode (the engine's mode); the same
    operations must give the same slots, tables and counters either way."""
    rng = np.random.default_rng(3)
    sts = [make_storage(system, 600, page_size=page_size, hot_fraction=0.3, max_running=6, max_context=80,
                        min_prefix_for_hot=8, check=check) for check in (True, False)]
    prefixes = [seq(100, 30), seq(300, 12)]
    live: dict[int, list[int]] = {}
    for _ in range(400):
        op = rng.integers(0, 5)
        outs = []
        if op == 0:
            p = prefixes[rng.integers(0, 2)][: rng.integers(0, 31)]
            toks = p + rng.integers(0, 50, size=rng.integers(1, 10)).tolist()
            for st in sts:
                a = st.admit(toks, shared_prefix_len=len(p) or None)
                outs.append(None if a is None else (a.row, a.cached_len, a.slots.tolist(), a.prefix))
            if outs[0] is not None:
                live[outs[0][0]] = toks
        elif op == 1 and live:
            rows = np.array(sorted(r for r in live if len(live[r]) < 80), dtype=np.int64)
            for st in sts:
                s = st.grow_batch(rows)
                outs.append(None if s is None else s.tolist())
            if outs[0] is not None:
                for r in rows.tolist():
                    live[r] = live[r] + [1]
        elif op == 2 and live:
            r = sorted(live)[rng.integers(0, len(live))]
            n = int(min(rng.integers(1, 8), 80 - len(live[r])))
            for st in sts:
                s = st.grow(st.live[r], n) if n else None
                outs.append(None if s is None else s.tolist())
            if outs[0] is not None:
                live[r] = live[r] + [2] * n
        elif op == 3 and live:
            r = sorted(live)[rng.integers(0, len(live))]
            outs = [st.cache_prompt(st.live[r], live[r]) for st in sts]
        elif op == 4 and live:
            r = sorted(live)[rng.integers(0, len(live))]
            toks = live.pop(r)
            finish = rng.integers(0, 2) == 1
            for st in sts:
                if finish:
                    st.finish(st.live[r], toks)
                else:
                    st.abort(st.live[r])
        assert outs[0] == outs[1] if outs else True
        for r in live:
            L = sts[0].seq_len(sts[0].live[r])
            assert L == sts[1].seq_len(sts[1].live[r]) == len(live[r])
            assert sts[0].table[r, :L].tolist() == sts[1].table[r, :L].tolist()
        assert sts[0].stats() == sts[1].stats()
    for st in sts:
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
