"""The HTTP server under good and bad clients: SGLang-native streaming, OpenAI completions,
32 concurrent streams, a client that disconnects mid-stream (its KV is freed), and every kind
of malformed request answered with a 4xx and a reason while the server keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from engine_testutil import tiny_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams
from granikv.server.app import LISTEN_BACKLOG, build_app, tcp_site
from granikv.server.loop import EngineLoop
from granikv.server.text import TextCodec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine_loop():
    engine = Engine(tiny_config("granikv", kernel_impl="torch", max_running=48, max_context=256))
    loop = EngineLoop(engine)
    loop.start()
    yield loop
    loop.stop()


@contextlib.contextmanager
def serving(loop, codec: TextCodec, **app_kw):
    """The aiohttp app over `loop` on a free port, served from a thread; yields its URL."""
    port = _free_port()
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


@pytest.fixture(scope="module")
def server(engine_loop):
    with serving(engine_loop, TextCodec()) as url:
        yield url, engine_loop.engine


def run(coro):
    return asyncio.run(coro)


async def _stream(session, url, payload):
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


def test_streaming_format_is_sglang_native(server):
    url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            # the extra fields SGLang's bench_serving sends must be accepted
            payload = {"input_ids": list(range(1, 40)), "stream": True, "return_logprob": False,
                       "logprob_start_len": -1, "lora_path": None,
                       "sampling_params": {"max_new_tokens": 5, "ignore_eos": True, "temperature": 0.0}}
            return await _stream(s, url, payload)

    ev = run(go())
    assert ev[-1] == "[DONE]"
    chunks = ev[:-1]
    # one chunk per token, unless tokens queued up while the handler was busy: those go out as
    # one chunk (cumulative text and ids, as SGLang's non-incremental streaming)
    assert 1 <= len(chunks) <= 5
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(set(counts)) and counts[-1] == 5
    for c in chunks:
        assert c["text"]  # bench_serving skips chunks with empty text
        assert c["meta_info"]["prompt_tokens"] == 39
        assert len(c["output_ids"]) == c["meta_info"]["completion_tokens"]
        assert c["meta_info"]["finish_reason"] == ({"type": "length"} if c is chunks[-1] else None)


def test_non_streaming_and_openai_completions(server):
    url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/generate", json={"input_ids": [5, 6, 7],
                                                       "sampling_params": {"max_new_tokens": 3}}) as r:
                a = (r.status, await r.json())
            async with s.post(url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 3}) as r:
                b = (r.status, await r.json())
            async with s.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 2}) as r:
                c = (r.status, await r.json())
        return a, b, c

    a, b, c = run(go())
    assert a[0] == 200 and len(a[1]["output_ids"]) == 3
    assert b[0] == 200 and b[1]["usage"]["completion_tokens"] == 3
    assert c[0] == 200 and c[1]["usage"]["prompt_tokens"] == 5


def test_32_concurrent_streams(server):
    url, engine = server

    async def go():
        async with aiohttp.ClientSession() as s:
            prefix = list(range(100, 160))
            payloads = [{"input_ids": prefix + [i + 1, i + 2], "stream": True, "shared_prefix_len": 60,
                         "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}} for i in range(32)]
            return await asyncio.gather(*(_stream(s, url, p) for p in payloads))

    results = run(go())
    assert all(r[-1] == "[DONE]" and r[-2]["meta_info"]["completion_tokens"] == 8 and len(r[-2]["output_ids"]) == 8
               for r in results)


def test_disconnect_mid_stream_frees_kv(server):
    url, engine = server

    async def go():
        async with aiohttp.ClientSession() as s:
            payload = {"input_ids": list(range(1, 30)), "stream": True,
                       "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}
            async with s.post(url + "/generate", json=payload) as r:
                n = 0
                async for raw in r.content:
                    if raw.startswith(b"data:"):
                        n += 1
                    if n >= 3:
                        break  # leave while the request is still generating
        # the engine drops the request and returns its KV
        for _ in range(100):
            async with aiohttp.ClientSession() as s, s.get(url + "/server_info") as r:
                info = await r.json()
            if info["running"] == 0 and info["storage"]["live_requests"] == 0:
                return info
            await asyncio.sleep(0.1)
        return info

    info = run(go())
    assert info["running"] == 0 and info["storage"]["live_requests"] == 0


def test_a_request_id_already_in_flight_is_refused_and_the_first_stream_completes(server):
    """A client-chosen `rid` that another request still streams under gets a 400; the first
    request keeps its stream (a second submit under the same id used to replace the first's
    queue, and the engine's duplicate-id error then closed it: the first client hung)."""
    url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            payload = {"input_ids": list(range(1, 30)), "stream": True, "rid": "same-id",
                       "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}
            async with s.post(url + "/generate", json=payload) as first:
                lines = first.content.__aiter__()
                while not (await lines.__anext__()).startswith(b"data:"):
                    pass  # the first request is streaming now
                async with s.post(url + "/generate", json={"input_ids": [3, 4], "rid": "same-id",
                                                           "sampling_params": {"max_new_tokens": 2}}) as r:
                    second = (r.status, await r.text())
                events = [json.loads(raw[5:]) if raw.strip() != b"data: [DONE]" else "[DONE]"
                          async for raw in first.content if raw.startswith(b"data:")]
            return events, second

    events, (status, text) = run(go())
    assert status == 400 and "same-id" in text and "in flight" in text
    assert events[-1] == "[DONE]" and events[-2]["meta_info"]["completion_tokens"] == 200


BAD = [
    (b"{not json", "malformed JSON"),
    (json.dumps([1, 2]).encode(), "JSON object"),
    (json.dumps({"input_ids": []}).encode(), "must not be empty"),
    (json.dumps({"input_ids": [1, 99999]}).encode(), "outside the vocabulary"),
    (json.dumps({"input_ids": [1, -3]}).encode(), "outside the vocabulary"),
    (json.dumps({"input_ids": [1, 2**70]}).encode(), "outside the vocabulary"),  # past int64
    (json.dumps({"input_ids": [[1, 2]]}).encode(), "flat list"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}}).encode(), "max_new_tokens"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -5}}).encode(), "max_new_tokens"),
    (json.dumps({"input_ids": "abc"}).encode(), "list of integers"),
    (json.dumps({"input_ids": [1, "x"]}).encode(), "integers only"),
    (json.dumps({"input_ids": [1, 2.5]}).encode(), "integers only"),
    (json.dumps({"input_ids": [1, True]}).encode(), "integers only"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": "fast"}).encode(), "sampling_params"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}).encode(), "temperature"),
    (b'{"input_ids": [1, 2], "sampling_params": {"temperature": NaN}}', "temperature"),  # Python's JSON parses NaN
    (b'{"input_ids": [1, 2], "sampling_params": {"temperature": Infinity}}', "temperature"),
    (json.dumps({"input_ids": [1, 2], "stream": "yes"}).encode(), "stream"),
    (json.dumps({"input_ids": list(range(300))}).encode(), "context length"),
    (json.dumps({"input_ids": [1, 2], "shared_prefix_len": 9}).encode(), "shared_prefix_len"),
    (json.dumps({}).encode(), "required"),
]


