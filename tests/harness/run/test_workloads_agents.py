"""The `agents` workload kind: nested sharing (common Lp prompt, per-agent La role prompt).

References: the suffixes are checked against the `sharegpt` kind's turns (same seed, same
filter) and against the tokenizer on a controlled dataset; the prefix structure against a
longest-common-prefix count, the quantity a radix tree shares.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from token_testutil import lcp

from harness.run.config import Cell
from harness.run.workloads import cli as workloads_cli
from harness.run.workloads.build import build, generate, write
from harness.run.workloads.config import WorkloadConfig
from harness.run.workloads.naming import workload_filename
from harness.run.workloads.requests import read_workload
from harness.run.workloads.tokenizer import Cl100kTokenizer

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def fake_dataset(tmp_path_factory) -> tuple[str, dict[str, str]]:
    """A small ShareGPT-shaped file; returns its path and each conversation's turn-0 text by source."""
    convs, texts = [], {}
    for i in range(120):
        n = 16 + (i * 29) % 200
        text = " ".join(f"w{(i + j) % 97}" for j in range(n))
        convs.append({"id": f"c{i}", "conversations": [{"from": "human", "value": text},
                                                        {"from": "gpt", "value": "ok"}]})
        texts[f"c{i}#{i}"] = text
    path = tmp_path_factory.mktemp("sharegpt") / "fake.json"
    path.write_text(json.dumps(convs))
    return str(path), texts


def _agents(fake: str, **kw) -> WorkloadConfig:
    return WorkloadConfig.for_kind("agents", **{"dataset_path": fake, **kw})


def test_defaults():
    cfg = WorkloadConfig.for_kind("agents")
    assert (cfg.k, cfg.lp, cfg.la, cfg.num_requests, cfg.output_len) == (8, 8192, 2048, 500, 256)
    mp = WorkloadConfig.for_kind("multiprefix")  # request count and output length as multiprefix's
    assert (cfg.num_requests, cfg.output_len, cfg.arrival, cfg.suffix) == \
        (mp.num_requests, mp.output_len, mp.arrival, mp.suffix)
    assert cfg.prefix_lengths() == (8192 + 2048,) * 8


