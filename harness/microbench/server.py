"""The HTTP server's own cost: streamed throughput against an engine whose step is a fixed sleep.

Why: at B=256 a GraniKV decode step is ~11-15 ms on an H200, so the server must stream
~20K tokens/s; the aiohttp side shares the GIL with the engine thread, and any per-token
Python cost there steals host time from the engine (engine_steps' HTTP-vs-in-process check
found 0.41 on the H200). This benchmark isolates that cost on any host, CPU included: a
simulated engine (`SimEngine`, a stand-in, not a model) sleeps `--step-ms` per decode step
(`--host-ms` of it busy on the host holding the GIL, as the engine's scheduling is, the rest
with the GIL released, as a CUDA sync is) and returns one token per running request; the
real EngineLoop, aiohttp app and streaming client (harness.run.client, its own process) serve
`--requests` requests at concurrency B. `ratio` = achieved output tokens/s over the engine's
own rate (B tokens per step): 1.0 means the server adds nothing.

    python -m harness.microbench.server --batch 256 --step-ms 12 --out results/cpu/microbench/server.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from granikv.runtime import aio
from harness.microbench._timing import env_info


@dataclass
class _Req:
    rid: str
    n_in: int
    max_new: int
    output_ids: list = field(default_factory=list)
    cached_tokens: int = 0
    finish_reason: str | None = None

    @property
    def input_ids(self):
        return range(self.n_in)


@dataclass
class _Out:
    req: _Req
    token: int
    finished: bool
    logprobs: None = None  # the engine's StepOutput field; the sim never computes logprobs
    error: None = None  # the engine's StepOutput field; the sim never fails a request


class SimEngine:
    """Just enough of granikv.engine.Engine for EngineLoop: decode steps that sleep."""

    def __init__(self, step_ms: float, prefill_ms: float = 0.0, max_running: int = 256, host_ms: float = 0.0):
        from types import SimpleNamespace

        self.step_s = step_ms / 1e3
        self.prefill_s = prefill_ms / 1e3
        self.host_s = host_ms / 1e3  # Python work holding the GIL per step (scheduling, bookkeeping)
        self.max_running = max_running
        self.spec = SimpleNamespace(vocab_size=32000, name="sim")
        self.config = SimpleNamespace(max_context=1 << 20)
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.steps = 0
        self.added_at: list[float] = []  # when each request reached the engine (admission ramp)

    def add_request(self, input_ids, params, rid=None, shared_prefix_len=None):
        r = _Req(rid, len(input_ids), params.max_new_tokens)
        self.waiting.append(r)
        self.added_at.append(time.perf_counter())
        return r

    def abort(self, rid):
        self.waiting = [r for r in self.waiting if r.rid != rid]
        self.running = [r for r in self.running if r.rid != rid]

    def flush_cache(self):
        return True

    def has_work(self):
        return bool(self.waiting or self.running)

    def stats(self):
        return {"steps": {"decode": self.steps}, "running": len(self.running), "waiting": len(self.waiting),
                "added_at": list(self.added_at)}

    def step(self):
        outs = []
        if self.waiting and len(self.running) < self.max_running:
            n = self.max_running - len(self.running)
            new, self.waiting = self.waiting[:n], self.waiting[n:]
            time.sleep(self.prefill_s)
            self.running += new
            for r in new:  # the prefill samples the first token
                r.output_ids.append(7)
                outs.append(_Out(r, 7, r.max_new == 1))
        else:
            t = time.perf_counter()
            while time.perf_counter() - t < self.host_s:  # the engine's own host work holds the GIL
                pass
            time.sleep(max(0.0, self.step_s - self.host_s))
            self.steps += 1
            for r in self.running:
                r.output_ids.append(len(r.output_ids) % 1000)
                outs.append(_Out(r, r.output_ids[-1], len(r.output_ids) >= r.max_new))
        for o in outs:
            if o.finished:
                o.req.finish_reason = "length"
        self.running = [r for r in self.running if len(r.output_ids) < r.max_new]
        return outs


def wave_ramps(times: list[float], batch: int) -> list[float]:
    """Seconds from the first to the last arrival of each wave after the first (waves of `batch`
    requests in arrival order). Every request has the same output length, so a wave finishes in
    one step and the client sends the next wave at once: how long that wave takes to reach the
    engine is the request path's cost at a wave boundary (Table 20/21's second-wave ramp)."""
    ts = sorted(times)
    return [ts[min(i + batch, len(ts)) - 1] - ts[i] for i in range(batch, len(ts), batch)]


def arrival_quantile(times: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of arrival times, measured from the first arrival."""
    ts = sorted(times)
    return ts[min(len(ts) - 1, int(q * len(ts)))] - ts[0]


