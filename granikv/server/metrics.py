"""Prometheus `/metrics`, with the `prometheus-client` library and one registry per app.

Two sources: what the HTTP side sees per request (TTFT, time per output token, prompt and
generated tokens, finished requests by finish reason: `Metrics.trace`), and what the engine
counts itself (running / waiting requests, HOT / COLD slot occupancy, the attention
dispatcher's prefix-pass counters), read from the engine's `stats` (the same dict
`/server_info` serves) at scrape time by `EngineCollector`. The registry is the app's own,
never prometheus_client's global default: two apps in one process (the tests) keep separate
counts.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "granikv"
# seconds; TTFT spans a CPU prefill (seconds) down to a GPU one (milliseconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


class EngineCollector:
    """The engine's own counters, from the last `stats` dict handed to `update`."""

    def __init__(self) -> None:
        self.stats: dict = {}

    def update(self, stats: dict) -> None:
        self.stats = stats

    def describe(self):
        return []  # collected on demand only: the values exist once a scrape fetched them

    def collect(self):
        s = self.stats
        if not s:
            return
        yield GaugeMetricFamily(f"{PREFIX}_num_running_reqs", "requests the engine is running", s.get("running", 0))
        yield GaugeMetricFamily(f"{PREFIX}_num_waiting_reqs", "requests waiting for admission", s.get("waiting", 0))
        st = s.get("storage", {})
        for pool in ("hot", "cold"):
            total, free = st.get(f"{pool}_slots"), st.get(f"{pool}_free")
            if total:
                yield GaugeMetricFamily(f"{PREFIX}_{pool}_slots", f"{pool.upper()} KV slots", total)
                yield GaugeMetricFamily(f"{PREFIX}_{pool}_occupancy", f"share of {pool.upper()} KV slots in use",
                                        (total - free) / total)
        if "num_slots" in st:
            yield GaugeMetricFamily(f"{PREFIX}_kv_slots", "KV slots in the cache", st["num_slots"])
        att = s.get("attention", {})
        steps = CounterMetricFamily(f"{PREFIX}_decode_steps", "decode steps by attention path", labels=["path"])
        for key in ("decode_steps", "dense_steps", "cascade_steps", "paged_steps"):
            if key in att:
                steps.add_metric([key.removesuffix("_steps").replace("decode", "all")], att[key])
        yield steps
        classes = CounterMetricFamily(f"{PREFIX}_prefix_class_decisions",
                                      "the dispatcher's per-prefix-class decisions", labels=["decision"])
        for k, v in att.get("class_decisions", {}).items():
            classes.add_metric([k], v)
        yield classes
        for key, doc in (("retractions", "requests retracted for memory"), ("hot_admits", "admissions to HOT slabs"),
                         ("hot_fallbacks", "HOT admissions that fell back to COLD")):
            if key in s:
                yield CounterMetricFamily(f"{PREFIX}_{key}", doc, value=s[key])


class Metrics:
    """The app's registry and the per-request series."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.engine = EngineCollector()
        self.registry.register(self.engine)
        r = self.registry
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "tokens generated", registry=r)
        self.success = Counter(f"{PREFIX}_request_success", "finished requests", ["finish_reason"], registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "time to first token", registry=r,
                              buckets=TTFT_BUCKETS)
        self.tpot = Histogram(f"{PREFIX}_time_per_output_token_seconds",
                              "time per output token after the first (inter-token latency)", registry=r,
                              buckets=TPOT_BUCKETS)
        self.e2e = Histogram(f"{PREFIX}_e2e_request_latency_seconds", "request latency", registry=r,
                             buckets=TTFT_BUCKETS)

    def trace(self, prompt_tokens: int) -> RequestTrace:
        self.prompt_tokens.inc(prompt_tokens)
        return RequestTrace(self)

    def render(self, stats: dict | None) -> bytes:
        self.engine.update(stats or {})
        return generate_latest(self.registry)


class RequestTrace:
    """One engine request's timing, as its handler sees the tokens arrive."""

    __slots__ = ("m", "t0", "first", "last", "n", "done")

    def __init__(self, m: Metrics) -> None:
        self.m = m
        self.t0 = time.perf_counter()
        self.first: float | None = None
        self.last = self.t0
        self.n = 0
        self.done = False

    def tokens(self, k: int) -> None:
        if k <= 0:
            return
        now = time.perf_counter()
        if self.first is None:
            self.first = now
            self.m.ttft.observe(now - self.t0)
        self.last = now
        self.n += k
        self.m.generation_tokens.inc(k)

    def finish(self, reason: str | None) -> None:
        if self.done:
            return
        self.done = True
        self.m.success.labels(reason or "unknown").inc()
        self.m.e2e.observe(time.perf_counter() - self.t0)
        if self.first is not None and self.n > 1:
            self.m.tpot.observe((self.last - self.first) / (self.n - 1))
