"""Workload files: determinism, ShareGPT filters, exact prefixes, prefix assignment, ladders."""

from __future__ import annotations

import json
import time
from dataclasses import fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.run.workloads import cli as workloads_cli
from harness.run.workloads import sharegpt
from harness.run.workloads.build import build, generate, write
from harness.run.workloads.config import HETERO_LADDERS, KINDS, WorkloadConfig
from harness.run.workloads.naming import workload_filename
from harness.run.workloads.requests import WorkloadRequest, read, read_workload
from harness.run.workloads.streams import unit_arrivals
from harness.run.workloads.tokenizer import Cl100kTokenizer, load_tokenizer

CONF = Path(__file__).resolve().parents[3] / "conf" / "workload"


@pytest.fixture(scope="module")
def cl100k() -> Cl100kTokenizer:
    return Cl100kTokenizer()


@pytest.fixture(scope="module")
def fake_dataset(tmp_path_factory, cl100k) -> tuple[str, dict[str, int]]:
    """A small ShareGPT-shaped file, cut off mid-record like the packaged one.

    Returns the path and, for every conversation that qualifies as a candidate (>= 2 turns,
    turn 0 from the user), its id -> token count of turn 0.
    """
    convs = []
    eligible: dict[str, int] = {}
    for i in range(400):
        n = 1 + (i * 37) % 700  # token counts 1..700, several outside [16, 512]
        text = "the" + " the" * (n - 1)
        assert len(cl100k.encode(text)) == n
        opener = "gpt" if i % 7 == 3 else "human"
        turns = [{"from": opener, "value": text}]
        if i % 5 != 4:
            turns.append({"from": "gpt" if opener == "human" else "human", "value": "ok"})
        convs.append({"id": f"c{i}", "conversations": turns})
        if len(turns) >= 2 and opener == "human":
            eligible[f"c{i}#{i}"] = n
    text = json.dumps(convs, indent=2)
    cut = text[: len(text) - 40]  # truncated inside the last record
    path = tmp_path_factory.mktemp("sharegpt") / "fake_sharegpt.json"
    path.write_text(cut)
    eligible.pop("c399#399", None)  # the cut-off record
    return str(path), eligible


def _cfg(kind: str, fake: str | None = None, **kw) -> WorkloadConfig:
    if fake is not None:
        kw.setdefault("dataset_path", fake)
    return WorkloadConfig.for_kind(kind, **kw)


# ----------------------------------------------------------------------------- determinism


def test_same_config_gives_byte_identical_files(tmp_path, fake_dataset):
    path, _ = fake_dataset
    cfg = _cfg("sharegpt", path, lp=200, num_requests=100)
    a = write(cfg, tmp_path / "a.jsonl").read_bytes()
    b = write(cfg, tmp_path / "b.jsonl").read_bytes()
    assert a == b
    c = write(_cfg("sharegpt", path, lp=200, num_requests=100, seed=7), tmp_path / "c.jsonl").read_bytes()
    assert c != a
    for kind in ("burst", "multiprefix", "hetero"):
        cfg = _cfg(kind, path, lp=64, num_requests=24, vocab_size=1024,
                   **({"lps": (8, 16, 32, 64)} if kind == "hetero" else {}))
        x = write(cfg, tmp_path / f"{kind}1.jsonl").read_bytes()
        y = write(cfg, tmp_path / f"{kind}2.jsonl").read_bytes()
        assert x == y, kind


def test_round_trip_and_header(tmp_path, fake_dataset):
    path, _ = fake_dataset
    cfg = _cfg("multiprefix", path, lp=32, k=4, num_requests=20, vocab_size=1024)
    out = write(cfg, tmp_path / "w.jsonl")
    back = read_workload(out)
    assert back.requests == generate(cfg)
    h = back.header
    assert WorkloadConfig.from_dict(h["config"]) == cfg
    assert h["tokenizer"] == "cl100k" and h["vocab_size"] == 1024 and h["id_mapping"] == "id % vocab_size"
    assert h["prefix_lengths"] == [32] * 4 and h["num_requests"] == 20
    assert h["dataset"]["truncated"] is True
    assert read(out) == back.requests


# ----------------------------------------------------------------------------- ShareGPT