async def _stats(loop) -> dict:
    return await loop.stats()


def write_workload(path: Path, n: int, prompt_len: int, output_len: int) -> None:
    from dataclasses import asdict

    from harness.run.workloads.requests import FORMAT_VERSION, WorkloadRequest

    with path.open("w") as f:
        f.write(json.dumps({"granikv_workload": FORMAT_VERSION, "kind": "sim", "num_requests": n}) + "\n")
        for i in range(n):
            r = WorkloadRequest(id=f"sim{i}", input_ids=[1 + (i + j) % 1000 for j in range(prompt_len)], prefix_id=None,
                        shared_prefix_len=0, output_len=output_len, arrival={"process": "burst"})
            f.write(json.dumps(asdict(r)) + "\n")


def _sim_factory(step_ms: float, batch: int, host_ms: float, prefill_ms: float, _cfg) -> SimEngine:
    return SimEngine(step_ms, prefill_ms=prefill_ms, max_running=batch, host_ms=host_ms)


def measure(batch: int, step_ms: float, requests: int, output_len: int, host_ms: float = 3.0,
            port: int = 30571, mode: str = "process", prompt_len: int = 16, warmup: int = 0,
            prefill_ms: float = 0.0, streaming: str = "cumulative", backlog: int | None = None,
            api: str = "generate") -> dict:
    """`warmup` requests run before the timed burst (at concurrency B, so `warmup >= B` leaves B
    open keep-alive connections for it); `prefill_ms` is the simulated cost of each admission
    step, during which no decode runs (prefill first, as the engine schedules); `streaming`:
    the server's chunks carry everything so far (SGLang's default) or only what is new
    (`--incremental-streaming-output`); `backlog`: the listen queue (None: the server's,
    LISTEN_BACKLOG; aiohttp's own default is 128, which a burst of B > 128 new connections
    overflows: the dropped SYNs are retried after TCP's 1 s timeout, seen in the arrival
    quantiles); `api`: the client drives SGLang's `/generate` or OpenAI's `/v1/completions`
    (`http_cpu_s`: this process's CPU seconds over the run, which in `process` mode is the HTTP
    side without the engine)."""
    from aiohttp import web

    from granikv.server.app import LISTEN_BACKLOG, build_app, tcp_site

    backlog = LISTEN_BACKLOG if backlog is None else backlog
    from granikv.runtime.loop import EngineLoop
    from granikv.server.text import TextCodec

    tmp = Path(tempfile.mkdtemp())
    wl = tmp / "sim.jsonl"
    write_workload(wl, requests, prompt_len, output_len)
    res = tmp / "client.json"
    if mode == "thread":
        loop = EngineLoop(_sim_factory(step_ms, batch, host_ms, prefill_ms, None))
        loop.start()
    else:
        import functools

        from granikv.runtime.process import EngineProcess

        loop = EngineProcess(None, factory=functools.partial(_sim_factory, step_ms, batch, host_ms, prefill_ms))
        loop.start()

    async def go():
        runner = web.AppRunner(build_app(loop, TextCodec(), incremental_streaming_output=streaming == "incremental"),
                               access_log=None)
        await runner.setup()
        await tcp_site(runner, "127.0.0.1", port, backlog=backlog).start()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "harness.run.client", "--url", f"http://127.0.0.1:{port}", "--workload", str(wl),
                "--max-concurrency", str(batch), "--warmup-requests", str(warmup),
                "--warmup-output-len", "2", "--no-progress", "--no-records", "--api", api,
                "--output", str(res), stdout=subprocess.DEVNULL)
            await proc.wait()
        finally:
            await runner.cleanup()

    cpu0 = time.process_time()
    aio.run(go())
    http_cpu_s = time.process_time() - cpu0
    st = aio.run(_stats(loop))
    decode_steps = st["steps"]["decode"]
    timed = st["added_at"][-requests:]  # the timed burst's arrivals at the engine (after the warm-up)
    loop.stop()
    m = json.loads(res.read_text())["metrics"]
    ideal = batch * 1e3 / step_ms
    return {"mode": mode, "streaming": streaming, "api": api, "http_cpu_s": http_cpu_s, "batch": batch,
            "step_ms": step_ms, "host_ms": host_ms,
            "requests": requests,
            "output_len": output_len,
            "output_throughput": m["output_throughput"], "engine_rate": ideal,
            "engine_decode_steps": decode_steps, "duration_s": m["duration_s"],
            "ratio": m["output_throughput"] / ideal, "median_tpot_ms": m.get("median_tpot_ms"),
            "median_ttft_ms": m.get("median_ttft_ms"), "p99_ttft_ms": m.get("p99_ttft_ms"),
            "prompt_len": prompt_len, "warmup": warmup, "prefill_ms": prefill_ms,
            "admission_ramp_s": timed[-1] - timed[0], "completed": m["completed"],
            "wave_ramps_s": wave_ramps(timed, batch),
            "backlog": backlog,
            # when the timed requests reached the engine, from the first one (s)
            "arrival_quantiles_s": {str(q): arrival_quantile(timed, q) for q in (0.5, 0.75, 0.9, 1.0)}}


