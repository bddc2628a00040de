"""The aiohttp application: the SGLang-native routes (`Server`) and the control endpoints, and the
app that serves them beside the OpenAI routes (openai_api.py), both over the state every route
shares (state.py) and its request checks (validation.py).

Nothing a client sends may crash the server or stall it for others: every malformed request gets
a 4xx with a reason in JSON (middleware.py), bodies are bounded before they are parsed (body.py),
a request the KV cache could never hold is refused alone (400), and the engine only ever sees
validated requests. A failure of the engine itself is a 5xx (errors.py), logged once with its
traceback, and /health turns 503 (`python -m granikv.server` then exits non-zero, for its
supervisor to restart it). Fields that SGLang's own clients send and that change nothing here
(return_logprob: false, logprob_start_len, lora_path: null, ...) are accepted, so SGLang's
benchmark client works unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass

import numpy as np
from aiohttp import web

from granikv.engine.request import SamplingParams
from granikv.runtime.loop import EngineLoop  # torch-free: the server process never imports torch
from granikv.server.errors import ApiError, BadRequest, native_response
from granikv.server.middleware import middlewares
from granikv.server.openai_api import OpenAIRoutes
from granikv.server.params import as_int, get, parse_native_sampling
from granikv.server.state import ServerState
from granikv.server.text import TextCodec

HEALTH_GENERATE_TIMEOUT_S = 30.0  # /health_generate: one token (or any engine output), or 503
MAX_PROFILE_STEPS = 1000  # a window long enough for any table, short enough to stay in memory
# /metrics waits this long for the engine's counters, then serves the last ones it got: the engine
# answers between steps, and one CPU prefill step can take seconds (a scrape must not time out)
METRICS_ENGINE_WAIT_S = 0.5

# The listen queue. A benchmark client at B=256 opens ~250 connections at once; aiohttp's default
# backlog of 128 overflows, the kernel drops the SYNs beyond it, and those clients retry only after
# TCP's 1 s initial retransmission timeout: a tenth of the requests then start a second late (seen
# as a p90 TTFT several times the median; docs/performance.md, "The engine in its own process"). uvicorn (SGLang's
# server) listens with 2048; the kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 2048


def tcp_site(runner: web.AppRunner, host: str, port: int, backlog: int = LISTEN_BACKLOG) -> web.TCPSite:
    """The server's listening site, with a listen queue deep enough for a burst of B connections."""
    return web.TCPSite(runner, host, port, backlog=backlog)


@dataclass
class GenerateRequest:
    input_ids: np.ndarray  # int32, checked against the vocabulary
    params: SamplingParams
    stream: bool
    shared_prefix_len: int | None
    rid: str