def test_prompt_ids_reach_the_engine_as_checked_int32_arrays():
    """The HTTP side hands the engine the int32 array it checked (one conversion per prompt)."""
    from granikv.server.app import Server
    from granikv.server.text import TextCodec

    class Info:
        info = {"vocab_size": 256, "max_context": 64, "model": "tiny", "device_type": "cpu"}

    s = Server(Info(), TextCodec(None))
    g = s._parse_generate({"input_ids": [0, 7, 255], "sampling_params": {"max_new_tokens": 3}})
    assert g.input_ids.dtype == np.int32 and g.input_ids.tolist() == [0, 7, 255]
    assert s._ids(None, "hi").tolist() == [104, 105]  # text: the UTF-8 fallback codec


@pytest.mark.parametrize("stream", [False, True])
def test_completions_check_the_prefix_hint_before_streaming(server, stream):
    """/v1/completions passed `shared_prefix_len` to the engine unchecked: past the prompt's end it
    was refused there, after a stream's headers had gone out, and the JSON 400 sent inside the
    stream broke the response (found by the fuzzed-body test below)."""
    url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/completions", json={"prompt": [3, 4, 5], "max_tokens": 2, "stream": stream,
                                                             "shared_prefix_len": 12}) as r:
                return r.status, await r.text()

    status, text = run(go())
    assert status == 400 and "shared_prefix_len" in text


