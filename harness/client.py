"""Streaming load generator for the SGLang-native HTTP API (`POST /generate`) or the OpenAI one
(`POST /v1/completions`).

The same client drives every system (paged, cascade, granikv in the bundled engine, and a real
SGLang server), so differences in the numbers come from the servers, not from the client.
It sends what SGLang's `bench_serving --backend sglang` sends for token-id prompts:

    {"input_ids": [...], "sampling_params": {"max_new_tokens": N, "ignore_eos": true,
     "temperature": 0.0}, "stream": true}

plus, only when `send_prefix_hint` is set, `"shared_prefix_len": Lp` (the explicit HOT-prefix
boundary of DESIGN.md §4; off by default so the payload is exactly bench_serving's).

With `api="completions"` it sends what `bench_serving --backend vllm` (OpenAI completions) sends
for token-id prompts, plus `stream_options.include_usage` for an exact token count:

    {"model": M, "prompt": [...], "max_tokens": N, "temperature": 0.0, "ignore_eos": true,
     "stream": true, "stream_options": {"include_usage": true}}

(`ignore_eos` is an extra field SGLang and vLLM accept; the hint goes in the body the same way).
Each OpenAI chunk carries only its own text (`choices[0].text`): a chunk with text is one arrival
(TTFT, ITL), and the output token count is the final usage chunk's `completion_tokens` (the
count of chunks with text when a server sends no usage), as bench_serving counts them.

Run shape (bench_serving's): warm-up requests (the first workload request, at most
`warmup_output_len` tokens, excluded from metrics) -> optional `POST /flush_cache` -> the
measured run, where request i becomes ready at `t_unit_i / rate` (the workload's rate-1
Poisson times; `rate=inf` sends all at once) and then waits for one of `max_concurrency`
slots. Send time (TTFT's origin) is taken when the slot is granted, as in bench_serving.
Failed requests (HTTP errors, disconnects, timeouts, streams without `[DONE]`) are recorded
with their error and counted in `failed`; they never stop the run. Metrics: harness/metrics.py.

Closed-loop session mode (workloads whose requests carry a `session` step, kind `debate`): a
session is a sequence of rounds whose prompts depend on earlier outputs. Each session starts at
its first request's arrival time; its round r is sent (all members at once, each still waiting
for a `max_concurrency` slot) when every request of round r - 1 has finished, each prompt being
the request's `input_ids` with the output token ids of the session's earlier rounds (rounds in
order, members in order) inserted at `session.insert_at`. Sessions progress independently. The
output ids are read from the response: /generate's `output_ids` (cumulative, or incremental with
SGLang's incremental streaming); /v1/completions sends vLLM's `"return_token_ids": true` and reads
`choices[0].token_ids`, and a stream without them fails the request (a server that cannot return
ids cannot run a closed loop). A failed request ends its session: the later rounds are recorded
as failed ("not sent") and never sent, because a transcript with a turn missing would make every
later prompt a different workload from the one the file describes. Metrics are the same
functions of the same records (all rounds of all sessions: one duration, TTFT/TPOT per request).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from granikv.runtime import aio
from harness.metrics import RequestRecord, compute_metrics
from harness.workloads import WorkloadRequest, is_closed_loop, read_workload

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
            await _read_stream(resp, rec, cfg.api, ids)
    except TimeoutError:
        rec.end = time.perf_counter()
        rec.success = False
        rec.error = f"TimeoutError: no complete answer within {cfg.request_timeout_s} s"
    except Exception as e:  # noqa: BLE001 - every failure is data, not a crash
        rec.end = time.perf_counter()
        rec.success = False
        rec.error = f"{type(e).__name__}: {e}"
    return rec


_META_KEY = b'"meta_info":'


def _chunk(data: bytes) -> dict:
    """One `data:` event's object. The server (ours and SGLang's) puts `meta_info` last, after the
    cumulative text and ids, and the client needs only that: parsing just the tail keeps a chunk's
    cost flat as the output grows (harness/diagnostics/client_stream.py). The tail is trusted only
    when it is exactly the object's last value — a nested or quoted `"meta_info":` leaves it
    unbalanced, so it fails to parse — and no `"error":` key precedes it (inside a JSON string
    the quotes would be escaped, so text cannot fake either); else: a full parse."""
    i = data.rfind(_META_KEY)
    if i > 0 and data.startswith(b'{"text":') and data.endswith(b"}") and data.find(b'"error":', 0, i) < 0:
        try:
            meta = json.loads(data[i + len(_META_KEY):-1])
        except ValueError:
            meta = None
        if isinstance(meta, dict) and meta.get("completion_tokens") is not None:
            return {"meta_info": meta}
    obj = json.loads(data)
    return obj if isinstance(obj, dict) else {}


class _Events:
    """One stream's parse state, fed line by line (`data:` events, blank separators, comments)."""

    __slots__ = ("rec", "done", "last_completion", "content_chunks", "ids", "raw")
    KEEP_RAW = True  # /generate's ids are read from the raw chunks at the end

    def __init__(self, rec: RequestRecord, ids: list[int] | None = None) -> None:
        self.rec = rec
        self.done = False
        self.last_completion: int | None = None
        self.content_chunks = 0
        self.ids = ids              # the output ids go here (closed-loop sessions only)
        self.raw: list[bytes] = []  # with ids: every data chunk, read for its ids at the end

    def line(self, raw: bytes, now: float) -> bool:
        """Take one line received at `now`; True once the stream is over ([DONE], or an error)."""
        line = raw.strip()
        if not line.startswith(b"data:"):
            return False  # blank separators, SSE comments/other fields
        self.rec.end = now
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return True
        if self.ids is not None and self.KEEP_RAW:
            self.raw.append(data)
        return self.data(data, now)

    def data(self, data: bytes, now: float) -> bool:
        """One SGLang-native chunk (cumulative text; `meta_info` last, read from the tail)."""
        rec = self.rec
        obj = _chunk(data)
        if obj.get("error"):
            rec.error = f"server error in stream: {str(obj['error'])[:300]}"
            return True
        meta = obj.get("meta_info") or {}
        completion = meta.get("completion_tokens")
        if completion is not None:
            new = int(completion) - (self.last_completion or 0)
            self.last_completion = int(completion)
        else:
            has_content = bool(obj.get("text") or obj.get("output_ids"))
            new = 1 if has_content else 0
            self.content_chunks += new
        if new > 0:
            rec.chunk_times.append(now - rec.start)
            rec.chunk_tokens.append(new)
        if meta.get("prompt_tokens") is not None:
            rec.prompt_tokens = int(meta["prompt_tokens"])
        if meta.get("cached_tokens") is not None:
            rec.cached_tokens = int(meta["cached_tokens"])
        return False

    def finish(self) -> None:
        rec = self.rec
        if rec.error:
            return
        if not self.done:
            rec.error = "stream ended before [DONE]"
            return
        rec.output_tokens = self.last_completion if self.last_completion is not None else self.content_chunks
        if rec.output_tokens < 1 or not rec.chunk_times:
            rec.error = "no output tokens"
            return
        if self.ids is not None:
            got = self.output_ids()
            if got is None or len(got) != rec.output_tokens:
                rec.error = (f"the stream carried {0 if got is None else len(got)} output ids for "
                             f"{rec.output_tokens} tokens; a closed-loop session needs them all")
                return
            self.ids.extend(got)
        rec.success = True

    def output_ids(self) -> list[int] | None:
        """/generate's output ids: the last chunk's when chunks are cumulative (SGLang's default),
        else (incremental streaming) every chunk's, in order."""
        last = json.loads(self.raw[-1]) if self.raw else {}
        ids = last.get("output_ids") if isinstance(last, dict) else None
        if isinstance(ids, list) and len(ids) == self.rec.output_tokens:
            return [int(x) for x in ids]
        out: list[int] = []
        for data in self.raw:
            obj = json.loads(data)
            out += [int(x) for x in (obj.get("output_ids") or [] if isinstance(obj, dict) else [])]
        return out


