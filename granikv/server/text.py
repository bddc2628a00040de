"""Text <-> token ids for the HTTP API.

Benchmarks send token ids, so text is a convenience: with a local Hugging Face tokenizer
(the model dir given by --model-path holds one) text round-trips through it; without one, the
server uses a documented fallback — prompts are UTF-8 bytes (ids 0..255, which every model's
vocabulary covers) and each output id renders as " <id>" — so clients that need non-empty
text chunks (SGLang's bench_serving) always get them.
"""

from __future__ import annotations

from pathlib import Path


class TextCodec:
    def __init__(self, model_path: str | None = None) -> None:
        self.tok = None
        self.path: str | None = None
        if model_path and (Path(model_path) / "tokenizer_config.json").exists():
            try:
                from transformers import AutoTokenizer

                self.tok = AutoTokenizer.from_pretrained(model_path)
                self.path = str(model_path)
            except Exception:  # pragma: no cover - a broken local tokenizer falls back
                self.tok = None

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's own chat template, if it has one (chat.py uses it)."""
        return getattr(self.tok, "chat_template", None) if self.tok is not None else None

    def encode(self, text: str) -> list[int]:
        if self.tok is not None:
            return list(self.tok.encode(text, add_special_tokens=False))
        return list(text.encode("utf-8"))

    @property
    def incremental(self) -> bool:
        """Whether decode(a + b) == decode(a) + decode(b), so streams can append pieces instead
        of re-decoding the whole output for every chunk (O(n) instead of O(n^2))."""
        return self.tok is None

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        if self.tok is not None:
            return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)
        return "".join(f" <{i}>" for i in ids)
