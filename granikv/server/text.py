"""Text <-> token ids for the HTTP API.

Benchmarks send token ids, so text is a convenience. With a local Hugging Face tokenizer (the
model dir given by --model-path holds one) text round-trips through it. Without one, the server
uses the *id codec* of the model's vocabulary of V ids:

- id i < 256 is the character chr(i) (Latin-1: ASCII text is its bytes);
- id i in [256, V-1) is the literal token "<i>" (decimal, no leading zero);
- id V-1 is the literal token "<unk>".

Encoding matches the literal tokens first ("<300>" is one id; "<99>", "<0300>" and, with
V = 1024, "<1023>" are not literal tokens but characters); every other character c is id ord(c)
when ord(c) < 256 and V-1 otherwise. Decoding concatenates the tokens' texts, so streams decode
each new piece alone (`incremental`), every id has non-empty text (SGLang's bench_serving counts
a chunk without text as a failure), and encode(decode(ids)) == ids unless character ids spell
a literal token (60, 51, 48, 48, 62 is "<300>", which encodes to 300; for uniformly random ids
at V = 1024, about 7e-13 per position). The codec has no special tokens: `skip_special_tokens` changes
nothing, so no token's text is ever dropped from the output.

The same scheme ships as Hugging Face tokenizer files for V = 1024 (the tiny models):
granikv/data/tokenizers/tiny (`HF_TOKENIZER_DIRS`), written by
`python -m granikv.server.text --write-hf DIR --vocab-size V --model-max-length N` and pinned to
this module by tests/server/test_tokenizer.py. The server reports it as /get_model_info's
`tokenizer_path`, so offline clients (SGLang's `bench_serving --tokenizer`, guidellm's
`--processor`) load it with `AutoTokenizer.from_pretrained` and count exactly the server's tokens.
For another vocabulary, that command writes the files to give them.

This module imports neither torch nor transformers unless a Hugging Face tokenizer is used
(the server process never imports torch).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import numpy as np

# The id codec's V when none is given: the tiny models' vocabulary (conf/model/tiny.yaml,
# tiny-qwen.yaml). The server passes the engine's (`TextCodec.with_vocab_size`).
DEFAULT_VOCAB_SIZE = 1024
UNK = "<unk>"
MIN_VOCAB_SIZE = 257  # 256 characters and <unk>

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "tokenizers"
# shipped Hugging Face tokenizer files of the id codec, by vocabulary size
HF_TOKENIZER_DIRS = {1024: DATA_DIR / "tiny"}
TINY_MODEL_MAX_LENGTH = 8192  # conf/model/tiny.yaml's max_position_embeddings


def hf_tokenizer_dir(vocab_size: int) -> Path | None:
    """The shipped Hugging Face tokenizer dir of the id codec of `vocab_size` ids, if there is one."""
    d = HF_TOKENIZER_DIRS.get(vocab_size)
    return d if d is not None and (d / "tokenizer.json").is_file() else None


class TextCodec:
    """Text <-> ids: a Hugging Face tokenizer, or the id codec (module docstring).

    `model_path`: a model dir; its tokenizer is used when it holds one (tokenizer_config.json).
    `tokenizer`: a Hugging Face tokenizer dir or a loaded tokenizer, used instead of model_path's.
    `vocab_size`: V of the id codec, used when neither gives a tokenizer (default
    DEFAULT_VOCAB_SIZE, the tiny models'; the server passes its engine's).

    `path`: the tokenizer dir clients should load (/get_model_info's `tokenizer_path`): the
    Hugging Face tokenizer's, or the shipped files of the id codec of this V (None if none)."""

    def __init__(self, model_path: str | os.PathLike | None = None, vocab_size: int | None = None,
                 tokenizer=None) -> None:
        self.tok = None
        self.path: str | None = None
        if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
            self.tok = tokenizer  # a loaded Hugging Face tokenizer
            self.path = getattr(tokenizer, "name_or_path", None) or None
        elif tokenizer is not None:  # a tokenizer dir, as asked: its errors are the caller's
            from transformers import AutoTokenizer

            self.tok = AutoTokenizer.from_pretrained(str(tokenizer))
            self.path = str(tokenizer)
        elif model_path and (Path(model_path) / "tokenizer_config.json").exists():
            try:
                from transformers import AutoTokenizer

                self.tok = AutoTokenizer.from_pretrained(str(model_path))
                self.path = str(model_path)
            except Exception:  # pragma: no cover - a broken local tokenizer falls back
                self.tok = None
        self.vocab_size: int | None = None
        if self.tok is None:
            v = DEFAULT_VOCAB_SIZE if vocab_size is None else int(vocab_size)
            if v < MIN_VOCAB_SIZE:
                raise ValueError(f"the id codec needs a vocabulary of at least {MIN_VOCAB_SIZE} ids, got {v}")
            self.vocab_size = v
            self.unk = v - 1
            shipped = hf_tokenizer_dir(v)
            self.path = str(shipped) if shipped is not None else None

    def with_vocab_size(self, vocab_size: int) -> TextCodec:
        """This codec for a model of `vocab_size` ids: itself when it is a Hugging Face tokenizer
        or already of that size, else the id codec of that size."""
        if self.tok is not None or self.vocab_size == vocab_size:
            return self
        return TextCodec(vocab_size=vocab_size)

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's own chat template, if it has one (chat.py uses it)."""
        return getattr(self.tok, "chat_template", None) if self.tok is not None else None

    @property
    def incremental(self) -> bool:
        """Whether decode(a + b) == decode(a) + decode(b), so streams can append pieces instead
        of re-decoding the whole output for every chunk (O(n) instead of O(n^2))."""
        return self.tok is None

    # -- encode -----------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self.tok is not None:
            return list(self.tok.encode(text, add_special_tokens=False))
        try:
            if "<" not in text:
                return list(text.encode("latin-1"))  # characters only: the common case, at C speed
        except UnicodeEncodeError:
            pass
        return self._encode_array(text).tolist()

    def _encode_array(self, text: str) -> np.ndarray:
        """The ids, by array passes over the text's code points: a pass per digit of the longest
        literal, none per token (a Python loop or a regex costs ~0.3 us per literal token: 10 ms
        for a 32K-token prompt of random ids, the text bench_serving's random datasets send)."""
        a = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32).astype(np.int64)
        ids = np.where(a < 256, a, self.unk)
        lt = np.flatnonzero(a == ord("<"))
        if len(lt) == 0:
            return ids
        # a literal starts at a "<": "unk>" or a number's digits and ">" follow it. A literal holds
        # no other "<", so those that match never overlap: no leftmost-match rule to apply.
        a = np.concatenate([a, np.zeros(max(len(UNK) - 1, self._max_digits + 1), dtype=np.int64)])  # look-ahead
        starts, ends, vals = [], [], []
        unk = np.ones(len(lt), dtype=bool)
        for k, c in enumerate("unk>", 1):
            unk &= a[lt + k] == ord(c)
        starts.append(lt[unk])
        ends.append(lt[unk] + len(UNK))
        vals.append(np.full(int(unk.sum()), self.unk, dtype=np.int64))
        digits = a[lt + 1] != ord("0")  # no leading zero
        val = np.zeros(len(lt), dtype=np.int64)
        for n in range(1, self._max_digits + 1):
            d = a[lt + n] - ord("0")
            digits &= (d >= 0) & (d <= 9)
            val = val * 10 + d
            if n >= 3:  # "<", n digits, ">": a literal when 256 <= its number < V-1
                hit = digits & (a[lt + n + 1] == ord(">")) & (val >= 256) & (val < self.unk)
                starts.append(lt[hit])
                ends.append(lt[hit] + n + 2)
                vals.append(val[hit])
        s = np.concatenate(starts)
        if len(s) == 0:
            return ids
        ids[s] = np.concatenate(vals)
        # a literal's first character keeps its id; the rest of its characters are dropped
        e = np.concatenate(ends)
        step = np.zeros(len(ids) + 1, dtype=np.int32)
        step[s + 1] = 1
        step[e] = -1  # no end is another literal's start + 1 (literals do not overlap)
        return ids[np.cumsum(step[:-1]) == 0]

    @functools.cached_property
    def _max_digits(self) -> int:
        """Digits of the largest literal number (V-2); 0 when there is none."""
        return len(str(self.unk - 1)) if self.unk - 1 >= 256 else 0

    # -- decode -----------------------------------------------------------------------------------
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The ids' text. The id codec has no special tokens (`skip_special_tokens` changes
        nothing); an id beyond its vocabulary, which no engine of that vocabulary produces,
        renders as "<id>" too."""
        if self.tok is not None:
            return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()  # bytes() of an array would be its buffer
        try:
            return bytes(ids).decode("latin-1")  # all characters: the common case, at C speed
        except ValueError:
            pass
        if min(ids) < 0:
            raise ValueError(f"token id {min(ids)} is negative")
        try:
            return "".join(map(self._pieces.__getitem__, ids))
        except IndexError:  # beyond the vocabulary
            n = len(self._pieces)
            return "".join(self._pieces[i] if i < n else f"<{i}>" for i in ids)

    @functools.cached_property
    def _pieces(self) -> list[str]:
        """Every id's text (built on the first decode that needs it)."""
        return [chr(i) for i in range(256)] + [f"<{i}>" for i in range(256, self.unk)] + [UNK]