@pytest.mark.parametrize("body,reason", BAD)
def test_bad_requests_get_4xx_with_reason(server, body, reason):
    url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/generate", data=body, headers={"Content-Type": "application/json"}) as r:
                bad = (r.status, await r.text())
            async with s.get(url + "/health") as r:
                ok = r.status
        return bad, ok

    (status, text), health = run(go())
    assert 400 <= status < 500
    assert reason in text
    assert health == 200


def test_health_info_flush(server):
    url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                h = r.status
            async with s.get(url + "/server_info") as r:
                info = await r.json()
            t0 = time.time()
            while True:
                async with s.post(url + "/flush_cache") as r:
                    f = r.status
                if f == 200 or time.time() - t0 > 10:
                    break
                await asyncio.sleep(0.1)
        return h, info, f

    h, info, f = run(go())
    assert h == 200 and f == 200
    assert info["config"]["system"] == "granikv"
    assert "dense_steps" in info["attention"]
    assert info["server"]["cpu_s"] > 0 and info["server"]["chunks_sent"] >= 0


def test_cli_help_lists_every_config_field():
    import dataclasses
    import subprocess
    import sys

    from granikv.config import EngineConfig

    out = subprocess.run([sys.executable, "-m", "granikv.server", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0
    for f in dataclasses.fields(EngineConfig):
        assert "--" + f.name.replace("_", "-") in out.stdout
    assert "127.0.0.1" in out.stdout


def test_the_server_process_does_not_import_torch():
    """Only the engine process needs torch: importing it in the HTTP process too cost every cell
    a second torch import (seconds on a CUDA build) before the engine process even started."""
    import subprocess
    import sys

    code = ("import sys, granikv.server.__main__, granikv.server.app, granikv.server.proc, "
            "granikv.server.loop, granikv.server.text; "
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_server_process_serves_and_stops_on_sigterm():
    import signal
    import subprocess
    import sys
    import urllib.request

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "granikv.server", "--model", "tiny", "--kernel-impl", "torch",
                             "--num-slots", "2048", "--max-running", "8", "--max-context", "256",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        t0 = time.time()
        line = ""
        while "ready" not in line and time.time() - t0 < 120:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert "ready" in line, "server did not start"
        req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", method="POST",
                                     data=json.dumps({"input_ids": [1, 2, 3],
                                                      "sampling_params": {"max_new_tokens": 2}}).encode())
        with urllib.request.urlopen(req, timeout=60) as r:
            assert len(json.loads(r.read())["output_ids"]) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_engine_process_serves_streams_counters_flush_and_errors():
    """The server's default: the engine in its own process (granikv.server.proc)."""
    from granikv.server.proc import EngineProcess

    handle = EngineProcess(tiny_config("granikv", kernel_impl="torch", max_running=16, max_context=256))
    handle.start()
    assert handle.info["vocab_size"] == 1024 and handle.info["device_type"] == "cpu"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"

    async def go():
        runner = web.AppRunner(build_app(handle, TextCodec()))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as s:
                prefix = list(range(100, 140))
                payloads = [{"input_ids": prefix + [i + 1], "stream": True, "shared_prefix_len": 40,
                             "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}} for i in range(6)]
                streams = await asyncio.gather(*(_stream(s, url, p) for p in payloads))
                async with s.post(url + "/generate", json={"input_ids": [1, 2, 3],
                                                           "sampling_params": {"max_new_tokens": 3}}) as r:
                    plain = await r.json()
                async with s.get(url + "/server_info") as r:
                    info = await r.json()
                async with s.post(url + "/flush_cache") as r:
                    flushed = r.status
                async with s.post(url + "/profile", json={"steps": 2}) as r:
                    prof = r.status
            return streams, plain, info, flushed, prof
        finally:
            await runner.cleanup()

    try:
        streams, plain, info, flushed, prof = run(go())
    finally:
        handle.stop()
    assert all(st[-1] == "[DONE]" and st[-2]["meta_info"]["completion_tokens"] == 6 for st in streams)
    # greedy and deterministic: requests with the same prompt get the same tokens as in-thread
    ref = Engine(tiny_config("granikv", kernel_impl="torch", max_running=16, max_context=256))
    assert plain["output_ids"] == ref.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3))[0]
    assert info["steps"]["decode"] > 0 and info["hot_admits"] >= 1
    # the engine process's loop clock: every request received and admitted, every step timed
    loop = info["loop"]
    assert loop["adds"] == 7 and loop["steps"] == sum(info["steps"].values()) and loop["add_s"] > 0
    step_log_s = sum(info["step_time_s"].values())
    assert loop["step_s"] >= 0.9 * step_log_s and all(loop[k] >= 0 for k in ("idle_s", "send_s", "cmd_s"))
    # where the start-up went: the engine's build inside the child's, inside spawn-to-ready
    up = info["startup"]
    assert 0 < up["build_s"] <= up["engine_s"] <= up["process_s"] and up["capture_s"] == 0  # no CUDA
    assert flushed == 200
    assert prof == 400  # profiling needs CUDA: a clear 4xx on a CPU engine, not a crash
    assert not handle.proc.is_alive()


def test_engine_process_reports_a_bad_config_at_start():
    from granikv.server.proc import EngineProcess

    handle = EngineProcess(tiny_config("granikv", kernel_impl="torch", model="no-such-model"))
    with pytest.raises(ValueError):
        handle.start()
    handle.stop()


class _JoinCodec(TextCodec):
    """A codec whose pieces depend on context (like a real tokenizer's): ids joined by commas."""

    @property
    def incremental(self) -> bool:
        return False

    def decode(self, ids):
        return ",".join(map(str, ids))


@pytest.mark.parametrize("codec", [TextCodec(), _JoinCodec()], ids=["piecewise", "whole-sequence"])
def test_incremental_streaming_output_sends_only_new_text_and_ids(engine_loop, codec):
    """With SGLang's --incremental-streaming-output, the chunks' ids and text concatenate to the
    whole output (the default mode's chunks each carry everything so far)."""

    async def go(url):
        async with aiohttp.ClientSession() as s:
            sp = {"max_new_tokens": 40, "ignore_eos": True, "temperature": 0.0}
            ev = await _stream(s, url, {"input_ids": list(range(3, 50)), "stream": True, "sampling_params": sp})
            async with s.post(url + "/generate", json={"input_ids": list(range(3, 50)), "sampling_params": sp}) as r:
                whole = await r.json()
            return ev, whole

    with serving(engine_loop, codec, incremental_streaming_output=True) as url:
        ev, whole = run(go(url))
    chunks = ev[:-1]
    assert ev[-1] == "[DONE]" and len(chunks) >= 2
    ids = [i for c in chunks for i in c["output_ids"]]
    assert ids == whole["output_ids"] and len(ids) == 40
    assert "".join(c["text"] for c in chunks) == codec.decode(ids)
    assert [c["meta_info"]["completion_tokens"] for c in chunks][-1] == 40


def test_listen_queue_holds_a_burst_of_connections(engine_loop):
    """A burst of B=300 new connections reaches the server while its loop accepts none (as when it
    is busy streaming): every one must complete its handshake into the listen queue. With
    aiohttp's default backlog (128) the kernel drops the SYNs beyond it and those clients wait for
    TCP's 1 s retransmission (the p90 TTFT of 1.1 s the H200 HTTP check showed)."""
    assert LISTEN_BACKLOG >= 300
    aloop = asyncio.new_event_loop()
    runner = web.AppRunner(build_app(engine_loop, TextCodec()))
    aloop.run_until_complete(runner.setup())
    port = _free_port()
    aloop.run_until_complete(tcp_site(runner, "127.0.0.1", port).start())
    socks = []
    try:  # the loop is not running: nothing is accepted while we connect
        t0 = time.monotonic()
        for _ in range(300):
            s = socket.socket()
            s.settimeout(0.9)  # under the SYN retransmission timeout: a dropped SYN fails here
            socks.append(s)
            s.connect(("127.0.0.1", port))
        assert time.monotonic() - t0 < 5
    finally:
        for s in socks:
            s.close()
        aloop.run_until_complete(runner.cleanup())
        aloop.close()


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


_any_body = st.one_of(_generate_bodies.map(lambda b: ("/generate", b)),
                      _completion_bodies.map(lambda b: ("/v1/completions", b)),
                      _json_any.map(lambda b: ("/generate", b)))


def _answer_is_below_500_and_the_server_keeps_serving(url: str, path: str, payload) -> None:
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


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_any_body)
def test_any_request_body_gets_an_answer_below_500_and_the_server_keeps_serving(server, body):
    """Whatever JSON a client sends (NaN included: Python's parser takes it), the answer is a
    200 with well-formed output or a 4xx with a reason — never a 5xx, a hang or a dead engine."""
    _answer_is_below_500_and_the_server_keeps_serving(server[0], *body)


@pytest.fixture(scope="module")
def process_server():
    """The server's default mode: the engine in its own process."""
    from granikv.server.proc import EngineProcess

    handle = EngineProcess(tiny_config("granikv", kernel_impl="torch", max_running=48, max_context=256))
    handle.start()
    try:
        with serving(handle, TextCodec()) as url:
            yield url
    finally:
        handle.stop()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_any_body)
