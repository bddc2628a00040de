"""Randomized operation sequences against every storage policy (hypothesis state machines).

After every operation: `Storage.audit()` (each usable slot free or owned exactly once, reference
counts and lock counts consistent, HOT nodes inside their slabs, lent slots accounted for, HOT
prefixes contiguous) and a KV-content check: a simulated KV array records what each slot holds,
so a live request reading a slot that eviction freed and someone else overwrote is caught.
At the end of every sequence everything is released and the pools must be whole again.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from granikv.systems import make_storage

PREFIXES = [list(range(100, 100 + n)) for n in (24, 40, 9)] + [list(range(100, 112)) + [7] * 20]
STEPS_PER_POLICY = 10_000


def value(tokens, positions):
    """What the KV of a token at a position 'is' in the simulation."""
    return np.asarray(tokens, dtype=np.int64) * 4096 + np.asarray(positions, dtype=np.int64)


class StorageMachine(RuleBasedStateMachine):
    system = "granikv"
    cold_page = 1  # granikv's COLD page size (paged COLD, P > 1, is the Table 18 ablation)
    steps = 0  # per class, read by the test
    seen: set  # which interesting situations the random runs reached, per class

    @initialize(num_slots=st.sampled_from([160, 240, 400]), hot_fraction=st.sampled_from([0.0, 0.15, 0.4]),
                page_size=st.sampled_from([1, 2, 4]), promote=st.sampled_from([0, 1, 2]))
    def setup(self, num_slots, hot_fraction, page_size, promote):
        self.st = make_storage(self.system, num_slots, page_size=page_size if self.system != "granikv" else 16,
                               hot_fraction=hot_fraction, max_running=6, max_context=96,
                               min_prefix_for_hot=8, promote_min_refs=promote, check=True,
                               cold_page_size=self.cold_page)
        self.kv = np.full(num_slots, -1, dtype=np.int64)
        self.tokens: dict[int, list[int]] = {}  # row -> tokens whose KV exists
        self.adms = {}
        self.plans = []

    def _count(self):
        type(self).steps += 1

    def _pick(self, i):
        rows = sorted(self.adms)
        return self.adms[rows[i % len(rows)]] if rows else None

    # ---- operations ----------------------------------------------------------------------------
    @rule(p=st.integers(0, len(PREFIXES)), cut=st.integers(0, 40),
          suffix=st.lists(st.integers(0, 5), min_size=1, max_size=12), explicit=st.booleans())
    def admit(self, p, cut, suffix, explicit):
        self._count()
        prefix = PREFIXES[p][:cut] if p < len(PREFIXES) else []
        toks = prefix + suffix
        adm = self.st.admit(toks, shared_prefix_len=len(prefix) if explicit and prefix else None)
        self.plans.extend(self.st.take_promotions())
        if adm is None:
            return
        # reused KV must be exactly what the prompt would have produced
        cached = adm.slots[: adm.cached_len]
        assert np.array_equal(self.kv[cached], value(toks[: adm.cached_len], np.arange(adm.cached_len)))
        assert 0 not in adm.slots
        self.kv[adm.slots[adm.cached_len :]] = value(toks[adm.cached_len :], np.arange(adm.cached_len, len(toks)))
        self.adms[adm.row] = adm
        self.tokens[adm.row] = list(toks)

    @precondition(lambda self: self.adms)
    @rule(i=st.integers(0, 10), n=st.integers(1, 20), tok=st.integers(0, 5))
    def grow(self, i, n, tok):
        self._count()
        adm = self._pick(i)
        L = self.st.seq_len(adm)
        if L + n > self.st.max_context:
            return
        slots = self.st.grow(adm, n)
        if slots is None:
            return
        assert len(slots) == n and 0 not in slots
        new = [tok] * n
        self.kv[slots] = value(new, np.arange(L, L + n))
        self.tokens[adm.row] += new

    @precondition(lambda self: self.adms)
    @rule(mask=st.lists(st.booleans(), min_size=6, max_size=6), tok=st.integers(0, 5))
    def grow_batch(self, mask, tok):
        self._count()
        rows = np.array([r for k, r in enumerate(sorted(self.adms)) if mask[k % 6]], dtype=np.int64)
        rows = rows[self.st.seq_lens[rows] < self.st.max_context]
        before = self.st.seq_lens[rows].copy()
        slots = self.st.grow_batch(rows)
        if slots is None:
            assert np.array_equal(self.st.seq_lens[rows], before)
            return
        assert len(set(slots.tolist())) == len(rows)
        self.kv[slots] = value([tok] * len(rows), before)
        for r in rows.tolist():
            self.tokens[r].append(tok)

    @precondition(lambda self: self.adms)
    @rule(i=st.integers(0, 10))
    def cache_prompt(self, i):
        self._count()
        adm = self._pick(i)
        self.st.cache_prompt(adm, self.tokens[adm.row])

    @precondition(lambda self: self.adms)
    @rule(i=st.integers(0, 10), drop_last=st.booleans())
    def finish(self, i, drop_last):
        self._count()
        adm = self._pick(i)
        toks = self.tokens.pop(adm.row)
        del self.adms[adm.row]
        self.st.finish(adm, toks[:-1] if drop_last else toks)

    @precondition(lambda self: self.adms)
    @rule(i=st.integers(0, 10))
    def abort(self, i):
        self._count()
        adm = self._pick(i)
        del self.tokens[adm.row]
        del self.adms[adm.row]
        self.st.abort(adm)

    @rule(n=st.integers(1, 100))
    def evict(self, n):
        self._count()
        self.st.evict(n)

    @rule()
    def flush(self):
        self._count()
        self.st.flush()

    @precondition(lambda self: self.plans)
    @rule(commit=st.booleans())
    def promotion(self, commit):
        self._count()
        plan = self.plans.pop(0)
        if commit:
            self.kv[plan.dst] = self.kv[plan.src]  # the engine's copy
            self.st.commit_promotion(plan)
        else:
            self.st.cancel_promotion(plan)

    # ---- checks --------------------------------------------------------------------------------
    @invariant()
    def consistent(self):
        if not hasattr(self, "st"):
            return
        self.st.audit()
        s = self.st.stats()
        for k in ("hot_admits", "hot_hits", "hot_fallbacks", "lent_slots", "cached_slabs", "evicted_slots",
                  "promotions_committed", "admit_failures", "cached_tokens"):
            if s.get(k):
                self.seen.add(k)
        for r, adm in self.adms.items():
            L = self.st.seq_len(adm)
            assert L == len(self.tokens[r])
            assert np.array_equal(self.kv[self.st.table[r, :L]], value(self.tokens[r], np.arange(L)))

    def teardown(self):
        if not hasattr(self, "st"):
            return
        for plan in self.plans:
            self.st.cancel_promotion(plan)
        for adm in list(self.adms.values()):
            self.st.abort(adm)
        self.st.flush()
        self.st.audit()
        s = self.st
        assert not s.radix.root.children and not s.live
        if s.system == "granikv":
            assert not s.hot.slabs and s.hot.num_lent == 0
            assert s.pool.num_free == s.pool.capacity and s.hot.num_free == s.hot.size
        else:
            assert s.pool.num_free_pages == s.pool.num_pages


# derandomize: the same >10,000 operations every run, so the coverage assertion below is a
# property of the code, not of the seed (randomly seeded runs missed `lent_slots` about once in 3)
SETTINGS = settings(max_examples=300, stateful_step_count=60, deadline=None, print_blob=True, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _run(system, cold_page=1):
    attrs = {"system": system, "cold_page": cold_page, "steps": 0, "seen": set()}
    machine = type(f"{system.title()}Machine", (StorageMachine,), attrs)
    run_state_machine_as_test(machine, settings=SETTINGS)
    label = f"{system}, COLD page {cold_page}" if system == "granikv" else system
    print(f"{label}: {machine.steps} random operations, reached {sorted(machine.seen)}")
    assert machine.steps >= STEPS_PER_POLICY, machine.steps
    # The situations the random runs must reach (promotions are reached in most runs but not all,
    # so they are covered deterministically in test_storage.py instead).
    must = {"evicted_slots", "admit_failures", "cached_tokens"}
    if system == "granikv":
        must |= {"hot_admits", "hot_hits", "hot_fallbacks", "cached_slabs"}
        if cold_page == 1:  # a paged COLD pool lends nothing
            must.add("lent_slots")
    assert must <= machine.seen, must - machine.seen


def test_random_operations_paged():
    _run("paged")


def test_random_operations_cascade():
    _run("cascade")


def test_random_operations_granikv():
    _run("granikv")


def test_random_operations_granikv_paged_cold():
    """The Table 18 ablation: COLD in 4-slot pages, the radix tree in whole pages."""
    _run("granikv", cold_page=4)
