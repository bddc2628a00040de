"""The client's closed-loop session mode (kind debate) against the in-process fake server.

The fake server answers every prompt with ids derived from a hash of the prompt and keeps what it
answered, so each round's expected prompt is rebuilt here, independently of the client, from the
workload's static parts and the outputs the server actually sent.
"""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from fake_server import HTTP_500, FakeServer, FakeTimings

from harness.run.client.benchmark import ClientConfig, run_benchmark
from harness.run.client.sessions import session_rounds
from harness.run.workloads.build import generate, write
from harness.run.workloads.config import WorkloadConfig
from harness.run.workloads.requests import WorkloadRequest, max_prompt_len

D, K, R, OUT = 2, 3, 3, 4


def _answer(prompt: list[int], n: int) -> list[int]:
    """The fake server's output ids: a function of the whole prompt, distinct across prompts."""
    h = hashlib.blake2b(repr(prompt).encode(), digest_size=8).digest()
    return [2000 + (h[j % 8] * 7 + j) % 1000 for j in range(n)]


def _workload(**kw) -> list[WorkloadRequest]:
    cfg = WorkloadConfig.for_kind("debate", **{
        "lp": 10, "la": 4, "k": K, "rounds": R, "num_requests": D * K * R, "suffix": "synthetic",
        "suffix_len": 5, "output_len": OUT, "vocab_size": 1024, **kw})
    return generate(cfg)


def _server(**kw) -> FakeServer:
    kw.setdefault("timings", FakeTimings(first_token_delay=0.02, inter_token_delay=0.002))
    srv = FakeServer(output_fn=_answer, **kw)
    srv.start()
    return srv


def _run(url: str, reqs, **kw):
    kw = {"warmup_requests": 0, "progress": False, **kw}
    return asyncio.run(run_benchmark(url, reqs, ClientConfig(**kw)))


def _debate_of(reqs: list[WorkloadRequest], prompt: list[int]) -> str:
    """Which debate a prompt belongs to: its topic (between system prompt and transcript)."""
    for r in reqs:
        if prompt[:r.session.insert_at] == r.input_ids[:r.session.insert_at]:
            return r.session.session
    raise AssertionError("a prompt of no debate")


def _expected_prompts(reqs: list[WorkloadRequest], answered: dict[tuple[int, ...], list[int]],
                      upto: dict[str, int] | None = None) -> dict[str, list[list[int]]]:
    """Per request id, the prompt the client had to send: system + topic + the earlier rounds'
    actual outputs (member order) + role, rebuilt from the server's answers."""
    out: dict[str, list[int]] = {}
    for name, rounds in session_rounds(reqs).items():
        transcript: list[int] = []
        for r, members in enumerate(rounds):
            if upto is not None and r > upto[name]:
                break
            for i in members:
                q = reqs[i]
                out[q.id] = q.input_ids[:q.session.insert_at] + transcript + q.input_ids[q.session.insert_at:]
            for i in members:
                transcript += answered.get(tuple(out[reqs[i].id]), [])
    return out


@pytest.mark.parametrize("api,incremental", [("generate", False), ("generate", True), ("completions", False)])
def test_each_round_prompt_is_system_topic_earlier_outputs_and_role(api, incremental):
    srv = _server(timings=FakeTimings(first_token_delay=0.02, inter_token_delay=0.002, incremental_ids=incremental))
    try:
        reqs = _workload()
        res = _run(srv.base_url, reqs, api=api)
    finally:
        srv.stop()
    assert len(res.records) == D * K * R == len(srv.payloads)
    assert [r.id for r in res.records] == [q.id for q in reqs]
    assert all(r.success for r in res.records), res.errors()
    answered = {tuple(p): o for p, o in srv.outputs}
    expected = _expected_prompts(reqs, answered)
    sent = [p["prompt"] if api == "completions" else p["input_ids"] for p in srv.payloads]
    assert sorted(map(tuple, sent)) == sorted(tuple(p) for p in expected.values())
    for q, rec in zip(reqs, res.records, strict=True):
        s = q.session
        prompt = expected[q.id]
        assert rec.prompt_len == len(prompt) == len(q.input_ids) + s.round * K * OUT  # full outputs, ignore_eos
        assert prompt[-4:] == q.input_ids[-4:]  # the role closes every prompt
    if api == "completions":
        assert all(p.get("return_token_ids") is True for p in srv.payloads)
    else:
        assert all("return_token_ids" not in p for p in srv.payloads)
    assert max_prompt_len(reqs) == max(map(len, sent))
    assert res.metrics["completed"] == D * K * R and res.metrics["total_output_tokens"] == D * K * R * OUT


def test_a_round_is_sent_only_when_the_previous_one_has_finished():
    srv = _server()
    try:
        reqs = _workload()
        res = _run(srv.base_url, reqs)
    finally:
        srv.stop()
    recs = {r.id: r for r in res.records}
    for rounds in session_rounds(reqs).values():
        for before, after in zip(rounds, rounds[1:]):
            assert min(recs[reqs[i].id].start for i in after) >= max(recs[reqs[i].id].end for i in before)
    assert res.max_in_flight <= D * K


