"""The kinds with one static prompt per request: prefix i mod k, then the request's suffix.

sharegpt and burst have one prefix (k = 1), multiprefix k of one length, hetero k of different
lengths (the ladder of Table 21), agents k nested ones (a common Lp-token system prompt, then
each agent's own La-token role prompt). Why one module: they differ only in how the k prefixes
are drawn (`prefixes`); a request is built the same way for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.run.workloads.config import WorkloadConfig
from harness.run.workloads.requests import Built, WorkloadRequest
from harness.run.workloads.streams import STREAM_ROLE, STREAM_ROLE_FIRST, system_prompts, unit_arrivals


def prefixes(cfg: WorkloadConfig, pool: Sequence[int], vocab: int) -> list[list[int]]:
    """The k distinct prefixes; for agents, the common Lp prompt followed by each role prompt."""
    if cfg.kind != "agents":
        return system_prompts(cfg.prefix_lengths(), pool, vocab, cfg.seed)
    common = system_prompts([cfg.lp], pool, vocab, cfg.seed)[0]
    roles = system_prompts([cfg.la] * cfg.k, pool, vocab, cfg.seed, streams=(STREAM_ROLE, STREAM_ROLE_FIRST))
    return [common + role for role in roles]



def multiprefix_requests(cfg: WorkloadConfig, pool: Sequence[int], vocab: int, suffixes: list[list[int]],
                         sources: list[str]) -> Built:
    """One static prompt per request: prefix i mod k (sharegpt, burst, multiprefix, hetero, agents)."""
    lengths = cfg.prefix_lengths()
    prompts = prefixes(cfg, pool, vocab)
    t_unit = unit_arrivals(cfg.num_requests, cfg.arrival, cfg.seed)
    width = len(str(cfg.num_requests - 1))
    agents = {"shared_lp": cfg.lp, "agent_len": cfg.la} if cfg.kind == "agents" else {}
    requests = []
    for i in range(cfg.num_requests):
        c = i % cfg.k
        requests.append(
            WorkloadRequest(
                id=f"{cfg.kind}-{i:0{width}d}",
                input_ids=prompts[c] + suffixes[i],
                prefix_id=(f"a{c}" if cfg.kind == "agents" else f"p{c}") if lengths[c] > 0 else None,
                shared_prefix_len=lengths[c],
                output_len=cfg.output_len,
                arrival={"process": cfg.arrival, "t_unit": t_unit[i]},
                source=sources[i],
                **agents,
            )
        )
    return requests, agents
