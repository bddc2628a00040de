"""A fake SGLang-native server for client tests: controlled timings and failure modes.

It runs an aiohttp app on 127.0.0.1 (random free port) in a background thread with its own
event loop, so tests can call the client with plain `asyncio.run`. `POST /generate` streams
`data: {...}` events in SGLang's shape (cumulative `text`, `output_ids`,
`meta_info.{prompt_tokens, completion_tokens, cached_tokens}`) then `data: [DONE]`.
`POST /v1/completions` streams OpenAI chunks (`choices[0].text`: only the chunk's new text,
`usage: null`), then, when `stream_options.include_usage` is set (and `send_meta`), a usage chunk
with empty `choices`, then `data: [DONE]`.

The first input id (or prompt id) selects a failure mode (ids are otherwise ignored):
HTTP_500 -> status 500; DISCONNECT -> two tokens then the socket is closed;
NO_DONE -> the stream ends cleanly but without [DONE]; HANG -> never answers.

Closed-loop tests can set `output_fn` (prompt, n -> the n output ids to stream; every answer
is then kept in `outputs`), `delay_fn` (prompt -> extra seconds before the first token) and
`mode_fn` (prompt -> failure mode, instead of the first id). `FakeTimings.incremental_ids`
streams only each chunk's new `output_ids` (SGLang's incremental streaming); a completions body
with `return_token_ids` gets each chunk's ids in `choices[0].token_ids` (vLLM's shape).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

HTTP_500 = -500
DISCONNECT = -1
NO_DONE = -2
HANG = -3


@dataclass
class FakeTimings:
    first_token_delay: float = 0.05   # request received -> first chunk
    inter_token_delay: float = 0.01   # between chunks
    tokens_per_chunk: int = 1
    send_meta: bool = True            # False: chunks carry text only (no meta_info)
    cached_tokens: int = 7
    incremental_ids: bool = False     # True: a chunk's output_ids are only its new ones


@dataclass
class FakeServer:
    timings: FakeTimings = field(default_factory=FakeTimings)
    in_flight: int = 0
    max_in_flight: int = 0
    payloads: list[dict] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # "generate" / "flush", in arrival order
    output_fn: Callable[[list[int], int], list[int]] | None = None  # None: ids 0..n-1
    delay_fn: Callable[[list[int]], float] | None = None
    mode_fn: Callable[[list[int]], int] | None = None
    outputs: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (prompt, output ids)
    base_url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _thread: threading.Thread | None = None

    # ------------------------------------------------------------------ handlers

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.payloads.append(body)
        self.events.append("generate")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._stream(request, body)
        finally:
            self.in_flight -= 1

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.payloads.append(body)
        self.events.append("completions")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._stream(request, body, openai=True)
        finally:
            self.in_flight -= 1

    def _chunk(self, body: dict, ids: list[int], sent: int, step: int, openai: bool, out: list[int]) -> dict:
        if openai:
            choice = {"index": 0, "text": "x" * step, "finish_reason": None}
            if body.get("return_token_ids"):
                choice["token_ids"] = out[sent - step:sent]
            return {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": body.get("model"),
                    "choices": [choice], "usage": None}
        new_only = self.timings.incremental_ids
        chunk = {"text": "x" * sent, "output_ids": out[sent - step:sent] if new_only else out[:sent], "index": 0}
        if self.timings.send_meta:
            chunk["meta_info"] = {
                "prompt_tokens": len(ids),
                "completion_tokens": sent,
                "cached_tokens": self.timings.cached_tokens,
            }
        return chunk

    async def _stream(self, request: web.Request, body: dict, openai: bool = False) -> web.StreamResponse:
        t = self.timings
        ids = body["prompt"] if openai else body["input_ids"]
        mode = self.mode_fn(ids) if self.mode_fn else (ids[0] if ids else 0)
        n = int(body["max_tokens"] if openai else body["sampling_params"]["max_new_tokens"])
        out = list(range(n))
        if self.output_fn is not None:
            out = list(self.output_fn(ids, n))
        if mode == HTTP_500:
            return web.Response(status=500, text="injected failure")
        if mode == HANG:
            await asyncio.sleep(3600)
        if self.output_fn is not None:
            self.outputs.append((list(ids), out))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(t.first_token_delay + (self.delay_fn(ids) if self.delay_fn else 0.0))
        sent = 0
        while sent < n:
            if sent > 0:
                await asyncio.sleep(t.inter_token_delay)
            step = min(t.tokens_per_chunk, n - sent)
            sent += step
            chunk = self._chunk(body, ids, sent, step, openai, out)
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if mode == DISCONNECT and sent >= 2:
                request.transport.close()
                return resp
        if openai and t.send_meta and (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": len(ids), "completion_tokens": sent, "total_tokens": len(ids) + sent,
                     "prompt_tokens_details": {"cached_tokens": t.cached_tokens}}
            final = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": body.get("model"),
                     "choices": [], "usage": usage}
            await resp.write(f"data: {json.dumps(final)}\n\n".encode())
        if mode != NO_DONE:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _flush(self, request: web.Request) -> web.Response:
        self.events.append("flush")
        return web.Response(text="Cache flushed.")

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> str:
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            app = web.Application()
            app.router.add_post("/generate", self._generate)
            app.router.add_post("/v1/completions", self._completions)
            app.router.add_post("/flush_cache", self._flush)
            # handler_cancellation: a client that gives up (timeout) cancels the HANG handler;
            # a short shutdown_timeout keeps stop() fast.
            self._runner = web.AppRunner(
                app, handle_signals=False, shutdown_timeout=0.5, handler_cancellation=True, access_log=None
            )
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            port = self._runner.addresses[0][1]
            self.base_url = f"http://127.0.0.1:{port}"
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self.base_url

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
