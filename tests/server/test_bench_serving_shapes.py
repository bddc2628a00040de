"""The request shapes SGLang's bench_serving sends (python/sglang/bench_serving.py), read back the
way it reads them: `sglang` (POST /generate with input_ids, sampling_params, stream), `sglang-oai`
(/v1/completions streamed, stream_options.include_usage) and `sglang-oai-chat`
(/v1/chat/completions streamed, text parts, max_completion_tokens). bench_serving first asks
/v1/models for a model id when none is given, and counts a request as failed without a chunk of
non-empty text."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from granikv.server.text import TextCodec

OUT = 7
CODEC = TextCodec()  # the server's text <-> ids for the tiny model (no tokenizer: the id codec)


async def _sse(session: aiohttp.ClientSession, url: str, payload: dict) -> list:
    events = []
    async with session.post(url, json=payload) as r:
        assert r.status == 200, await r.text()
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            body = line[5:].strip()
            events.append(body if body == "[DONE]" else json.loads(body))
    return events


def _run(coro):
    return asyncio.run(coro)


def test_sglang_backend(cpu_server):
    payload = {"input_ids": list(range(10, 60)), "sampling_params": {"temperature": 0.0, "max_new_tokens": OUT,
                                                                     "ignore_eos": True},
               "stream": True, "return_logprob": False, "logprob_start_len": -1, "lora_path": None}

    async def go():
        async with aiohttp.ClientSession() as s:
            return await _sse(s, cpu_server.url + "/generate", payload)

    ev = _run(go())
    assert ev[-1] == "[DONE]"
    chunks = ev[:-1]
    assert all(c["text"] for c in chunks)
    assert chunks[-1]["meta_info"]["completion_tokens"] == OUT and len(chunks[-1]["output_ids"]) == OUT


def test_sglang_oai_backend(cpu_server):
    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.get(cpu_server.v1 + "/models") as r:
                model = (await r.json())["data"][0]["id"]
            payload = {"model": model, "prompt": "The quick brown fox", "temperature": 0.0, "best_of": 1,
                       "max_tokens": OUT, "stream": True, "stream_options": {"include_usage": True},
                       "ignore_eos": True}
            return await _sse(s, cpu_server.v1 + "/completions", payload)

    ev = _run(go())
    assert ev[-1] == "[DONE]"
    text_chunks = [c for c in ev[:-1] if c["choices"]]
    assert text_chunks and all(c["choices"][0]["text"] for c in text_chunks)
    assert len(CODEC.encode("".join(c["choices"][0]["text"] for c in text_chunks))) == OUT
    assert ev[-2]["choices"] == [] and ev[-2]["usage"]["completion_tokens"] == OUT


def test_sglang_oai_chat_backend(cpu_server):
    async def go():
        async with aiohttp.ClientSession() as s:
            payload = {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text",
                                                                                  "text": "Tell me a story"}]}],
                       "temperature": 0.0, "max_completion_tokens": OUT, "stream": True,
                       "stream_options": {"include_usage": True}, "ignore_eos": True}
            return await _sse(s, cpu_server.v1 + "/chat/completions", payload)

    ev = _run(go())
    assert ev[-1] == "[DONE]"
    deltas = [c["choices"][0]["delta"].get("content") for c in ev[:-1] if c["choices"]]
    assert len(CODEC.encode("".join(d or "" for d in deltas))) == OUT
    assert ev[-2]["usage"]["completion_tokens"] == OUT


def test_concurrent_oai_streams_with_half_the_clients_leaving(cpu_server):
    """32 streams on /v1/completions, half of them dropped after their first chunk: the rest
    complete and the engine ends with nothing running and no live KV."""

    async def one(s, i):
        payload = {"prompt": list(range(100, 140)) + [i], "max_tokens": 24, "stream": True, "temperature": 0,
                   "ignore_eos": True}
        async with s.post(cpu_server.v1 + "/completions", json=payload) as r:
            n = 0
            async for raw in r.content:
                if raw.startswith(b"data:"):
                    n += 1
                    if i % 2 and n >= 2:
                        return None  # leave mid-stream
            return n

    async def go():
        async with aiohttp.ClientSession() as s:
            done = await asyncio.gather(*(one(s, i) for i in range(32)))
            for _ in range(200):
                async with s.get(cpu_server.url + "/server_info") as r:
                    info = await r.json()
                if info["running"] == 0 and info["waiting"] == 0 and info["storage"]["live_requests"] == 0:
                    break
                await asyncio.sleep(0.1)
            return done, info

    done, info = _run(go())
    assert all(n is not None and n >= 2 for i, n in enumerate(done) if i % 2 == 0)
    assert info["running"] == 0 and info["waiting"] == 0 and info["storage"]["live_requests"] == 0


def test_streamed_openai_chunks_are_plain_json_dumps(cpu_server):
    """The streamed chunks are written from a per-choice serialized head plus the delta: each data
    line must be exactly json.dumps of the object it parses to (same keys, order and escaping)."""
    prompts = {"/completions": {"prompt": "Quo \"vadis\" é\n", "logprobs": 2},
               "/chat/completions": {"messages": [{"role": "user", "content": "hi \u2603"}], "logprobs": True,
                                     "top_logprobs": 1}}

    async def go():
        lines = []
        async with aiohttp.ClientSession() as s:
            for path, body in prompts.items():
                payload = {"model": "tiny", "max_tokens": OUT, "temperature": 0.0, "stream": True, "n": 2, **body}
                async with s.post(cpu_server.v1 + path, json=payload) as r:
                    assert r.status == 200, await r.text()
                    async for raw in r.content:
                        line = raw.decode().rstrip("\n")
                        if line.startswith("data: ") and line != "data: [DONE]":
                            lines.append(line[6:])
        return lines

    lines = _run(go())
    assert len(lines) > 2 * OUT
    for line in lines:
        assert json.dumps(json.loads(line)) == line