def test_sharegpt_filter_on_controlled_dataset(fake_dataset, cl100k):
    path, eligible = fake_dataset
    cfg = _cfg("sharegpt", path, lp=0, num_requests=120)
    reqs = generate(cfg)
    assert len(reqs) == 120
    sources = [r.source for r in reqs]
    assert len(set(sources)) == 120
    for r in reqs:
        assert r.source in eligible  # >= 2 turns, turn 0 from the user, complete record
        n = eligible[r.source]
        assert 16 <= n <= 512
        assert len(r.input_ids) == n and r.shared_prefix_len == 0 and r.prefix_id is None
    # Not enough qualifying turns is an error, not a silently short workload.
    qualifying = sum(16 <= n <= 512 for n in eligible.values())
    with pytest.raises(ValueError, match="user turns"):
        generate(_cfg("sharegpt", path, lp=0, num_requests=qualifying + 1))


def test_sharegpt_bounds_are_inclusive_and_configurable(fake_dataset):
    path, eligible = fake_dataset
    reqs = generate(_cfg("sharegpt", path, lp=0, num_requests=20, min_turn_tokens=100,
                            max_turn_tokens=200))
    assert {len(r.input_ids) for r in reqs} <= set(range(100, 201))
    exact = [n for n in eligible.values() if n == 38]
    if exact:
        only = generate(_cfg("sharegpt", path, lp=0, num_requests=len(exact),
                                min_turn_tokens=38, max_turn_tokens=38))
        assert all(len(r.input_ids) == 38 for r in only)


@pytest.fixture(scope="module")
def real_sharegpt(tmp_path_factory):
    """The paper's ShareGPT workload from the packaged dataset (small Lp to keep it light)."""
    cfg = WorkloadConfig.for_kind("sharegpt", lp=256)
    t0 = time.perf_counter()
    path = write(cfg, tmp_path_factory.mktemp("real") / workload_filename(cfg))
    print(f"\n[timing] sharegpt workload, 500 turns, written in {time.perf_counter() - t0:.2f} s")
    return cfg, path


def test_real_sharegpt_500_turns(real_sharegpt, cl100k):
    cfg, path = real_sharegpt
    w = read_workload(path)
    assert len(w.requests) == 500
    assert w.header["dataset"]["name"] == "ShareGPT_V3_unfiltered_cleaned_split.json"
    assert w.header["dataset"]["conversations_parsed"] > 500
    prefix = w.requests[0].input_ids[:256]
    for r in w.requests:
        assert r.input_ids[:256] == prefix and r.shared_prefix_len == 256
        assert 16 <= len(r.input_ids) - 256 <= 512
        assert r.output_len == 256 and r.arrival["process"] == "poisson"
    assert len({r.source for r in w.requests}) == 500
    # The suffix is the tokenized user turn, verbatim.
    r0 = w.requests[0]
    assert len(r0.input_ids) - 256 == len(r0.input_ids[256:])


def test_real_sharegpt_is_byte_identical(real_sharegpt, tmp_path):
    cfg, path = real_sharegpt
    again = write(cfg, tmp_path / "again.jsonl")
    assert again.read_bytes() == Path(path).read_bytes()


def test_parse_truncated_array():
    items, truncated = sharegpt._parse_json_array_prefix('[{"a": 1}, {"b": [2, 3]}]')
    assert items == [{"a": 1}, {"b": [2, 3]}] and truncated is False
    items, truncated = sharegpt._parse_json_array_prefix('[\n {"a": 1},\n {"b": [2, 3')
    assert items == [{"a": 1}] and truncated is True


# ----------------------------------------------------------------------------- prefixes


@pytest.mark.parametrize("lp", [1, 300, 2048])
def test_prefix_is_exactly_lp_and_identical(fake_dataset, cl100k, lp):
    path, _ = fake_dataset
    reqs = generate(_cfg("sharegpt", path, lp=lp, num_requests=30))
    prefix = reqs[0].input_ids[:lp]
    assert len(prefix) == lp
    pool = set(cl100k.word_ids())
    assert set(prefix) <= pool  # plain word tokens, never special tokens
    for r in reqs:
        assert r.shared_prefix_len == lp and r.prefix_id == "p0"
        assert r.input_ids[:lp] == prefix