class _CompletionEvents(_Events):
    """An OpenAI `/v1/completions` stream. A chunk holds only its own text, so its size (and a full
    parse) stays flat as the output grows: no tail trick is needed to keep the reader cheap."""

    __slots__ = ("raw_ids",)
    KEEP_RAW = False  # each chunk is parsed whole as it comes: its ids are taken then

    def __init__(self, rec: RequestRecord, ids: list[int] | None = None) -> None:
        super().__init__(rec, ids)
        self.raw_ids: list[int] = []  # vLLM's `return_token_ids`: each chunk's `choices[0].token_ids`

    def output_ids(self) -> list[int] | None:
        return self.raw_ids

    def data(self, data: bytes, now: float) -> bool:
        rec = self.rec
        obj = json.loads(data)
        if not isinstance(obj, dict):
            return False
        if obj.get("error"):
            rec.error = f"server error in stream: {str(obj['error'])[:300]}"
            return True
        choices = obj.get("choices")
        if choices and isinstance(choices[0], dict) and choices[0].get("text"):
            rec.chunk_times.append(now - rec.start)
            rec.chunk_tokens.append(1)  # the chunk's token count is not sent; usage gives the total
            self.content_chunks += 1
        if self.ids is not None and choices and isinstance(choices[0], dict):
            self.raw_ids.extend(int(x) for x in choices[0].get("token_ids") or ())
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if usage.get("completion_tokens") is not None:
                self.last_completion = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                rec.prompt_tokens = int(usage["prompt_tokens"])
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                rec.cached_tokens = int(details["cached_tokens"])
        return False


