"""The client's run: warm-up, an optional cache flush, then the measured requests under a
concurrency cap, each sent when its arrival time comes (the package docstring gives the shape).

Why every setting is a field of ClientConfig: the result file records `config.client` from it, so
what the client did is always on file beside the numbers it measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from granikv.runtime import aio
from harness.run.client.metrics import RequestRecord, compute_metrics
from harness.run.client.sessions import run_sessions
from harness.run.client.stream import read_stream
from harness.run.workloads.requests import WorkloadRequest, is_closed_loop

# Streamed lines can be long (cumulative text); bench_serving raises aiohttp's 64 KiB default too.
_READ_BUFSIZE = 10 * 1024**2
APIS = {"generate": "/generate", "completions": "/v1/completions"}  # api -> path


@dataclass(frozen=True)
class ClientConfig:
    """How the load is offered. Every field lands in the result file."""

    rate: float = math.inf             # requests/s of the Poisson process; inf = all at once
    max_concurrency: int | None = 256  # in-flight cap (the paper's B); None = no cap
    warmup_requests: int = 1
    warmup_output_len: int = 32
    flush_cache: bool = False          # POST /flush_cache after warm-up, before the run
    send_prefix_hint: bool = False     # add "shared_prefix_len" to the payload
    request_timeout_s: float = 3600.0  # per request, send to last byte
    max_new_tokens: int | None = None  # override every request's output_len
    temperature: float = 0.0
    ignore_eos: bool = True
    progress: bool = True              # tqdm on stderr, only when stderr is a tty
    api: str = "generate"              # "generate": POST /generate; "completions": POST /v1/completions
    model: str | None = None           # completions' "model" field (servers check it); None: the
                                       # first id of the server's GET /v1/models, as bench_serving does

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", float(self.rate))
        if not self.rate > 0:
            raise ValueError("rate must be > 0 (inf for all at once)")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1 or None")
        if self.warmup_requests < 0 or self.request_timeout_s <= 0:
            raise ValueError("warmup_requests must be >= 0 and request_timeout_s > 0")
        if self.api not in APIS:
            raise ValueError(f"api must be one of {sorted(APIS)}, got {self.api!r}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rate"] = "inf" if math.isinf(self.rate) else self.rate
        return d


@dataclass
class BenchmarkResult:
    """Metrics of the measured run, plus every raw record (measured and warm-up)."""

    metrics: dict[str, float | int]
    records: list[RequestRecord]
    warmup: list[RequestRecord] = field(default_factory=list)
    flush_status: int | None = None
    max_in_flight: int = 0
    config: ClientConfig = field(default_factory=ClientConfig)
    # this process's CPU seconds over the measured run: near duration_s, the client was the
    # bottleneck (one asyncio loop reads every chunk; harness/diagnostics/client_stream.py)
    client_cpu_s: float | None = None

    def errors(self) -> dict[str, int]:
        """Failure reasons of the measured requests, with counts."""
        out: dict[str, int] = {}
        for r in self.records:
            if not r.success:
                key = r.error.split("\n", 1)[0][:120]
                out[key] = out.get(key, 0) + 1
        return out

    def to_dict(self, with_records: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "client": self.config.to_dict(),
            "metrics": self.metrics,
            "errors": self.errors(),
            "flush_status": self.flush_status,
            "max_in_flight": self.max_in_flight,
            "client_cpu_s": self.client_cpu_s,
            "event_loop": aio.event_loop_name(),  # the client's and (same host, same env) the server's
            "warmup": [asdict(r) for r in self.warmup],
        }
        if with_records:
            d["records"] = [asdict(r) for r in self.records]
        return d


def build_payload(req: WorkloadRequest, max_new_tokens: int, cfg: ClientConfig,
                  want_ids: bool = False) -> dict[str, Any]:
    """The JSON body of `POST /generate` (or `/v1/completions`, per `cfg.api`) for `req`.
    `want_ids` (closed-loop sessions): ask a completions server for the output token ids
    (/generate streams them anyway)."""
    payload: dict[str, Any]
    if cfg.api == "completions":
        payload = {"model": cfg.model or "default", "prompt": req.input_ids, "max_tokens": max_new_tokens,
                   "temperature": cfg.temperature, "ignore_eos": cfg.ignore_eos, "stream": True,
                   "stream_options": {"include_usage": True}}
        if want_ids:
            payload["return_token_ids"] = True
        if cfg.send_prefix_hint and req.shared_prefix_len > 0:
            payload["shared_prefix_len"] = req.shared_prefix_len
        return payload
    payload = {
        "input_ids": req.input_ids,
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "ignore_eos": cfg.ignore_eos,
            "temperature": cfg.temperature,
        },
        "stream": True,
    }
    if cfg.send_prefix_hint and req.shared_prefix_len > 0:
        payload["shared_prefix_len"] = req.shared_prefix_len
    return payload


async def send_request(
    session: aiohttp.ClientSession, url: str, req: WorkloadRequest, max_new_tokens: int, cfg: ClientConfig,
    ids: list[int] | None = None,
) -> RequestRecord:
    """POST one streaming request and record its timeline; never raises (but on cancel). With
    `ids` (closed-loop sessions), the output token ids are appended to it; a response that does
    not carry them all fails the request."""
    rec = RequestRecord(id=req.id, prompt_len=len(req.input_ids), max_new_tokens=max_new_tokens)
    payload = build_payload(req, max_new_tokens, cfg, want_ids=ids is not None)
    timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
    rec.start = time.perf_counter()
    try:
        async with session.post(url, json=payload, timeout=timeout) as resp:
            rec.status = resp.status
            if resp.status != 200:
                body = await resp.text()
                rec.end = time.perf_counter()
                rec.error = f"HTTP {resp.status}: {body[:300]}"
                return rec
            await read_stream(resp, rec, cfg.api, ids)
    except TimeoutError:
        rec.end = time.perf_counter()
        rec.success = False
        rec.error = f"TimeoutError: no complete answer within {cfg.request_timeout_s} s"
    except Exception as e:  # noqa: BLE001 - every failure is data, not a crash
        rec.end = time.perf_counter()
        rec.success = False
        rec.error = f"{type(e).__name__}: {e}"
    return rec



def _progress(total: int, cfg: ClientConfig):
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, disable=not (cfg.progress and sys.stderr.isatty()),
                unit="req", dynamic_ncols=True)


async def _served_model(session: aiohttp.ClientSession, base: str) -> str:
    """The first model id the server lists (`GET /v1/models`); "default" when it lists none."""
    async with session.get(base + "/v1/models") as r:
        if r.status != 200:
            return "default"
        data = (await r.json()).get("data") or []
    return str(data[0]["id"]) if data else "default"


async def run_benchmark(base_url: str, requests: Sequence[WorkloadRequest], cfg: ClientConfig,
                        on_warmed: Callable[[], Awaitable[Any]] | None = None) -> BenchmarkResult:
    """Offer `requests` to the server at `base_url` as `cfg` says; return metrics and records.
    `on_warmed` is awaited after the warm-up (and flush), right before the measured run: the
    cell snapshots the engine's counters there, so the run's own steps can be told apart."""
    base = base_url.rstrip("/")
    url = base + APIS[cfg.api]
    connector = aiohttp.TCPConnector(limit=0)  # the semaphore is the only cap (default is 100)
    async with aiohttp.ClientSession(connector=connector, read_bufsize=_READ_BUFSIZE) as session:
        if cfg.api == "completions" and not cfg.model:
            cfg = dataclasses.replace(cfg, model=await _served_model(session, base))
        warmup: list[RequestRecord] = []
        if cfg.warmup_requests and requests:
            first = requests[0]
            n = min(cfg.max_new_tokens or first.output_len, cfg.warmup_output_len)
            warmup = list(await asyncio.gather(
                *(send_request(session, url, first, n, cfg) for _ in range(cfg.warmup_requests))
            ))
            if not any(r.success for r in warmup):
                print(f"[client] warning: every warm-up request failed: {warmup[0].error}", file=sys.stderr)

        flush_status = None
        if cfg.flush_cache:
            flush_status = await _flush(session, base, cfg)

        if on_warmed is not None:
            await on_warmed()

        sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        in_flight = 0
        max_in_flight = 0
        bar = _progress(len(requests), cfg)

        async def one(req: WorkloadRequest, ready_at: float, ids: list[int] | None = None) -> RequestRecord:
            nonlocal in_flight, max_in_flight
            delay = ready_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem is not None:
                await sem.acquire()
            try:
                in_flight += 1
                max_in_flight = max(max_in_flight, in_flight)
                rec = await send_request(session, url, req, cfg.max_new_tokens or req.output_len, cfg, ids)
            finally:
                in_flight -= 1
                if sem is not None:
                    sem.release()
            bar.update(1)
            return rec

        t0 = time.perf_counter()
        cpu0 = time.process_time()
        try:
            if is_closed_loop(requests):
                records = await run_sessions(requests, t0, cfg.rate, cfg.max_new_tokens, one)
            else:
                records = list(await asyncio.gather(
                    *(one(r, t0 + r.arrival_offset(cfg.rate)) for r in requests)
                ))
        finally:
            bar.close()
        client_cpu_s = time.process_time() - cpu0

    return BenchmarkResult(
        metrics=compute_metrics(records),
        records=records,
        warmup=warmup,
        flush_status=flush_status,
        max_in_flight=max_in_flight,
        config=cfg,
        client_cpu_s=client_cpu_s,
    )


async def _flush(session: aiohttp.ClientSession, base: str, cfg: ClientConfig) -> int | None:
    try:
        async with session.post(base + "/flush_cache",
                                timeout=aiohttp.ClientTimeout(total=cfg.request_timeout_s)) as resp:
            await resp.read()
            if resp.status != 200:
                print(f"[client] warning: /flush_cache answered HTTP {resp.status}", file=sys.stderr)
            return resp.status
    except Exception as e:  # noqa: BLE001
        print(f"[client] warning: /flush_cache failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None