def test_vocab_size_maps_ids_into_range(fake_dataset):
    path, _ = fake_dataset
    plain = generate(_cfg("sharegpt", path, lp=128, num_requests=10))
    small = generate(_cfg("sharegpt", path, lp=128, num_requests=10, vocab_size=1024))
    for a, b in zip(plain, small):
        assert b.input_ids == [x % 1024 for x in a.input_ids]
        assert max(b.input_ids) < 1024
    assert all(max(r.input_ids) < 100277 for r in plain)


def test_synthetic_burst(fake_dataset):
    path, _ = fake_dataset
    cfg = _cfg("burst", path, lp=64, num_requests=32, suffix_len=48, vocab_size=1024)
    assert cfg.arrival == "burst" and cfg.suffix == "synthetic"
    reqs = generate(cfg)
    assert len(reqs) == 32
    for r in reqs:
        assert len(r.input_ids) == 64 + 48 and r.shared_prefix_len == 64
        assert r.arrival == {"process": "burst", "t_unit": 0.0}
        assert r.arrival_offset(5.0) == 0.0 and r.arrival_offset(float("inf")) == 0.0
    assert len({tuple(r.input_ids[64:]) for r in reqs}) == 32  # distinct suffixes


@pytest.mark.parametrize("k", [1, 4, 16, 64])
def test_multiprefix_assignment_is_i_mod_k(k):
    cfg = WorkloadConfig.for_kind("multiprefix", k=k, lp=40, num_requests=2 * k + 3, suffix="synthetic",
                                  suffix_len=8, vocab_size=1024)
    reqs = generate(cfg)
    by_class: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        assert r.prefix_id == f"p{i % k}" and r.shared_prefix_len == 40
        by_class.setdefault(r.prefix_id, r.input_ids[:40])
        assert r.input_ids[:40] == by_class[r.prefix_id]
    assert len(by_class) == k
    firsts = [p[0] for p in by_class.values()]
    assert len(set(firsts)) == k  # distinct from the first token, even after id % 1024


def test_hetero_ladders():
    assert HETERO_LADDERS[4] == (2048, 4096, 8192, 16384) and sum(HETERO_LADDERS[4]) == 30720
    ladder8 = HETERO_LADDERS[8]
    assert ladder8[0] == 1024 and ladder8[-1] == 16384 and list(ladder8) == sorted(set(ladder8))
    assert sum(ladder8) == 53248  # the paper's "53.2K slab tokens"
    assert WorkloadConfig.for_kind("hetero").lps == HETERO_LADDERS[4]
    assert WorkloadConfig.for_kind("hetero", k=8).lps == ladder8
    with pytest.raises(ValueError):
        WorkloadConfig.for_kind("hetero", k=5)
    with pytest.raises(ValueError):
        WorkloadConfig.for_kind("hetero", k=4, lps=(1, 2))


@pytest.mark.parametrize("k", [4, 8])
def test_hetero_requests_cycle_through_the_ladder(k):
    cfg = WorkloadConfig.for_kind("hetero", k=k, num_requests=2 * k, suffix="synthetic", suffix_len=4,
                                  vocab_size=1024)
    reqs = generate(cfg)
    for i, r in enumerate(reqs):
        lp = HETERO_LADDERS[k][i % k]
        assert r.shared_prefix_len == lp and r.prefix_id == f"p{i % k}" and len(r.input_ids) == lp + 4
        assert r.input_ids[:lp] == reqs[i % k].input_ids[:lp]
    assert len({r.input_ids[0] for r in reqs[:k]}) == k


def test_poisson_unit_arrivals():
    t = unit_arrivals(4000, "poisson", 42)
    assert t[0] == 0.0 and all(b >= a for a, b in zip(t, t[1:]))
    mean_gap = t[-1] / (len(t) - 1)
    assert 0.9 < mean_gap < 1.1  # Exp(1) gaps
    assert unit_arrivals(4000, "poisson", 42) == t
    assert unit_arrivals(5, "burst", 42) == [0.0] * 5
    r = WorkloadRequest(id="x", input_ids=[1], prefix_id=None, shared_prefix_len=0, output_len=1,
                   arrival={"process": "poisson", "t_unit": t[10]})
    assert r.arrival_offset(4.0) == t[10] / 4.0
    assert r.arrival_offset(float("inf")) == 0.0


# ----------------------------------------------------------------------------- config


