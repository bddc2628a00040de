"""The `openai` SDK, unmodified, against the CPU server started as a user starts it (conftest):
models, completions and chat (streamed and not, with usage), stop strings, n, batched
prompts, logprobs, and bad input raising the SDK's own error classes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from granikv.server.text import TextCodec

openai = pytest.importorskip("openai")  # a test dependency; absent on a bare GPU image (`-m gpu` collects this file)

TOKENS = 6
CODEC = TextCodec()  # the server's text <-> ids for the tiny model (no tokenizer: the id codec)


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def client(cpu_server):
    return openai.OpenAI(base_url=cpu_server.v1, api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def capabilities(cpu_server):
    return _get(cpu_server.url + "/get_model_info")


def _generate_ids(url: str, ids: list[int], n: int) -> list[int]:
    status, out = _post(url + "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": n}})
    assert status == 200, out
    return out["output_ids"]


def _render(ids: list[int]) -> str:
    return CODEC.decode(ids)  # the server's documented text for ids without a tokenizer


def _count(text: str) -> int:
    return len(CODEC.encode(text))  # tokens in the text


def test_the_server_says_which_kernel_path_it_runs(cpu_server):
    assert "on cpu: torch reference kernels" in cpu_server.ready_line


def test_models_list_and_retrieve(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_completions_greedy_is_bit_identical_to_generate(client, cpu_server):
    prompt = [5, 17, 300, 2, 9]
    ids = _generate_ids(cpu_server.url, prompt, TOKENS)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=TOKENS, temperature=0)
    assert r.choices[0].text == _render(ids)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (5, TOKENS, 5 + TOKENS)


def test_completions_stream_with_usage(client):
    full = client.completions.create(model="tiny", prompt="hello", max_tokens=TOKENS, temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt="hello", max_tokens=TOKENS, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == TOKENS and last.usage.prompt_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])


def _extra(obj, name):
    """A field the OpenAI schema lacks, as the SDK keeps it (pydantic extras)."""
    return (obj.model_extra or {}).get(name)


@pytest.mark.parametrize("stop", [None, "zzz"])
def test_return_token_ids_are_the_generated_ids(client, cpu_server, stop):
    """vLLM's `return_token_ids` (sent through the SDK's extra_body, as agent frameworks do): the
    ids are /generate's output_ids, whole in a response and in pieces over a stream (a stop string
    holding text back must not drop ids), with the prompt's ids once."""
    prompt = [3, 1, 4, 1, 5]
    ids = _generate_ids(cpu_server.url, prompt, TOKENS)
    kw = dict(model="tiny", prompt=prompt, max_tokens=TOKENS, temperature=0, extra_body={"return_token_ids": True})
    if stop:
        kw["stop"] = [stop]
    r = client.completions.create(**kw)
    assert _extra(r.choices[0], "token_ids") == ids and _extra(r.choices[0], "prompt_token_ids") == prompt
    chunks = [c for c in client.completions.create(stream=True, **kw) if c.choices]
    assert [t for c in chunks for t in (_extra(c.choices[0], "token_ids") or [])] == ids
    assert [_extra(c.choices[0], "prompt_token_ids") for c in chunks if _extra(c.choices[0], "prompt_token_ids")] \
        == [prompt]
    msgs = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=TOKENS, temperature=0,
                                          extra_body={"return_token_ids": True})
    assert len(_extra(chat.choices[0], "token_ids")) == TOKENS
    plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=TOKENS, temperature=0)
    assert _extra(plain.choices[0], "token_ids") is None  # only when asked
    status, out = _post(cpu_server.v1 + "/completions", {"model": "tiny", "prompt": prompt, "return_token_ids": "yes"})
    assert status == 400 and "return_token_ids" in json.dumps(out)


