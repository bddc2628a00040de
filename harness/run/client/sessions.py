"""Closed-loop sessions (kind debate): each round is sent once the session's previous round has
finished, its prompts holding the outputs the server returned (the package docstring says how).

Why apart from the open-loop run: the sender (a slot under the concurrency cap, a record per
request) is the benchmark's; what differs is only when a request may start and what its prompt
is, which this module decides.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence

from harness.run.client.metrics import RequestRecord
from harness.run.workloads.requests import WorkloadRequest

# send(request, ready_at, ids sink) -> its record: run_benchmark's slot-taking sender
Send = Callable[[WorkloadRequest, float, list[int] | None], Awaitable[RequestRecord]]


def session_rounds(requests: Sequence[WorkloadRequest]) -> dict[str, list[list[int]]]:
    """Per session (first-appearance order), its rounds in order, each the indices into
    `requests` of its members in member order. Rounds must be 0..R-1 with distinct members."""
    rounds: dict[str, dict[int, list[int]]] = {}
    for i, r in enumerate(requests):
        if r.session is None:
            raise ValueError(f"request {r.id} has no session step; in a closed-loop workload every request has one")
        rounds.setdefault(r.session.session, {}).setdefault(r.session.round, []).append(i)
    out: dict[str, list[list[int]]] = {}
    for name, by_round in rounds.items():
        if sorted(by_round) != list(range(len(by_round))):
            raise ValueError(f"session {name} has rounds {sorted(by_round)}; need 0..R-1 (was the workload cut?)")
        ordered = []
        for r in range(len(by_round)):
            members = sorted(by_round[r], key=lambda i: requests[i].session.member)  # type: ignore[union-attr]
            if len({requests[i].session.member for i in members}) != len(members):  # type: ignore[union-attr]
                raise ValueError(f"session {name} round {r} names a member twice")
            ordered.append(members)
        out[name] = ordered
    return out


def _not_sent(req: WorkloadRequest, max_new_tokens: int, why: str) -> RequestRecord:
    """The record of a session request that was never sent; its times are "now", so the run's
    duration (first send to last end) is not stretched by it."""
    now = time.perf_counter()
    return RequestRecord(id=req.id, prompt_len=len(req.input_ids), max_new_tokens=max_new_tokens,
                         error=f"not sent: {why}", start=now, end=now)


async def run_sessions(requests: Sequence[WorkloadRequest], t0: float, rate: float, max_new_tokens: int | None,
                       send: Send) -> list[RequestRecord]:
    """Run every session closed-loop (see the module docstring), a session starting at its first
    request's arrival at `rate`; the records in `requests` order (`max_new_tokens`: the client's
    override of each request's output_len, recorded on the requests never sent)."""
    records: list[RequestRecord | None] = [None] * len(requests)

    async def one_session(name: str, rounds: list[list[int]]) -> None:
        delay = t0 + requests[rounds[0][0]].arrival_offset(rate) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        transcript: list[int] = []
        for r, members in enumerate(rounds):
            outs: list[list[int]] = [[] for _ in members]
            sent = [_with_transcript(requests[i], transcript) for i in members]
            recs = await asyncio.gather(*(send(q, 0.0, out) for q, out in zip(sent, outs, strict=True)))
            for i, rec in zip(members, recs, strict=True):
                records[i] = rec
            failed = [rec.id for rec in recs if not rec.success]
            if failed:
                why = f"session {name} ended in round {r}: {', '.join(failed)} failed"
                for later in rounds[r + 1:]:
                    for i in later:
                        records[i] = _not_sent(requests[i], max_new_tokens or requests[i].output_len, why)
                return
            for out in outs:
                transcript += out

    await asyncio.gather(*(one_session(name, rounds) for name, rounds in session_rounds(requests).items()))
    return [rec for rec in records if rec is not None]


def _with_transcript(req: WorkloadRequest, transcript: list[int]) -> WorkloadRequest:
    """`req` as sent after `transcript`: its prompt, and the hint (when sent) at the session's actual
    shared part, everything before the member's own tail."""
    assert req.session is not None
    return dataclasses.replace(req, input_ids=req.prompt(transcript),
                               shared_prefix_len=req.session.insert_at + len(transcript))