def test_file_names():
    assert workload_filename(WorkloadConfig.for_kind("sharegpt", vocab_size=128256)) == \
        "sharegpt-lp16384-n500-v128256.jsonl"
    assert workload_filename(WorkloadConfig.for_kind("sharegpt")) == "sharegpt-lp16384-n500-v100277.jsonl"
    assert workload_filename(WorkloadConfig.for_kind("multiprefix", k=16, vocab_size=1024)) == \
        "multiprefix-k16-lp8192-n500-v1024.jsonl"
    assert workload_filename(WorkloadConfig.for_kind("hetero")).startswith(
        "hetero-k4-lp2048_4096_8192_16384-n512-")
    variants = [
        WorkloadConfig.for_kind("sharegpt"),
        WorkloadConfig.for_kind("sharegpt", seed=1),
        WorkloadConfig.for_kind("sharegpt", output_len=128),
        WorkloadConfig.for_kind("sharegpt", arrival="burst"),
        WorkloadConfig.for_kind("sharegpt", max_turn_tokens=1024),
        WorkloadConfig.for_kind("sharegpt", dataset_path="/x.json"),
        WorkloadConfig.for_kind("burst"),
        WorkloadConfig.for_kind("burst", suffix_len=64),
    ]
    names = [workload_filename(c) for c in variants]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("kind", KINDS)
def test_conf_yaml_mirrors_the_dataclass(kind):
    raw = OmegaConf.to_container(OmegaConf.load(CONF / f"{kind}.yaml"), resolve=True)
    assert set(raw) == {f.name for f in fields(WorkloadConfig)}
    assert WorkloadConfig.from_dict(raw) == WorkloadConfig.for_kind(kind)
    with pytest.raises(ValueError, match="unknown"):
        WorkloadConfig.from_dict({**raw, "lpp": 1})


def test_invalid_configs():
    with pytest.raises(ValueError):
        WorkloadConfig.for_kind("sharegpt", k=4)
    with pytest.raises(ValueError):
        WorkloadConfig.for_kind("multiprefix", lps=(1, 2))
    with pytest.raises(ValueError):
        WorkloadConfig(kind="nope")
    with pytest.raises(ValueError):
        WorkloadConfig.for_kind("sharegpt", min_turn_tokens=600)


# ----------------------------------------------------------------------------- tokenizer, CLI


def _tiny_hf_tokenizer(tmp_path: Path) -> Path:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    words = [f"{a}{b}{c}" for a in "bcdfg" for b in "aeiou" for c in "lmnprst"]
    corpus = [" ".join(words[i:] + words[:i]) for i in range(0, len(words), 7)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=600, min_frequency=1, special_tokens=["<s>", "</s>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>")
    out = tmp_path / "tiny-tok"
    tok.save_pretrained(out)
    return out


def test_local_hf_tokenizer_is_used(tmp_path, fake_dataset, capsys):
    path, eligible = fake_dataset
    tok_dir = _tiny_hf_tokenizer(tmp_path)
    tok = load_tokenizer(str(tok_dir))
    assert tok.name == "tiny-tok"
    cfg = _cfg("sharegpt", path, lp=50, num_requests=5, tokenizer_path=str(tok_dir), min_turn_tokens=1,
               max_turn_tokens=100000)
    w = build(cfg)
    assert w.header["tokenizer"] == "tiny-tok" and w.header["n_vocab"] == tok.n_vocab
    for r in w.requests:
        assert max(r.input_ids) < tok.n_vocab
        n = eligible[r.source]
        assert r.input_ids[50:] == tok.encode("the" + " the" * (n - 1))  # counted with this tokenizer
    assert "toktiny-tok" in workload_filename(cfg)
    # A tokenizer path that does not exist falls back to cl100k_base, loudly.
    assert load_tokenizer(str(tmp_path / "missing")).name == "cl100k"
    assert "not found" in capsys.readouterr().err


def test_cli_writes_the_derived_name(tmp_path, fake_dataset):
    path, _ = fake_dataset
    rc = workloads_cli.main(["--kind", "multiprefix", "--k", "4", "--lp", "32", "--num-requests", "12",
                  "--vocab-size", "1024", "--dataset-path", path, "--out-dir", str(tmp_path)])
    assert rc == 0
    cfg = WorkloadConfig.for_kind("multiprefix", k=4, lp=32, num_requests=12, vocab_size=1024,
                                  dataset_path=path)
    out = tmp_path / workload_filename(cfg)
    assert out.exists()
    assert out.read_bytes() == write(cfg, tmp_path / "direct.jsonl").read_bytes()
