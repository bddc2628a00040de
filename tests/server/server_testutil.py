"""Helpers of the HTTP server tests: a free port, the app served from a thread, an SSE reader,
and the fuzzed request bodies with the check every answer must pass."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading

import aiohttp
from aiohttp import web
from hypothesis import strategies as st

from granikv.server.app import build_app, tcp_site
from granikv.server.text import TextCodec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(loop, codec: TextCodec, **app_kw):
    """The aiohttp app over `loop` on a free port, served from a thread; yields its URL."""
    port = free_port()
    ready = threading.Event()
    state = {}

    def serve():
        aloop = asyncio.new_event_loop()
        state["loop"] = aloop
        runner = web.AppRunner(build_app(loop, codec, **app_kw))
        aloop.run_until_complete(runner.setup())
        aloop.run_until_complete(tcp_site(runner, "127.0.0.1", port).start())
        ready.set()
        aloop.run_forever()
        aloop.run_until_complete(runner.cleanup())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        state["loop"].call_soon_threadsafe(state["loop"].stop)
        t.join(10)


def run(coro):
    return asyncio.run(coro)


async def stream(session, url, payload):
    events = []
    async with session.post(url + "/generate", json=payload) as r:
        assert r.status == 200, await r.text()
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            body = line[5:].strip()
            if body == "[DONE]":
                events.append("[DONE]")
                break
            events.append(json.loads(body))
    return events


# --------------------------------------------------------------------------- fuzzed request bodies

_json_leaf = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
              | st.text(max_size=6))
_json_any = st.recursive(_json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c,
                                                                                           max_size=4),
                         max_leaves=8)


def _maybe(valid):
    return st.one_of(valid, valid, _json_any)


_sampling = st.fixed_dictionaries({}, optional={
    "max_new_tokens": _maybe(st.integers(-2, 6)), "temperature": _maybe(st.floats(-1, 3) | st.sampled_from([1e-40])),
    "top_k": _maybe(st.integers(-3, 2000)), "ignore_eos": _maybe(st.booleans()),
    "stop_token_ids": _maybe(st.lists(st.integers(-3, 1100), max_size=3))})
_generate_bodies = st.fixed_dictionaries({}, optional={
    "input_ids": _maybe(st.lists(st.integers(-3, 1100), max_size=24)), "text": _maybe(st.text(max_size=24)),
    "sampling_params": _maybe(_sampling), "stream": _maybe(st.booleans()), "rid": _maybe(st.uuids().map(str)),
    "shared_prefix_len": _maybe(st.integers(-3, 30)), "return_logprob": _json_any})
_completion_bodies = st.fixed_dictionaries({}, optional={
    "prompt": _maybe(st.lists(st.integers(-3, 1100), max_size=24) | st.text(max_size=24)),
    "max_tokens": _maybe(st.integers(-2, 6)), "temperature": _maybe(st.floats(-1, 3)),
    "top_k": _maybe(st.integers(-3, 50)), "stream": _maybe(st.booleans()), "ignore_eos": _maybe(st.booleans()),
    "shared_prefix_len": _maybe(st.integers(-3, 30))})


any_body = st.one_of(_generate_bodies.map(lambda b: ("/generate", b)),
                      _completion_bodies.map(lambda b: ("/v1/completions", b)),
                      _json_any.map(lambda b: ("/generate", b)))


def answer_is_below_500_and_the_server_keeps_serving(url: str, path: str, payload) -> None:
    async def go():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            async with s.post(url + path, data=json.dumps(payload, allow_nan=True),
                              headers={"Content-Type": "application/json"}) as r:
                status, text = r.status, await r.text()
            async with s.get(url + "/health") as r:
                health = r.status
            for _ in range(100):  # the request leaves nothing behind in the engine
                async with s.get(url + "/server_info") as r:
                    info = await r.json()
                if info["running"] == 0 and info["waiting"] == 0:
                    break
                await asyncio.sleep(0.05)
        return status, text, health, info

    status, text, health, info = run(go())
    assert status < 500, (payload, status, text)
    assert health == 200
    assert info["running"] == 0 and info["waiting"] == 0 and info["storage"]["live_requests"] == 0
    if status >= 400:
        assert "error" in text
    elif "data:" in text:  # a stream: every event parses, and it ends with [DONE]
        events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        assert events[-1] == "[DONE]" and all(json.loads(e) for e in events[:-1])
    else:
        json.loads(text)
