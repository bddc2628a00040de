"""A streamed response read into its request's record: chunk times, token counts, output ids.

Why its own module, and why it is written for speed: one client process reads every chunk of
every stream of a run (B=512 at a ~20 ms step is ~25K chunks/s), so a per-chunk cost here caps
what the client can measure (harness/diagnostics/client_stream.py times it alone). The reader
splits each read's bytes itself and, for /generate, parses only a chunk's trailing `meta_info`.
"""

from __future__ import annotations

import json
import time

import aiohttp

from harness.run.client.metrics import RequestRecord

META_KEY = b'"meta_info":'


def parse_chunk(data: bytes) -> dict:
    """One `data:` event's object. The server (ours and SGLang's) puts `meta_info` last, after the
    cumulative text and ids, and the client needs only that: parsing just the tail keeps a chunk's
    cost flat as the output grows (harness/diagnostics/client_stream.py). The tail is trusted only
    when it is exactly the object's last value — a nested or quoted `"meta_info":` leaves it
    unbalanced, so it fails to parse — and no `"error":` key precedes it (inside a JSON string
    the quotes would be escaped, so text cannot fake either); else: a full parse."""
    i = data.rfind(META_KEY)
    if i > 0 and data.startswith(b'{"text":') and data.endswith(b"}") and data.find(b'"error":', 0, i) < 0:
        try:
            meta = json.loads(data[i + len(META_KEY):-1])
        except ValueError:
            meta = None
        if isinstance(meta, dict) and meta.get("completion_tokens") is not None:
            return {"meta_info": meta}
    obj = json.loads(data)
    return obj if isinstance(obj, dict) else {}


class GenerateEvents:
    """One stream's parse state, fed line by line (`data:` events, blank separators, comments)."""

    __slots__ = ("rec", "done", "last_completion", "content_chunks", "ids", "raw")
    KEEP_RAW = True  # /generate's ids are read from the raw chunks at the end

    def __init__(self, rec: RequestRecord, ids: list[int] | None = None) -> None:
        self.rec = rec
        self.done = False
        self.last_completion: int | None = None
        self.content_chunks = 0
        self.ids = ids              # the output ids go here (closed-loop sessions only)
        self.raw: list[bytes] = []  # with ids: every data chunk, read for its ids at the end

    def line(self, raw: bytes, now: float) -> bool:
        """Take one line received at `now`; True once the stream is over ([DONE], or an error)."""
        line = raw.strip()
        if not line.startswith(b"data:"):
            return False  # blank separators, SSE comments/other fields
        self.rec.end = now
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return True
        if self.ids is not None and self.KEEP_RAW:
            self.raw.append(data)
        return self.data(data, now)

    def data(self, data: bytes, now: float) -> bool:
        """One SGLang-native chunk (cumulative text; `meta_info` last, read from the tail)."""
        rec = self.rec
        obj = parse_chunk(data)
        if obj.get("error"):
            rec.error = f"server error in stream: {str(obj['error'])[:300]}"
            return True
        meta = obj.get("meta_info") or {}
        completion = meta.get("completion_tokens")
        if completion is not None:
            new = int(completion) - (self.last_completion or 0)
            self.last_completion = int(completion)
        else:
            has_content = bool(obj.get("text") or obj.get("output_ids"))
            new = 1 if has_content else 0
            self.content_chunks += new
        if new > 0:
            rec.chunk_times.append(now - rec.start)
            rec.chunk_tokens.append(new)
        if meta.get("prompt_tokens") is not None:
            rec.prompt_tokens = int(meta["prompt_tokens"])
        if meta.get("cached_tokens") is not None:
            rec.cached_tokens = int(meta["cached_tokens"])
        return False

    def finish(self) -> None:
        rec = self.rec
        if rec.error:
            return
        if not self.done:
            rec.error = "stream ended before [DONE]"
            return
        rec.output_tokens = self.last_completion if self.last_completion is not None else self.content_chunks
        if rec.output_tokens < 1 or not rec.chunk_times:
            rec.error = "no output tokens"
            return
        if self.ids is not None:
            got = self.output_ids()
            if got is None or len(got) != rec.output_tokens:
                rec.error = (f"the stream carried {0 if got is None else len(got)} output ids for "
                             f"{rec.output_tokens} tokens; a closed-loop session needs them all")
                return
            self.ids.extend(got)
        rec.success = True

    def output_ids(self) -> list[int] | None:
        """/generate's output ids: the last chunk's when chunks are cumulative (SGLang's default),
        else (incremental streaming) every chunk's, in order."""
        last = json.loads(self.raw[-1]) if self.raw else {}
        ids = last.get("output_ids") if isinstance(last, dict) else None
        if isinstance(ids, list) and len(ids) == self.rec.output_tokens:
            return [int(x) for x in ids]
        out: list[int] = []
        for data in self.raw:
            obj = json.loads(data)
            out += [int(x) for x in (obj.get("output_ids") or [] if isinstance(obj, dict) else [])]
        return out


class CompletionEvents(GenerateEvents):
    """An OpenAI `/v1/completions` stream. A chunk holds only its own text, so its size (and a full
    parse) stays flat as the output grows: no tail trick is needed to keep the reader cheap."""

    __slots__ = ("raw_ids",)
    KEEP_RAW = False  # each chunk is parsed whole as it comes: its ids are taken then

    def __init__(self, rec: RequestRecord, ids: list[int] | None = None) -> None:
        super().__init__(rec, ids)
        self.raw_ids: list[int] = []  # vLLM's `return_token_ids`: each chunk's `choices[0].token_ids`

    def output_ids(self) -> list[int] | None:
        return self.raw_ids

    def data(self, data: bytes, now: float) -> bool:
        rec = self.rec
        obj = json.loads(data)
        if not isinstance(obj, dict):
            return False
        if obj.get("error"):
            rec.error = f"server error in stream: {str(obj['error'])[:300]}"
            return True
        choices = obj.get("choices")
        if choices and isinstance(choices[0], dict) and choices[0].get("text"):
            rec.chunk_times.append(now - rec.start)
            rec.chunk_tokens.append(1)  # the chunk's token count is not sent; usage gives the total
            self.content_chunks += 1
        if self.ids is not None and choices and isinstance(choices[0], dict):
            self.raw_ids.extend(int(x) for x in choices[0].get("token_ids") or ())
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if usage.get("completion_tokens") is not None:
                self.last_completion = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                rec.prompt_tokens = int(usage["prompt_tokens"])
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                rec.cached_tokens = int(details["cached_tokens"])
        return False


async def read_stream(resp: aiohttp.ClientResponse, rec: RequestRecord, api: str = "generate",
                       ids: list[int] | None = None) -> None:
    """Consume `data: ...` events until `[DONE]`; fill chunk times and token counts (and, with
    `ids`, the output ids). Reads whatever bytes arrived (`iter_any`) and splits the lines itself:
    one await per read, not two per event (the data line and its blank separator)."""
    events = CompletionEvents(rec, ids) if api == "completions" else GenerateEvents(rec, ids)
    pending = b""
    async for piece in resp.content.iter_any():
        now = time.perf_counter()
        lines = (pending + piece if pending else piece).split(b"\n")
        pending = lines.pop()  # an unfinished line waits for the next read
        for raw in lines:
            if events.line(raw, now):
                return events.finish()
    if pending:  # the stream's last line, without a newline after it
        events.line(pending, time.perf_counter())
    events.finish()
