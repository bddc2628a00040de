"""EngineProcess: the engine in its own process, the HTTP server in this one.

Why a process and not a thread: at B=256 a decode step is 11-15 ms on an H200 and the server
streams ~20K tokens/s. On a thread of the server process the engine shares the GIL with the
aiohttp side, whose per-chunk work (queues, JSON, socket writes) then delays the engine's own
scheduling by milliseconds per step: engine_steps' HTTP check measured 0.41 of in-process
throughput, and harness/microbench/server.py reproduces it on any host. SGLang and vLLM
separate the two for the same reason.

Protocol (two one-way pipes, so no connection end is used by two threads):
- commands, parent -> child: ("add", rid, ids (int32 array), params, hint), ("abort", rid),
  ("call", call_id, name, arg) for flush / stats / profile, ("stop",);
- messages, child -> parent: ("ready", info) or ("error", text) once at start, then
  ("out", items) once per step (items: (rid, token, finished, finish_reason, prompt_tokens,
  completion_tokens, cached_tokens, error), plus (logprob, top_logprobs) at the end of the
  items of requests that asked for logprobs), ("reply", call_id, ok, value), ("fatal", text).
The child exits when told to stop or when its command pipe closes (the server died).
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import multiprocessing as mp
import queue
import signal
import threading
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import numpy as np

from granikv.config import EngineConfig
from granikv.runtime.loop import Event, _settle, engine_info, fan_out, profile_window


class EngineError(RuntimeError):
    pass


# ----------------------------------------------------------------------------- child side


@dataclass
class LoopClock:
    """Where the engine process's wall time goes, outside and around `Engine.step()`.

    A serving run's duration exceeds the engine's own step totals (`step_time_s`) by 0.1–0.9 s
    in H200 cells of every system (docs/reproduction.md); this says which part of the loop holds
    it: waiting with no work (`idle_s`: requests not here yet), admitting requests (`add_s`;
    receiving them is the command reader thread's), other commands (`cmd_s`), the step calls
    (`step_s`, which the step log times from inside), or sending their outputs to the server
    process (`send_s`)."""

    idle_s: float = 0.0
    add_s: float = 0.0
    adds: int = 0
    cmd_s: float = 0.0
    step_s: float = 0.0
    steps: int = 0
    send_s: float = 0.0
    # Where the idle time falls in the measured run: each idle wait of >= GAP_MIN_S as
    # [seconds since the run's first request, seconds idle, requests added before it]. A run
    # starts at the first add after a cache flush (a cell flushes after its warm-up); the last
    # MAX_GAPS are kept.
    gaps: deque = field(default_factory=lambda: deque(maxlen=LoopClock.MAX_GAPS))
    run_t0: float | None = None
    run_adds: int = 0

    GAP_MIN_S: ClassVar[float] = 0.005
    MAX_GAPS: ClassVar[int] = 64

    def flushed(self) -> None:
        self.run_t0, self.run_adds = None, 0
        self.gaps.clear()

    def added(self, now: float, seconds: float) -> None:
        self.add_s += seconds
        self.adds += 1
        if self.run_t0 is None:
            self.run_t0 = now
        self.run_adds += 1

    def idled(self, start: float, seconds: float) -> None:
        self.idle_s += seconds
        if self.run_t0 is not None and seconds >= self.GAP_MIN_S:
            self.gaps.append([round(start - self.run_t0, 4), round(seconds, 4), self.run_adds])

    def as_dict(self) -> dict:
        out = {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()
               if k not in ("gaps", "run_t0", "run_adds")}
        out["run_idle_gaps"] = [list(g) for g in self.gaps]
        return out


def _items(outs) -> list[tuple]:
    """One step's outputs as plain tuples (cheap to pickle at 256 per step); the logprobs
    ride along only for the requests that asked, so a plain step's message is unchanged."""
    items = []
    for o in outs:
        r = o.req
        item = (r.rid, o.token, o.finished, r.finish_reason if o.finished else None, len(r.input_ids),
                len(r.output_ids), r.cached_tokens, o.error)
        if o.logprobs is not None:
            item += (o.logprobs.logprob, o.logprobs.top)
        items.append(item)
    return items


def _event(item: tuple) -> Event:
    """The Event of one `_items` tuple."""
    rid, tok, finished, reason, n_in, n_out, cached, error = item[:8]
    lp, top = item[8:] if len(item) > 8 else (None, None)
    return Event(tok, finished, reason, prompt_tokens=n_in, completion_tokens=n_out, cached_tokens=cached,
                 error=error, logprob=lp, top_logprobs=top)


def _child(cfg: EngineConfig, cmds, msgs, factory) -> None:
    # the server stops us through the pipe, after draining its requests: a SIGTERM sent to the
    # whole process group (systemd, harness.run.systems) must not kill the engine under them
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    t_start = time.perf_counter()
    try:
        if factory is None:
            from granikv.runtime.tp import create_engine as factory

        engine = factory(cfg)
    except Exception as e:  # noqa: BLE001 - reported to the server, which exits with it
        # a ValueError is a configuration the engine refuses: its message says it all
        msgs.send(("error", str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"))
        return
    # the engine's build (torch import included) as the child saw it, beside the engine's own split
    startup = {**getattr(engine, "startup", {}), "engine_s": round(time.perf_counter() - t_start, 3)}
    msgs.send(("ready", engine_info(engine)))
    clock = LoopClock()
    perf = time.perf_counter
    # Commands are read by a thread of their own, not between steps: a 16K-token prompt is a
    # ~66 KB message, over a pipe's 64 KB buffer, so a loop that reads only between engine steps
    # let one prompt through per step — and blocked the server's event loop on the write —
    # while a burst waited (one single-request prefill step per prompt at Lp=16K;
    # tests/runtime/test_engine_process.py)
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read_commands() -> None:
        try:
            while True:
                inbox.put(cmds.recv())
        except (EOFError, OSError):
            inbox.put(("eof",))  # the server is gone

    threading.Thread(target=read_commands, name="granikv-commands", daemon=True).start()

    def step() -> bool:
        if not engine.has_work():
            return False
        t0 = perf()
        outs = engine.step()
        t1 = perf()
        msgs.send(("out", _items(outs)))
        clock.step_s += t1 - t0
        clock.send_s += perf() - t1
        clock.steps += 1
        return True

    def handle(cmd) -> bool:
        kind = cmd[0]
        t0 = perf()
        if kind == "add":
            _, rid, ids, params, hint = cmd
            try:
                engine.add_request(ids, params, rid=rid, shared_prefix_len=hint)
            except ValueError as e:
                msgs.send(("out", [(rid, None, True, "error", 0, 0, 0, str(e))]))
            clock.added(t0, perf() - t0)
            return True
        if kind == "abort":
            engine.abort(cmd[1])
        elif kind == "call":
            _, cid, name, arg = cmd
            try:
                if name == "flush":
                    value = engine.flush_cache()
                    if value:
                        clock.flushed()
                elif name == "stats":
                    value = {**engine.stats(), "loop": clock.as_dict(), "startup": startup}
                elif name == "profile":
                    value = profile_window(engine, step, arg)
                else:
                    raise ValueError(f"unknown call {name!r}")
                msgs.send(("reply", cid, True, value))
            except Exception as e:  # noqa: BLE001 - the caller gets the error
                msgs.send(("reply", cid, False, f"{type(e).__name__}: {e}"))
        elif kind in ("stop", "eof"):
            return False
        clock.cmd_s += perf() - t0
        return True

    try:
        running = True
        while running:
            if not engine.has_work():
                t0 = perf()
                try:
                    first = [inbox.get(timeout=0.5)]  # idle: wait for a command
                except queue.Empty:
                    first = []
                clock.idled(t0, perf() - t0)
                for cmd in first:
                    running = handle(cmd)
            while running:  # everything that arrived during the last step
                try:
                    cmd = inbox.get_nowait()
                except queue.Empty:
                    break
                running = handle(cmd)
            if running:
                step()
    except Exception:  # noqa: BLE001 - tell the server, then exit
        try:
            msgs.send(("fatal", traceback.format_exc()))
        except OSError:
            pass
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()


# ----------------------------------------------------------------------------- server side

PIPE_BYTES = 1 << 20  # Linux's default pipe-max-size: ~15 prompts of 16K tokens in flight


def _grow_pipe(conn, size: int = PIPE_BYTES) -> None:
    """Enlarge the pipe under `conn` (Linux F_SETPIPE_SZ; the default buffer of 64 KB is one
    16K-token prompt), so the server's writes of a burst rarely wait for the engine process's
    reader. Silently keeps the default where the OS does not allow it."""
    op = getattr(fcntl, "F_SETPIPE_SZ", None)
    if op is None:
        return
    try:
        fcntl.fcntl(conn.fileno(), op, size)
    except OSError:
        pass


class EngineProcess:
    """The EngineLoop interface (submit / abort / flush / stats / profile / info / fatal) over
    an engine running in a child process."""

    def __init__(self, cfg: EngineConfig | None, start_timeout_s: float = 1800.0, factory=None) -> None:
        """`factory(cfg)` builds the engine in the child (default: granikv's create_engine); it
        must be picklable (a module-level callable or a functools.partial of one)."""
        ctx = mp.get_context("spawn")
        self._cmd_r, self._cmd_w = ctx.Pipe(duplex=False)
        self._msg_r, self._msg_w = ctx.Pipe(duplex=False)
        for conn in (self._cmd_w, self._msg_w):
            _grow_pipe(conn)
        # not a daemon: a TP engine starts worker processes of its own
        self.proc = ctx.Process(target=_child, args=(cfg, self._cmd_r, self._msg_w, factory), name="granikv-engine")
        self.start_timeout_s = start_timeout_s
        self.streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.calls: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self.fatal: str | None = None
        self.last_output = 0.0  # time.monotonic() when the engine's last step ended
        self.info: dict = {}
        self.process_s: float | None = None
        self.reader = threading.Thread(target=self._read, name="granikv-engine-reader", daemon=True)

    def start(self) -> None:
        """Start the engine process and wait until it is ready (blocking: run in a thread)."""
        t0 = time.perf_counter()
        self.proc.start()
        self._cmd_r.close()
        self._msg_w.close()
        if not self._msg_r.poll(self.start_timeout_s):
            self.proc.kill()
            raise EngineError(f"the engine process did not start within {self.start_timeout_s:.0f}s")
        try:
            msg = self._msg_r.recv()
        except EOFError:
            self.proc.join(5)
            raise EngineError(f"the engine process exited during start (exit code {self.proc.exitcode})") from None
        if msg[0] == "error":
            self.proc.join(10)
            raise ValueError(msg[1])
        self.info = msg[1]
        self.process_s = round(time.perf_counter() - t0, 3)  # spawn, imports, engine build, captures
        self.reader.start()

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.is_alive():
            try:
                self._send(("stop",))
            except OSError:
                pass
            self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
        if self.proc.pid is not None:
            self.proc.join(5)  # reaps it: a dead engine process never stays behind as a zombie

    def fail_all(self, error: str) -> None:
        """End every stream with `error` (its handler answers it) and abort its request."""
        for rid in list(self.streams):
            st = self.streams.pop(rid, None)  # the engine's thread may have just finished it
            if st is None:
                continue
            loop, q = st
            loop.call_soon_threadsafe(q.put_nowait, Event(None, True, "error", error=error))
            if not self.fatal:
                try:
                    self._send(("abort", rid))
                except OSError:
                    pass

    # -- asyncio side ---------------------------------------------------------------------------
    def _send(self, cmd) -> None:
        with self._send_lock:
            self._cmd_w.send(cmd)

    def submit(self, rid: str, input_ids: list[int], params, shared_prefix_len: int | None) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self.streams[rid] = (asyncio.get_running_loop(), q)
        if self.fatal:
            q.put_nowait(Event(None, True, "error", error="engine failure"))
            return q
        # int32 bytes, not a list: the engine process unpickles it in ~3 µs instead of ~0.27 ms
        # for a 16K-token prompt, and add_request skips the list conversion (the ids are checked
        # integers in [0, vocab) by now: validation.RequestValidator.prompt_ids)
        self._send(("add", rid, np.asarray(input_ids, dtype=np.int32), params, shared_prefix_len))
        return q

    def abort(self, rid: str) -> None:
        self.streams.pop(rid, None)
        if not self.fatal:
            self._send(("abort", rid))

    async def _call(self, name: str, arg=None):
        if self.fatal:
            raise EngineError("the engine process failed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        cid = next(self._ids)
        self.calls[cid] = (loop, fut)
        self._send(("call", cid, name, arg))
        return await fut

    async def flush(self) -> bool:
        return await self._call("flush")

    async def stats(self) -> dict:
        value = await self._call("stats")
        if isinstance(value.get("startup"), dict) and self.process_s is not None:
            value["startup"] = {**value["startup"], "process_s": self.process_s}
        value["engine_pid"] = self.proc.pid  # the process an operator (or a test) may signal
        return value

    async def profile(self, steps: int) -> dict:
        return await self._call("profile", steps)

    # -- reader thread --------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                msg = self._msg_r.recv()
                kind = msg[0]
                if kind == "out":  # one per engine step, empty for a prefill chunk that samples nothing
                    self.last_output = time.monotonic()
                    self._dispatch(msg[1])
                elif kind == "reply":
                    _, cid, ok, value = msg
                    loop, fut = self.calls.pop(cid)
                    loop.call_soon_threadsafe(_settle, fut, value if ok else None,
                                              None if ok else EngineError(value))
                elif kind == "fatal":
                    self._fail(msg[1])
                    return
        except (EOFError, OSError):
            self.proc.join(2)  # reaped, so its exit code (a signal's, negative) can be told
            self._fail(f"the engine process exited (exit code {self.proc.exitcode})")

    def _dispatch(self, items) -> None:
        fan_out(self.streams, ((item[0], _event(item)) for item in items))

    def _fail(self, why: str) -> None:
        if self.fatal:
            return
        self.fatal = why
        for rid in list(self.streams):
            loop, q = self.streams.pop(rid)
            loop.call_soon_threadsafe(q.put_nowait, Event(None, True, "error", error="engine failure"))
        for cid in list(self.calls):
            loop, fut = self.calls.pop(cid)
            loop.call_soon_threadsafe(_settle, fut, None, EngineError(why))
