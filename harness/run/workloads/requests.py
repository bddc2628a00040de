"""A workload's requests and its file format: one JSON header line, then one request per line.

Why here and not beside the generator: the client, the cell, the replays and the microbenchmarks
read workload files without generating any, so reading needs nothing of the generator (no
tokenizer, no dataset). Closed-loop sessions (kind debate) are a property of the requests, so the
checks that a tool can offer them live here too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1


@dataclass(frozen=True)
class SessionStep:
    """Where a request sits in a closed-loop session (kind debate): its prompt is known only once
    the session's earlier rounds have finished. The client sends round r of a session when round
    r - 1 has finished, with the outputs of every earlier round (rounds in order, members in
    order within a round) inserted into `input_ids` at `insert_at`."""

    session: str    # the session (debate) id
    round: int      # 0-based
    member: int     # the agent's index; fixes the order of the outputs in the transcript
    insert_at: int  # where the transcript goes in input_ids (after system prompt and topic)

    def to_dict(self) -> dict[str, Any]:
        return {"session": self.session, "round": self.round, "member": self.member, "insert_at": self.insert_at}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SessionStep:
        return cls(session=str(d["session"]), round=int(d["round"]), member=int(d["member"]),
                   insert_at=int(d["insert_at"]))


@dataclass
class WorkloadRequest:
    """One request of a workload file (see the module docstring for field meanings)."""

    id: str
    input_ids: list[int]
    prefix_id: str | None
    shared_prefix_len: int
    output_len: int
    arrival: dict[str, Any]
    source: str = ""
    shared_lp: int | None = None    # agents: the common part of the prefix (Lp)
    agent_len: int | None = None    # agents: the agent's own part (La); shared_prefix_len = Lp + La
    prefix_levels: list[int] | None = None  # tree, debate: cumulative lengths of the shared levels
    session: SessionStep | None = None      # debate: its place in a closed-loop session

    def prompt(self, transcript: Sequence[int] = ()) -> list[int]:
        """The prompt to send: `input_ids`, with a session request's transcript spliced in."""
        if self.session is None or not transcript:
            return self.input_ids
        at = self.session.insert_at
        return self.input_ids[:at] + list(transcript) + self.input_ids[at:]

    def arrival_offset(self, rate: float) -> float:
        """Seconds after the start of the run at which to send this request at `rate` req/s."""
        if math.isinf(rate) or self.arrival.get("process") == "burst":
            return 0.0
        if rate <= 0:
            raise ValueError("rate must be > 0 (use inf for all at once)")
        return float(self.arrival["t_unit"]) / rate

    def to_json(self) -> str:
        # Explicit dict (not dataclasses.asdict, which deep-copies every id): fixed key order.
        d = {
            "id": self.id,
            "input_ids": self.input_ids,
            "prefix_id": self.prefix_id,
            "shared_prefix_len": self.shared_prefix_len,
            "output_len": self.output_len,
            "arrival": self.arrival,
            "source": self.source,
        }
        if self.shared_lp is not None or self.agent_len is not None:
            d["shared_lp"] = self.shared_lp
            d["agent_len"] = self.agent_len
        if self.prefix_levels is not None:
            d["prefix_levels"] = self.prefix_levels
        if self.session is not None:
            d["session"] = self.session.to_dict()
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkloadRequest:
        return cls(
            id=str(d["id"]),
            input_ids=[int(x) for x in d["input_ids"]],
            prefix_id=d.get("prefix_id"),
            shared_prefix_len=int(d.get("shared_prefix_len", 0)),
            output_len=int(d["output_len"]),
            arrival=dict(d.get("arrival") or {"process": "burst", "t_unit": 0.0}),
            source=str(d.get("source", "")),
            shared_lp=None if d.get("shared_lp") is None else int(d["shared_lp"]),
            agent_len=None if d.get("agent_len") is None else int(d["agent_len"]),
            prefix_levels=None if d.get("prefix_levels") is None else [int(x) for x in d["prefix_levels"]],
            session=None if d.get("session") is None else SessionStep.from_dict(d["session"]),
        )


@dataclass
class Workload:
    """A generated workload: the header (provenance) and the requests."""

    header: dict[str, Any]
    requests: list[WorkloadRequest] = field(default_factory=list)



def read_workload(path: str | Path) -> Workload:
    """Header and requests of a workload file."""
    with open(path, encoding="utf-8") as f:
        header = json.loads(f.readline())
        if header.get("granikv_workload") != FORMAT_VERSION:
            raise ValueError(f"{path}: not a workload file of format {FORMAT_VERSION}")
        requests = [WorkloadRequest.from_dict(json.loads(line)) for line in f if line.strip()]
    if len(requests) != header.get("num_requests"):
        raise ValueError(f"{path}: header says {header.get('num_requests')} requests, found {len(requests)}")
    return Workload(header=header, requests=requests)


def read(path: str | Path) -> list[WorkloadRequest]:
    """The requests of a workload file."""
    return read_workload(path).requests


def is_closed_loop(requests: Sequence[WorkloadRequest]) -> bool:
    """Whether the prompts depend on the server's outputs (kind debate): only a client that runs
    the sessions (harness.run.client) can offer them; a static replay cannot."""
    return any(r.session is not None for r in requests)


def require_open_loop(requests: Sequence[WorkloadRequest], tool: str) -> None:
    """Refuse a closed-loop workload in a tool that replays static prompts, saying why."""
    if is_closed_loop(requests):
        raise ValueError(f"{tool} replays static prompts, but this is a closed-loop session workload (kind "
                         f"debate): its prompts hold earlier rounds' outputs. Run it with harness.run.client or "
                         f"harness.run.cell")


def max_prompt_len(requests: Sequence[WorkloadRequest]) -> int:
    """The longest prompt the client can send: a session request's static ids plus, at most, the
    output_len of every request of its earlier rounds (its transcript)."""
    earlier: dict[tuple[str, int], int] = {}
    for r in requests:
        if r.session is not None:
            key = (r.session.session, r.session.round)
            earlier[key] = earlier.get(key, 0) + r.output_len
    longest = 0
    for r in requests:
        extra = 0
        if r.session is not None:
            extra = sum(n for (s, rnd), n in earlier.items() if s == r.session.session and rnd < r.session.round)
        longest = max(longest, len(r.input_ids) + extra)
    return longest


# What a family's builder (multiprefix, tree, debate) returns: the requests and the header's
# keys of its own kind.
Built = tuple[list["WorkloadRequest"], dict[str, Any]]
