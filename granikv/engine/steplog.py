"""Per-step timing log of an Engine: how long each extend and decode step took on the host clock.

Why: a serving cell reports only end-to-end metrics; when one system is slower than another
the first question is which phase (prefill/extend or decode) and which step sizes cost the
time. `/server_info` carries this summary, and `harness.run.cell` stores it in the result file.
Times are host wall times of `Engine.step()` (an extend step waits for its tokens, so it
includes its GPU time; an overlapped decode step's time is the wait for the previous one).
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass
class PhaseLog:
    count: int = 0
    total_s: float = 0.0
    tokens: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=256))  # (tokens, requests, ms)
    # steps and seconds by the step's request count, rounded up to a power of two: where a run's
    # time goes over the whole run (`recent` keeps only its end), e.g. how much of the decode
    # total the draining tail of small batches takes
    by_batch: dict = field(default_factory=dict)
    # the run's slowest steps wherever they fall, as a min-heap of (ms, step index, requests):
    # a one-off stall (a Triton compile or graph capture inside the run, a host pause) hides in
    # the by-batch totals and falls outside `recent`, and the slowest steps say when it happened
    # and how long it took (tests/engine/test_no_compile_gpu.py: what a stall inside a run costs)
    slowest: list = field(default_factory=list)
    keep_slowest: int = 8

    def add(self, tokens: int, reqs: int, seconds: float) -> None:
        self.count += 1
        self.total_s += seconds
        self.tokens += tokens
        ms = round(seconds * 1e3, 3)
        self.recent.append((tokens, reqs, ms))
        entry = (ms, self.count - 1, reqs)
        if len(self.slowest) < self.keep_slowest:
            heapq.heappush(self.slowest, entry)
        elif ms > self.slowest[0][0]:
            heapq.heapreplace(self.slowest, entry)
        bucket = 1 << max(reqs - 1, 0).bit_length()
        n_s = self.by_batch.setdefault(bucket, [0, 0.0])
        n_s[0] += 1
        n_s[1] += seconds

    def summary(self, keep: int) -> dict:
        ms = [r[2] for r in self.recent]
        out = {"count": self.count, "total_s": round(self.total_s, 4), "tokens": self.tokens,
               "recent_median_ms": statistics.median(ms) if ms else None,
               "recent_max_ms": max(ms) if ms else None,
               "by_batch": {str(b): [n, round(t, 4)] for b, (n, t) in sorted(self.by_batch.items())},
               # [step index (0 = the phase's first step since start), requests, ms], slowest first
               "slowest": [[i, n, ms] for ms, i, n in sorted(self.slowest, reverse=True)]}
        if keep:
            out["recent"] = [list(r) for r in list(self.recent)[-keep:]]
        return out


@dataclass
class StepLog:
    extend: PhaseLog = field(default_factory=PhaseLog)
    decode: PhaseLog = field(default_factory=PhaseLog)

    def summary(self) -> dict:
        return {"extend": self.extend.summary(keep=64), "decode": self.decode.summary(keep=0)}
