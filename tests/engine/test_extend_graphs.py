"""Extend graphs (granikv.engine.extend_graphs): small extend steps through padded static
buffers. On CPU the padded step runs eagerly (no capture), so these tests check what a capture
would record: the padding (an extra request on the all-zero row owning the padding tokens, slot
0 for their K/V), the buffer layout, the sampled rows, the fixed split count — against the plain
extend path, by greedy tokens of all three systems with mid-run arrivals and chunked prefill."""

from __future__ import annotations

import numpy as np
import pytest
from engine_testutil import multi_prefix_prompts, tiny_config
from test_systems_agree import run_staggered

from granikv.config import EngineConfig
from granikv.engine.engine import Engine
from granikv.engine.extend_graphs import ExtendGraphs, ExtendKey, _layout

GRAPHS = dict(extend_graph_tokens=(8, 16, 32, 64), extend_graph_reqs=(2, 4, 8))


@pytest.mark.parametrize("system", ["paged", "cascade", "granikv"])
def test_padded_extend_steps_give_the_plain_paths_tokens(system):
    # chunked prefill at 24 tokens: long prompts span steps (non-sampling chunks beside
    # sampling ones); late arrivals make small steps behind cached prefixes
    prompts = multi_prefix_prompts(seed=5, prefix_lens=(40, 70, 23), per_prefix=(3, 2, 4))
    kw = dict(kernel_impl="torch", chunked_prefill_tokens=24)
    plain, _ = run_staggered(Engine(tiny_config(system, **kw)), prompts, 20, late_after=3)
    graphed, eng = run_staggered(Engine(tiny_config(system, **kw, **GRAPHS)), prompts, 20, late_after=3)
    assert graphed == plain
    eg = eng.stats()["graphs"]["extend_graphs"]
    assert eg["runs"] > 0 and eg["replays"] == 0 and not eg["captured"]  # CPU: padded eager


def test_padded_extend_steps_with_triton_kernels_and_fixed_splits(monkeypatch):
    """Through the Triton extend kernel (interpreter) with the graph key's split count: the
    policy's minimum split length lowered so the late arrivals' small steps split their keys."""
    from granikv.engine import builder
    from granikv.kernels import ExtendSplitPolicy

    class Named:  # EngineConfig.extend_split_rule -> this policy (the engine's KernelOps and graphs)
        named = staticmethod(lambda rule: ExtendSplitPolicy(min_split_len=8))

    monkeypatch.setattr(builder, "ExtendSplitPolicy", Named)
    prompts = multi_prefix_prompts(seed=2, prefix_lens=(30,), per_prefix=(4,))
    plain, _ = run_staggered(Engine(tiny_config("granikv", kernel_impl="torch")), prompts, 5, late_after=2)
    graphed, eng = run_staggered(Engine(tiny_config("granikv", kernel_impl="triton", **GRAPHS)), prompts, 5,
                                 late_after=2)
    assert graphed == plain
    keys = list(eng.runner.extend_graphs.graphs)
    assert keys and any(k.splits > 1 for k in keys), keys


def _graphs(split=True, **kw):
    from granikv.attention.ops import KernelOps

    class Backend:  # the head shapes and ops ExtendGraphs reads
        num_q_heads, num_kv_heads, head_dim = 32, 8, 128
        ops = KernelOps("torch", split_extend=split)

    import torch

    return ExtendGraphs(model=None, backend=Backend(), pad_row=99, token_buckets=(64, 256),
                        req_buckets=(2, 4, 8), device=torch.device("cpu"), use_graphs=False, **kw)


def test_keys_buckets_and_splits():
    g = _graphs()
    assert g.key_for(300, 1, 16400) is None  # above every token bucket
    assert g.key_for(20, 8, 16400) is None  # 8 requests need a bucket of 9 (one is padding)
    k = g.key_for(20, 1, 16404)
    assert (k.tokens, k.reqs) == (64, 2)
    assert k.splits == 32  # one 20-token request behind 16K keys: the policy's 32
    k3 = g.key_for(200, 3, 16544)
    assert (k3.tokens, k3.reqs) == (256, 4) and k3.splits & (k3.splits - 1) == 0  # a power of two
    # the padded step's workspace caps the splits: 256 tokens x 32 heads x 129 x 4 B per split
    assert k3.splits <= (64 << 20) // (256 * 32 * 129 * 4)
    assert _graphs(split=False).key_for(20, 1, 16404).splits == 1


def test_ahead_keys_cover_every_key_a_step_can_get():
    import random

    g = _graphs()
    ahead = set(g.ahead_keys())
    rng = random.Random(0)
    for _ in range(3000):
        n = rng.randrange(1, 8)
        t = rng.randrange(n, 257)
        key = g.key_for(t, n, rng.randrange(t, 40000))
        assert key in ahead, key
    # caps: 256-token keys stop at 8 splits (workspace), 64-token keys at the policy's 32
    assert max(k.splits for k in ahead if k.tokens == 256) == 8
    assert max(k.splits for k in ahead if k.tokens == 64) == 32
    assert {k.splits for k in _graphs(split=False).ahead_keys()} == {1}
    assert g.capture_ahead() == 0  # CPU: nothing to capture


def test_pack_pads_with_one_request_on_the_padding_row():
    g = _graphs()
    key = ExtendKey(tokens=16, reqs=4, splits=1)
    # two requests: 3 new tokens behind 10 cached, 5 new behind none; only the first samples
    h = g.pack(key, ids=[7] * 8, pos=[10, 11, 12, 0, 1, 2, 3, 4], slots=list(range(100, 108)), rows=[3, 5],
               prefix=[10, 0], seq_lens=[13, 5], indptr=[0, 3, 8], logit_rows=[2])
    lay = _layout(key)
    f = {k: h[v] for k, v in lay.items() if k != "length"}
    assert list(f["indptr"]) == [0, 3, 8, 16, 16]  # request 2 (padding) owns tokens 8..15
    assert list(f["rows"]) == [3, 5, 99, 99]
    assert list(f["prefix"]) == [10, 0, 0, 0] and list(f["seq"]) == [13, 5, 8, 0]
    assert np.all(f["slots"][8:] == 0) and list(f["slots"][:8]) == list(range(100, 108))
    assert list(f["pos"][8:]) == list(range(8)) and np.all(f["ids"][8:] == 0)
    assert list(f["logit_rows"]) == [2, 0, 0, 0]
    assert len(h) == 3 * 16 + 4 * 4 + 5


def test_config_and_cli_take_the_buckets():
    import argparse

    from granikv.server.cli import add_engine_args, config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    ns = parser.parse_args(["--extend-graph-tokens", "64,128", "--extend-graph-reqs", "2,4"])
    cfg = config_from_args(ns)
    assert cfg.extend_graph_tokens == (64, 128) and cfg.extend_graph_reqs == (2, 4)
    assert EngineConfig().extend_graph_tokens == ()  # off by default
    assert cfg.to_dict()["extend_graph_tokens"] == [64, 128]
    with pytest.raises(ValueError, match="padding"):
        EngineConfig(extend_graph_tokens=(64,), extend_graph_reqs=(1,))
