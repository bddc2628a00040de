"""The server as a user starts it: its CLI, the server process (no torch in it, stops on
SIGTERM), and the app over the engine in its own process (streams, counters, flush, errors,
fuzzed bodies). The engine process without HTTP: tests/runtime/test_engine_process.py."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web
from engine_testutil import tiny_config
from hypothesis import HealthCheck, given, settings

from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams
from granikv.server.app import build_app
from granikv.server.text import TextCodec

from .server_testutil import answer_is_below_500_and_the_server_keeps_serving, any_body, free_port, run, serving, stream


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

    code = ("import sys, granikv.server.__main__, granikv.server.app, granikv.runtime.process, "
            "granikv.runtime.loop, granikv.server.text; "
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_server_process_serves_and_stops_on_sigterm():
    import signal
    import subprocess
    import sys
    import urllib.request

    port = free_port()
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
    """The server's default: the engine in its own process (granikv.runtime.process)."""
    from granikv.runtime.process import EngineProcess

    handle = EngineProcess(tiny_config("granikv", kernel_impl="torch", max_running=16, max_context=256))
    handle.start()
    assert handle.info["vocab_size"] == 1024 and handle.info["device_type"] == "cpu"
    port = free_port()
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
                streams = await asyncio.gather(*(stream(s, url, p) for p in payloads))
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


@pytest.fixture(scope="module")
def process_server():
    """The server's default mode: the engine in its own process."""
    from granikv.runtime.process import EngineProcess

    handle = EngineProcess(tiny_config("granikv", kernel_impl="torch", max_running=48, max_context=256))
    handle.start()
    try:
        with serving(handle, TextCodec()) as url:
            yield url
    finally:
        handle.stop()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=any_body)
def test_any_request_body_through_the_engine_process(process_server, body):
    """The same through the engine process (its own add-error path and the int32 prompt pipe)."""
    answer_is_below_500_and_the_server_keeps_serving(process_server, *body)


