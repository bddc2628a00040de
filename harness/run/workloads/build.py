"""Generate a workload: its suffixes, its family's requests, the header; and write the file.

Why one entry point (`build`) for every kind: the tokenizer, the word pool, the suffixes and the
header are the same code for all of them, so the families differ only in their request builder
(multiprefix, tree, debate) and files of the older kinds keep their bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.run.workloads.config import WorkloadConfig
from harness.run.workloads.debate import debate_requests
from harness.run.workloads.multiprefix import multiprefix_requests
from harness.run.workloads.requests import FORMAT_VERSION, Workload, WorkloadRequest
from harness.run.workloads.sharegpt import load_conversations, user_turns
from harness.run.workloads.streams import STREAM_SUFFIX, map_ids, raw_draws
from harness.run.workloads.tokenizer import load_tokenizer
from harness.run.workloads.tree import tree_requests


def _suffixes(cfg: WorkloadConfig, tok: Any, vocab: int, pool: Sequence[int],
              n: int) -> tuple[list[list[int]], list[str], dict[str, Any] | None]:
    """n suffixes (ShareGPT user turns or synthetic words), their sources and the dataset's record."""
    if cfg.suffix == "sharegpt":
        convs, dataset_info = load_conversations(cfg.dataset_path)
        turns = user_turns(convs, tok, n, cfg.seed, cfg.min_turn_tokens, cfg.max_turn_tokens)
        return [map_ids(t.ids, vocab) for t in turns], [t.source for t in turns], dataset_info
    pool_arr = np.asarray(pool, dtype=np.uint64)
    suffixes = [
        map_ids(pool_arr[raw_draws(cfg.seed, STREAM_SUFFIX, i, cfg.suffix_len) % np.uint64(len(pool_arr))], vocab)
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
    kind_build = {"tree": tree_requests, "debate": debate_requests}.get(cfg.kind, multiprefix_requests)
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
