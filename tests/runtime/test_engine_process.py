"""The engine in its own process (granikv.runtime.process.EngineProcess) without HTTP: a bad
config reported at start, a burst of long prompts received while the engine steps, and the
process's loop clock. (Through the HTTP app: tests/server/test_server_process.py.)"""

from __future__ import annotations

import asyncio
import functools
import json

import pytest
from engine_testutil import tiny_config

from granikv.engine.request import SamplingParams
from granikv.runtime.process import EngineProcess, LoopClock


def run(coro):
    return asyncio.run(coro)


def test_engine_process_reports_a_bad_config_at_start():
    handle = EngineProcess(tiny_config("granikv", kernel_impl="torch", model="no-such-model"))
    with pytest.raises(ValueError):
        handle.start()
    handle.stop()


def test_a_burst_of_long_prompts_reaches_the_engine_process_while_it_steps():
    """A 16K-token prompt is a ~66 KB message, over a pipe's 64 KB buffer: when the engine process
    read commands only between steps, one prompt got through per step and the server's event loop
    blocked on each write (a burst at Lp=16K became one single-request prefill step per prompt).
    The engine process reads commands on a thread of its own, so a burst arrives while
    a (simulated, 200 ms) prefill step runs."""
    from harness.microbench.server import _sim_factory  # an engine that simulates step times

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
