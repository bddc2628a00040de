"""A failed engine is the server's failure: 503 in each API's error shape, /health 503, and the
engine's traceback in the server log (it used to answer 400 "engine failure" and log nothing)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from aiohttp import web

from granikv.config import EngineConfig
from granikv.engine.engine import Engine
from granikv.runtime.loop import EngineLoop
from granikv.server.app import build_app, tcp_site
from granikv.server.text import TextCodec

from .conftest import free_port


def _broken_step():
    raise RuntimeError("kernel exploded")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the engine thread's death
def test_engine_failure_is_a_503_logged_with_its_traceback(caplog):
    engine = Engine(EngineConfig(model="tiny", device="cpu", kernel_impl="torch", num_slots=1024, max_running=4,
                                 max_context=128, cuda_graphs=False))
    engine.step = _broken_step
    loop = EngineLoop(engine)
    loop.start()

    async def go():
        runner = web.AppRunner(build_app(loop, TextCodec()))
        await runner.setup()
        port = free_port()
        await tcp_site(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/health") as r:
                    ok = r.status
                async with s.post(url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2}) as r:
                    oai = (r.status, await r.json())
                async with s.post(url + "/generate", json={"input_ids": [1, 2],
                                                                "sampling_params": {"max_new_tokens": 2}}) as r:
                    native = (r.status, await r.json())
                async with s.get(url + "/health") as r:
                    dead = r.status
                async with s.get(url + "/health_generate") as r:
                    dead_gen = r.status
            return ok, oai, native, dead, dead_gen
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.ERROR, logger="granikv.server"):
        ok, (s1, oai), (s2, native), dead, dead_gen = asyncio.run(go())
    loop.stop()
    assert ok == 200
    assert s1 == 503 and set(oai["error"]) == {"message", "type", "param", "code"}
    assert oai["error"]["code"] == "engine_failure"
    assert s2 == 503 and "message" in native["error"]
    assert dead == 503 and dead_gen == 503
    logged = [r.getMessage() for r in caplog.records if r.name == "granikv.server"]
    assert len(logged) == 1 and "Traceback" in logged[0] and "kernel exploded" in logged[0]
