"""What every storage does alike (storage/base.py): rows wait for a free one, slot 0 is never handed
out, a request ends once, reused rows, growth up to max_context, and unchecked pools (the engine's)
behave like checked ones."""

import numpy as np
import pytest
from storage_testutil import gk, seq

from granikv.systems import make_storage


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


def test_double_finish_rejected():
    st = gk()
    a = st.admit([1, 2, 3])
    st.finish(a, [1, 2, 3])
    with pytest.raises(ValueError):
        st.abort(a)


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
