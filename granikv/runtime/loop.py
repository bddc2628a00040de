"""EngineLoop: runs an Engine on its own thread and fans its outputs out to asyncio streams.

The HTTP handlers live on the asyncio loop and must never block on GPU work; the engine must
never wait for the network. Commands (add, abort, flush) cross over through a thread-safe
queue; step outputs come back through `loop.call_soon_threadsafe` onto per-request asyncio
queues. A request whose client went away is aborted, which frees its KV.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

from granikv.engine.request import SamplingParams

if TYPE_CHECKING:  # the server process never imports torch: the engine process does (process.py)
    from granikv.engine.engine import Engine


@dataclass
class Event:
    """One generated token of a request (or its end / error). `logprob` and `top_logprobs`
    are set when the request's SamplingParams asked for logprobs: the token's raw logprob
    (log_softmax of the model's unmodified float32 logits) and the `logprobs` most likely
    tokens as (token id, logprob), most likely first (empty when logprobs=0)."""

    token: int | None
    finished: bool
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


def engine_info(engine) -> dict:
    """What the HTTP side needs to know about the engine: validation limits, names, and what
    actually runs (the start-up line says it: the config's defaults may not be what a host runs,
    e.g. no CUDA graphs on a CPU)."""
    dev = getattr(engine, "device", "cpu")
    cfg = engine.config
    runner = getattr(engine, "runner", None)
    storage = getattr(engine, "storage", None)
    dtype = getattr(engine, "dtype", None)
    return {"vocab_size": engine.spec.vocab_size, "max_context": cfg.max_context,
            "max_position_embeddings": getattr(engine.spec, "max_position_embeddings", None),
            "model": engine.spec.name, "device_type": getattr(dev, "type", str(dev)),
            "kernel_impl": getattr(cfg, "kernel_impl", None),
            "system": getattr(cfg, "system", None), "tp": getattr(cfg, "tp", 1),
            "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
            "cuda_graphs": getattr(runner, "graphs", None) is not None,
            "max_running": getattr(cfg, "max_running", None),
            "chunked_prefill_tokens": getattr(cfg, "chunked_prefill_tokens", None),
            "kv_slots": getattr(storage, "num_slots", None),
            "kv_capacity": getattr(engine, "kv_capacity", None),  # tokens one request may hold
            "logprobs": True}  # SamplingParams.logprobs is served (Event.logprob / top_logprobs)


def profile_window(engine, step, steps: int) -> dict:
    """granikv.profiling's capture of the engine's next `steps` serving steps, plus the kinds of
    steps that ran in the window and how many requests were running."""
    from granikv.profiling import capture  # imports torch.profiler: only when a capture is asked for

    before = dict(engine.steps)
    out = capture(step, steps)
    out["step_kinds"] = {k: v - before.get(k, 0) for k, v in engine.steps.items() if v - before.get(k, 0)}
    out["running"] = len(engine.scheduler.running)
    return out


class EngineLoop:
    """The engine on a thread of the server's own process (tests, in-process benchmarks).

    `python -m granikv.server` runs the engine in its own process instead (EngineProcess,
    process.py): on a thread here it shares the GIL with the HTTP side, which at B=256 steals
    milliseconds per step from the engine (harness/microbench/server.py)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.cmds: queue.Queue = queue.Queue()
        self.streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="granikv-engine", daemon=True)
        self.fatal: str | None = None
        self.last_output = 0.0  # time.monotonic() when the engine's last step ended

    def fail_all(self, error: str) -> None:
        """End every stream with `error` (its handler answers it) and abort its request."""
        for rid in list(self.streams):
            st = self.streams.pop(rid, None)  # the engine's thread may have just finished it
            if st is None:
                continue
            loop, q = st
            loop.call_soon_threadsafe(q.put_nowait, Event(None, True, "error", error=error))
            self.cmds.put(("abort", rid))

    @property
    def info(self) -> dict:
        return engine_info(self.engine)

    def start(self) -> None:
        self.thread.start()

    async def stats(self) -> dict:
        return self.engine.stats()

    async def profile(self, steps: int) -> dict:
        return await self.run_exclusive(lambda step: profile_window(self.engine, step, steps))

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        self.cmds.put(("wake",))
        self.thread.join(timeout)

    # -- called from the asyncio side ----------------------------------------------------------
    def submit(self, rid: str, input_ids: list[int], params: SamplingParams,
               shared_prefix_len: int | None) -> asyncio.Queue:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        self.streams[rid] = (loop, q)
        self.cmds.put(("add", rid, input_ids, params, shared_prefix_len))
        return q

    def abort(self, rid: str) -> None:
        self.streams.pop(rid, None)
        self.cmds.put(("abort", rid))

    async def flush(self) -> bool:
        fut = asyncio.get_running_loop().create_future()
        self.cmds.put(("flush", fut, asyncio.get_running_loop()))
        return await fut

    async def run_exclusive(self, fn):
        """Run `fn(step)` on the engine thread between two steps and return its result.

        `step()` runs one engine step and delivers its tokens to the clients (False when the
        engine has nothing to do), so `fn` can drive a window of real serving steps: the
        profiler (POST /profile) wraps N of them. Other commands wait until `fn` returns.
        """
        aloop = asyncio.get_running_loop()
        fut = aloop.create_future()
        self.cmds.put(("call", fn, fut, aloop))
        return await fut

    # -- engine thread ------------------------------------------------------------------------
    def _emit(self, rid: str, ev: Event) -> None:
        s = self.streams.get(rid)
        if s is None:
            return
        loop, q = s
        loop.call_soon_threadsafe(q.put_nowait, ev)
        if ev.finished:
            self.streams.pop(rid, None)

    def _handle(self, cmd) -> None:
        kind = cmd[0]
        if kind == "add":
            _, rid, ids, params, hint = cmd
            try:
                self.engine.add_request(ids, params, rid=rid, shared_prefix_len=hint)
            except ValueError as e:
                self._emit(rid, Event(None, True, "error", error=str(e)))
        elif kind == "abort":
            self.engine.abort(cmd[1])
        elif kind == "flush":
            _, fut, loop = cmd
            ok = self.engine.flush_cache()
            loop.call_soon_threadsafe(fut.set_result, ok)
        elif kind == "call":
            _, fn, fut, loop = cmd
            try:
                result = fn(self._step_once)
            except Exception as e:  # noqa: BLE001 - the caller gets the error; the engine keeps serving
                loop.call_soon_threadsafe(_settle, fut, None, e)
                if self.fatal:  # the engine itself failed inside fn: stop as a failed step does
                    raise
            else:
                loop.call_soon_threadsafe(_settle, fut, result, None)

    def _run(self) -> None:
        eng = self.engine
        while not self.stop_event.is_set():
            block = not eng.has_work()
            try:
                cmd = self.cmds.get(block=block, timeout=0.5 if block else None)
                self._handle(cmd)
                while True:  # drain everything queued before the next step
                    self._handle(self.cmds.get_nowait())
            except queue.Empty:
                pass
            self._step_once()

    def _step_once(self) -> bool:
        """One engine step with its outputs delivered; False when there was nothing to step."""
        eng = self.engine
        if not eng.has_work():
            return False
        try:
            outs = eng.step()
        except Exception:  # a bug must not silently hang every client
            self.fatal = traceback.format_exc()
            for rid in list(self.streams):
                self._emit(rid, Event(None, True, "error", error="engine failure"))
            raise
        self._emit_step(outs)
        return True

    def _emit_step(self, outs) -> None:
        self.last_output = time.monotonic()  # a step ended: progress, even with no token in it
        fan_out(self.streams, ((o.req.rid, step_event(o)) for o in outs))


