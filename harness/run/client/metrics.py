"""Serving metrics, defined exactly as SGLang's `bench_serving` defines them.

The client records raw timestamps per request (`RequestRecord`); everything here is a pure
function of those records, so a metric can always be recomputed from a result file.

Definitions (bench_serving's `calculate_metrics` and `async_request_sglang_generate`):

- a *chunk* is one streamed `data: {...}` event that carries >= 1 new output token; its token
  count is the increase of `meta_info.completion_tokens` (1 per chunk with text/output_ids
  when the server sends no meta_info);
- TTFT = arrival of the first chunk - send time;
- latency (E2E) = arrival of the last line (`data: [DONE]`) - send time;
- TPOT per request = (latency - TTFT) / (output_tokens - 1), only for output_tokens > 1;
- ITL: for every chunk after the first, (its arrival - previous chunk's arrival) / n_new,
  repeated n_new times (so a chunk of several tokens counts as several equal gaps);
- output tokens = the last `completion_tokens` seen (fallback: number of chunks);
- input tokens = len(input_ids) of the request;
- duration = first send to last completion (over every request sent, failed or not);
  throughputs divide token/request totals of the *successful* requests by it;
- mean / median / percentiles with numpy (`np.percentile`, linear interpolation); a metric
  with no samples is 0.0, as in bench_serving.

Differences from bench_serving, on purpose: a chunk counts as a token by its token count, not
by non-empty text (a tiny random model can emit tokens that decode to ""), and a stream that
ends without `[DONE]` or with no token is a failure, not a success.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestRecord:
    """What the client saw of one request. Times are `time.perf_counter()` seconds."""

    id: str
    prompt_len: int
    max_new_tokens: int
    success: bool = False
    error: str = ""
    status: int | None = None
    start: float = 0.0                 # just before the POST was issued
    end: float = 0.0                   # last line received (or the failure)
    chunk_times: list[float] = field(default_factory=list)  # seconds since `start`
    chunk_tokens: list[int] = field(default_factory=list)   # new tokens in each chunk
    output_tokens: int = 0
    prompt_tokens: int | None = None   # as reported by the server
    cached_tokens: int | None = None   # as reported by the server (prefix-cache hits)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] if self.chunk_times else 0.0

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        if self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        out: list[float] = []
        for j in range(1, len(self.chunk_times)):
            n = self.chunk_tokens[j]
            out.extend([(self.chunk_times[j] - self.chunk_times[j - 1]) / n] * n)
        return out


def _stats(name: str, seconds: Sequence[float], which: Sequence[str]) -> dict[str, float]:
    arr = np.asarray(seconds if len(seconds) else [0.0], dtype=np.float64)
    fns = {
        "mean": lambda a: np.mean(a),
        "median": lambda a: np.median(a),
        "p90": lambda a: np.percentile(a, 90),
        "p99": lambda a: np.percentile(a, 99),
    }
    return {f"{w}_{name}_ms": float(fns[w](arr)) * 1000.0 for w in which}


STATS = ("mean", "median", "p90", "p99")


def compute_metrics(records: Sequence[RequestRecord]) -> dict[str, float | int]:
    """bench_serving's metrics over the measured requests (warm-up excluded by the caller)."""
    ok = [r for r in records if r.success]
    duration = (max(r.end for r in records) - min(r.start for r in records)) if records else 0.0
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    ttfts = [r.ttft for r in ok]
    tpots = [t for t in (r.tpot for r in ok) if t is not None]
    itls = [x for r in ok for x in r.itl]
    e2e = [r.latency for r in ok]

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    metrics: dict[str, float | int] = {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "total_cached_tokens": sum(r.cached_tokens or 0 for r in ok),
        "request_throughput": per_s(len(ok)),
        "input_throughput": per_s(total_in),
        "output_throughput": per_s(total_out),
        "total_throughput": per_s(total_in + total_out),
        "concurrency": per_s(sum(e2e)),
    }
    metrics |= _stats("ttft", ttfts, STATS)
    metrics |= _stats("tpot", tpots, STATS)
    metrics |= _stats("itl", itls, STATS)
    metrics |= _stats("e2e_latency", e2e, STATS)
    return metrics
