"""The three systems are one engine with different KV storage and decode attention: on the same
requests they must produce the same greedy tokens (float32, tiny model), including requests
that arrive while others are decoding, and classes that take the dense, cascade and plain paths."""

from __future__ import annotations

import pytest
from engine_testutil import multi_prefix_prompts, tiny_config

from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams, Status


def run_staggered(engine: Engine, prompts, steps: int, hints: bool = True, late_after: int = 5):
    """Half the requests at t=0, the rest after `late_after` engine steps (mid-run arrivals)."""
    params = SamplingParams(max_new_tokens=steps, ignore_eos=True)
    first, late = prompts[: len(prompts) // 2], prompts[len(prompts) // 2:]
    reqs = [engine.add_request(p, params, shared_prefix_len=lp if hints else None) for p, lp in first]
    for _ in range(late_after):
        engine.step()
    reqs += [engine.add_request(p, params, shared_prefix_len=lp if hints else None) for p, lp in late]
    while any(r.status != Status.FINISHED for r in reqs):
        engine.step()
    return [r.output_ids for r in reqs], engine


def _run_all(prompts, steps, late_after: int = 5, **kw):
    outs, engines = {}, {}
    for system in ("paged", "cascade", "granikv"):
        outs[system], engines[system] = run_staggered(Engine(tiny_config(system, **kw)), prompts, steps,
                                                      late_after=late_after)
    return outs, engines


def test_three_systems_same_greedy_tokens_64_steps():
    """k = 3 prefixes of different lengths, 9 requests, 64 greedy steps (vectorized torch ops)."""
    outs, engines = _run_all(multi_prefix_prompts(), 64, kernel_impl="torch")
    assert all(len(o) == 64 for o in outs["paged"])
    assert outs["cascade"] == outs["paged"]
    assert outs["granikv"] == outs["paged"]
    st = engines["granikv"].stats()
    assert st["hot_admits"] > 0
    att = st["attention"]
    assert att["dense_steps"] > 0 and att["cascade_steps"] > 0, att
    # with three prefixes in one batch the batch-global common prefix is empty: plain paged
    assert engines["cascade"].stats()["attention"]["paged_steps"] > 0


def test_single_prefix_cascade_reads_prefix_once():
    """k = 1: the cascade baseline finds the batch-global prefix and uses its prefix pass."""
    prompts = multi_prefix_prompts(seed=3, prefix_lens=(48,), per_prefix=(5,))
    outs, engines = _run_all(prompts, 12, kernel_impl="torch")
    assert outs["cascade"] == outs["paged"] == outs["granikv"]
    assert engines["cascade"].stats()["attention"]["cascade_steps"] > 0


def test_three_systems_agree_with_triton_kernels():
    """The same check through the Triton kernels (interpreter on CPU): short, but every kernel
    (store_kv, extend, decode_paged, prefix_cascade on slabs and pages, prefix_dense, merge)
    runs inside the engine."""
    prompts = multi_prefix_prompts(seed=1, prefix_lens=(20, 33), per_prefix=(3, 2))
    outs, engines = _run_all(prompts, 6, kernel_impl="triton", late_after=2)
    ref, _ = _run_all(prompts, 6, kernel_impl="torch", late_after=2)
    assert outs["paged"] == ref["paged"]
    assert outs["cascade"] == outs["paged"]
    assert outs["granikv"] == outs["paged"]
    att = engines["granikv"].stats()["attention"]
    assert att["dense_steps"] > 0 and att["cascade_steps"] > 0, att


@pytest.mark.parametrize("rule", ["fill", "long-keys"])
def test_three_systems_agree_with_split_key_extend(monkeypatch, rule):
    """The engine passes its host bounds to the extend kernel, which splits the keys of small
    prefill steps (on an H200: under 2 waves of programs and >= 1024 keys). With the policy's
    minimum split length lowered to 8 keys, the tiny model's late arrivals (a few tokens behind a
    cached 20-33-token prefix) take the split path; the tokens must not change. `long-keys`
    (EngineConfig.extend_split_rule) with its thresholds scaled down to these contexts takes
    its long-key branch (>= 4 splits) on the same steps."""
    import importlib

    from granikv.engine import builder

    ext = importlib.import_module("granikv.kernels.extend")  # the package re-exports a function of that name
    calls = []
    real_policy, real_splits = ext.ExtendSplitPolicy, ext.extend_splits
    tiny = {"fill": real_policy(min_split_len=8),
            "long-keys": real_policy(min_split_len=8, long_keys=24, long_key_splits=4, full_wave=0.75)}

    asked = []

    class Named:
        @staticmethod
        def named(r):
            asked.append(r)
            return tiny[rule]

    monkeypatch.setattr(builder, "ExtendSplitPolicy", Named)

    def spy(*a, **kw):
        s = real_splits(*a, **kw)
        calls.append((s, kw.get("policy") or a[-1]))
        return s

    monkeypatch.setattr(ext, "extend_splits", spy)
    prompts = multi_prefix_prompts(seed=1, prefix_lens=(20, 33), per_prefix=(3, 2))
    outs, _ = _run_all(prompts, 4, kernel_impl="triton", late_after=2, extend_split_rule=rule)
    ref, _ = _run_all(prompts, 4, kernel_impl="torch", late_after=2)
    assert rule in asked and all(pol is tiny[rule] for _, pol in calls)
    assert max(s for s, _ in calls) > 1, calls
    if rule == "long-keys":
        assert max(s for s, _ in calls) >= 4, calls
    assert outs["paged"] == ref["paged"]
    assert outs["cascade"] == outs["paged"]
    assert outs["granikv"] == outs["paged"]
