"""The aiohttp application: request validation, streaming, and the control endpoints.

Nothing a client sends may crash the server: every malformed request gets a 4xx with a
reason, and the engine thread only ever sees validated requests. Unknown fields that SGLang's
own clients send (return_logprob, logprob_start_len, lora_path, ...) are accepted and ignored,
so SGLang's benchmark client works unchanged.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass

import numpy as np
from aiohttp import web

from granikv.engine.request import SamplingParams
from granikv.server.loop import EngineLoop  # torch-free: the server process never imports torch
from granikv.server.text import TextCodec

MAX_PROFILE_STEPS = 1000  # a window long enough for any table, short enough to stay in memory

# The listen queue. A benchmark client at B=256 opens ~250 connections at once; aiohttp's default
# backlog of 128 overflows, the kernel drops the SYNs beyond it, and those clients retry only after
# TCP's 1 s initial retransmission timeout: a tenth of the requests then start a second late (seen
# as p90 TTFT of 1.1 s against a median of 0.2 s on the H200, perf-notes v6). uvicorn (SGLang's
# server) listens with 2048; the kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 2048


def tcp_site(runner: web.AppRunner, host: str, port: int, backlog: int = LISTEN_BACKLOG) -> web.TCPSite:
    """The server's listening site, with a listen queue deep enough for a burst of B connections."""
    return web.TCPSite(runner, host, port, backlog=backlog)


class BadRequest(Exception):
    pass


@dataclass
class GenerateRequest:
    input_ids: np.ndarray  # int32, checked against the vocabulary
    params: SamplingParams
    stream: bool
    shared_prefix_len: int | None
    rid: str