def step_event(o) -> Event:
    """The Event of one engine StepOutput."""
    lp = o.logprobs
    return Event(o.token, o.finished, o.req.finish_reason if o.finished else None,
                 prompt_tokens=len(o.req.input_ids), completion_tokens=len(o.req.output_ids),
                 cached_tokens=o.req.cached_tokens, error=o.error, logprob=None if lp is None else lp.logprob,
                 top_logprobs=None if lp is None else lp.top)


def fan_out(streams: dict, events) -> None:
    """Deliver one step's (rid, Event) pairs to their asyncio queues with one wake-up of each
    loop per step, not one per request: with 256 streams a call_soon_threadsafe each (a
    self-pipe write and a lock) costs the calling thread milliseconds per step. A finished
    request's stream is dropped; events of unknown (aborted) requests are ignored."""
    batches: dict[int, tuple[asyncio.AbstractEventLoop, list]] = {}
    for rid, ev in events:
        st = streams.get(rid)
        if st is None:
            continue
        loop, q = st
        batches.setdefault(id(loop), (loop, []))[1].append((q, ev))
        if ev.finished:
            streams.pop(rid, None)
    for loop, items in batches.values():
        loop.call_soon_threadsafe(_deliver, items)


def _settle(fut: asyncio.Future, result, error: BaseException | None) -> None:
    if fut.done():  # the caller gave up (cancelled)
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


def _deliver(items) -> None:
    for q, ev in items:
        q.put_nowait(ev)