class Server(ServerState):
    """The SGLang-native routes (/generate, health, information, /metrics) and the control
    endpoints (/flush_cache, /profile), over the state every route shares."""

    def __init__(self, loop: EngineLoop, codec: TextCodec, incremental_streaming_output: bool = False,
                 served_model_name: str | None = None, model_path: str | None = None,
                 context_length: int | None = None, health_timeout_s: float = HEALTH_GENERATE_TIMEOUT_S,
                 max_request_bytes_: int | None = None) -> None:
        super().__init__(loop, codec, served_model_name, model_path, context_length, max_request_bytes_)
        # SGLang's server flag of the same name: streamed /generate chunks carry only the new text
        # and ids instead of everything so far (the default, as SGLang's), whose bytes grow with
        # the square of the output length: 6 MB per 1024-token request, which the client must
        # parse (docs/performance.md, "Incremental streaming")
        self.incremental = incremental_streaming_output
        self.health_timeout_s = health_timeout_s
        self._engine_stats: dict | None = None  # the last engine counters /metrics got
        self._stats_call: asyncio.Future | None = None

    def _parse_generate(self, body: dict) -> GenerateRequest:
        ids = self.checks.prompt_ids(get(body, "input_ids"), get(body, "text"))
        params = parse_native_sampling(body.get("sampling_params"))
        self.checks.check_context(len(ids), params.max_new_tokens, "max_new_tokens")
        hint = self.checks.check_hint(get(body, "shared_prefix_len"), len(ids))
        stream = get(body, "stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("stream must be a boolean", "stream")
        if get(body, "return_logprob", False) is not False:
            raise BadRequest("return_logprob is not supported on /generate; use /v1 with logprobs", "return_logprob")
        rid = body.get("rid") or uuid.uuid4().hex
        if not isinstance(rid, str):
            raise BadRequest("rid must be a string", "rid")
        return GenerateRequest(ids, params, stream, hint, rid)

    # -- health and information -------------------------------------------------------------------
    def _dead(self) -> web.Response | None:
        if getattr(self.loop, "fatal", None):
            self.engine_error_seen()
            return web.json_response({"status": "error", "error": "the engine failed; see the server log"},
                                     status=503)
        return None

    async def health(self, request: web.Request) -> web.Response:
        if self.draining:  # load balancers stop sending here before the listener closes
            return self._dead() or web.json_response({"status": "shutting down"}, status=503)
        return self._dead() or web.json_response({"status": "ok"})

    async def health_generate(self, request: web.Request) -> web.Response:
        """SGLang's /health_generate: the engine generates within the timeout. As in SGLang, any
        progress of the engine after the check began counts, not only the probe's own token: a
        step that ends (a prefill chunk ahead of the probe included) shows a busy engine alive."""
        dead = self._dead()
        if dead is not None:
            return dead
        if self.draining:
            return web.json_response({"status": "shutting down"}, status=503)
        rid = "health-" + uuid.uuid4().hex
        t0 = time.monotonic()
        q = self.loop.submit(rid, np.zeros(1, dtype=np.int32), SamplingParams(max_new_tokens=1, ignore_eos=True),
                             None)
        ev = None
        try:
            while ev is None and time.monotonic() - t0 < self.health_timeout_s:
                try:
                    ev = await asyncio.wait_for(q.get(), min(0.25, self.health_timeout_s))
                except TimeoutError:
                    if getattr(self.loop, "last_output", 0.0) > t0:
                        break  # the engine stepped since the probe came in: it is alive
        finally:
            if ev is None or not ev.finished:
                self.loop.abort(rid)
        if ev is not None and ev.error:
            return native_response(self.event_failure(ev.error))
        if ev is None and not getattr(self.loop, "last_output", 0.0) > t0:
            return web.json_response({"status": "error", "error": f"no token within {self.health_timeout_s:g} s"},
                                     status=503)
        return web.json_response({"status": "ok"})

    async def model_info(self, request: web.Request) -> web.Response:
        """SGLang's /get_model_info shape, plus GraniKV's limits and capabilities."""
        return web.json_response({
            "model_path": self.model_path or self.model, "tokenizer_path": self.codec.path,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
            "served_model_name": self.served_name, "max_context_length": self.checks.context_limit,
            "vocab_size": self.checks.vocab, "logprobs": self.logprobs_supported,
            "device_type": self.loop.info.get("device_type"), "kernel_impl": self.loop.info.get("kernel_impl")})

    async def _latest_engine_stats(self) -> dict | None:
        """The engine's counters if it answers within METRICS_ENGINE_WAIT_S, else the last ones it
        answered (one call in flight at a time; a late answer still refreshes them)."""
        if getattr(self.loop, "fatal", None):
            return None
        if self._stats_call is None or self._stats_call.done():
            call = asyncio.ensure_future(self.loop.stats())

            def keep(f: asyncio.Future) -> None:
                if not f.cancelled() and f.exception() is None:
                    self._engine_stats = f.result()
            call.add_done_callback(keep)
            self._stats_call = call
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._stats_call), METRICS_ENGINE_WAIT_S)
        return self._engine_stats

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        stats = await self._latest_engine_stats()  # None: the server's own series still serve
        return web.Response(body=self.metrics.render(stats),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def server_info(self, request: web.Request) -> web.Response:
        try:
            stats = await self.loop.stats()
        except Exception as e:  # noqa: BLE001 - the engine process failed
            self.engine_error_seen()
            return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=503)
        # this (HTTP) process's own CPU time: with the client's, it says which side of the
        # stream was busy when a run lasts longer than the engine's work
        stats["server"] = {"cpu_s": time.process_time(), "chunks_sent": self.chunks_sent}
        # SGLang's keys: sglang-router names a worker's model from them (its /v1/models); a bare
        # model name is no path (the router would fetch a tokenizer of that name from the Hub)
        stats["served_model_name"] = self.served_name
        if self.model_path:
            stats["model_path"] = self.model_path
        return web.json_response(stats)

    async def flush_cache(self, request: web.Request) -> web.Response:
        ok = await self.loop.flush()
        if not ok:
            return web.json_response({"error": "requests are running; cache not flushed"}, status=409)
        return web.json_response({"status": "flushed"})

    async def profile(self, request: web.Request) -> web.Response:
        """POST /profile {"steps": N}: profile the engine's next N steps (torch.profiler, CUDA
        kernels) and answer the summary (harness.run.profile: ms per kernel category, wall, host
        gap) plus how many steps of each kind ran in the window. The capture runs on the engine
        thread between steps, so the steps are the ones the current clients are served by."""
        try:
            body = await self.checks.json_body(request)
            steps = as_int(get(body, "steps", 20), "steps", 1)
            if steps > MAX_PROFILE_STEPS:
                raise BadRequest(f"steps must be <= {MAX_PROFILE_STEPS}, got {steps}")
        except BadRequest as e:
            return web.json_response({"error": e.message}, status=400)
        if self.loop.info.get("device_type") != "cuda":
            return web.json_response({"error": f"profiling needs CUDA; the engine runs on "
                                               f"{self.loop.info.get('device_type')}"}, status=400)
        try:
            summary = await self.loop.profile(steps)  # granikv.profiling's capture and categories
        except Exception as e:  # noqa: BLE001 - a failed capture is reported, the server keeps serving
            return web.json_response({"error": f"profiling failed: {type(e).__name__}: {e}"}, status=500)
        return web.json_response(summary)

    # -- /generate --------------------------------------------------------------------------------
    def _meta(self, g: GenerateRequest, ev, n_out: int) -> dict:
        fr = {"type": ev.finish_reason} if ev.finished and ev.finish_reason else None
        return {"id": g.rid, "prompt_tokens": len(g.input_ids), "completion_tokens": n_out,
                "cached_tokens": ev.cached_tokens, "finish_reason": fr}

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang-native /generate. Streamed chunks carry the cumulative text and output ids
        (SGLang's default, non-incremental streaming), or with `incremental_streaming_output`
        only what is new since the previous chunk. Events that queued up while this handler
        waited are sent as one chunk, as SGLang's tokenizer manager does when it lags: at B=256
        the engine produces ~20K tokens/s and a write per token would take the GIL from the
        engine thread (harness/microbench/server.py measures this). The ids list is kept as
        serialized JSON text and appended to, so a chunk costs O(new tokens), not O(output)."""
        with self.tracked():
            return await self._generate(request)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        try:
            g = self._parse_generate(await self.checks.json_body(request))
            if g.rid in self.loop.streams:
                # a second stream under one id would take the first's queue, and the engine's
                # duplicate-id error would then close it: the first client would hang
                raise BadRequest(f"request id {g.rid!r} is already in flight", "rid")
            self.check_alive()
        except ApiError as e:
            return native_response(e)
        q = self.loop.submit(g.rid, g.input_ids, g.params, g.shared_prefix_len)
        trace = self.metrics.trace(len(g.input_ids))
        out: list[int] = []
        ids_json = ""  # ",".join(map(str, out)), grown incrementally
        text = ""
        sent = 0  # characters of text already streamed (incremental mode, whole-sequence codec)
        resp = None
        try:
            if g.stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
                await resp.prepare(request)
            while True:
                evs = [await q.get()]
                while not q.empty() and not (evs[-1].finished or evs[-1].error):
                    evs.append(q.get_nowait())
                ev = evs[-1]
                new = [e.token for e in evs if not e.error]
                out.extend(new)
                trace.tokens(len(new))
                if ev.error:
                    err = self.event_failure(ev.error)
                    trace.finish("error")
                    if resp is None:
                        return native_response(err)
                    await resp.write(f"data: {json.dumps({'error': {'message': err.message}})}\n\n".encode())
                    break
                if resp is not None and self.incremental:
                    if self.codec.incremental:
                        text = self.codec.decode(new)
                    else:  # a tokenizer whose pieces depend on context: cut the new part off the whole
                        full = self.codec.decode(out)
                        text, sent = full[sent:], len(full)
                    ids_json = ",".join(map(str, new))
                elif resp is not None:
                    text = text + self.codec.decode(new) if self.codec.incremental else self.codec.decode(out)
                    ids_json += ("," if ids_json and new else "") + ",".join(map(str, new))
                if resp is not None:
                    await resp.write(sse_chunk(text, ids_json, self._meta(g, ev, len(out))))
                    self.chunks_sent += 1
                if ev.finished:
                    trace.finish(ev.finish_reason)
                    break
            if resp is None:
                return web.json_response({"text": self.codec.decode(out), "output_ids": out,
                                          "meta_info": self._meta(g, ev, len(out))})
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except BaseException:
            self.loop.abort(g.rid)  # the client went away (or the handler failed): free its KV
            trace.finish("abort")
            raise


def sse_chunk(text: str, ids_json: str, meta: dict) -> bytes:
    """One streamed /generate event, SGLang's shape: text, output ids (`ids_json` is the list's
    serialized body), then `meta_info` last — the client reads only that tail of each chunk."""
    return (f'data: {{"text": {json.dumps(text)}, "output_ids": [{ids_json}], '
            f'"meta_info": {json.dumps(meta)}}}\n\n').encode()


SERVER = web.AppKey("server", Server)  # the app's Server (its drain and cut run the shutdown)


def app_runner(app: web.Application, shutdown_timeout: float = 10.0) -> web.AppRunner:
    """The runner every server of this package uses. `handler_cancellation`: a handler is
    cancelled when its client disconnects, so a non-streamed request whose client went away is
    aborted at once (its KV freed) instead of running to its end; streamed ones notice at their
    next write either way. `shutdown_timeout`: what `cleanup` grants handlers still running
    (a graceful shutdown has ended them by then: `Server.drain`, `Server.cut`)."""
    return web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=shutdown_timeout)


def build_app(loop: EngineLoop, codec: TextCodec, incremental_streaming_output: bool = False,
              served_model_name: str | None = None, model_path: str | None = None,
              context_length: int | None = None, api_key: str | None = None,
              max_request_bytes_: int | None = None) -> web.Application:
    """The app over an engine loop. `api_key`: required on every route but /health
    (middleware.py); `max_request_bytes_`: the body limit (default: what a valid request can
    need, body.max_request_bytes)."""
    s = Server(loop, codec, incremental_streaming_output, served_model_name, model_path, context_length,
               max_request_bytes_=max_request_bytes_)
    oai = OpenAIRoutes(s)
    # the size is checked in body.read_json (a JSON 413); aiohttp's own limit stays as a backstop
    app = web.Application(client_max_size=s.checks.limits.max_bytes + 1, middlewares=middlewares(api_key))
    app.router.add_get("/health", s.health)
    app.router.add_get("/health_generate", s.health_generate)
    app.router.add_get("/server_info", s.server_info)
    app.router.add_get("/get_server_info", s.server_info)
    app.router.add_get("/get_model_info", s.model_info)
    app.router.add_get("/model_info", s.model_info)
    app.router.add_get("/metrics", s.metrics_endpoint)
    app.router.add_post("/flush_cache", s.flush_cache)  # POST only: a GET must not change state
    app.router.add_post("/generate", s.generate)
    app.router.add_post("/profile", s.profile)
    app.router.add_get("/v1/models", oai.models)
    app.router.add_get("/v1/models/{model:.+}", oai.model)
    app.router.add_post("/v1/completions", oai.completions)
    app.router.add_post("/v1/chat/completions", oai.chat)
    app[SERVER] = s
    return app
