"""The client's OpenAI mode (`api="completions"`, POST /v1/completions): the payload, the SSE chunks
read into the same records and metrics as the SGLang-native mode, failures, and the bundled
server's real endpoint (a tiny engine on CPU) read the same way in both modes."""

from __future__ import annotations

import asyncio

import pytest
from fake_server import DISCONNECT, HTTP_500, NO_DONE, FakeServer, FakeTimings

from harness.run.client import cli as client_cli
from harness.run.client.benchmark import BenchmarkResult, ClientConfig, run_benchmark
from harness.run.client.metrics import RequestRecord
from harness.run.client.stream import CompletionEvents
from harness.run.workloads.requests import WorkloadRequest

SLACK = 0.005


@pytest.fixture
def server():
    srv = FakeServer()
    srv.start()
    yield srv
    srv.stop()


def _reqs(n: int, out: int = 5, lp: int = 0, first: int = 1) -> list[WorkloadRequest]:
    return [WorkloadRequest(id=f"r{i}", input_ids=[first + i] * (lp + 10), prefix_id="p0" if lp else None,
                    shared_prefix_len=lp, output_len=out, arrival={"process": "burst", "t_unit": 0.0})
            for i in range(n)]


def _run(url: str, reqs: list[WorkloadRequest], **kw) -> BenchmarkResult:
    kw.setdefault("warmup_requests", 0)
    kw.setdefault("progress", False)
    kw.setdefault("api", "completions")
    return asyncio.run(run_benchmark(url, reqs, ClientConfig(**kw)))


def test_api_is_checked_and_recorded():
    with pytest.raises(ValueError, match="api"):
        ClientConfig(api="chat")
    assert ClientConfig().to_dict()["api"] == "generate"
    assert ClientConfig(api="completions", model="m").to_dict()["model"] == "m"


