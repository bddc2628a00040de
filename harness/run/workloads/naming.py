"""The file name a workload config gets, e.g. `sharegpt-lp16384-n500-v128256.jsonl`.

Why names and not hashes: a workloads/ folder is read by people choosing what to carry to a GPU
host, and two configs that give different files must never share a name, so the name spells out
every field that differs from its kind's defaults.
"""

from __future__ import annotations

import hashlib

from harness.run.workloads.config import WorkloadConfig
from harness.run.workloads.tokenizer import load_tokenizer

_ABBREV = {
    "num_requests": "n", "lp": "lp", "k": "k", "suffix": "sfx-", "suffix_len": "s",
    "min_turn_tokens": "tmin", "max_turn_tokens": "tmax", "output_len": "o",
    "arrival": "arr-", "seed": "seed",
}


def workload_filename(cfg: WorkloadConfig, tokenizer: tuple[str, int] | None = None) -> str:
    """A file name derived from the config, e.g. `sharegpt-lp16384-n500-v128256.jsonl`.

    Always names kind, k (but for sharegpt), the prefix length(s) (tree: its levels `lv<fanout>x
    <length>_...` and any jitter `j<x>`; agents and debate add `la`, debate its rounds `r`), the
    request count and the effective vocabulary; any other field that differs from the kind's defaults is appended,
    so two configs that give different files never share a name. The vocabulary tag is the
    one the ids are bounded by (`vocab_size`, else the tokenizer's), and a non-cl100k
    tokenizer adds `-tok<name>`; resolving it reads the tokenizer directory, not the data.
    `tokenizer` (its name and vocabulary size), when the caller knows them, spares loading it.
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
    tok_tag, n_vocab = tokenizer or tokenizer_tag(cfg.tokenizer_path)
    parts.append(f"v{cfg.vocab_size or n_vocab}")
    if tok_tag != "cl100k":
        parts.append(f"tok{tok_tag}")
    if cfg.dataset_path is not None:
        parts.append("ds" + hashlib.blake2b(str(cfg.dataset_path).encode(), digest_size=4).hexdigest())
    return "-".join(parts) + ".jsonl"


def tokenizer_tag(tokenizer_path: str | None) -> tuple[str, int]:
    """(name, vocabulary size) of the tokenizer at `tokenizer_path` (None: cl100k_base), loaded."""
    tok = load_tokenizer(tokenizer_path)
    return tok.name, tok.n_vocab