async def _read_stream(resp: aiohttp.ClientResponse, rec: RequestRecord, api: str = "generate",
                       ids: list[int] | None = None) -> None:
    """Consume `data: ...` events until `[DONE]`; fill chunk times and token counts (and, with
    `ids`, the output ids). Reads whatever bytes arrived (`iter_any`) and splits the lines itself:
    one await per read, not two per event (the data line and its blank separator)."""
    events = _CompletionEvents(rec, ids) if api == "completions" else _Events(rec, ids)
    pending = b""
    async for piece in resp.content.iter_any():
        now = time.perf_counter()
        lines = (pending + piece if pending else piece).split(b"\n")
        pending = lines.pop()  # an unfinished line waits for the next read
        for raw in lines:
            if events.line(raw, now):
                return events.finish()
    if pending:  # the stream's last line, without a newline after it
        events.line(pending, time.perf_counter())
    events.finish()


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
                records = await run_sessions(requests, t0, cfg, one)
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


# ----------------------------------------------------------------------------- closed-loop sessions

# send(request, ready_at, ids sink) -> its record: run_benchmark's slot-taking sender
Send = Callable[[WorkloadRequest, float, list[int] | None], Awaitable[RequestRecord]]


def session_rounds(requests: Sequence[WorkloadRequest]) -> dict[str, list[list[int]]]:
    """Per session (first-appearance order), its rounds in order, each the indices into
    `requests` of its members in member order. Rounds must be 0..R-1 with distinct members."""
    rounds: dict[str, dict[int, list[int]]] = {}
    for i, r in enumerate(requests):
        if r.session is None:
            raise ValueError(f"request {r.id} has no session step; in a closed-loop workload every request has one")
        rounds.setdefault(r.session.session, {}).setdefault(r.session.round, []).append(i)
    out: dict[str, list[list[int]]] = {}
    for name, by_round in rounds.items():
        if sorted(by_round) != list(range(len(by_round))):
            raise ValueError(f"session {name} has rounds {sorted(by_round)}; need 0..R-1 (was the workload cut?)")
        ordered = []
        for r in range(len(by_round)):
            members = sorted(by_round[r], key=lambda i: requests[i].session.member)  # type: ignore[union-attr]
            if len({requests[i].session.member for i in members}) != len(members):  # type: ignore[union-attr]
                raise ValueError(f"session {name} round {r} names a member twice")
            ordered.append(members)
        out[name] = ordered
    return out


def _not_sent(req: WorkloadRequest, max_new_tokens: int, why: str) -> RequestRecord:
    """The record of a session request that was never sent; its times are "now", so the run's
    duration (first send to last end) is not stretched by it."""
    now = time.perf_counter()
    return RequestRecord(id=req.id, prompt_len=len(req.input_ids), max_new_tokens=max_new_tokens,
                         error=f"not sent: {why}", start=now, end=now)


async def run_sessions(requests: Sequence[WorkloadRequest], t0: float, cfg: ClientConfig,
                       send: Send) -> list[RequestRecord]:
    """Run every session closed-loop (see the module docstring); the records in `requests` order."""
    records: list[RequestRecord | None] = [None] * len(requests)

    async def one_session(name: str, rounds: list[list[int]]) -> None:
        delay = t0 + requests[rounds[0][0]].arrival_offset(cfg.rate) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        transcript: list[int] = []
        for r, members in enumerate(rounds):
            outs: list[list[int]] = [[] for _ in members]
            sent = [_with_transcript(requests[i], transcript) for i in members]
            recs = await asyncio.gather(*(send(q, 0.0, out) for q, out in zip(sent, outs, strict=True)))
            for i, rec in zip(members, recs, strict=True):
                records[i] = rec
            failed = [rec.id for rec in recs if not rec.success]
            if failed:
                why = f"session {name} ended in round {r}: {', '.join(failed)} failed"
                for later in rounds[r + 1:]:
                    for i in later:
                        records[i] = _not_sent(requests[i], cfg.max_new_tokens or requests[i].output_len, why)
                return
            for out in outs:
                transcript += out

    await asyncio.gather(*(one_session(name, rounds) for name, rounds in session_rounds(requests).items()))
    return [rec for rec in records if rec is not None]


