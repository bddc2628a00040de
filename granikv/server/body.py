"""Request bodies -> JSON objects, with the work bounded before it is done.

The HTTP handlers share one event loop: whatever a handler does between two awaits stalls every
other client, /health and /metrics included. Parsing is the one step whose cost a client picks,
so it is bounded before it starts:
- size: the body may not exceed `BodyLimits.max_bytes` (413), which is derived from what a valid
  request can hold (`max_request_bytes`);
- shape: `json.loads` costs ~0.5 µs per object or array and nothing much per string byte or digit,
  so a body with more `{` and `[` bytes than `max_containers` (counted in C before parsing; an
  upper bound, since brackets inside strings count too) is refused before it is parsed: 16 MB of
  `[{},{},...]` would otherwise hold the loop for seconds;
- depth: the C parser raises RecursionError past Python's recursion limit (a 100,000-deep array):
  a 400, never a 500.
Strings that are not valid Unicode (a lone UTF-16 surrogate such as "\\ud800", which JSON allows
and Python decodes) are refused where text is tokenized (`RequestValidator.encode_text`, validation.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiohttp import web

from granikv.server.errors import ApiError, BadRequest

MAX_PROMPTS = 64  # prompts in one batched /v1/completions request
BYTES_PER_TOKEN_ID = 8  # "128255, " — a token id as the JSON of a list of ids
MIN_BODY_BYTES = 1 << 20  # 1 MiB: messages, stop strings and fields around the prompt
MAX_CONTAINERS = 1 << 18  # JSON objects + arrays a body may hold: ~0.1 s of parsing at most


def max_request_bytes(context_limit: int) -> int:
    """The largest body a valid request needs: a batch of `MAX_PROMPTS` prompts of token ids, each
    as long as the context, plus room for the other fields (text prompts of the same token counts
    are smaller: a token is a few characters)."""
    return MIN_BODY_BYTES + MAX_PROMPTS * context_limit * BYTES_PER_TOKEN_ID


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int
    max_containers: int = MAX_CONTAINERS


class BodyTooLarge(ApiError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"request body of {size} bytes exceeds this server's limit of {limit} bytes", 413,
                         code="request_too_large")


async def read_json(request: web.Request, limits: BodyLimits) -> dict:
    """The request's JSON object, or an ApiError (400 malformed, 413 too large)."""
    if request.content_length is not None and request.content_length > limits.max_bytes:
        raise BodyTooLarge(request.content_length, limits.max_bytes)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:  # chunked bodies: aiohttp counts as it reads
        raise BodyTooLarge(e.actual_size, limits.max_bytes) from None
    return parse_json(raw, limits)


def parse_json(raw: bytes, limits: BodyLimits) -> dict:
    if len(raw) > limits.max_bytes:
        raise BodyTooLarge(len(raw), limits.max_bytes)
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > limits.max_containers:
        raise BadRequest(f"request body holds more than {limits.max_containers} JSON objects and arrays "
                         f"({containers} '{{' and '[' bytes); split it into smaller requests")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise BadRequest(f"malformed JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body