def notes_table(path: str) -> str:
    """Markdown table of a server.json (numbers are read, never typed); files that compare the
    client's two APIs (`--api generate completions`) get the API and the HTTP side's CPU seconds
    as columns too."""
    doc = json.loads(Path(path).read_text())
    apis = len({r.get("api", "generate") for r in doc["records"]}) > 1
    head = ["engine"] + (["API", "HTTP CPU s"] if apis else []) + [
        "chunks", "out tokens", "B", "step ms (host ms)", "served tok/s", "engine tok/s", "ratio", "TPOT p50 ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in doc["records"]:
        api = [r.get("api", "generate"), f"{r['http_cpu_s']:.2f}"] if apis else []
        cells = [r["mode"], *api, r.get("streaming", "cumulative"), r["output_len"], r["batch"],
                 f"{r['step_ms']:.0f} ({r['host_ms']:.0f})", f"{r['output_throughput']:.0f}",
                 f"{r['engine_rate']:.0f}", f"{r['ratio']:.3f}", f"{r['median_tpot_ms']:.1f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    env = doc["env"]
    lines.append("")
    lines.append(f"Measured on {env.get('host')} ({env.get('gpu') or 'CPU'} host, python {env.get('python')}), "
                 f"git {str(env.get('git_sha'))[:10]}, {env.get('started_at')}.")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[256])
    ap.add_argument("--step-ms", type=float, nargs="+", default=[12.0])
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--host-ms", type=float, default=3.0, help="engine host work per step (holds the GIL)")
    ap.add_argument("--waves", type=int, default=2, help="requests = waves x batch")
    ap.add_argument("--prompt-len", type=int, default=16, help="tokens per prompt (request body size)")
    ap.add_argument("--warmup", type=int, nargs="+", default=[0],
                    help="client warm-up requests before the timed run (>= B pre-opens B connections)")
    ap.add_argument("--prefill-ms", type=float, default=0.0, help="simulated admission (prefill) step")
    ap.add_argument("--mode", nargs="+", default=["thread", "process"],
                    help="engine on a thread of the server process, or in its own process (the server's default)")
    ap.add_argument("--streaming", nargs="+", default=["cumulative"], choices=["cumulative", "incremental"],
                    help="chunks with everything so far (SGLang's default) or only what is new")
    ap.add_argument("--backlog", type=int, nargs="+", default=[None],
                    help="listen queue lengths to compare (default: the server's; aiohttp's own is 128)")
    ap.add_argument("--api", nargs="+", default=["generate"], choices=["generate", "completions"],
                    help="the API the client drives: SGLang's /generate or OpenAI's /v1/completions")
    ap.add_argument("--port", type=int, default=30571)
    ap.add_argument("--out", default=None)
    ap.add_argument("--notes", default=None, help="print the Markdown table of an existing server.json and exit")
    args = ap.parse_args(argv)
    if args.notes:
        print(notes_table(args.notes))
        return 0
    recs = []
    for mode in args.mode:
        for b in args.batch:
            for s in args.step_ms:
                for w, st, bl, api in itertools.product(args.warmup, args.streaming, args.backlog,
                                                        args.api):
                    r = measure(b, s, args.waves * b, args.output_len, args.host_ms, port=args.port, mode=mode,
                                prompt_len=args.prompt_len, warmup=w, prefill_ms=args.prefill_ms, streaming=st,
                                backlog=bl, api=api)
                    recs.append(r)
                    print(f"{mode:7s} {api:11s} {st:11s} B={b:4d} step {s:5.1f} ms warm-up {w:4d}: "
                          f"{r['output_throughput']:8.0f} "
                          f"tok/s of {r['engine_rate']:8.0f} = {r['ratio']:.3f}  (TPOT p50 "
                          f"{r['median_tpot_ms']:.1f} ms, TTFT p50 {r['median_ttft_ms']:.0f} ms, admission "
                          f"ramp {r['admission_ramp_s'] * 1e3:.0f} ms, HTTP CPU {r['http_cpu_s']:.2f} s, p90 arrival "
                          f"{r['arrival_quantiles_s']['0.9'] * 1e3:.0f} ms, later waves' ramps "
                          f"{[round(x * 1e3) for x in r['wave_ramps_s']]} ms, backlog {r['backlog']})", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"env": env_info(), "config": vars(args), "records": recs}, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