def test_payload_is_openai_completions_with_token_ids(server):
    server.timings = FakeTimings(first_token_delay=0.0, inter_token_delay=0.0)
    reqs = _reqs(1, out=3, lp=4) + _reqs(1, out=3, first=50)
    _run(server.base_url, reqs, model="llama-3.1-8b")
    assert server.events == ["completions", "completions"]
    assert server.payloads[0] == {
        "model": "llama-3.1-8b", "prompt": reqs[0].input_ids, "max_tokens": 3, "temperature": 0.0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    server.payloads.clear()
    _run(server.base_url, reqs, send_prefix_hint=True, max_new_tokens=2)
    hinted = {p["prompt"][0]: p for p in server.payloads}
    assert hinted[1]["shared_prefix_len"] == 4 and hinted[1]["max_tokens"] == 2
    assert hinted[1]["model"] == "default"
    assert "shared_prefix_len" not in hinted[50]


def test_chunks_and_usage_give_the_same_records_as_generate(server):
    """One token per chunk: the OpenAI stream gives the records /generate gives, by definition."""
    server.timings = FakeTimings(first_token_delay=0.05, inter_token_delay=0.02)
    res = _run(server.base_url, _reqs(6, out=5), max_concurrency=3)
    assert res.metrics["completed"] == 6 and res.metrics["total_output_tokens"] == 30
    assert res.metrics["total_cached_tokens"] == 6 * server.timings.cached_tokens
    for r in res.records:
        assert r.success and r.output_tokens == 5 and r.prompt_tokens == 10 and r.chunk_tokens == [1] * 5
        # a late read only delays a chunk's arrival, and shortens the gap after it by as much: no
        # single gap has a lower bound on a loaded host, but the last chunk cannot arrive before
        # the server's first delay and its four inter-token sleeps have passed
        assert r.ttft >= 0.05 - SLACK and r.ttft + sum(r.itl) >= 0.05 + 4 * 0.02 - SLACK
    gen = _run(server.base_url, _reqs(6, out=5), max_concurrency=3, api="generate")
    for a, b in zip(res.records, gen.records):
        assert (a.output_tokens, a.prompt_tokens, a.cached_tokens, a.chunk_tokens) == (
            b.output_tokens, b.prompt_tokens, b.cached_tokens, b.chunk_tokens)


def test_the_usage_chunk_counts_tokens_that_chunks_do_not_show(server):
    """Several tokens in one chunk: the chunks give the arrival times, usage the token count."""
    server.timings = FakeTimings(first_token_delay=0.02, inter_token_delay=0.03, tokens_per_chunk=3)
    res = _run(server.base_url, _reqs(2, out=7))
    for r in res.records:
        assert r.output_tokens == 7 and len(r.chunk_times) == 3
    assert res.metrics["total_output_tokens"] == 14


def test_without_usage_tokens_are_counted_by_chunks(server):
    server.timings = FakeTimings(first_token_delay=0.01, inter_token_delay=0.005, send_meta=False)
    res = _run(server.base_url, _reqs(2, out=4))
    assert res.metrics["completed"] == 2 and res.metrics["total_output_tokens"] == 8
    assert all(r.prompt_tokens is None and r.cached_tokens is None for r in res.records)


def test_failures_are_recorded(server):
    server.timings = FakeTimings(first_token_delay=0.01, inter_token_delay=0.005)
    bad = _reqs(3, out=4, first=0)
    for r, mode in zip(bad, (HTTP_500, DISCONNECT, NO_DONE)):
        r.input_ids[0] = mode
        r.id = f"bad{mode}"
    res = _run(server.base_url, _reqs(2, out=4) + bad, request_timeout_s=5.0)
    assert res.metrics["completed"] == 2 and res.metrics["failed"] == 3
    errors = {r.id: r.error for r in res.records if not r.success}
    assert errors[f"bad{HTTP_500}"].startswith("HTTP 500")
    assert errors[f"bad{NO_DONE}"] == "stream ended before [DONE]"


def test_an_error_event_ends_the_stream_as_a_failure():
    rec = RequestRecord(id="x", prompt_len=3, max_new_tokens=4)
    ev = CompletionEvents(rec)
    assert not ev.line(b'data: {"choices": [{"index": 0, "text": "a"}], "usage": null}', 0.1)
    assert ev.line(b'data: {"error": {"message": "engine died"}}', 0.2)
    ev.finish()
    assert not rec.success and "engine died" in rec.error


def test_cli_takes_the_api(server, tmp_path):
    from harness.run.workloads.build import write
    from harness.run.workloads.config import WorkloadConfig
    from harness.run.workloads.naming import workload_filename

    server.timings = FakeTimings(first_token_delay=0.0, inter_token_delay=0.0)
    cfg = WorkloadConfig.for_kind("burst", lp=8, num_requests=2, suffix_len=4, output_len=3, vocab_size=1024)
    path = write(cfg, tmp_path / workload_filename(cfg))
    assert client_cli.main(["--url", server.base_url, "--workload", str(path), "--no-progress", "--api", "completions",
                    "--model", "m", "--warmup-requests", "0"]) == 0
    assert server.events == ["completions", "completions"] and server.payloads[0]["model"] == "m"


# ----------------------------------------------------------------------------- the bundled server


def test_the_bundled_servers_two_apis_read_alike():
    """granikv.server (tiny engine, CPU): /generate and /v1/completions streams give every request
    its max_tokens tokens and one arrival per token."""
    from aiohttp import web
    from engine_testutil import tiny_config

    from granikv.engine.engine import Engine
    from granikv.runtime.loop import EngineLoop
    from granikv.server.app import build_app, tcp_site
    from granikv.server.text import TextCodec

    async def measure(loop: EngineLoop) -> dict[str, BenchmarkResult]:
        runner = web.AppRunner(build_app(loop, TextCodec()))
        await runner.setup()
        await tcp_site(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        reqs = _reqs(4, out=6, lp=20, first=3)
        try:
            return {api: await run_benchmark(url, reqs, ClientConfig(api=api, max_concurrency=4, warmup_requests=0,
                                                                     send_prefix_hint=True, progress=False))
                    for api in ("generate", "completions")}
        finally:
            await runner.cleanup()

    loop = EngineLoop(Engine(tiny_config("granikv", kernel_impl="torch", max_running=8, max_context=256)))
    loop.start()
    try:
        out = asyncio.run(measure(loop))
    finally:
        loop.stop()
    for api, res in out.items():
        assert res.metrics["completed"] == 4, (api, res.errors())
        assert res.metrics["total_output_tokens"] == 24
        # a chunk per engine step, or fewer: events that queued while the handler was busy go out as one
        assert all(0 < len(r.chunk_times) <= 6 for r in res.records), api