def _int(v, name: str, lo: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{name} must be an integer, got {type(v).__name__}")
    if lo is not None and v < lo:
        raise BadRequest(f"{name} must be >= {lo}, got {v}")
    return v


def _hint(body: dict, n_ids: int) -> int | None:
    """The request's `shared_prefix_len` (GraniKV's extension field), checked against its prompt."""
    hint = body.get("shared_prefix_len")
    if hint is None:
        return None
    hint = _int(hint, "shared_prefix_len", 0)
    if hint > n_ids:
        raise BadRequest("shared_prefix_len exceeds the prompt length")
    return hint


def parse_sampling(sp, default_max: int = 128) -> SamplingParams:
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params must be an object")
    max_new = _int(sp.get("max_new_tokens", default_max), "max_new_tokens", 1)
    temp = sp.get("temperature", 0.0)
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or not math.isfinite(temp) or temp < 0:
        raise BadRequest("temperature must be a finite number >= 0")  # JSON's NaN/Infinity parse in Python
    top_k = _int(sp.get("top_k", -1), "top_k")
    ignore_eos = sp.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("ignore_eos must be a boolean")
    stop_ids = sp.get("stop_token_ids") or []
    if not isinstance(stop_ids, list):
        raise BadRequest("stop_token_ids must be a list of integers")
    try:
        return SamplingParams(max_new_tokens=max_new, temperature=float(temp), top_k=top_k, ignore_eos=ignore_eos,
                              stop_token_ids=tuple(_int(t, "stop_token_ids[]") for t in stop_ids))
    except ValueError as e:  # whatever SamplingParams refuses is the client's error, never a 500
        raise BadRequest(str(e)) from None


class Server:
    def __init__(self, loop: EngineLoop, codec: TextCodec, incremental_streaming_output: bool = False) -> None:
        self.loop = loop  # EngineLoop (engine thread) or EngineProcess (engine process): one interface
        self.codec = codec
        # SGLang's server flag of the same name: streamed /generate chunks carry only the new text
        # and ids instead of everything so far (the default, as SGLang's), whose bytes grow with
        # the square of the output length: 6 MB per 1024-token request, which the client must
        # parse (perf-notes, "HTTP check at 1024 output tokens")
        self.incremental = incremental_streaming_output
        self.vocab = loop.info["vocab_size"]
        self.max_context = loop.info["max_context"]
        self.model = loop.info["model"]
        self.started = time.time()
        self.chunks_sent = 0  # streamed events written, for /server_info's "server" section

    # -- validation -----------------------------------------------------------------------------
    async def _json(self, request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
            raise BadRequest(f"malformed JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body

    def _ids(self, ids, text, field: str = "input_ids") -> np.ndarray:
        """The prompt as a checked int32 array (what the engine process is sent)."""
        if ids is None:
            if text is None:
                raise BadRequest(f"one of {field} or text is required")
            if isinstance(text, list):
                if len(text) != 1:
                    raise BadRequest("batched text prompts are not supported; send one request each")
                text = text[0]
            if not isinstance(text, str):
                raise BadRequest("text must be a string")
            ids = self.codec.encode(text)
        if not isinstance(ids, list) or (ids and isinstance(ids[0], list)):
            raise BadRequest(f"{field} must be a flat list of integers")
        if not ids:
            raise BadRequest(f"{field} must not be empty")
        # C-level passes only (type set, one array conversion, min/max on the array): a per-token
        # Python loop costs ~0.1 ms for a 656-token prompt, and 256 requests arriving at once queue
        # behind it (the admission ramp); min/max over the list cost 0.5 ms at 16K tokens, the array
        # conversion the engine process needs anyway ~0.4 ms, so checking the array is ~free
        if set(map(type, ids)) != {int}:  # exact int: bool and float are rejected
            raise BadRequest(f"{field} must contain integers only")
        try:
            arr = np.fromiter(ids, dtype=np.int64, count=len(ids))
        except OverflowError:
            raise BadRequest(f"{field} holds a token id outside the vocabulary [0, {self.vocab})") from None
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.vocab:
            bad = lo if lo < 0 else hi
            raise BadRequest(f"token id {bad} is outside the vocabulary [0, {self.vocab})")
        return arr.astype(np.int32)

    def _parse_generate(self, body: dict) -> GenerateRequest:
        ids = self._ids(body.get("input_ids"), body.get("text"))
        params = parse_sampling(body.get("sampling_params"))
        if len(ids) + params.max_new_tokens > self.max_context:
            raise BadRequest(f"prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) "
                             f"exceeds the context length {self.max_context}")
        hint = _hint(body, len(ids))
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("stream must be a boolean")
        rid = body.get("rid") or uuid.uuid4().hex
        if not isinstance(rid, str):
            raise BadRequest("rid must be a string")
        return GenerateRequest(ids, params, stream, hint, rid)

    # -- handlers ---------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if self.loop.fatal:
            return web.json_response({"status": "error", "error": "engine thread died"}, status=503)
        return web.json_response({"status": "ok"})

    async def server_info(self, request: web.Request) -> web.Response:
        try:
            stats = await self.loop.stats()
        except Exception as e:  # noqa: BLE001 - the engine process failed
            return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=503)
        # this (HTTP) process's own CPU time: with the client's, it says which side of the
        # stream was busy when a run lasts longer than the engine's work
        stats["server"] = {"cpu_s": time.process_time(), "chunks_sent": self.chunks_sent}
        return web.json_response(stats)

    async def flush_cache(self, request: web.Request) -> web.Response:
        ok = await self.loop.flush()
        if not ok:
            return web.json_response({"error": "requests are running; cache not flushed"}, status=409)
        return web.json_response({"status": "flushed"})

    async def profile(self, request: web.Request) -> web.Response:
        """POST /profile {"steps": N}: profile the engine's next N steps (torch.profiler, CUDA
        kernels) and answer the summary (harness.profile: ms per kernel category, wall, host
        gap) plus how many steps of each kind ran in the window. The capture runs on the engine
        thread between steps, so the steps are the ones the current clients are served by."""
        try:
            body = await self._json(request)
            steps = _int(body.get("steps", 20), "steps", 1)
            if steps > MAX_PROFILE_STEPS:
                raise BadRequest(f"steps must be <= {MAX_PROFILE_STEPS}, got {steps}")
        except BadRequest as e:
            return web.json_response({"error": str(e)}, status=400)
        if self.loop.info.get("device_type") != "cuda":
            return web.json_response({"error": f"profiling needs CUDA; the engine runs on "
                                               f"{self.loop.info.get('device_type')}"}, status=400)
        try:
            summary = await self.loop.profile(steps)
        except ImportError as e:  # the categories are the harness's measurement definition
            return web.json_response({"error": f"harness.profile is not importable: {e}"}, status=501)
        except Exception as e:  # noqa: BLE001 - a failed capture is reported, the server keeps serving
            if "ModuleNotFoundError" in str(e) or "ImportError" in str(e):
                return web.json_response({"error": f"harness.profile is not importable: {e}"}, status=501)
            return web.json_response({"error": f"profiling failed: {type(e).__name__}: {e}"}, status=500)
        return web.json_response(summary)

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
        try:
            g = self._parse_generate(await self._json(request))
            if g.rid in self.loop.streams:
                # a second stream under one id would take the first's queue, and the engine's
                # duplicate-id error would then close it: the first client would hang
                raise BadRequest(f"request id {g.rid!r} is already in flight")
        except BadRequest as e:
            return web.json_response({"error": str(e)}, status=400)
        q = self.loop.submit(g.rid, g.input_ids, g.params, g.shared_prefix_len)
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
                if ev.error:
                    if resp is None:
                        return web.json_response({"error": ev.error}, status=400)
                    await resp.write(f"data: {json.dumps({'error': ev.error})}\n\n".encode())
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
                    break
            if resp is None:
                return web.json_response({"text": self.codec.decode(out), "output_ids": out,
                                          "meta_info": self._meta(g, ev, len(out))})
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except (ConnectionResetError, ConnectionError, RuntimeError, OSError):
            self.loop.abort(g.rid)  # the client went away: free its KV
            raise
        except BaseException:
            self.loop.abort(g.rid)
            raise

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """OpenAI-style completions over token ids or one text prompt."""
        try:
            body = await self._json(request)
            prompt = body.get("prompt")
            # token ids, or text (a string, or a list of one): _ids checks every id in C passes
            if isinstance(prompt, list) and prompt and not isinstance(prompt[0], str):
                ids = self._ids(prompt, None, "prompt")
            else:
                ids = self._ids(None, prompt, "prompt")
            sp = {"max_new_tokens": body.get("max_tokens", 16), "temperature": body.get("temperature", 0.0),
                  "ignore_eos": body.get("ignore_eos", False)}
            if body.get("top_k") is not None:
                sp["top_k"] = body["top_k"]
            params = parse_sampling(sp)
            if len(ids) + params.max_new_tokens > self.max_context:
                raise BadRequest("prompt + max_tokens exceeds the context length")
            hint = _hint(body, len(ids))
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise BadRequest("stream must be a boolean")
        except BadRequest as e:
            return web.json_response({"error": {"message": str(e), "type": "invalid_request_error"}},
                                     status=400)
        rid = "cmpl-" + uuid.uuid4().hex
        q = self.loop.submit(rid, ids, params, hint)
        model = self.model
        out: list[int] = []
        resp = None
        try:
            if stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
            while True:
                ev = await q.get()
                if ev.error:
                    if resp is None:
                        return web.json_response({"error": {"message": ev.error}}, status=400)
                    # the stream's headers are out: the error goes as an event, then the stream ends
                    await resp.write(f"data: {json.dumps({'error': {'message': ev.error}})}\n\n".encode())
                    break
                out.append(ev.token)
                if resp is not None:
                    chunk = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
                             "choices": [{"index": 0, "text": self.codec.decode([ev.token]),
                                          "finish_reason": ev.finish_reason if ev.finished else None}]}
                    await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if ev.finished:
                    break
            usage = {"prompt_tokens": len(ids), "completion_tokens": len(out),
                     "total_tokens": len(ids) + len(out)}
            if resp is None:
                return web.json_response({"id": rid, "object": "text_completion", "created": int(time.time()),
                                          "model": model, "usage": usage,
                                          "choices": [{"index": 0, "text": self.codec.decode(out),
                                                       "finish_reason": ev.finish_reason}]})
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except BaseException:
            self.loop.abort(rid)
            raise


def sse_chunk(text: str, ids_json: str, meta: dict) -> bytes:
    """One streamed /generate event, SGLang's shape: text, output ids (`ids_json` is the list's
    serialized body), then `meta_info` last — the client reads only that tail of each chunk."""
    return (f'data: {{"text": {json.dumps(text)}, "output_ids": [{ids_json}], '
            f'"meta_info": {json.dumps(meta)}}}\n\n').encode()


def build_app(loop: EngineLoop, codec: TextCodec, incremental_streaming_output: bool = False) -> web.Application:
    s = Server(loop, codec, incremental_streaming_output)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", s.health)
    app.router.add_get("/health_generate", s.health)
    app.router.add_get("/server_info", s.server_info)
    app.router.add_get("/get_server_info", s.server_info)
    app.router.add_post("/flush_cache", s.flush_cache)
    app.router.add_get("/flush_cache", s.flush_cache)
    app.router.add_post("/generate", s.generate)
    app.router.add_post("/profile", s.profile)
    app.router.add_post("/v1/completions", s.completions)
    app["server"] = s
    return app
