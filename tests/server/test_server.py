"""The HTTP server under good and bad clients: SGLang-native streaming, OpenAI completions,
32 concurrent streams, a client that disconnects mid-stream (its KV is freed), and every kind
of malformed request answered with a 4xx and a reason while the server keeps serving."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from engine_testutil import tiny_config
from hypothesis import HealthCheck, given, settings

from granikv.engine.engine import Engine
from granikv.runtime.loop import EngineLoop
from granikv.server.app import LISTEN_BACKLOG, build_app, tcp_site
from granikv.server.text import TextCodec

from .server_testutil import answer_is_below_500_and_the_server_keeps_serving, any_body, free_port, run, serving, stream


@pytest.fixture(scope="module")
def engine_loop():
    engine = Engine(tiny_config("granikv", kernel_impl="torch", max_running=48, max_context=256))
    loop = EngineLoop(engine)
    loop.start()
    yield loop
    loop.stop()


@pytest.fixture(scope="module")
def server(engine_loop):
    with serving(engine_loop, TextCodec()) as url:
        yield url, engine_loop.engine


def test_streaming_format_is_sglang_native(server):
    url, _ = server

    async def go():
        async with aiohttp.ClientSession() as s:
            # the extra fields SGLang's bench_serving sends must be accepted
            payload = {"input_ids": list(range(1, 40)), "stream": True, "return_logprob": False,
                       "logprob_start_len": -1, "lora_path": None,
                       "sampling_params": {"max_new_tokens": 5, "ignore_eos": True, "temperature": 0.0}}
            return await stream(s, url, payload)

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
            return await asyncio.gather(*(stream(s, url, p) for p in payloads))

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
    assert s.checks.prompt_ids(None, "hi").tolist() == [104, 105]  # text: the id codec (ASCII: their codes)


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
            ev = await stream(s, url, {"input_ids": list(range(3, 50)), "stream": True, "sampling_params": sp})
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
    port = free_port()
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


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=any_body)
def test_any_request_body_gets_an_answer_below_500_and_the_server_keeps_serving(server, body):
    """Whatever JSON a client sends (NaN included: Python's parser takes it), the answer is a
    200 with well-formed output or a 4xx with a reason — never a 5xx, a hang or a dead engine."""
    answer_is_below_500_and_the_server_keeps_serving(server[0], *body)
