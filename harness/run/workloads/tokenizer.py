"""Token counting for workload generation.

Workloads are files of token ids, so text has to become ids somewhere; this module is that
place. The model's own tokenizer is used when a local copy exists (a directory that
`transformers.AutoTokenizer` can load without the network); otherwise `cl100k_base` from the
`bpe-openai` package, which is the base vocabulary of Llama-3's tokenizer, so user-turn
lengths come out close to the real model's.

Besides `encode`, a tokenizer offers `word_ids()`: the ids of non-special tokens that decode
to one plain lowercase word (with its leading space, for byte-level BPE). Synthetic system
prompts and suffixes draw from this pool, so they never contain special/control tokens and
decode to harmless text.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# Byte-level BPE (Llama-3, Qwen-2.5, cl100k) decodes a word token with its leading space;
# sentencepiece tokenizers drop it when a token is decoded alone, hence the optional space.
_WORD = re.compile(r"^ ?[a-z]{3,12}$")
_WORD_BYTES = re.compile(rb"^ [a-z]{3,12}$")


class Tokenizer(Protocol):
    """What the workload generator needs from a tokenizer."""

    name: str
    n_vocab: int

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added (no BOS)."""
        ...

    def word_ids(self) -> list[int]:
        """Sorted ids of non-special tokens that decode to one lowercase word."""
        ...


@dataclass
class Cl100kTokenizer:
    """`cl100k_base` through the Rust `bpe-openai` tokenizer (tiktoken-compatible API)."""

    name: str = "cl100k"
    _enc: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        import bpe_openai

        self._enc = bpe_openai.get_encoding("cl100k_base")

    @property
    def n_vocab(self) -> int:
        return int(self._enc.n_vocab)

    def encode(self, text: str) -> list[int]:
        # encode_ordinary: text that spells a special token ("<|endoftext|>") stays plain text.
        return list(self._enc.encode_ordinary(text))

    def word_ids(self) -> list[int]:
        # token_byte_values() lists every mergeable token's bytes (never a special token).
        words = (b for b in self._enc.token_byte_values() if _WORD_BYTES.match(b))
        return sorted(int(self._enc.encode_single_token(b)) for b in words)


@dataclass
class HFTokenizer:
    """A local Hugging Face tokenizer directory (never downloads)."""

    path: str
    name: str = ""
    _tok: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        if not self.name:
            self.name = Path(self.path).resolve().name

    @property
    def n_vocab(self) -> int:
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def word_ids(self) -> list[int]:
        special = set(self._tok.all_special_ids)
        texts = self._tok.batch_decode([[i] for i in range(self.n_vocab)])
        words = [i for i, t in enumerate(texts) if i not in special and _WORD.match(t)]
        if len(words) < 256:  # an unusual vocabulary: any non-special token will do
            words = [i for i in range(self.n_vocab) if i not in special]
        return words


def load_tokenizer(tokenizer_path: str | None) -> Tokenizer:
    """The model's tokenizer if `tokenizer_path` is a local directory, else cl100k_base.

    A path that is given but missing falls back to cl100k_base with a warning on stderr (the
    workload header records which tokenizer was used, so the fallback is never silent in the
    data).
    """
    if tokenizer_path:
        if Path(tokenizer_path).is_dir():
            return HFTokenizer(path=str(tokenizer_path))
        print(
            f"[workloads] tokenizer_path {tokenizer_path!r} not found; counting tokens with cl100k_base",
            file=sys.stderr,
        )
    return Cl100kTokenizer()