def test_any_request_body_through_the_engine_process(process_server, body):
    """The same through the engine process (its own add-error path and the int32 prompt pipe)."""
    _answer_is_below_500_and_the_server_keeps_serving(process_server, *body)


def test_a_burst_of_long_prompts_reaches_the_engine_process_while_it_steps():
    """A 16K-token prompt is a ~66 KB message, over a pipe's 64 KB buffer: when the engine process
    read commands only between steps, one prompt got through per step and the server's event loop
    blocked on each write (a burst at Lp=16K became one single-request prefill step per prompt).
    The engine process reads commands on a thread of its own, so a burst arrives while
    a (simulated, 200 ms) prefill step runs."""
    import functools

    from granikv.engine.request import SamplingParams
    from granikv.server.proc import EngineProcess
    from harness.microbench.server import _sim_factory

    handle = EngineProcess(None, factory=functools.partial(_sim_factory, 5.0, 64, 0.0, 200.0))
    handle.start()
    prompt = list(range(1, 16601))

    async def go():
        queues = [handle.submit(f"r{i}", prompt, SamplingParams(max_new_tokens=2), None) for i in range(8)]
        for q in queues:
            while not (await q.get()).finished:
                pass
        return await handle.stats()

    try:
        stats = run(asyncio.wait_for(go(), 60))
    finally:
        handle.stop()
    added = stats["added_at"]
    assert len(added) == 8
    assert max(added) - min(added) < 0.5  # one per 200 ms step would be >= 1.4 s


def test_loop_clock_places_idle_gaps_in_the_measured_run():
    """The engine process's idle waits inside a run (after a flush, from its first request on)
    are kept with their offset and the requests added before them; shorter waits, and waits
    before the run's first request, are only summed."""
    from granikv.server.proc import LoopClock

    c = LoopClock()
    c.idled(0.0, 1.0)  # before any request: server start, warm-up wait
    c.added(10.0, 0.001)
    c.idled(10.5, 0.2)  # a warm-up gap
    assert c.flushed() is None and not c.gaps
    c.idled(11.0, 0.3)  # after the flush, before the run's first request
    c.added(12.0, 0.001)
    c.added(12.1, 0.001)
    c.idled(13.0, 0.001)  # too short to keep
    c.idled(14.0, 0.25)
    d = c.as_dict()
    assert d["run_idle_gaps"] == [[2.0, 0.25, 2]]
    assert d["adds"] == 3 and abs(d["idle_s"] - 1.751) < 1e-3
    json.dumps(d)  # /server_info serves it as JSON
    for i in range(LoopClock.MAX_GAPS + 5):
        c.idled(20.0 + i, 0.01)
    assert len(c.as_dict()["run_idle_gaps"]) == LoopClock.MAX_GAPS