# -- the Hugging Face files -----------------------------------------------------------------------
def write_hf_tokenizer(out_dir: str | os.PathLike, vocab_size: int = DEFAULT_VOCAB_SIZE,
                       model_max_length: int = TINY_MODEL_MAX_LENGTH) -> Path:
    """Write the id codec of `vocab_size` ids as Hugging Face tokenizer files (tokenizer.json,
    tokenizer_config.json) into `out_dir`: a WordLevel model of one character per word, the
    literal tokens as added tokens (matched before the characters, as the id codec does), and
    Fuse to decode by concatenation. No token is special: `unk_token` is the model's (unknown
    characters), not the tokenizer's, so `skip_special_tokens` keeps "<unk>" as the id codec does.
    Needs the `tokenizers` library (a test dependency; imported here only)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"the id codec needs a vocabulary of at least {MIN_VOCAB_SIZE} ids, got {vocab_size}")
    literals = [f"<{i}>" for i in range(256, vocab_size - 1)] + [UNK]
    vocab = {chr(i): i for i in range(256)}
    vocab.update({t: 256 + k for k, t in enumerate(literals)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in literals])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "model_max_length": model_max_length}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m granikv.server.text",
                                description="Write the server's id codec as Hugging Face tokenizer files")
    p.add_argument("--write-hf", metavar="DIR", required=True, help="directory to write the files into")
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                   help=f"the model's vocabulary size (default: {DEFAULT_VOCAB_SIZE}, the tiny models')")
    p.add_argument("--model-max-length", type=int, default=TINY_MODEL_MAX_LENGTH,
                   help=f"the model's max_position_embeddings (default: {TINY_MODEL_MAX_LENGTH}, the tiny models')")
    args = p.parse_args(argv)
    print(write_hf_tokenizer(args.write_hf, args.vocab_size, args.model_max_length))
    return 0


if __name__ == "__main__":
    sys.exit(main())
