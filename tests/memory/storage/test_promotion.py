"""Promotion of a shared COLD prefix to a HOT slab (`GraniKVStorage.commit_promotion`): every live
reader of the promoted path is re-pointed to the slab, no other row is, and the COLD copy is freed."""

import numpy as np
import torch
from storage_testutil import TokenKV, drain, gk, seq

from granikv.memory import KVCache


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
