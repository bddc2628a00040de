"""Where a granikv replay's evictions and recompute come from (a diagnostic beside replay.py).

    python -m harness.diagnostics.replay_causes --workload /tmp/mp64.jsonl --num-slots 555175 --batch 256

Runs `replay`'s load against granikv with one storage instance instrumented (its bound methods
wrapped on the instance; the library is unchanged) and reports:
- evicted slots by call site and node kind: `admit` (COLD pressure while placing a prompt),
  `grow_batch` (decode growth), `admit.slab` (a new explicit prefix making room in HOT),
  `promote.slab` (a promotion making room in HOT), `other` (flush);
- slab allocations by site and outcome, and why the failed ones failed (`all_slabs_live`: every
  slab has readers; `fragmented`: enough free HOT slots but not contiguous; `lent`: enough
  counting slots lent to COLD; `cached_slabs_kept`: only evicting cached slabs could make room,
  and the policy kept them);
- named-prefix tokens: computed in COLD after a fallback, COLD-cached heads recomputed into a
  new slab, served from a slab.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

from harness.microbench.replay import ReplayConfig, engine_config, offers, serve, stub_engine, warm_up
from harness.run.workloads.requests import read_workload


@dataclass
class Ledger:
    evicted: Counter = field(default_factory=Counter)  # (site, node kind) -> slots
    slab_allocs: Counter = field(default_factory=Counter)  # (site, ok|fail) -> count
    slab_alloc_evicted: Counter = field(default_factory=Counter)  # (site, ok|fail) -> slots evicted
    slab_failures: Counter = field(default_factory=Counter)  # (site, reason) -> count
    named: Counter = field(default_factory=Counter)  # named-prefix token accounting
    lent_sum: int = 0
    steps: int = 0

    def summary(self) -> dict:
        n = max(1, self.steps)
        return {
            "evicted_slots": {f"{s}/{k}": v for (s, k), v in self.evicted.most_common()},
            "slab_allocs": {f"{s}/{o}": v for (s, o), v in sorted(self.slab_allocs.items())},
            "slab_alloc_evicted_slots": {f"{s}/{o}": v for (s, o), v in sorted(self.slab_alloc_evicted.items())},
            "slab_alloc_failures": {f"{s}/{r}": v for (s, r), v in sorted(self.slab_failures.items())},
            "named_prefix_tokens": dict(self.named),
            "mean_lent_slots": round(self.lent_sum / n, 1),
        }


class Instrument:
    """Wraps one GraniKVStorage's (and its engine's) methods to fill a Ledger."""

    def __init__(self, engine):
        self.engine, self.st = engine, engine.storage
        self.ledger = Ledger()
        self.site = ["other"]
        self._wrap_remove()
        self._wrap_slab_alloc("alloc_slab", "admit.slab")
        self._wrap_slab_alloc("promotion_slab", "promote.slab")
        self._wrap_site(self.st, "grow_batch", "grow_batch")
        self._wrap_admit()
        self._wrap_step()

    @contextmanager
    def at(self, site: str):
        self.site.append(site)
        try:
            yield
        finally:
            self.site.pop()

    def _wrap_remove(self) -> None:
        radix, orig = self.st.radix, self.st.radix._remove

        def _remove(node):
            freed = orig(node)
            self.ledger.evicted[(self.site[-1], node.kind)] += freed
            return freed

        radix._remove = _remove

    def _wrap_site(self, obj, name: str, site: str) -> None:
        orig = getattr(obj, name)

        def wrapped(*a, **kw):
            with self.at(site):
                return orig(*a, **kw)

        setattr(obj, name, wrapped)

    def _failure_reason(self, length: int) -> str:
        h = self.st.hot
        if h.num_free >= length:
            return "fragmented"
        if h.num_free + h.num_lent >= length:
            return "lent"
        return "all_slabs_live" if h.num_cached == 0 else "cached_slabs_kept"

    def _wrap_slab_alloc(self, name: str, site: str) -> None:
        pol = self.st.policy
        orig = getattr(pol, name)

        def wrapped(length):
            reason = self._failure_reason(length)
            before = self.st.counters.evicted_slots
            with self.at(site):
                slab = orig(length)
            outcome = "ok" if slab is not None else "fail"
            self.ledger.slab_allocs[(site, outcome)] += 1
            self.ledger.slab_alloc_evicted[(site, outcome)] += self.st.counters.evicted_slots - before
            if slab is None:
                self.ledger.slab_failures[(site, reason)] += 1
            return slab

        setattr(pol, name, wrapped)

    def _wrap_admit(self) -> None:
        st, orig = self.st, self.st._admit

        def _admit(tokens, shared_prefix_len):
            with self.at("admit"):
                adm = orig(tokens, shared_prefix_len)
            if adm is not None and shared_prefix_len:
                self._count_named(adm, int(shared_prefix_len))
            return adm

        st._admit = _admit

    def _count_named(self, adm, lp: int) -> None:
        named = self.ledger.named
        if adm.slab is not None:
            named["computed_into_new_slab"] += lp
        elif adm.prefix is not None:
            named["served_from_slab"] += lp
        else:
            named["computed_in_cold"] += lp - min(lp, adm.cached_len)
            named["served_from_cold"] += min(lp, adm.cached_len)

    def _wrap_step(self) -> None:
        engine, orig = self.engine, self.engine.step

        def step():
            out = orig()
            led = self.ledger
            led.lent_sum += self.st.hot.num_lent
            led.steps += 1
            return out

        engine.step = step


def explain(requests, rc: ReplayConfig) -> dict:
    engine, c = stub_engine(engine_config("granikv", rc), rc.num_slots)
    inst = Instrument(engine)
    load = offers(requests, rc)
    warm_up(engine, load, rc)
    serve(engine, load, rc.batch, max_steps=rc.max_steps)
    st = engine.stats()
    return {"prefill_tokens": c.prefill_tokens, "evicted_slots": st["storage"]["evicted_slots"],
            "retractions": st["retractions"], **inst.ledger.summary()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--num-slots", type=int, default=ReplayConfig.num_slots)
    ap.add_argument("--batch", type=int, default=ReplayConfig.batch)
    ap.add_argument("--hot-fraction", type=float, default=ReplayConfig.hot_fraction)
    ap.add_argument("--max-context", type=int, default=ReplayConfig.max_context)
    args = ap.parse_args(argv)
    rc = ReplayConfig(batch=args.batch, num_slots=args.num_slots, hot_fraction=args.hot_fraction,
                      max_context=args.max_context)
    print(json.dumps(explain(read_workload(args.workload).requests, rc), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