def test_same_config_gives_byte_identical_files(tmp_path, fake_dataset):
    path, _ = fake_dataset
    cfg = _agents(path, lp=48, la=24, k=4, num_requests=30, vocab_size=1024)
    a = write(cfg, tmp_path / "a.jsonl").read_bytes()
    assert write(cfg, tmp_path / "b.jsonl").read_bytes() == a
    assert write(_agents(path, lp=48, la=24, k=4, num_requests=30, vocab_size=1024, seed=7),
                    tmp_path / "c.jsonl").read_bytes() != a
    # The CLI writes the same bytes under the derived name.
    assert workloads_cli.main(["--kind", "agents", "--k", "4", "--lp", "48", "--la", "24", "--num-requests", "30",
                    "--vocab-size", "1024", "--dataset-path", path, "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / workload_filename(cfg)).read_bytes() == a


@pytest.mark.parametrize("vocab_size", [None, 1024])  # 1024: the tiny model of the cpu-smoke stand-in
@pytest.mark.parametrize("k,lp,la", [(8, 128, 32), (3, 40, 1), (5, 0, 16)])
def test_nested_prefix_structure(fake_dataset, k, lp, la, vocab_size):
    path, texts = fake_dataset
    n = 2 * k + 3
    cfg = _agents(path, lp=lp, la=la, k=k, num_requests=n, vocab_size=vocab_size)
    reqs = generate(cfg)
    assert len(reqs) == n
    common = reqs[0].input_ids[:lp]
    roles: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        a = i % k  # round-robin
        assert r.prefix_id == f"a{a}"
        assert (r.shared_prefix_len, r.shared_lp, r.agent_len, r.output_len) == (lp + la, lp, la, 256)
        assert r.input_ids[:lp] == common  # every agent opens with the common Lp tokens ...
        roles.setdefault(r.prefix_id, r.input_ids[lp:lp + la])
        assert r.input_ids[lp:lp + la] == roles[r.prefix_id]  # ... then its own La tokens
        assert len(roles[r.prefix_id]) == la
    assert len(roles) == k
    assert len({role[0] for role in roles.values()}) == k  # distinct from their first token on
    if vocab_size:
        assert max(max(r.input_ids) for r in reqs) < vocab_size
    # What a radix tree shares: exactly Lp across agents, at least Lp + La within one.
    for i, r in enumerate(reqs):
        for j, q in enumerate(reqs[:i]):
            shared = lcp(r.input_ids, q.input_ids)
            if i % k == j % k:
                assert shared >= lp + la
            else:
                assert shared == lp
    # Suffixes: the tokenized ShareGPT turns (ids mapped for the small vocabulary).
    tok = Cl100kTokenizer()
    for r in reqs:
        want = tok.encode(texts[r.source])
        assert r.input_ids[lp + la:] == ([x % vocab_size for x in want] if vocab_size else want)
    assert len({r.source for r in reqs}) == n


def test_suffixes_and_arrivals_are_those_of_the_other_kinds():
    """Same seed -> the same packaged ShareGPT turns as `sharegpt`, the same times as `multiprefix`."""
    n = 40
    agents = generate(WorkloadConfig.for_kind("agents", lp=64, la=16, k=8, num_requests=n))
    plain = generate(WorkloadConfig.for_kind("sharegpt", lp=0, num_requests=n))
    multi = generate(WorkloadConfig.for_kind("multiprefix", lp=8, k=8, num_requests=n))
    for a, s, m in zip(agents, plain, multi, strict=True):
        assert a.input_ids[80:] == s.input_ids and a.source == s.source
        assert a.arrival == m.arrival
        assert a.id.startswith("agents-")


def test_round_trip_header_and_name(tmp_path, fake_dataset):
    path, _ = fake_dataset
    cfg = _agents(path, lp=32, la=8, k=4, num_requests=10, vocab_size=1024)
    out = write(cfg, tmp_path / workload_filename(cfg))
    back = read_workload(out)
    assert back.requests == generate(cfg)
    h = back.header
    assert WorkloadConfig.from_dict(h["config"]) == cfg and h["config"]["la"] == 8
    assert h["prefix_lengths"] == [40] * 4 and (h["shared_lp"], h["agent_len"]) == (32, 8)
    assert workload_filename(cfg).startswith("agents-k4-lp32-la8-n10-v1024")
    names = {workload_filename(_agents(path, lp=32, la=la, k=4, num_requests=10)) for la in (8, 16)}
    assert len(names) == 2
    # Other kinds neither carry la in their header nor the per-request agent fields.
    mp = build(WorkloadConfig.for_kind("multiprefix", lp=8, k=2, num_requests=2, suffix="synthetic",
                                          suffix_len=4, vocab_size=1024))
    assert "la" not in mp.header["config"] and "shared_lp" not in mp.header
    assert "shared_lp" not in json.loads(mp.requests[0].to_json())


def test_invalid_configs():
    with pytest.raises(ValueError, match="la >= 1"):
        WorkloadConfig.for_kind("agents", la=0)
    with pytest.raises(ValueError, match="la is for kind=agents"):
        WorkloadConfig.for_kind("multiprefix", la=16)
    with pytest.raises(ValueError, match="lps"):
        WorkloadConfig.for_kind("agents", lps=(1, 2))
    with pytest.raises(ValueError, match="distinct prefixes"):
        generate(WorkloadConfig.for_kind("agents", k=9, lp=4, la=4, num_requests=9, suffix="synthetic",
                                            suffix_len=4, vocab_size=8))


def _compose(*overrides: str) -> Cell:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return Cell.from_config(compose(config_name="config", overrides=list(overrides)))


def test_cell_overrides_reach_the_generator():
    cfg = _compose("workload=agents", "k=8", "lp=8192", "workload.la=2048", "batch=256")
    w = cfg.workload
    assert (w.kind, w.k, w.lp, w.la, w.num_requests, w.vocab_size) == ("agents", 8, 8192, 2048, 500, 128256)
    assert cfg.result_path.name == "granikv-llama-3.1-8b-tp1-agents-lp8192-b256-k8-r0.json"
    w = _compose("workload=agents", "k=4", "lp=128", "workload.la=32", "model=tiny").workload
    assert (w.k, w.lp, w.la, w.vocab_size) == (4, 128, 32, 1024)
    # The hint A/B: the no-hint cell differs by its tag, so both land side by side.
    off = _compose("workload=agents", "client.send_prefix_hint=false", "tag=nohint")
    assert off.result_path.name == "granikv-llama-3.1-8b-tp1-agents-lp8192-b256-k8-r0-tagnohint.json"
