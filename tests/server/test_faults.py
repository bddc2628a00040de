"""The server under the faults its users bring, each against a real `python -m granikv.server`
process (tiny model, CPU): a request the KV cache could never hold, clients that disconnect, no
or a wrong API key, SIGTERM with requests in flight, the engine process killed, a port in use,
hostile bodies, a long prefill while others probe it, and the start-up line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import aiohttp
import pytest

from .conftest import LiveServer, free_port, start_server, stop_server

TIMEOUT = aiohttp.ClientTimeout(total=120)


def _request(url: str, body=None, method: str = "POST", headers: dict | None = None, raw: bytes | None = None,
             timeout: float = 120) -> tuple[int, dict | str]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def _info(srv: LiveServer) -> dict:
    return _request(srv.url + "/server_info", method="GET")[1]


def _wait_idle(srv: LiveServer, timeout_s: float = 60.0) -> dict:
    t0 = time.time()
    while True:
        info = _info(srv)
        if info["running"] == 0 and info["waiting"] == 0 or time.time() - t0 > timeout_s:
            return info
        time.sleep(0.1)


def _exits(srv: LiveServer, timeout_s: float) -> int:
    try:
        return srv.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        pytest.fail(f"the server did not exit within {timeout_s} s")


@pytest.fixture(scope="module")
def small_kv():
    """2048 KV slots: a 1500-token prompt with 1000 new tokens can never fit."""
    srv = start_server("--num-slots", "2048", "--max-running", "32")
    try:
        yield srv
    finally:
        stop_server(srv)


# -- 1. capacity --------------------------------------------------------------------------------

def test_a_request_the_kv_cache_cannot_hold_is_refused_alone(small_kv):
    """It used to be admitted, fail mid-decode, and take the engine down for everyone (503 until a
    restart). Now it is a 400 naming the capacity, on every API, streamed or not, and the server
    keeps serving."""
    url = small_kv.url
    too_big = {"input_ids": [5] * 1500, "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
    for stream in (False, True):
        status, body = _request(url + "/generate", {**too_big, "stream": stream})
        assert status == 400 and "KV cache" in body["error"]["message"], body
    status, body = _request(url + "/v1/completions", {"prompt": [5] * 1500, "max_tokens": 1000, "stream": True})
    assert status == 400 and body["error"]["param"] == "max_tokens" and "KV cache" in body["error"]["message"]
    # a chat request without max_tokens gets what the cache holds, not the context's 8192 tokens
    # (a prompt near the capacity keeps the decode short on a CPU)
    status, body = _request(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 2000}],
                                                             "max_tokens": None, "ignore_eos": True})
    usage = body["usage"]
    assert status == 200 and usage["prompt_tokens"] > 2000 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] <= _info(small_kv)["storage"]["num_slots"]
    status, body = _request(url + "/generate", {"input_ids": [5] * 10, "sampling_params": {"max_new_tokens": 3}})
    assert status == 200 and len(body["output_ids"]) == 3
    assert _request(url + "/health", method="GET")[0] == 200


# -- 2. disconnects -----------------------------------------------------------------------------

def test_non_streamed_requests_are_aborted_when_their_client_disconnects(small_kv):
    """Non-streamed requests whose client went away used to run to their end (minutes of decode
    and KV held); the handler is cancelled on disconnect and aborts them, as streams are."""
    async def go():
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
            body = {"input_ids": [7] * 16, "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}
            tasks = [asyncio.ensure_future(s.post(small_kv.url + "/generate", json=body)) for _ in range(8)]
            for _ in range(100):  # until they are all running
                async with s.get(small_kv.url + "/server_info") as r:
                    if (await r.json())["running"] == 8:
                        break
                await asyncio.sleep(0.1)
            for t in tasks:
                t.cancel()  # closes each connection
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(go())
    t0 = time.time()
    info = _wait_idle(small_kv, 20)
    assert info["running"] == 0 and info["waiting"] == 0 and info["storage"]["live_requests"] == 0
    assert time.time() - t0 < 20


# -- 3. authentication --------------------------------------------------------------------------

def test_api_key_is_required_on_every_route_but_health():
    srv = start_server("--api-key", "s3cret")
    try:
        url = srv.url
        good = {"Authorization": "Bearer s3cret"}
        assert _request(url + "/health", method="GET")[0] == 200  # probes need no key
        for path, method, body in (("/generate", "POST", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}),
                                   ("/v1/completions", "POST", {"prompt": [1], "max_tokens": 1}),
                                   ("/v1/models", "GET", None), ("/metrics", "GET", None),
                                   ("/server_info", "GET", None), ("/get_model_info", "GET", None),
                                   ("/health_generate", "GET", None), ("/flush_cache", "POST", None)):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                status, answer = _request(url + path, body, method, headers)
                assert status == 401 and "API key" in json.dumps(answer), (path, headers, answer)
            assert _request(url + path, body, method, good)[0] == 200, path
        status, answer = _request(url + "/v1/models", method="GET", headers={"Authorization": "Bearer x"})
        assert answer["error"]["code"] == "invalid_api_key"  # OpenAI's shape under /v1
    finally:
        stop_server(srv)


def test_api_key_from_the_environment_and_the_openai_sdk():
    openai = pytest.importorskip("openai")
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "GRANIKV_API_KEY": "from-env"}
    proc = subprocess.Popen([sys.executable, "-m", "granikv.server", "--model", "tiny", "--device", "cpu",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    srv = LiveServer(f"http://127.0.0.1:{port}", "", proc, [])
    try:
        t0 = time.time()
        while "ready" not in srv.ready_line and time.time() - t0 < 120:
            srv.ready_line = proc.stdout.readline() or srv.ready_line
            if proc.poll() is not None:
                break
        threading.Thread(target=lambda: srv.log.extend(proc.stdout), daemon=True).start()
        ok = openai.OpenAI(base_url=srv.v1, api_key="from-env", max_retries=0)
        assert ok.completions.create(model="tiny", prompt=[1, 2], max_tokens=2).usage.completion_tokens == 2
        bad = openai.OpenAI(base_url=srv.v1, api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="tiny", prompt=[1, 2], max_tokens=2)
    finally:
        stop_server(srv)


def test_flush_cache_is_post_only_and_unknown_routes_answer_json(small_kv):
    status, body = _request(small_kv.url + "/flush_cache", method="GET")
    assert status == 405 and "not allowed" in body["error"]["message"]
    status, body = _request(small_kv.url + "/nope", method="GET")
    assert status == 404 and body["error"]["message"] == "no route /nope"
    status, body = _request(small_kv.url + "/v1/nope", {})
    assert status == 404 and body["error"]["code"] == "not_found"


def test_binding_beyond_localhost_without_a_key_warns():
    srv = start_server("--host", "0.0.0.0")
    try:
        time.sleep(0.2)
    finally:
        stop_server(srv)
    assert any("without an API key" in line for line in srv.log)


# -- 4. shutdown and the engine's death ----------------------------------------------------------

async def _sse_tail(session: aiohttp.ClientSession, url: str, body: dict) -> list[str]:
    events = []
    async with session.post(url, json=body) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.decode().strip()
            if line.startswith("data:"):
                events.append(line[5:].strip())
    return events


def test_sigterm_drains_then_cuts_streams_with_an_error_event():
    """Requests that finish within the grace period finish; longer ones get an error event and
    [DONE]; new requests and /health get 503 meanwhile; the process exits 0 promptly."""
    srv = start_server("--graceful-shutdown-timeout", "4", "--num-slots", "40000")

    async def go():
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
            long_body = {"input_ids": [9] * 8, "stream": True,
                         "sampling_params": {"max_new_tokens": 7000, "ignore_eos": True}}
            short_body = {"prompt": [3] * 8, "max_tokens": 24, "ignore_eos": True}
            longs = [asyncio.ensure_future(_sse_tail(s, srv.url + "/generate", long_body)) for _ in range(2)]
            await asyncio.sleep(1.0)
            short = asyncio.ensure_future(s.post(srv.v1 + "/completions", json=short_body))
            await asyncio.sleep(0.05)
            srv.proc.send_signal(signal.SIGTERM)
            t0 = time.time()
            await asyncio.sleep(0.3)
            async with s.get(srv.url + "/health") as r:
                health = r.status
            async with s.post(srv.url + "/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}
                              ) as r:
                refused = (r.status, await r.json())
            async with await short as r:
                finished = (r.status, await r.json())
            tails = await asyncio.gather(*longs)
            return health, refused, finished, tails, t0

    health, refused, finished, tails, t0 = asyncio.run(go())
    code = _exits(srv, 30)
    assert code == 0 and time.time() - t0 < 15
    assert health == 503
    assert refused[0] == 503 and "shutting down" in refused[1]["error"]["message"]
    assert finished[0] == 200 and finished[1]["usage"]["completion_tokens"] == 24
    for events in tails:
        assert events[-1] == "[DONE]" and "shutting down" in json.loads(events[-2])["error"]["message"]


def test_a_killed_engine_process_makes_the_server_exit_nonzero():
    """It used to stay up answering 503 forever, its engine a zombie; a supervisor must see it
    exit to restart it. Requests in flight get a 503 first."""
    srv = start_server("--num-slots", "40000")
    pid = _info(srv)["engine_pid"]
    result = {}

    def waiting():
        result["answer"] = _request(srv.url + "/generate", {"input_ids": [4] * 8,
                                                            "sampling_params": {"max_new_tokens": 6000,
                                                                                "ignore_eos": True}})

    t = threading.Thread(target=waiting)
    t.start()
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    code = _exits(srv, 30)
    t.join(30)
    assert code == 1
    assert result["answer"][0] == 503
    time.sleep(0.2)  # the log reader thread catches up
    assert any("the engine failed" in line for line in srv.log)


# -- 5. the port --------------------------------------------------------------------------------

def test_a_port_in_use_is_an_error_at_once():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t0 = time.time()
        out = subprocess.run([sys.executable, "-m", "granikv.server", "--model", "tiny", "--device", "cpu",
                              "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and time.time() - t0 < 30
    assert "Address already in use" in out.stderr and "Traceback" not in out.stderr + out.stdout


# -- 6. hostile bodies and a responsive loop -----------------------------------------------------

@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_bodies_that_used_to_give_500_give_json_400(small_kv, path):
    deep = b"[" * 100_000 + b"]" * 100_000
    status, body = _request(small_kv.url + path, raw=deep)
    assert status == 400 and "nested too deeply" in json.dumps(body)
    text = {"/generate": b'{"text": "a\\ud800b"}', "/v1/completions": b'{"prompt": "a\\ud800b"}',
            "/v1/chat/completions": b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}'}[path]
    status, body = _request(small_kv.url + path, raw=text)
    assert status == 400 and "not valid Unicode" in json.dumps(body)
    assert _request(small_kv.url + "/health", method="GET")[0] == 200


def test_nested_objects_in_any_field_are_4xx(small_kv):
    nested = [{"a": {"b": 1}}, [{"a": 1}], [[1]]]
    fields = {"/generate": ["input_ids", "text", "sampling_params", "rid", "stream", "shared_prefix_len",
                            "return_logprob", "lora_path"],
              "/v1/completions": ["prompt", "max_tokens", "model", "stop", "n", "stream", "stream_options",
                                  "logprobs", "seed", "temperature", "top_p", "top_k", "logit_bias", "echo",
                                  "best_of", "suffix", "stop_token_ids", "user", "ignore_eos"],
              "/v1/chat/completions": ["messages", "max_completion_tokens", "tools", "tool_choice", "top_logprobs",
                                       "logprobs", "response_format", "stream_options", "n", "model"]}
    base = {"/generate": {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}},
            "/v1/completions": {"prompt": [1, 2], "max_tokens": 2},
            "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}
    for path, names in fields.items():
        for name in names:
            for v in nested:
                status, body = _request(small_kv.url + path, {**base[path], name: v})
                assert status < 500, (path, name, v, body)
        for key in ("max_new_tokens", "temperature", "top_k", "stop_token_ids", "seed", "ignore_eos"):
            for v in nested:
                status, _ = _request(small_kv.url + "/generate", {"input_ids": [1], "sampling_params": {key: v}})
                assert status < 500
    assert _wait_idle(small_kv)["running"] == 0


def test_oversized_bodies_are_refused_without_stalling_the_loop(small_kv):
    """A 50 MB body is refused from its Content-Length (413, JSON) before it is read; a body
    within the size limit but made of a million tiny objects is refused before it is parsed.
    /health answers throughout."""
    lat: list[float] = []
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            t = time.perf_counter()
            _request(small_kv.url + "/health", method="GET")
            lat.append(time.perf_counter() - t)
            time.sleep(0.02)

    th = threading.Thread(target=probe)
    th.start()
    try:
        status, body = _request(small_kv.url + "/generate", raw=b'{"text": "' + b"x" * 50_000_000 + b'"}')
        assert status == 413 and body["error"]["message"].startswith("request body of")
        many = b'{"input_ids": [1], "x": [' + b"{}," * 1_000_000 + b'{}]}'
        status, body = _request(small_kv.url + "/generate", raw=many)
        assert status == 400 and "JSON objects and arrays" in body["error"]["message"]
        status, body = _request(small_kv.url + "/v1/completions",
                                {"prompt": "x" * (64 * 8192 + 1), "max_tokens": 1})
        assert status == 400 and "characters exceeds the context length" in body["error"]["message"]
    finally:
        stop.set()
        th.join()
    assert lat and max(lat) < 2.0, max(lat)


def test_stop_strings_are_bounded(small_kv):
    status, body = _request(small_kv.url + "/v1/completions", {"prompt": [1, 2], "max_tokens": 4,
                                                               "stop": ["x" * 100_000] * 16})
    assert status == 400 and body["error"]["param"] == "stop" and "1024" in body["error"]["message"]
    status, body = _request(small_kv.url + "/v1/completions", {"prompt": [1, 2], "max_tokens": 64, "stream": False,
                                                               "stop": ["<1>" + "y" * 1020] * 16, "ignore_eos": True})
    assert status == 200 and body["usage"]["completion_tokens"] == 64


def test_a_long_prefill_does_not_stall_metrics_or_health_generate():
    """On the CPU an 8K-token prompt takes seconds of prefill; /metrics answers from the engine's
    last counters when the engine is mid-step, and /health_generate counts any engine progress."""
    srv = start_server("--num-slots", "20000")
    try:
        async def go():
            async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
                async with s.get(srv.url + "/metrics") as r:  # the engine's counters, once
                    assert r.status == 200
                long = asyncio.ensure_future(s.post(srv.url + "/generate", json={
                    "input_ids": [6] * 8000, "sampling_params": {"max_new_tokens": 2}}))
                await asyncio.sleep(0.5)
                times = {}
                for path in ("/metrics", "/health_generate", "/health"):
                    t = time.perf_counter()
                    async with s.get(srv.url + path) as r:
                        times[path] = (r.status, time.perf_counter() - t)
                t = time.perf_counter()
                async with await long as r:
                    assert r.status == 200
                return times, time.perf_counter() - t

        times, rest = asyncio.run(go())
        assert all(status == 200 for status, _ in times.values()), times
        assert times["/metrics"][1] < 3.0 and times["/health"][1] < 3.0, times
        assert times["/health_generate"][1] < 10.0, times
    finally:
        stop_server(srv)


# -- 7. what runs --------------------------------------------------------------------------------

def test_the_ready_line_says_what_runs_on_a_cpu(small_kv):
    line = small_kv.ready_line
    for part in ("on cpu", "torch reference kernels", "CUDA graphs off", "context 8192 tokens",
                 "up to 32 requests at once", "prefill chunks of 512 tokens", "KV cache 2048 slots"):
        assert part in line, (part, line)
    assert "triton" not in line.lower() and "32768" not in line


def test_device_cuda_without_cuda_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    out = subprocess.run([sys.executable, "-m", "granikv.server", "--model", "tiny", "--device", "cuda",
                          "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--device cuda" in out.stderr and "no CUDA device" in out.stderr and "Traceback" not in out.stderr


# -- 8. usage ------------------------------------------------------------------------------------

def test_usage_reports_cached_prompt_tokens(small_kv):
    prompt = list(range(100, 400))
    for _ in range(2):
        status, body = _request(small_kv.url + "/v1/completions", {"prompt": prompt, "max_tokens": 2})
        assert status == 200
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 256  # the second found the first's KV
