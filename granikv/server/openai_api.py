"""The OpenAI-compatible routes, as vLLM and SGLang serve them: /v1/models, /v1/completions and
/v1/chat/completions (streamed and not).

One OpenAI request becomes one engine request per choice: `n` choices per prompt, and
/v1/completions takes a batch of prompts (choice index = prompt index * n + i, as OpenAI
numbers them); with a `seed`, choice i samples with seed + i. Stop strings are the server's
(detok.py): a choice that meets one is cut before it, finishes with "stop", and its engine
request is aborted (its KV freed). A choice the engine ends on a stop token id or EOS
("stop") counts that token in `usage` but leaves its text out, as vLLM does. `usage` is on
every non-streamed answer and, with `stream_options.include_usage`, is the last chunk
(`choices: []`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from aiohttp import web

from granikv.server.body import MAX_PROMPTS
from granikv.server.chat import chat_prompt
from granikv.server.detok import ChoiceText
from granikv.server.errors import ApiError, BadRequest, openai_body, openai_response
from granikv.server.params import OpenAIRequest, get, parse_openai
from granikv.server.state import ServerState

if TYPE_CHECKING:
    from granikv.server.metrics import RequestTrace


@dataclass
class Prompt:
    ids: np.ndarray  # int32, checked
    text: str | None  # for `echo`: the prompt as the client sent it (None: decode the ids)


@dataclass
class Choice:
    index: int
    rid: str
    prompt: Prompt
    text: ChoiceText
    trace: RequestTrace
    tokens: int = 0
    cached: int = 0  # prompt tokens the engine found in its prefix cache (the last event's count)
    finish_reason: str | None = None
    logprobs: list = field(default_factory=list)  # (token id, logprob, top [(id, logprob)]) per token
    sent_logprobs: int = 0  # entries already streamed
    ids: list[int] = field(default_factory=list)  # every generated id, the stop token included (as /generate)
    sent_ids: int = 0  # ids already streamed (`return_token_ids`)
    done: bool = False
    chunk_head: str | None = None  # the serialized constant part of this choice's stream chunks


class OpenAIRoutes:
    """The /v1 routes over the server's shared state and checks (the native routes' too)."""

    def __init__(self, server: ServerState) -> None:
        self.s = server

    # -- models -----------------------------------------------------------------------------------
    def _card(self) -> dict:
        s = self.s
        return {"id": s.served_name, "object": "model", "created": int(s.started), "owned_by": "granikv",
                "root": s.model_path or s.model, "parent": None, "max_model_len": s.checks.context_limit}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._card()]})

    async def model(self, request: web.Request) -> web.Response:
        try:
            self._check_model(request.match_info["model"])
        except ApiError as e:
            return openai_response(e)
        return web.json_response(self._card())

    def _check_model(self, name) -> None:
        if name is None:
            return  # SGLang and vLLM serve their one model to a request that names none
        if not isinstance(name, str):
            raise BadRequest("model must be a string", "model")
        if name not in self.s.model_names:
            raise ApiError(f"The model `{name}` does not exist. This server serves `{self.s.served_name}`.",
                           404, "model", "model_not_found")

    # -- completions ------------------------------------------------------------------------------
    def _prompts(self, prompt) -> list[Prompt]:
        """A string, a list of token ids, or a batch of either."""
        if prompt is None:
            raise BadRequest("prompt is required", "prompt")
        if isinstance(prompt, str):
            batch = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            batch = prompt
        elif isinstance(prompt, list):
            batch = [prompt]  # one prompt of token ids (or malformed: prompt_ids says how)
        else:
            raise BadRequest("prompt must be a string, a list of token ids, or a list of either", "prompt")
        out = []
        for p in batch:
            if isinstance(p, str):
                out.append(Prompt(self.s.checks.prompt_ids(None, p, "prompt"), p))
            else:
                out.append(Prompt(self.s.checks.prompt_ids(p, None, "prompt"), None))
        if len(out) > MAX_PROMPTS:
            raise BadRequest(f"at most {MAX_PROMPTS} prompts per request, got {len(out)}", "prompt")
        return out

    async def completions(self, request: web.Request) -> web.StreamResponse:
        with self.s.tracked():
            return await self._completions(request)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self.s.checks.json_body(request)
            self._check_model(body.get("model"))
            req = parse_openai(body, chat=False, logprobs_supported=self.s.logprobs_supported, default_max=16)
            prompts = self._prompts(body.get("prompt"))
            hint = get(body, "shared_prefix_len")
            for p in prompts:
                self.s.checks.check_hint(hint, len(p.ids))
        except ApiError as e:
            return openai_response(e)
        return await self._run(request, "cmpl", prompts, req, hint)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        with self.s.tracked():
            return await self._chat(request)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self.s.checks.json_body(request)
            self._check_model(body.get("model"))
            req = parse_openai(body, chat=True, logprobs_supported=self.s.logprobs_supported, default_max=None)
            ids, _ = chat_prompt(body.get("messages"), self.s.codec,
                                 lambda text: self.s.checks.encode_text(text, "messages"))
            prompts = [Prompt(self.s.checks.prompt_ids(ids, None, "messages"), None)]
        except ApiError as e:
            return openai_response(e)
        return await self._run(request, "chatcmpl", prompts, req, None)

    # -- one request, all its choices ------------------------------------------------------------
    async def _run(self, request: web.Request, kind: str, prompts: list[Prompt], req: OpenAIRequest,
                   hint: int | None) -> web.StreamResponse:
        s = self.s
        chat = kind == "chatcmpl"
        base = f"{kind}-{uuid.uuid4().hex}"
        created = int(time.time())
        choices: list[Choice] = []
        try:
            plans = []
            for p in prompts:
                # no max_tokens (chat's default): the rest of what the context and the KV cache hold
                max_new = req.max_tokens if req.max_tokens is not None else s.checks.request_limit - len(p.ids)
                s.checks.check_context(len(p.ids), max(max_new, 1), req.max_tokens_name)
                plans.append((p, max_new))
            s.check_alive()
        except ApiError as e:
            return openai_response(e)
        queues = []
        for pi, (p, max_new) in enumerate(plans):
            for i in range(req.n):
                idx = pi * req.n + i
                c = Choice(idx, f"{base}-{idx}", p, ChoiceText(s.codec, req.stop, req.skip_special_tokens),
                           s.metrics.trace(len(p.ids)))
                choices.append(c)
                queues.append(s.loop.submit(c.rid, p.ids, req.choice_params(i, max_new), hint))
        head = {"id": base, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": s.served_name}
        resp = None
        try:
            if req.stream:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
                await resp.prepare(request)
                for c in choices:  # the role first, as OpenAI's stream does; echo's prompt text first
                    if chat:
                        await _send(resp, {**head, "choices": [{"index": c.index, "delta": {"role": "assistant",
                                                                                            "content": ""},
                                                                "logprobs": None, "finish_reason": None}]})
                    elif req.echo:
                        await _send(resp, {**head, "choices": [{"index": c.index, "text": self._echo(c.prompt),
                                                                "logprobs": None, "finish_reason": None}]})
            failed = None
            async with contextlib.aclosing(_merged(choices, queues)) as arrivals:
                async for c, evs in arrivals:
                    err = next((e.error for e in evs if e.error), None)
                    if err is not None:
                        for o in choices:
                            if not o.done and o is not c:
                                s.loop.abort(o.rid)
                            o.done = True
                        failed = s.event_failure(err)
                        break
                    self._consume(c, evs)
                    if resp is not None:
                        await self._stream_choice(resp, head, c, chat, req)
            if failed is not None:
                if resp is None:
                    return openai_response(failed)
                await _send(resp, openai_body(failed))  # the headers are out: the error is an event
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            if resp is None:
                return web.json_response(self._final(base, created, choices, chat, req))
            if req.include_usage:
                await _send(resp, {**head, "choices": [], "usage": _usage(choices)})
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except BaseException:
            for c in choices:  # the client went away (or the handler failed): free the rest
                if not c.done:
                    s.loop.abort(c.rid)
            raise

    def _echo(self, p: Prompt) -> str:
        return p.text if p.text is not None else self.s.codec.decode(p.ids.tolist())

    def _consume(self, c: Choice, evs) -> None:
        """Fold one batch of engine events into the choice's state."""
        toks = [e.token for e in evs if e.token is not None]
        last = evs[-1]
        c.tokens += len(toks)
        c.ids.extend(toks)
        c.cached = last.cached_tokens
        c.trace.tokens(len(toks))
        text_toks = toks
        if last.finished and last.finish_reason == "stop" and toks:
            text_toks = toks[:-1]  # the stop token / EOS: counted, not shown
        for e in evs:
            if e.token is not None and e.logprob is not None:
                c.logprobs.append((e.token, e.logprob, e.top_logprobs or []))
        c.text.add(text_toks)
        if c.text.stopped and not last.finished:
            self.s.loop.abort(c.rid)  # the stop string ended it: free its KV now
            c.finish_reason = "stop"
            c.done = True
        elif last.finished:
            c.finish_reason = "stop" if c.text.stopped else last.finish_reason
            c.done = True
        if c.done:
            c.trace.finish(c.finish_reason)

    def _logprobs(self, c: Choice, entries: list, chat: bool, offset0: int = 0):
        dec = self.s.codec.decode
        if chat:
            def item(t, lp):
                tok = dec([t])
                return {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8"))}
            return {"content": [{**item(t, lp), "top_logprobs": [item(a, alp) for a, alp in top]}
                                for t, lp, top in entries]}
        tokens = [dec([t]) for t, _, _ in entries]
        offsets, o = [], offset0
        for tok in tokens:
            offsets.append(o)
            o += len(tok)
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [{dec([a]): alp for a, alp in top} for _, _, top in entries],
                "text_offset": offsets}

    async def _stream_choice(self, resp, head: dict, c: Choice, chat: bool, req: OpenAIRequest) -> None:
        delta = c.text.delta(final=c.done)
        lp = None
        if req.logprobs is not None and (delta or c.done):
            entries = c.logprobs[c.sent_logprobs:]
            lp = self._logprobs(c, entries, chat, c.text.sent - len(delta))
            c.sent_logprobs = len(c.logprobs)
        if delta:
            # one chunk per engine step and request (11K a second at B=256): the chunk's constant
            # part is serialized once per choice, and only the delta, logprobs and finish reason per
            # chunk; the bytes are the same JSON as json.dumps of the whole chunk
            if c.chunk_head is None:
                c.chunk_head = (f'data: {json.dumps(head)[:-1]}, "choices": [{{"index": {c.index}, '
                                + ('"delta": {"content": ' if chat else '"text": '))
            fr = None if chat or not c.done else c.finish_reason
            await resp.write((f'{c.chunk_head}{json.dumps(delta)}{"}" if chat else ""}, "logprobs": '
                              f'{"null" if lp is None else json.dumps(lp)}, "finish_reason": '
                              f'{"null" if fr is None else json.dumps(fr)}{self._ids_part(c, req)}}}]}}\n\n')
                             .encode())
            self.s.chunks_sent += 1
        if c.done and (chat or not delta):
            ch = {"index": c.index, "finish_reason": c.finish_reason, "logprobs": None}
            ch.update({"delta": {}} if chat else {"text": ""})
            if req.return_token_ids:  # ids a held-back text (stop-string match, partial UTF-8) left unsent
                if c.sent_ids == 0:
                    ch["prompt_token_ids"] = c.prompt.ids.tolist()
                ch["token_ids"] = c.ids[c.sent_ids:]
                c.sent_ids = len(c.ids)
            await _send(resp, {**head, "choices": [ch]})

    @staticmethod
    def _ids_part(c: Choice, req: OpenAIRequest) -> str:
        """The `token_ids` member of a streamed choice: the ids since the last chunk (a chunk is sent
        only when text is, so ids whose text is held back ride with the next chunk); the prompt's
        ids with the choice's first chunk, as vLLM streams them."""
        if not req.return_token_ids:
            return ""
        part = ""
        if c.sent_ids == 0:
            part = f', "prompt_token_ids": [{",".join(map(str, c.prompt.ids.tolist()))}]'
        part += f', "token_ids": [{",".join(map(str, c.ids[c.sent_ids:]))}]'
        c.sent_ids = len(c.ids)
        return part

    def _final(self, base: str, created: int, choices: list[Choice], chat: bool, req: OpenAIRequest) -> dict:
        out = []
        for c in choices:
            text = c.text.delta(final=True)
            lp = None
            if req.logprobs is not None:
                lp = self._logprobs(c, c.logprobs, chat)
            if chat:
                out.append({"index": c.index, "message": {"role": "assistant", "content": text},
                            "logprobs": lp, "finish_reason": c.finish_reason})
            else:
                if req.echo:
                    text = self._echo(c.prompt) + text
                out.append({"index": c.index, "text": text, "logprobs": lp, "finish_reason": c.finish_reason})
            if req.return_token_ids:
                out[-1].update({"prompt_token_ids": c.prompt.ids.tolist(), "token_ids": list(c.ids)})
        return {"id": base, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": self.s.served_name, "choices": out, "usage": _usage(choices)}


def _usage(choices: list[Choice]) -> dict:
    seen: set[int] = set()
    prompt = 0
    for c in choices:  # a prompt counts once, however many choices it has
        if id(c.prompt) not in seen:
            seen.add(id(c.prompt))
            prompt += len(c.prompt.ids)
    done = sum(c.tokens for c in choices)
    # OpenAI's `prompt_tokens_details.cached_tokens` (vLLM and SGLang report it too): prompt tokens
    # whose KV was reused from the prefix cache, once per prompt (the most any of its choices found)
    per_prompt: dict[int, int] = {}
    for c in choices:
        per_prompt[id(c.prompt)] = max(per_prompt.get(id(c.prompt), 0), c.cached)
    cached = sum(per_prompt.values())
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def _send(resp: web.StreamResponse, obj: dict) -> None:
    await resp.write(f"data: {json.dumps(obj)}\n\n".encode())


def _drain(q: asyncio.Queue, ev) -> list:
    """The event and whatever else already queued behind it, up to its request's end."""
    evs = [ev]
    while not q.empty() and not (evs[-1].finished or evs[-1].error):
        evs.append(q.get_nowait())
    return evs


async def _merged(choices: list[Choice], queues: list[asyncio.Queue]):
    """(choice, events) as they arrive over all the choices' queues, until every choice is done."""
    if len(queues) == 1:  # the common case, without a task per wait
        c, q = choices[0], queues[0]
        while not c.done:
            yield c, _drain(q, await q.get())
        return
    waits = {asyncio.ensure_future(q.get()): i for i, q in enumerate(queues)}
    try:
        while waits:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for t in sorted(done, key=waits.get):
                i = waits.pop(t)
                yield choices[i], _drain(queues[i], t.result())
                if not choices[i].done:
                    waits[asyncio.ensure_future(queues[i].get())] = i
                if all(c.done for c in choices):
                    return
    finally:
        for t in waits:
            t.cancel()
