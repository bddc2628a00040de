"""The streaming client and its metrics, against an in-process fake SGLang server.

Timing checks are one-sided where the clock can only make things later (a sleep never ends
early), with generous upper bounds; every metric is also checked to equal its definition
computed independently from the recorded timestamps.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from fake_server import DISCONNECT, HANG, HTTP_500, NO_DONE, FakeServer, FakeTimings

from harness.run.client import cli as client_cli
from harness.run.client.benchmark import BenchmarkResult, ClientConfig, run_benchmark
from harness.run.client.metrics import RequestRecord, compute_metrics
from harness.run.workloads.build import write
from harness.run.workloads.config import WorkloadConfig
from harness.run.workloads.naming import workload_filename
from harness.run.workloads.requests import WorkloadRequest

SLACK = 0.005  # timer granularity: a sleep of d may be observed as d - SLACK at worst


@pytest.fixture
def server():
    srv = FakeServer()
    srv.start()
    yield srv
    srv.stop()


def _reqs(n: int, out: int = 5, lp: int = 0, first: int = 1, t_units=None) -> list[WorkloadRequest]:
    return [
        WorkloadRequest(
            id=f"r{i}",
            input_ids=[first + i] * (lp + 10),
            prefix_id="p0" if lp else None,
            shared_prefix_len=lp,
            output_len=out,
            arrival={"process": "poisson" if t_units else "burst", "t_unit": t_units[i] if t_units else 0.0},
        )
        for i in range(n)
    ]


def _run(url: str, reqs: list[WorkloadRequest], **kw) -> BenchmarkResult:
    kw.setdefault("warmup_requests", 0)
    kw.setdefault("progress", False)
    return asyncio.run(run_benchmark(url, reqs, ClientConfig(**kw)))


def _definition(records: list[RequestRecord]) -> dict[str, float]:
    """bench_serving's metrics, recomputed here from the raw timestamps (independent code)."""
    ok = [r for r in records if r.success]
    dur = max(r.end for r in records) - min(r.start for r in records)
    ttft = [r.chunk_times[0] for r in ok]
    lat = [r.end - r.start for r in ok]
    tpot = [(r.end - r.start - r.chunk_times[0]) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = []
    for r in ok:
        for j in range(1, len(r.chunk_times)):
            gap = r.chunk_times[j] - r.chunk_times[j - 1]
            itl += [gap / r.chunk_tokens[j]] * r.chunk_tokens[j]
    out = sum(r.output_tokens for r in ok)
    inp = sum(r.prompt_len for r in ok)
    d = {
        "duration_s": dur,
        "output_throughput": out / dur,
        "request_throughput": len(ok) / dur,
        "total_throughput": (inp + out) / dur,
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e_latency", lat)):
        d[f"mean_{name}_ms"] = 1000 * float(np.mean(xs))
        d[f"median_{name}_ms"] = 1000 * float(np.median(xs))
        d[f"p90_{name}_ms"] = 1000 * float(np.percentile(xs, 90))
        d[f"p99_{name}_ms"] = 1000 * float(np.percentile(xs, 99))
    return d


def _assert_matches_definition(result: BenchmarkResult) -> None:
    expect = _definition(result.records)
    for key, value in expect.items():
        assert result.metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


# ----------------------------------------------------------------------------- pure metrics


def test_metrics_on_hand_made_records():
    """A fake clock: records with chosen timestamps give known metric values."""
    a = RequestRecord(id="a", prompt_len=10, max_new_tokens=3, success=True, start=10.0, end=11.0,
                      chunk_times=[0.5, 0.7, 0.9], chunk_tokens=[1, 1, 1], output_tokens=3, cached_tokens=4)
    b = RequestRecord(id="b", prompt_len=20, max_new_tokens=3, success=True, start=10.5, end=11.5,
                      chunk_times=[0.25, 0.75], chunk_tokens=[1, 2], output_tokens=3)
    c = RequestRecord(id="c", prompt_len=30, max_new_tokens=3, success=False, start=9.0, end=9.5,
                      error="HTTP 500")
    m = compute_metrics([a, b, c])
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["duration_s"] == pytest.approx(2.5)          # first send (c) to last completion (b)
    assert m["total_input_tokens"] == 30 and m["total_output_tokens"] == 6
    assert m["total_cached_tokens"] == 4
    assert m["output_throughput"] == pytest.approx(6 / 2.5)
    assert m["request_throughput"] == pytest.approx(2 / 2.5)
    assert m["total_throughput"] == pytest.approx(36 / 2.5)
    assert m["mean_ttft_ms"] == pytest.approx(375.0)
    assert m["median_e2e_latency_ms"] == pytest.approx(1000.0)
    assert m["mean_tpot_ms"] == pytest.approx(1000 * (0.25 + 0.375) / 2)  # (lat - ttft) / (out - 1)
    assert a.itl == pytest.approx([0.2, 0.2]) and b.itl == pytest.approx([0.25, 0.25])
    assert m["mean_itl_ms"] == pytest.approx(1000 * (0.2 + 0.2 + 0.25 + 0.25) / 4)
    assert m["p99_itl_ms"] == pytest.approx(1000 * float(np.percentile([0.2, 0.2, 0.25, 0.25], 99)))
    empty = compute_metrics([c])
    assert empty["completed"] == 0 and empty["output_throughput"] == 0.0 and empty["mean_ttft_ms"] == 0.0


REQUIRED = {
    "output_throughput", "request_throughput", "total_throughput", "mean_ttft_ms", "median_ttft_ms",
    "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
    "median_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms", "completed", "failed",
    "duration_s", "total_input_tokens", "total_output_tokens",
}


def test_metric_names_are_the_result_contract():
    r = RequestRecord(id="a", prompt_len=1, max_new_tokens=2, success=True, start=0.0, end=0.3,
                      chunk_times=[0.1, 0.2], chunk_tokens=[1, 1], output_tokens=2)
    assert REQUIRED <= set(compute_metrics([r]))
    assert REQUIRED <= set(compute_metrics([]))


def test_single_token_outputs_have_no_tpot():
    r = RequestRecord(id="a", prompt_len=1, max_new_tokens=1, success=True, start=0.0, end=0.3,
                      chunk_times=[0.2], chunk_tokens=[1], output_tokens=1)
    assert r.tpot is None and r.itl == []
    assert compute_metrics([r])["mean_tpot_ms"] == 0.0


# ----------------------------------------------------------------------------- streaming


def test_metrics_follow_the_definition_and_the_injected_delays(server):
    server.timings = FakeTimings(first_token_delay=0.08, inter_token_delay=0.02)
    res = _run(server.base_url, _reqs(12, out=6), max_concurrency=4)
    m = res.metrics
    assert m["completed"] == 12 and m["failed"] == 0
    assert m["total_output_tokens"] == 72 and m["total_input_tokens"] == 120
    assert m["total_cached_tokens"] == 12 * server.timings.cached_tokens
    _assert_matches_definition(res)
    for r in res.records:
        assert r.success and r.output_tokens == 6 and r.prompt_tokens == 10 and r.chunk_tokens == [1] * 6
        assert r.ttft >= 0.08 - SLACK
        # one late read shortens the next gap by as much, so no gap has a lower bound on a busy
        # host, nor their sum (the first read may be the late one); the last chunk, though, cannot
        # arrive before the server's first delay and its five inter-token sleeps have passed
        assert r.ttft + sum(r.itl) >= 0.08 + 5 * 0.02 - SLACK
        assert r.latency >= 0.08 + 5 * 0.02 - SLACK
    # Near the injected delays (generous: the host may be busy).
    assert m["median_ttft_ms"] < 80 + 500
    assert m["median_itl_ms"] < 20 + 100


def test_multi_token_chunks_spread_the_itl(server):
    server.timings = FakeTimings(first_token_delay=0.02, inter_token_delay=0.03, tokens_per_chunk=3)
    res = _run(server.base_url, _reqs(3, out=7))
    _assert_matches_definition(res)
    for r in res.records:
        assert r.chunk_tokens == [3, 3, 1] and r.output_tokens == 7
        itl = r.itl
        assert len(itl) == 4 and itl[0] == itl[1] == itl[2]  # one gap shared by 3 tokens
        assert r.ttft + sum(itl) >= 0.02 + 2 * 0.03 - SLACK  # the last chunk: after both sleeps
    assert res.metrics["total_output_tokens"] == 21


def test_without_meta_info_tokens_are_counted_by_chunks(server):
    server.timings = FakeTimings(first_token_delay=0.01, inter_token_delay=0.005, send_meta=False)
    res = _run(server.base_url, _reqs(2, out=4))
    assert res.metrics["completed"] == 2 and res.metrics["total_output_tokens"] == 8
    assert all(r.cached_tokens is None and r.prompt_tokens is None for r in res.records)
    _assert_matches_definition(res)


def test_failures_are_counted_and_never_fatal(server):
    server.timings = FakeTimings(first_token_delay=0.02, inter_token_delay=0.01)
    good = _reqs(6, out=4)
    bad = _reqs(4, out=4, first=0)
    for r, mode in zip(bad, (HTTP_500, DISCONNECT, NO_DONE, HANG)):
        r.input_ids[0] = mode
        r.id = f"bad{mode}"
    res = _run(server.base_url, good + bad, request_timeout_s=1.0, max_concurrency=16)
    m = res.metrics
    assert m["completed"] == 6 and m["failed"] == 4
    assert m["total_output_tokens"] == 24 and m["total_input_tokens"] == 60
    errors = {r.id: r.error for r in res.records if not r.success}
    assert errors[f"bad{HTTP_500}"].startswith("HTTP 500")
    assert errors[f"bad{NO_DONE}"] == "stream ended before [DONE]"
    assert errors[f"bad{HANG}"].startswith("TimeoutError")
    assert errors[f"bad{DISCONNECT}"]  # a transport error (payload incomplete / disconnected)
    assert sum(res.errors().values()) == 4
    _assert_matches_definition(res)


def test_all_failed_gives_zeros_not_an_exception(server):
    reqs = _reqs(3)
    for r in reqs:
        r.input_ids[0] = HTTP_500
    res = _run(server.base_url, reqs)
    assert res.metrics["completed"] == 0 and res.metrics["failed"] == 3
    assert res.metrics["output_throughput"] == 0.0 and res.metrics["mean_ttft_ms"] == 0.0


def test_unreachable_server_is_a_failure_per_request():
    res = _run("http://127.0.0.1:9", _reqs(2), request_timeout_s=5.0)
    assert res.metrics["failed"] == 2 and all(r.error for r in res.records)


def test_concurrency_cap_is_respected(server):
    server.timings = FakeTimings(first_token_delay=0.05, inter_token_delay=0.01)
    res = _run(server.base_url, _reqs(24, out=3), max_concurrency=5)
    assert res.metrics["completed"] == 24
    assert server.max_in_flight == 5 and res.max_in_flight == 5


def test_no_hidden_connection_cap(server):
    # aiohttp's default connector allows 100 connections; the client must not inherit that cap.
    server.timings = FakeTimings(first_token_delay=1.0, inter_token_delay=0.01)
    res = _run(server.base_url, _reqs(130, out=2), max_concurrency=None)
    assert res.metrics["completed"] == 130
    assert server.max_in_flight > 100


def test_payload_is_bench_serving_s(server):
    server.timings = FakeTimings(first_token_delay=0.0, inter_token_delay=0.0)
    reqs = _reqs(1, out=3, lp=4) + _reqs(1, out=3, lp=0, first=50)
    _run(server.base_url, reqs)
    assert server.payloads[0] == {
        "input_ids": reqs[0].input_ids,
        "sampling_params": {"max_new_tokens": 3, "ignore_eos": True, "temperature": 0.0},
        "stream": True,
    }
    server.payloads.clear()
    _run(server.base_url, reqs, send_prefix_hint=True, max_new_tokens=2)
    hinted = {p["input_ids"][0]: p for p in server.payloads}
    assert hinted[1]["shared_prefix_len"] == 4 and hinted[1]["sampling_params"]["max_new_tokens"] == 2
    assert "shared_prefix_len" not in hinted[50]  # no prefix, no hint


def test_warmup_then_flush_then_run(server):
    server.timings = FakeTimings(first_token_delay=0.01, inter_token_delay=0.005)
    reqs = _reqs(3, out=40)
    res = _run(server.base_url, reqs, warmup_requests=2, warmup_output_len=8, flush_cache=True)
    assert server.events == ["generate", "generate", "flush", "generate", "generate", "generate"]
    assert [p["sampling_params"]["max_new_tokens"] for p in server.payloads[:2]] == [8, 8]
    assert all(p["input_ids"] == reqs[0].input_ids for p in server.payloads[:2])
    assert len(res.warmup) == 2 and all(r.success for r in res.warmup)
    assert len(res.records) == 3 and res.metrics["completed"] == 3  # warm-up excluded
    assert res.metrics["total_output_tokens"] == 120 and res.flush_status == 200


def test_poisson_send_times_follow_the_workload(server):
    server.timings = FakeTimings(first_token_delay=0.01, inter_token_delay=0.005)
    t_units = [0.0, 1.0, 2.5, 4.0]
    reqs = _reqs(4, out=2, t_units=t_units)
    res = _run(server.base_url, reqs, rate=10.0, max_concurrency=None)
    s0 = res.records[0].start
    for r, t in zip(res.records, t_units):
        assert r.start - s0 >= t / 10.0 - SLACK


def test_cli_end_to_end(server, tmp_path, capsys):
    server.timings = FakeTimings(first_token_delay=0.01, inter_token_delay=0.005)
    cfg = WorkloadConfig.for_kind("burst", lp=8, num_requests=4, suffix_len=4, output_len=3,
                                     vocab_size=1024)
    path = write(cfg, tmp_path / workload_filename(cfg))
    out = tmp_path / "res.json"
    rc = client_cli.main(["--url", server.base_url, "--workload", str(path), "--rate", "inf",
                  "--max-concurrency", "2", "--no-progress", "--output", str(out), "--flush-cache"])
    assert rc == 0
    assert "Serving Benchmark Result" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["metrics"]["completed"] == 4 and data["metrics"]["total_output_tokens"] == 12
    assert data["client"]["rate"] == "inf" and data["client"]["max_concurrency"] == 2
    assert len(data["records"]) == 4 and data["workload"]["header"]["config"]["kind"] == "burst"
    assert server.max_in_flight <= 2