def test_chat_stream_and_not_with_usage(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=TOKENS, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == TOKENS
    assert _count(r.choices[0].message.content) == TOKENS
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_completion_tokens=TOKENS,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == TOKENS
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_stop_strings_cut_the_text_before_them(client):
    full = client.completions.create(model="tiny", prompt=[7, 8, 9], max_tokens=8, temperature=0).choices[0].text
    pieces = [_render([i]) for i in CODEC.encode(full)]
    stop = next(p for p in pieces[3:] if len(p) > 1)  # the 4th (or a later) token's text, of several characters
    expect = full[:full.index(stop)]
    r = client.completions.create(model="tiny", prompt=[7, 8, 9], max_tokens=8, temperature=0, stop=[stop, "zzz"])
    assert r.choices[0].text == expect and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens <= 8
    chunks = list(client.completions.create(model="tiny", prompt=[7, 8, 9], max_tokens=8, temperature=0,
                                            stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expect
    assert chunks[-1].choices[0].finish_reason == "stop"
    # a stop string that ends inside a token's text cuts inside it
    partial = stop[:-1]
    r = client.completions.create(model="tiny", prompt=[7, 8, 9], max_tokens=8, temperature=0, stop=partial)
    assert r.choices[0].text == full[:full.index(partial)]


def test_n_choices_and_batched_prompts(client):
    r = client.completions.create(model="tiny", prompt=[4, 5, 6], max_tokens=3, temperature=0, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.text for c in r.choices}) == 1  # greedy: the same choice three times
    assert r.usage.completion_tokens == 9 and r.usage.prompt_tokens == 3
    r = client.completions.create(model="tiny", prompt=["ab", "cde"], max_tokens=2, temperature=0, n=2)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 8
    single = client.completions.create(model="tiny", prompt="cde", max_tokens=2, temperature=0)
    assert {c.text for c in r.choices if c.index >= 2} == {single.choices[0].text}
    r = client.completions.create(model="tiny", prompt=[[1, 2], [3, 4, 5]], max_tokens=2, temperature=0)
    assert len(r.choices) == 2 and r.usage.prompt_tokens == 5
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                 max_tokens=3, temperature=0, n=2, stream=True,
                                                 stream_options={"include_usage": True}))
    per = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            per[ch.index] += ch.delta.content or ""
    assert per[0] == per[1] and _count(per[0]) == 3
    assert chunks[-1].usage.completion_tokens == 6


def test_echo_prepends_the_prompt(client):
    r = client.completions.create(model="tiny", prompt="abc", max_tokens=2, temperature=0, echo=True)
    assert r.choices[0].text.startswith("abc") and _count(r.choices[0].text[3:]) == 2


def test_logprobs(client, capabilities):
    if not capabilities["logprobs"]:
        with pytest.raises(openai.BadRequestError, match="logprobs"):
            client.completions.create(model="tiny", prompt=[1, 2], max_tokens=2, logprobs=2)
        pytest.skip("the engine does not report logprobs yet (get_model_info: logprobs false)")
    r = client.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=4, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert val <= 0 and len(top) == 3
        assert max(top.values()) == pytest.approx(val, abs=1e-4) and tok in top  # greedy picks the top token
    c = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "q"}], max_tokens=3,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_seeded_sampling_gives_choice_i_the_seed_plus_i(client, capabilities):
    if not capabilities["logprobs"]:
        pytest.skip("per-request seeds come with the sampling engine (get_model_info: logprobs false)")
    kw = dict(model="tiny", prompt=[3, 1, 4, 1, 5], max_tokens=6, temperature=1.0)
    r = client.completions.create(n=2, seed=11, **kw)
    a = client.completions.create(seed=11, **kw).choices[0].text
    b = client.completions.create(seed=12, **kw).choices[0].text
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == [a, b]


@pytest.mark.parametrize("kw,field", [
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": -1.0}, "frequency_penalty"),
    ({"n": 1000}, "n"),
    ({"best_of": 3}, "best_of"),
    ({"suffix": "end"}, "suffix"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"stop": ""}, "stop"),
])
def test_unsupported_or_bad_parameters_are_400s_naming_them(client, kw, field):
    args = {"model": "tiny", "prompt": [1, 2], "max_tokens": 2, **kw}
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(**args)
    assert field in str(ei.value)
    assert "max_new_tokens" not in str(ei.value)


def test_chat_refuses_tools_and_json_mode(client):
    msgs = [{"role": "user", "content": "x"}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, tools=[tool])
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2,
                                       response_format={"type": "json_object"})
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny", messages=[{"role": "robot", "content": "x"}], max_tokens=2)


def test_unknown_model_is_a_404_in_openai_shape(client, cpu_server):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="llama-9000", prompt="x", max_tokens=1)
    status, body = _post(cpu_server.v1 + "/chat/completions",
                         {"model": "llama-9000", "messages": [{"role": "user", "content": "x"}]})
    assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"


def test_context_limit_is_the_models_and_names_both_numbers(client, cpu_server):
    limit = _get(cpu_server.v1 + "/models")["data"][0]["max_model_len"]
    assert limit == 8192  # conf/model/tiny.yaml's max_position_embeddings (the engine's max_context is larger)
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="tiny", prompt=[1] * 8000, max_tokens=500)
    msg = str(ei.value)
    assert "8000" in msg and "500" in msg and "8192" in msg and "max_tokens" in msg


def test_null_fields_are_absent(cpu_server):
    status, body = _post(cpu_server.v1 + "/completions",
                         {"model": None, "prompt": [1, 2, 3], "max_tokens": None, "temperature": None,
                          "stream": None, "n": None, "stop": None, "logprobs": None, "seed": None, "top_p": None})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 16  # OpenAI's default max_tokens for completions
    status, body = _post(cpu_server.v1 + "/chat/completions",
                         {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                          "max_tokens": 2, "temperature": None, "stream": None, "stream_options": None})
    assert status == 200 and _count(body["choices"][0]["message"]["content"]) == 2