def test_debates_progress_independently():
    """Debate d0 answers slowly: d1 must run all its rounds meanwhile, not wait for d0's rounds."""
    reqs = _workload()
    slow = reqs[0].input_ids[:reqs[0].session.insert_at]  # d0's system + topic
    srv = _server(delay_fn=lambda p: 1.0 if p[:len(slow)] == slow else 0.0)
    try:
        res = _run(srv.base_url, reqs)
    finally:
        srv.stop()
    assert all(r.success for r in res.records), res.errors()
    by = {(q.session.session, q.session.round): [] for q in reqs}
    for q, rec in zip(reqs, res.records, strict=True):
        by[(q.session.session, q.session.round)].append(rec)
    d1_done = max(r.end for rnd in range(R) for r in by[("d1", rnd)])
    d0_round1 = min(r.start for r in by[("d0", 1)])
    assert d1_done < d0_round1


def test_a_failed_request_ends_its_debate_and_the_others_go_on():
    reqs = _workload()
    target = next(q for q in reqs if (q.session.session, q.session.round, q.session.member) == ("d0", 1, 1))
    role = target.input_ids[target.session.insert_at:]
    head = target.input_ids[:target.session.insert_at]

    def mode(p: list[int]) -> int:  # d0's round-1 prompt of agent 1: head + K outputs + role
        hit = p[:len(head)] == head and p[-len(role):] == role and len(p) == len(head) + K * OUT + len(role)
        return HTTP_500 if hit else 1

    srv = _server(mode_fn=mode)
    try:
        res = asyncio.run(asyncio.wait_for(
            run_benchmark(srv.base_url, reqs, ClientConfig(warmup_requests=0, progress=False)), 30))
    finally:
        srv.stop()
    got = {q.id: (q.session, rec) for q, rec in zip(reqs, res.records, strict=True)}
    for s, rec in got.values():
        if s.session == "d1" or s.round == 0 or (s.round == 1 and s.member != 1):
            assert rec.success, rec.error
        elif s.round == 1:
            assert not rec.success and rec.error.startswith("HTTP 500")
        else:
            assert not rec.success
            assert rec.error.startswith(f"not sent: session d0 ended in round 1: {target.id} failed")
    assert len(srv.payloads) == D * K * R - K  # d0's last round never went out
    assert res.metrics["failed"] == 1 + K and res.metrics["completed"] == D * K * R - 1 - K
    # the records that were never sent do not stretch the run's duration
    sent = [rec for _, rec in got.values() if not rec.error.startswith("not sent")]
    assert res.metrics["duration_s"] == pytest.approx(max(r.end for r in sent) - min(r.start for r in sent), abs=0.05)


def test_completions_without_token_ids_fail_the_request_not_the_run():
    class NoIds(FakeServer):
        def _chunk(self, body, ids, sent, step, openai, out):
            chunk = super()._chunk(body, ids, sent, step, openai, out)
            for c in chunk.get("choices", []):
                c.pop("token_ids", None)
            return chunk

    srv = NoIds(output_fn=_answer, timings=FakeTimings(first_token_delay=0.01, inter_token_delay=0.001))
    srv.start()
    try:
        reqs = _workload()
        res = _run(srv.base_url, reqs, api="completions")
    finally:
        srv.stop()
    assert not any(r.success for r in res.records)
    assert len(srv.payloads) == D * K  # round 0 only: every debate ended there
    first = res.records[0].error
    assert "carried 0 output ids for 4 tokens" in first and "closed-loop session" in first


def test_the_concurrency_cap_holds_in_session_mode():
    srv = _server()
    try:
        res = _run(srv.base_url, _workload(), max_concurrency=2)
    finally:
        srv.stop()
    assert all(r.success for r in res.records) and srv.max_in_flight <= 2 and res.max_in_flight <= 2


def test_session_rounds_refuses_a_cut_workload():
    reqs = _workload()
    with pytest.raises(ValueError, match="rounds"):
        session_rounds([q for q in reqs if q.session.round != 1])
    assert session_rounds(reqs)["d1"][2] == [15, 16, 17]


def test_the_cli_refuses_to_cut_sessions(tmp_path, capsys):
    from harness.run.client import cli as client_cli

    cfg = WorkloadConfig.for_kind("debate", lp=10, la=4, k=K, rounds=R, num_requests=D * K * R, suffix="synthetic",
                                  suffix_len=5, output_len=OUT, vocab_size=1024)
    path = write(cfg, tmp_path / "d.jsonl")
    with pytest.raises(SystemExit):
        client_cli.main(["--url", "http://127.0.0.1:9", "--workload", str(path), "--num-requests", "4"])
    assert "cut sessions apart" in capsys.readouterr().err
