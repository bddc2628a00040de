"""The checks every route applies before the engine sees a request, the SGLang-native routes
(app.py) and the OpenAI routes (openai_api.py) alike: the body read within its bounds, text
bounded before it is tokenized, the prompt as one checked int32 array, the context and KV-cache
limits, and GraniKV's prefix hint.

A request the engine could never serve is the client's mistake, answered 400 with a reason that
names the field, so the engine only ever sees validated requests. The limits are the engine's own
numbers (`engine_info`: vocabulary, context, KV capacity), within what the operator set.
"""

from __future__ import annotations

import numpy as np
from aiohttp import web

from granikv.server.body import BodyLimits, max_request_bytes, read_json
from granikv.server.errors import BadRequest
from granikv.server.params import as_int
from granikv.server.text import TextCodec

# a text prompt longer than this many characters per token of the context is refused before it is
# tokenized (no tokenizer makes tokens that long on average; tokenizing megabytes holds the loop)
MAX_CHARS_PER_TOKEN = 64


class RequestValidator:
    """One server's limits and the checks against them; each check raises BadRequest."""

    def __init__(self, codec: TextCodec, info: dict, context_length: int | None = None,
                 max_request_bytes_: int | None = None) -> None:
        """`info`: the engine's (engine_info); `context_length`: a smaller context the operator set
        (--context-length); `max_request_bytes_`: the body limit (default: what a valid request
        can need, body.max_request_bytes)."""
        self.codec = codec
        self.vocab = info["vocab_size"]
        self.max_context = info["max_context"]  # the engine's slot-table width: a hard limit
        # the context limit: the model's own (max_position_embeddings) within the engine's, or
        # a smaller one the operator set (--context-length)
        self.context_limit = min(self.max_context, info.get("max_position_embeddings") or self.max_context,
                                 context_length or self.max_context)
        # the most tokens (prompt + output) the KV cache holds for one request: more is a 400
        self.kv_capacity = info.get("kv_capacity") or self.context_limit
        self.limits = BodyLimits(max_request_bytes_ or max_request_bytes(self.context_limit))

    async def json_body(self, request: web.Request) -> dict:
        return await read_json(request, self.limits)

    def encode_text(self, text: str, field: str) -> list[int]:
        """The prompt text's token ids. Text is bounded before it is tokenized (a prompt of
        megabytes holds the event loop), and text that is not valid Unicode (a lone UTF-16
        surrogate, which JSON's \\u escapes allow) is the client's error, not a 500."""
        if len(text) > MAX_CHARS_PER_TOKEN * self.context_limit:
            raise BadRequest(f"{field} of {len(text)} characters exceeds the context length "
                             f"{self.context_limit} tokens", field)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise BadRequest(f"{field} is not valid Unicode text: {e.reason} at character {e.start}", field) \
                from None
        return self.codec.encode(text)

    def prompt_ids(self, ids, text, field: str = "input_ids") -> np.ndarray:
        """The prompt as a checked int32 array (what the engine process is sent)."""
        if ids is None:
            if text is None:
                raise BadRequest(f"one of {field} or text is required", field)
            if isinstance(text, list):
                if len(text) != 1:
                    raise BadRequest("batched text prompts are not supported; send one request each", field)
                text = text[0]
            if not isinstance(text, str):
                raise BadRequest("text must be a string", field)
            ids = self.encode_text(text, "text" if field == "input_ids" else field)
        if not isinstance(ids, list) or (ids and isinstance(ids[0], list)):
            raise BadRequest(f"{field} must be a flat list of integers", field)
        if not ids:
            raise BadRequest(f"{field} must not be empty", field)
        if len(ids) > self.context_limit:  # before any pass over the ids: they cannot be served
            raise BadRequest(f"prompt ({len(ids)} tokens) exceeds the context length {self.context_limit}", field)
        # C-level passes only (type set, one array conversion, min/max on the array): a per-token
        # Python loop costs ~0.1 ms for a 656-token prompt, and 256 requests arriving at once queue
        # behind it (the admission ramp); min/max over the list cost 0.5 ms at 16K tokens, the array
        # conversion the engine process needs anyway ~0.4 ms, so checking the array is ~free
        if set(map(type, ids)) != {int}:  # exact int: bool and float are rejected
            raise BadRequest(f"{field} must contain integers only", field)
        try:
            arr = np.fromiter(ids, dtype=np.int64, count=len(ids))
        except OverflowError:
            raise BadRequest(f"{field} holds a token id outside the vocabulary [0, {self.vocab})", field) from None
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.vocab:
            bad = lo if lo < 0 else hi
            raise BadRequest(f"token id {bad} is outside the vocabulary [0, {self.vocab})", field)
        return arr.astype(np.int32)

    def check_context(self, n_prompt: int, max_new: int, name: str) -> None:
        need = n_prompt + max_new
        if need > self.context_limit:
            raise BadRequest(f"prompt ({n_prompt} tokens) + {name} ({max_new}) = {need} tokens "
                             f"exceeds the context length {self.context_limit}", name)
        if need > self.kv_capacity:  # it could never run, even alone: refused, the engine serves on
            raise BadRequest(f"prompt ({n_prompt} tokens) + {name} ({max_new}) = {need} tokens exceeds the "
                             f"{self.kv_capacity} tokens this server's KV cache holds for one request", name)

    @property
    def request_limit(self) -> int:
        """The most tokens (prompt + output) one request may ask for."""
        return min(self.context_limit, self.kv_capacity)

    def check_hint(self, hint, n_ids: int) -> int | None:
        """The request's `shared_prefix_len` (GraniKV's extension field), checked against its prompt."""
        if hint is None:
            return None
        hint = as_int(hint, "shared_prefix_len", 0)
        if hint > n_ids:
            raise BadRequest("shared_prefix_len exceeds the prompt length", "shared_prefix_len")
        return hint
