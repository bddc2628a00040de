"""The id codec (granikv.server.text) and its Hugging Face tokenizer files: the shipped files are
what the generator writes; the server's native codec and `AutoTokenizer` (transformers,
unmodified) on those files encode and decode alike; and through a real server, text built from
random ids is counted as those ids and the output text re-tokenizes to the reported completion
tokens (SGLang's bench_serving with `--tokenizer`, guidellm with `--processor`)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from granikv.server.text import DEFAULT_VOCAB_SIZE, HF_TOKENIZER_DIRS, TextCodec, hf_tokenizer_dir, write_hf_tokenizer

transformers = pytest.importorskip("transformers")  # test dependencies; absent on a bare GPU image
pytest.importorskip("tokenizers")

V = DEFAULT_VOCAB_SIZE
TINY = Path(__file__).resolve().parents[2] / "conf" / "model" / "tiny.yaml"
# text that exercises the literal rule: literal tokens, and look-alikes that are characters
SNIPPETS = ["<300>", "<unk>", "<1023>", "<1022>", "<256>", "<255>", "<99>", "<0300>", "<<300>>", "<un", "<3",
            "00>", "unk>", "<", ">", "\n", "\r\n", "\x00", "é", "\u20ac", "\U0001f600", "<\u0663\u0660\u0660>"]


def _hf(path) -> transformers.PreTrainedTokenizerBase:
    return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def hf():
    return _hf(hf_tokenizer_dir(V))


@pytest.fixture(scope="module")
def other_sizes(tmp_path_factory):
    """The native codec and the generated HF tokenizer of vocabularies other than the tiny's:
    none beyond <unk> (257), 3-digit literals (300) and 5-digit ones (10007)."""
    out = {}
    for v in (257, 300, 10007):
        d = write_hf_tokenizer(tmp_path_factory.mktemp(f"tok{v}"), v, 4096)
        out[v] = (TextCodec(vocab_size=v), _hf(d))
    return out


def _ids(v: int):
    # characters that can spell a literal ("<", digits, "unk", ">") drawn often, so that runs
    # like 60, 51, 48, 48, 62 come up
    spelled = st.sampled_from([60, 62, 48, 49, 50, 51, 53, 117, 110, 107])
    return st.lists(st.one_of(st.integers(0, v - 1), spelled, st.sampled_from([256 % v, v - 2, v - 1])),
                    max_size=40)


_text = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(SNIPPETS)), max_size=12).map("".join)


# -- (a) the shipped files are the generator's ------------------------------------------------------
def test_the_shipped_tokenizer_files_are_what_the_generator_writes(tmp_path):
    shipped = hf_tokenizer_dir(V)
    assert shipped == HF_TOKENIZER_DIRS[V] and shipped.is_absolute()
    tiny = yaml.safe_load(TINY.read_text())
    assert tiny["vocab_size"] == V
    write_hf_tokenizer(tmp_path, V, tiny["max_position_embeddings"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert json.loads((shipped / name).read_text()) == json.loads((tmp_path / name).read_text()), name
    # and the command line writes the same
    out = subprocess.run([sys.executable, "-m", "granikv.server.text", "--write-hf", str(tmp_path / "cli")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (shipped / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name


def test_the_shipped_tokenizer_is_what_benchmark_clients_need(hf):
    tiny = yaml.safe_load(TINY.read_text())
    # bench_serving's random datasets draw ids below tokenizer.vocab_size and decode them
    assert hf.vocab_size == len(hf) == tiny["vocab_size"]
    assert hf.model_max_length == tiny["max_position_embeddings"]
    # no special tokens: skip_special_tokens keeps every token's text, as the server's codec does
    assert hf.all_special_ids == [] and hf.decode([65, V - 1], skip_special_tokens=True) == "A<unk>"
    assert hf("ab<300>").input_ids == [97, 98, 300]  # no BOS/EOS added


def test_the_default_codec_is_the_tiny_models_and_points_at_the_shipped_files():
    c = TextCodec()
    assert c.vocab_size == V and c.incremental and c.chat_template is None
    assert c.path == str(hf_tokenizer_dir(V))
    assert TextCodec(None).path == c.path
    assert TextCodec(vocab_size=300).path is None  # nothing shipped for that vocabulary
    assert c.with_vocab_size(V) is c
    big = c.with_vocab_size(152064)
    assert big.vocab_size == 152064 and big.path is None
    assert big.encode("<152062><152063><1000000>") == [152062] + list(b"<152063><1000000>")
    assert big.decode([152063, 152062, 65]) == "<unk><152062>A"
    with pytest.raises(ValueError, match="257"):
        TextCodec(vocab_size=256)


def test_a_hugging_face_codec_is_kept_and_used(hf):
    c = TextCodec(tokenizer=hf_tokenizer_dir(V))
    assert c.tok is not None and not c.incremental and c.path == str(hf_tokenizer_dir(V))
    assert c.with_vocab_size(5000) is c
    assert c.encode("a<300>é\u20ac") == [97, 300, 233, V - 1] == TextCodec().encode("a<300>é\u20ac")
    assert TextCodec(tokenizer=hf).decode([300, 10]) == "<300>\n"


def test_ascii_text_encodes_to_its_bytes_as_before():
    c = TextCodec()
    for s in ("hello", "<|user|>\nhi\n<|assistant|>\n", "a < b > c", "<99> <x> <01>", ""):
        assert c.encode(s) == list(s.encode())


def test_literal_rule_examples(hf):
    c = TextCodec()
    cases = {
        "a<300>b": [97, 300, 98],
        "<<300>>": [60, 300, 62],
        "<unk>": [V - 1],
        "<1023>": list(b"<1023>"),  # V-1 is <unk>, not "<1023>"
        "<1022>": [1022],
        "<99>": list(b"<99>"),  # ids below 256 are characters
        "<255><256>": list(b"<255>") + [256],
        "<0300>": list(b"<0300>"),  # no leading zeros
        "<un<300>": [60, 117, 110, 300],
        "é\u20ac\U0001f600\n": [233, V - 1, V - 1, 10],  # beyond Latin-1: <unk>
        "<\u0663\u0660\u0660>": [60, V - 1, V - 1, V - 1, 62],  # Arabic-Indic digits are not digits here
    }
    for text, ids in cases.items():
        assert c.encode(text) == ids == hf.encode(text, add_special_tokens=False), text


def test_decode_edges():
    c = TextCodec()
    assert c.decode([]) == ""
    assert c.decode(np.array([104, 300, 1023])) == "h<300><unk>"
    assert c.decode([5000, 65]) == "<5000>A"  # beyond the vocabulary: no engine of it produces one
    with pytest.raises(ValueError, match="negative"):
        c.decode([300, -1])
    # the one way decode -> encode is not exact: character ids that spell a literal token
    spelled = [60, 51, 48, 48, 62]
    assert c.decode(spelled) == "<300>" and c.encode("<300>") == [300]


def test_the_id_codec_imports_neither_torch_nor_transformers():
    code = ("import sys; from granikv.server.text import TextCodec; c = TextCodec(); "
            "assert c.decode(c.encode('a<300>\\u20ac')) == 'a<300><unk>'; "
            "print(sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- (b) the native codec and AutoTokenizer agree ---------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(ids=_ids(V))
def test_decode_agrees_with_hf_and_round_trips(hf, ids):
    c = TextCodec()
    text = c.decode(ids)
    assert text == hf.decode(ids) == hf.decode(ids, skip_special_tokens=True) == c.decode(ids, True)
    again = c.encode(text)
    assert again == hf.encode(text, add_special_tokens=False)
    assert c.decode(again) == text  # the text always round-trips
    if 60 not in ids:  # no "<" among the characters: none spells a literal, the ids round-trip
        assert again == ids


@settings(max_examples=300, deadline=None)
@given(text=_text)
def test_encode_agrees_with_hf(hf, text):
    c = TextCodec()
    ids = c.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert all(0 <= i < V for i in ids)
    back = c.decode(ids)
    assert back == hf.decode(ids)
    assert c.encode(back) == ids  # characters beyond Latin-1 became <unk>, which stays <unk>
    if all(ord(ch) < 256 for ch in text):
        assert back == text


@settings(max_examples=100, deadline=None)
@given(data=st.data(), v=st.sampled_from([257, 300, 10007]))
def test_other_vocabulary_sizes_agree_with_their_generated_tokenizers(other_sizes, data, v):
    c, hf_v = other_sizes[v]
    ids = data.draw(_ids(v))
    text = c.decode(ids)
    assert text == hf_v.decode(ids)
    assert c.encode(text) == hf_v.encode(text, add_special_tokens=False)
    snippets = [f"<{v - 2}>", f"<{v - 1}>", f"<{v}>", "<256>", "<unk>", "<3000>"]
    text = "".join(data.draw(st.lists(st.one_of(st.text(max_size=4), st.sampled_from(snippets)), max_size=8)))
    assert c.encode(text) == hf_v.encode(text, add_special_tokens=False)


def test_long_random_prompts_agree_with_hf(hf):
    rng = random.Random(7)
    c = TextCodec()
    for n in (1, 1000, 8192):
        ids = [rng.randrange(V) for _ in range(n)]
        text = c.decode(ids)
        assert text == hf.decode(ids)
        assert c.encode(text) == hf.encode(text, add_special_tokens=False) == ids


# -- (c) incremental ------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(a=_ids(V), b=_ids(V))
def test_decode_is_concatenative(hf, a, b):
    c = TextCodec()
    assert c.incremental
    assert c.decode(a + b) == c.decode(a) + c.decode(b) == hf.decode(a) + hf.decode(b)


# -- (d) through a real server --------------------------------------------------------------------
N_OUT = 12


def _post(url: str, body: dict) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        return r.read()


def _events(raw: bytes) -> list[dict]:
    out = [line[5:].strip() for line in raw.decode().splitlines() if line.startswith("data:")]
    assert out[-1] == "[DONE]"
    return [json.loads(e) for e in out[:-1]]


@pytest.fixture(scope="module")
def served(cpu_server):
    with urllib.request.urlopen(cpu_server.url + "/get_model_info", timeout=60) as r:
        info = json.loads(r.read())
    return cpu_server, info


def test_model_info_names_the_shipped_tokenizer(served):
    _, info = served
    assert info["tokenizer_path"] == str(hf_tokenizer_dir(V))
    assert info["vocab_size"] == V


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("route", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_server_counts_equal_the_tokenizers(served, route, stream):
    """Text decoded from random ids by AutoTokenizer (as bench_serving's random datasets make
    prompts) is counted as those ids, and the output text re-encoded by AutoTokenizer has exactly
    the completion tokens the server reports (bench_serving's "retokenized" output length)."""
    srv, info = served
    tok = _hf(info["tokenizer_path"])
    rng = random.Random(f"{route}{stream}")
    ids = [rng.randrange(V) for _ in range(60)]
    prompt = tok.decode(ids)
    assert tok.encode(prompt, add_special_tokens=False) == ids
    if route == "/generate":
        body = {"text": prompt, "sampling_params": {"max_new_tokens": N_OUT, "temperature": 1.0}, "stream": stream}
        raw = _post(srv.url + route, body)
        out = _events(raw)[-1] if stream else json.loads(raw)  # streamed: cumulative text and ids
        meta = out["meta_info"]
        assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == N_OUT
        assert tok.encode(out["text"], add_special_tokens=False) == out["output_ids"]
        return
    chat = route.endswith("chat/completions")
    body = {"model": "tiny", "max_tokens": N_OUT, "temperature": 1.0, "stream": stream,
            **({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})}
    if stream:
        body["stream_options"] = {"include_usage": True}
        evs = _events(_post(srv.url + route, body))
        usage = evs[-1]["usage"]
        parts = [c["choices"][0]["delta"].get("content") if chat else c["choices"][0]["text"]
                 for c in evs if c["choices"]]
        text = "".join(p or "" for p in parts)
    else:
        r = json.loads(_post(srv.url + route, body))
        usage = r["usage"]
        text = r["choices"][0]["message"]["content"] if chat else r["choices"][0]["text"]
    assert usage["completion_tokens"] == N_OUT
    assert len(tok.encode(text, add_special_tokens=False)) == usage["completion_tokens"]
    if chat:  # the plain chat template around the prompt, tokenized alike
        from granikv.server.chat import plain_template

        templated = plain_template([{"role": "user", "content": prompt}])
        assert usage["prompt_tokens"] == len(tok.encode(templated, add_special_tokens=False))
    else:
        assert usage["prompt_tokens"] == len(ids)


def test_tokenizer_path_flag_serves_that_tokenizer(tmp_path):
    """`--tokenizer-path` (SGLang's flag) puts a Hugging Face tokenizer in front of the engine:
    /get_model_info names it, and text is counted by it."""
    from .conftest import start_server, stop_server

    d = write_hf_tokenizer(tmp_path / "tok", V, 8192)
    srv = start_server("--tokenizer-path", str(d))
    try:
        with urllib.request.urlopen(srv.url + "/get_model_info", timeout=60) as r:
            info = json.loads(r.read())
        assert info["tokenizer_path"] == str(d)
        tok = _hf(d)
        out = json.loads(_post(srv.url + "/generate", {"text": "ab<300>c", "sampling_params": {"max_new_tokens": 2}}))
        assert out["meta_info"]["prompt_tokens"] == len(tok.encode("ab<300>c", add_special_tokens=False)) == 4
    finally:
        stop_server(srv)


def test_a_tokenizer_path_without_a_tokenizer_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "granikv.server", "--model", "tiny", "--device", "cpu",
                          "--tokenizer-path", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no tokenizer.json" in out.stderr and "Traceback" not in out.stderr
