"""The client's stream reader: the meta_info-tail fast path reads what a full parse reads, for any
way the bytes are cut into reads; and the client-side microbenchmark that motivated it."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from granikv.server.app import sse_chunk
from harness.diagnostics import client_stream
from harness.run.client.metrics import RequestRecord
from harness.run.client.stream import parse_chunk, read_stream


def _meta(n: int, **kw) -> dict:
    return {"id": "r", "prompt_tokens": 7, "completion_tokens": n, "cached_tokens": 3, "finish_reason": None, **kw}


def _data(event: bytes) -> bytes:
    return event.strip()[len(b"data:"):].strip()


@pytest.mark.parametrize("text", ["", "plain", 'has "meta_info": {"completion_tokens": 99} inside',
                                  'quote \\" backslash \\\\ }', "ünïcødé \n newline"])
def test_the_tail_parse_reads_what_a_full_parse_reads(text):
    data = _data(sse_chunk(text, "1,2,3", _meta(3)))
    assert parse_chunk(data)["meta_info"] == json.loads(data)["meta_info"]


@pytest.mark.parametrize("data", [
    b'{"error": "boom"}',
    b'{"text": "a", "error": "first", "meta_info": {"completion_tokens": 1}}',     # error beside meta
    b'{"text": "a", "meta_info": {"completion_tokens": 1}, "error": "late"}',      # meta not last
    b'{"text": "a", "meta_info": {"x": {"meta_info": {"completion_tokens": 5}}}}',  # nested key
    b'{"text": "a", "output_ids": [1]}',                                            # no meta at all
    b'{"text": "a", "meta_info": {"prompt_tokens": 2}}',                            # no token count
])
def test_anything_else_falls_back_to_the_full_parse(data):
    assert parse_chunk(data) == json.loads(data)


def _stream(n: int, crlf: bool = False, done: bool = True) -> bytes:
    ids = []
    out = b": an SSE comment\n\n"
    for i in range(1, n + 1):
        ids.append(str(100 + i))
        out += sse_chunk(" t" * i, ",".join(ids), _meta(i))
    out += b"data: [DONE]\n\n" if done else b""
    return out.replace(b"\n", b"\r\n") if crlf else out


async def _read(pieces: list[bytes]) -> RequestRecord:
    loop = asyncio.get_running_loop()
    rd = client_stream._reader(loop)
    rec = RequestRecord(id="r", prompt_len=7, max_new_tokens=0)
    task = asyncio.ensure_future(read_stream(SimpleNamespace(content=rd), rec))
    for p in pieces:
        rd.feed_data(p)
        await asyncio.sleep(0)
    rd.feed_eof()
    await task
    return rec


def _cut(blob: bytes, cuts: list[int]) -> list[bytes]:
    cuts = sorted({c % (len(blob) + 1) for c in cuts} | {0, len(blob)})
    return [blob[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 12), cuts=st.lists(st.integers(0, 10**6), max_size=30), crlf=st.booleans())
def test_any_cut_of_the_bytes_into_reads_gives_the_same_record(n, cuts, crlf):
    blob = _stream(n, crlf)
    rec = asyncio.run(_read(_cut(blob, cuts)))
    assert rec.success, rec.error
    assert rec.output_tokens == n and sum(rec.chunk_tokens) == n and len(rec.chunk_times) == n
    assert (rec.prompt_tokens, rec.cached_tokens) == (7, 3)


def test_a_last_line_without_its_newline_still_counts():
    rec = asyncio.run(_read([_stream(2)[:-2]]))  # "data: [DONE]" with no line end
    assert rec.success and rec.output_tokens == 2


def test_a_stream_without_done_or_with_an_error_is_a_failure():
    rec = asyncio.run(_read([_stream(3, done=False)]))
    assert not rec.success and rec.error == "stream ended before [DONE]"
    rec = asyncio.run(_read([sse_chunk("a", "1", _meta(1)), b'data: {"error": "out of memory"}\n\n']))
    assert not rec.success and "out of memory" in rec.error


def test_client_stream_bench_reads_every_chunk(tmp_path):
    assert client_stream.main(["--batch", "3", "--output-len", "5", "--reps", "1",
                               "--out", str(tmp_path / "cs.json")]) == 0
    doc = json.loads((tmp_path / "cs.json").read_text())
    assert [r["streaming"] for r in doc["records"]] == ["cumulative", "incremental"]
    assert all(r["us_per_chunk"] > 0 and r["output_len"] == 5 for r in doc["records"])
