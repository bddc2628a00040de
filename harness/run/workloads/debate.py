"""The `debate` kind: closed-loop multi-agent debates, whose later prompts hold earlier outputs.

Why its own builder: a debate's file holds only the static parts of each prompt (system, topic,
role) and where the transcript goes (`session.insert_at`); the client builds each round's prompt
from the outputs the server returned (harness.run.client.sessions).
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.run.workloads.config import WorkloadConfig
from harness.run.workloads.requests import Built, SessionStep, WorkloadRequest
from harness.run.workloads.streams import STREAM_ROLE, STREAM_ROLE_FIRST, system_prompts, unit_arrivals


def debate_requests(cfg: WorkloadConfig, pool: Sequence[int], vocab: int, suffixes: list[list[int]],
                    sources: list[str]) -> Built:
    """The static parts of D debates x k agents x R rounds, run closed-loop by the client.

    One Lp-token system prompt is shared by every debate; debate d's topic is its suffix (a
    ShareGPT user turn, or synthetic words); agent a's La-token role prompt is shared by agent a
    of every debate. Round r of debate d asks agent a with system + topic_d + the outputs of
    rounds 0..r-1 (agent order) + role_a: `input_ids` holds system + topic_d + role_a and
    `session.insert_at` is where the client puts the transcript. Requests are listed debate by
    debate, round by round, agent by agent; each debate starts at its arrival time.
    """
    system = system_prompts([cfg.lp], pool, vocab, cfg.seed)[0]
    roles = system_prompts([cfg.la] * cfg.k, pool, vocab, cfg.seed, streams=(STREAM_ROLE, STREAM_ROLE_FIRST))
    t_unit = unit_arrivals(cfg.debates, cfg.arrival, cfg.seed)
    width = len(str(cfg.num_requests - 1))
    requests = []
    for d in range(cfg.debates):
        opening = system + suffixes[d]
        for r in range(cfg.rounds):
            shared = len(opening) + r * cfg.k * cfg.output_len  # nominal: every output output_len long
            for a in range(cfg.k):
                requests.append(WorkloadRequest(
                    id=f"debate-{len(requests):0{width}d}", input_ids=opening + roles[a],
                    prefix_id=f"d{d}r{r}", shared_prefix_len=shared, output_len=cfg.output_len,
                    arrival={"process": cfg.arrival, "t_unit": t_unit[d]}, source=sources[d],
                    prefix_levels=[cfg.lp, shared],
                    session=SessionStep(session=f"d{d}", round=r, member=a, insert_at=len(opening)),
                ))
    extra = {"closed_loop": {"sessions": cfg.debates, "members": cfg.k, "rounds": cfg.rounds,
                             "system_len": cfg.lp, "role_len": cfg.la}}
    return requests, extra