def _with_transcript(req: WorkloadRequest, transcript: list[int]) -> WorkloadRequest:
    """`req` as sent after `transcript`: its prompt, and the hint (when sent) at the session's actual
    shared part, everything before the member's own tail."""
    assert req.session is not None
    return dataclasses.replace(req, input_ids=req.prompt(transcript),
                               shared_prefix_len=req.session.insert_at + len(transcript))


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


# ----------------------------------------------------------------------------- CLI

_SUMMARY = (
    ("completed", "Successful requests", "d"),
    ("failed", "Failed requests", "d"),
    ("duration_s", "Benchmark duration (s)", ".2f"),
    ("total_input_tokens", "Total input tokens", "d"),
    ("total_output_tokens", "Total generated tokens", "d"),
    ("request_throughput", "Request throughput (req/s)", ".2f"),
    ("output_throughput", "Output token throughput (tok/s)", ".2f"),
    ("total_throughput", "Total token throughput (tok/s)", ".2f"),
    ("mean_ttft_ms", "Mean TTFT (ms)", ".2f"),
    ("median_ttft_ms", "Median TTFT (ms)", ".2f"),
    ("p99_ttft_ms", "P99 TTFT (ms)", ".2f"),
    ("mean_tpot_ms", "Mean TPOT (ms)", ".2f"),
    ("median_tpot_ms", "Median TPOT (ms)", ".2f"),
    ("p99_tpot_ms", "P99 TPOT (ms)", ".2f"),
    ("median_itl_ms", "Median ITL (ms)", ".2f"),
    ("p99_itl_ms", "P99 ITL (ms)", ".2f"),
    ("median_e2e_latency_ms", "Median E2E latency (ms)", ".2f"),
)


def format_summary(result: BenchmarkResult) -> str:
    lines = [" Serving Benchmark Result ".center(50, "=")]
    for key, label, fmt in _SUMMARY:
        lines.append(f"{label + ':':<40} {format(result.metrics[key], fmt)}")
    for err, n in result.errors().items():
        lines.append(f"  failed x{n}: {err}")
    lines.append("=" * 50)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.client", description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    ap.add_argument("--workload", required=True, help="workload .jsonl (python -m harness.workloads)")
    ap.add_argument("--rate", default="inf", help="requests/s (Poisson), or inf")
    ap.add_argument("--max-concurrency", type=int, default=256, help="0 = no cap")
    ap.add_argument("--num-requests", type=int, default=None, help="use only the first N requests")
    ap.add_argument("--warmup-requests", type=int, default=1)
    ap.add_argument("--warmup-output-len", type=int, default=32)
    ap.add_argument("--flush-cache", action="store_true")
    ap.add_argument("--send-prefix-hint", action="store_true")
    ap.add_argument("--api", choices=sorted(APIS), default="generate",
                    help="generate: POST /generate (SGLang-native); completions: POST /v1/completions (OpenAI)")
    ap.add_argument("--model", default=None, help="the completions API's model name (default: GET /v1/models' first)")
    ap.add_argument("--request-timeout", type=float, default=3600.0)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="override the workload's output_len")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--output", default=None, help="write the result JSON here")
    ap.add_argument("--no-records", action="store_true", help="leave per-request records out of --output")
    args = ap.parse_args(argv)

    wl = read_workload(args.workload)
    if args.num_requests and is_closed_loop(wl.requests):
        ap.error("--num-requests would cut sessions apart; a closed-loop workload (kind debate) runs whole: "
                 "generate a smaller one (python -m harness.workloads --kind debate --num-requests N ...)")
    reqs = wl.requests[: args.num_requests] if args.num_requests else wl.requests
    cfg = ClientConfig(
        rate=float(args.rate),
        max_concurrency=args.max_concurrency or None,
        warmup_requests=args.warmup_requests,
        warmup_output_len=args.warmup_output_len,
        flush_cache=args.flush_cache,
        send_prefix_hint=args.send_prefix_hint,
        request_timeout_s=args.request_timeout,
        max_new_tokens=args.max_new_tokens,
        progress=not args.no_progress,
        api=args.api,
        model=args.model,
    )
    result = aio.run(run_benchmark(args.url, reqs, cfg))
    print(format_summary(result))
    if args.output:
        out = result.to_dict(with_records=not args.no_records)
        out["workload"] = {"path": str(args.workload), "header": wl.header, "num_requests": len(reqs)}
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
