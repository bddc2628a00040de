"""The `tree` and `debate` workload kinds, and the older kinds' bytes (pinned).

References: a tree's sharing is checked against a longest-common-prefix count (the quantity a
radix tree shares) and against the common path computed independently from the leaf indices;
the older kinds' hashes were taken from the generator as it was before these kinds existed.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from token_testutil import lcp

from harness.run.workloads import cli as workloads_cli
from harness.run.workloads.build import generate, write
from harness.run.workloads.config import WorkloadConfig
from harness.run.workloads.naming import workload_filename
from harness.run.workloads.requests import is_closed_loop, max_prompt_len, read_workload, require_open_loop
from harness.run.workloads.tree import tree_node_lengths, tree_path

# sha256 of files written by harness/run/workloads/ before tree and debate were added
# (commit 18bd4fd): the new fields must not change a byte of the older kinds' files.
PINNED = [
    ("sharegpt", dict(lp=40, num_requests=7, suffix="synthetic", suffix_len=6),
     "sharegpt-lp40-n7-sfx-synthetic-s6-v100277.jsonl",
     "037a1e535e59ca03fe24246b006b2ca4b56bbf7cba193a33b229cec3dfd5fc9d"),
    ("burst", dict(lp=30, num_requests=9, suffix_len=8), "burst-k1-lp30-n9-s8-v100277.jsonl",
     "f4a638427e6673023365c48a3fa34f23bdd9d07c80bce74ed25d6f5b618c0257"),
    ("multiprefix", dict(lp=20, k=3, num_requests=12, suffix="synthetic", suffix_len=5),
     "multiprefix-k3-lp20-n12-sfx-synthetic-s5-v100277.jsonl",
     "d0fc04d2020a2442ff362599181d6a90d0da19aee901430329c35455bf71771f"),
    ("hetero", dict(k=4, lps=(5, 9, 13, 2), num_requests=10, suffix="synthetic", suffix_len=4),
     "hetero-k4-lp5_9_13_2-n10-sfx-synthetic-s4-v100277.jsonl",
     "75f66e7acc3d887a059aab0db9d0f20753558aae431cdc75f57a2e1dc16f5c9d"),
    ("agents", dict(lp=24, la=8, k=3, num_requests=11, suffix="synthetic", suffix_len=4, vocab_size=1024),
     "agents-k3-lp24-la8-n11-sfx-synthetic-s4-v1024.jsonl",
     "1b3b4ecfeb7db59aa22aa1f77d416aeabf44d7e038c8e45b5ea31607af0b647b"),
]


@pytest.mark.parametrize("kind,kw,name,sha", PINNED, ids=[p[0] for p in PINNED])
def test_older_kinds_keep_their_bytes_and_names(tmp_path, kind, kw, name, sha):
    cfg = WorkloadConfig.for_kind(kind, **kw)
    assert workload_filename(cfg) == name
    assert hashlib.sha256(write(cfg, tmp_path / "w.jsonl").read_bytes()).hexdigest() == sha


def _tree(levels, jitter=0.0, n=None, **kw) -> WorkloadConfig:
    leaves = math.prod(f for f, _ in levels)
    kw = {"suffix": "synthetic", "suffix_len": 3, "vocab_size": 1024, **kw}
    return WorkloadConfig.for_kind("tree", levels=tuple(levels), jitter=jitter, k=leaves,
                                   num_requests=n or 2 * leaves + 1, **kw)


# ----------------------------------------------------------------------------- tree


def test_tree_defaults():
    cfg = WorkloadConfig.for_kind("tree")
    assert cfg.levels == ((1, 4096), (4, 4096), (4, 2048)) and cfg.k == 16 and cfg.num_requests == 256
    assert cfg.prefix_lengths() == (10240,) * 16
    assert workload_filename(cfg) == "tree-k16-lv1x4096_4x4096_4x2048-n256-v100277.jsonl"


def _common_path(levels, a: int, b: int) -> int:
    """Levels shared by leaves a and b: the depth where their ancestor indices first differ."""
    depth, shared = len(levels), 0
    for d in range(depth):
        below = math.prod(f for f, _ in levels[d + 1:])  # leaves under one node of level d
        if a // below != b // below:
            break
        shared = d + 1
    return shared


@settings(max_examples=25, deadline=None)
@given(levels=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 9)), min_size=1, max_size=4),
       jitter=st.sampled_from([0.0, 0.3, 0.9]), seed=st.integers(0, 3))
def test_tree_prompts_share_exactly_their_common_path(levels, jitter, seed):
    cfg = _tree(levels, jitter, seed=seed)
    reqs = generate(cfg)
    nodes = tree_node_lengths(cfg)
    assert [len(level) for level in nodes] == [math.prod(f for f, _ in levels[:d + 1]) for d in range(len(levels))]
    for i, r in enumerate(reqs):
        leaf = i % cfg.k  # round-robin over the leaves
        path = [nodes[d][j] for d, j in enumerate(tree_path(cfg.levels, leaf))]
        assert r.prefix_levels == [sum(path[:d + 1]) for d in range(len(path))]
        assert r.shared_prefix_len == sum(path) == cfg.prefix_lengths()[leaf]
        assert len(r.input_ids) == r.shared_prefix_len + 3
        assert max(r.input_ids) < 1024
    for a in range(cfg.k):
        for b in range(cfg.k):
            ra, rb = reqs[a], reqs[b]
            shared = _common_path(levels, a, b)
            want = ra.prefix_levels[shared - 1] if shared else 0
            if a == b:
                assert ra.input_ids[:ra.shared_prefix_len] == reqs[a + cfg.k].input_ids[:ra.shared_prefix_len]
                assert ra.prefix_id == reqs[a + cfg.k].prefix_id
            else:
                assert lcp(ra.input_ids, rb.input_ids) == want  # the radix tree branches at the node boundary
                assert ra.prefix_id != rb.prefix_id


@settings(max_examples=25, deadline=None)
@given(length=st.integers(1, 5000), fanout=st.integers(2, 6), jitter=st.floats(0.0, 0.99), seed=st.integers(0, 9))
def test_jitter_stays_within_its_bounds(length, fanout, jitter, seed):
    cfg = _tree([(1, 7), (fanout, length), (1, 5)], jitter, seed=seed)
    nodes = tree_node_lengths(cfg)
    assert nodes[0] == (7,) and nodes[2] == (5,) * fanout  # levels of fanout 1 keep their length
    for n in nodes[1]:
        assert max(1, math.floor(length * (1 - jitter))) <= n <= math.ceil(length * (1 + jitter))


def test_jitter_makes_siblings_unequal_and_zero_jitter_keeps_them_equal():
    nodes = tree_node_lengths(_tree([(1, 64), (4, 4096), (4, 2048)], 0.25))
    assert len(set(nodes[1])) == 4 and len(set(nodes[2])) > 8
    assert tree_node_lengths(_tree([(1, 64), (4, 4096), (4, 2048)])) == ((64,), (4096,) * 4, (2048,) * 16)


def test_tree_files_are_deterministic_and_named_by_levels_and_jitter(tmp_path):
    cfg = _tree([(1, 20), (3, 10), (2, 5)], 0.5)
    a = write(cfg, tmp_path / "a.jsonl").read_bytes()
    assert write(cfg, tmp_path / "b.jsonl").read_bytes() == a
    assert write(_tree([(1, 20), (3, 10), (2, 5)], 0.5, seed=1), tmp_path / "c.jsonl").read_bytes() != a
    name = workload_filename(cfg)
    assert name == "tree-k6-lv1x20_3x10_2x5-j0.5-n13-sfx-synthetic-s3-v1024.jsonl"
    assert workload_filename(_tree([(1, 20), (3, 10), (2, 5)])) == name.replace("-j0.5", "")
    assert workloads_cli.main(["--kind", "tree", "--levels", "1x20,3x10,2x5", "--jitter", "0.5", "--k", "6",
                              "--lp", "0", "--num-requests", "13", "--suffix", "synthetic", "--suffix-len", "3",
                              "--vocab-size", "1024", "--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / name).read_bytes() == a
    w = read_workload(tmp_path / name)
    assert WorkloadConfig.from_dict(w.header["config"]) == cfg
    assert w.header["tree_node_lengths"] == [list(x) for x in tree_node_lengths(cfg)]
    assert w.header["prefix_lengths"] == list(cfg.prefix_lengths())
    assert [r.prefix_levels for r in w.requests] == [r.prefix_levels for r in generate(cfg)]


@pytest.mark.parametrize("kw,match", [
    ({"levels": ()}, "1 to 5 levels"),
    ({"levels": ((1, 4),) * 6, "k": 1}, "1 to 5 levels"),
    ({"levels": ((1, 4), (0, 4)), "k": 1}, "need fanout >= 1"),
    ({"levels": ((1, 4), (2, 0)), "k": 2}, "length >= 1"),
    ({"levels": ((1, 4), (2, 3)), "k": 2, "jitter": 1.0}, r"jitter must be in \[0, 1\)"),
    ({"levels": ((1, 4), (2, 3)), "k": 2, "jitter": -0.1}, r"jitter must be in \[0, 1\)"),
    ({"levels": ((1, 4), (2, 3)), "k": 3}, "k must be 2"),
    ({"levels": ((1, 4), (2, 3)), "k": 2, "lp": 8}, "lp must be 0"),
    ({"levels": ((1, 4, 5),), "k": 1}, r"\[fanout, length\]"),
])
def test_invalid_tree_configs(kw, match):
    with pytest.raises(ValueError, match=match):
        WorkloadConfig.for_kind("tree", **kw)


def test_tree_fields_belong_to_tree_only():
    with pytest.raises(ValueError, match="levels and jitter are for kind=tree"):
        WorkloadConfig.for_kind("burst", levels=((1, 4),))
    with pytest.raises(ValueError, match="levels and jitter are for kind=tree"):
        WorkloadConfig.for_kind("burst", jitter=0.1)
    with pytest.raises(ValueError, match="rounds is for kind=debate"):
        WorkloadConfig.for_kind("tree", rounds=2)


# ----------------------------------------------------------------------------- debate (the file)


def _debate(**kw) -> WorkloadConfig:
    kw = {"lp": 10, "la": 4, "k": 3, "rounds": 3, "num_requests": 18, "suffix": "synthetic", "suffix_len": 5,
          "output_len": 4, "vocab_size": 1024, **kw}
    return WorkloadConfig.for_kind("debate", **kw)


def test_debate_defaults():
    cfg = WorkloadConfig.for_kind("debate")
    assert (cfg.debates, cfg.k, cfg.rounds, cfg.lp, cfg.la, cfg.output_len) == (32, 8, 4, 4096, 512, 256)
    assert cfg.num_requests == 32 * 8 * 4 and cfg.arrival == "burst"


def test_debate_file_holds_the_static_parts(tmp_path):
    cfg = _debate()
    path = write(cfg, tmp_path / workload_filename(cfg))
    assert path.name == "debate-k3-lp10-la4-r3-n18-sfx-synthetic-s5-o4-v1024.jsonl"
    assert write(cfg, tmp_path / "again.jsonl").read_bytes() == path.read_bytes()
    w = read_workload(path)
    assert w.header["closed_loop"] == {"sessions": 2, "members": 3, "rounds": 3, "system_len": 10, "role_len": 4}
    assert w.header["config"]["rounds"] == 3 and w.header["config"]["la"] == 4 and "levels" not in w.header["config"]
    assert WorkloadConfig.from_dict(w.header["config"]) == cfg
    reqs = w.requests
    assert len(reqs) == 18 and is_closed_loop(reqs)
    system = reqs[0].input_ids[:10]
    steps = [(r.session.session, r.session.round, r.session.member) for r in reqs]
    assert steps == [(f"d{d}", r, a) for d in range(2) for r in range(3) for a in range(3)]
    roles = {r.session.member: r.input_ids[r.session.insert_at:] for r in reqs}
    assert all(len(x) == 4 for x in roles.values()) and len({x[0] for x in roles.values()}) == 3
    topics = {r.session.session: r.input_ids[10:r.session.insert_at] for r in reqs}
    assert len(topics["d0"]) == len(topics["d1"]) == 5 and topics["d0"] != topics["d1"]
    for r in reqs:
        s = r.session
        assert r.input_ids == system + topics[s.session] + roles[s.member]  # one system prompt, roles shared
        assert r.prefix_id == f"{s.session}r{s.round}"
        assert r.shared_prefix_len == s.insert_at + s.round * 3 * 4 == r.prefix_levels[1]
        assert r.prefix_levels[0] == 10 and r.output_len == 4
        assert r.prompt([]) == r.input_ids
        assert r.prompt([7, 8]) == r.input_ids[:s.insert_at] + [7, 8] + r.input_ids[s.insert_at:]
    # the longest prompt: the last round's static ids plus two rounds of k outputs
    assert max_prompt_len(reqs) == 10 + 5 + 2 * 3 * 4 + 4
    json.loads(path.read_text().splitlines()[1])  # plain JSON lines, as every kind


@pytest.mark.parametrize("kw,match", [
    ({"num_requests": 17}, "multiple of k x rounds"),
    ({"rounds": 0}, "rounds >= 1"),
    ({"la": 0}, "la >= 1"),
])
def test_invalid_debate_configs(kw, match):
    with pytest.raises(ValueError, match=match):
        _debate(**kw)


def test_static_replays_refuse_a_closed_loop_workload():
    reqs = generate(_debate())
    with pytest.raises(ValueError, match="closed-loop session workload"):
        require_open_loop(reqs, "the replay")
    require_open_loop(generate(_tree([(1, 4), (2, 2)])), "the replay")  # open-loop kinds pass
    from harness.microbench import replay

    with pytest.raises(ValueError, match="the engine replay replays static prompts"):
        replay.offers(reqs, replay.ReplayConfig())
