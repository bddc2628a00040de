"""granikv.runtime.aio: the server's and the client's event loop (uvloop when installed)."""

from __future__ import annotations

import asyncio

import pytest

from granikv.runtime import aio


async def _loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


def test_stdlib_loop_when_switched_off(monkeypatch):
    monkeypatch.setenv("GRANIKV_UVLOOP", "0")
    assert not aio.uvloop_enabled()
    assert aio.event_loop_name() == "asyncio"
    assert aio.run(_loop_module()).startswith("asyncio")


def test_uvloop_when_installed(monkeypatch):
    pytest.importorskip("uvloop")
    monkeypatch.delenv("GRANIKV_UVLOOP", raising=False)
    assert aio.uvloop_enabled()
    assert aio.event_loop_name() == "uvloop"
    assert aio.run(_loop_module()).startswith("uvloop")


def test_run_returns_the_result_and_raises_the_error(monkeypatch):
    async def boom():
        raise KeyError("x")

    for flag in ("0", "1"):
        monkeypatch.setenv("GRANIKV_UVLOOP", flag)
        assert aio.run(asyncio.sleep(0, result=42)) == 42
        with pytest.raises(KeyError):
            aio.run(boom())
