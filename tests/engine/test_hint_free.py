"""Sharing without hints (issue #29): requests that send no `shared_prefix_len` get their prefix
read once per class all the same. A promotion that commits while its readers decode re-points
them to the slab (same tokens: the slab holds bit-identical K/V), prefixes without HOT space form
COLD classes (rows pass), and `storage.audit()` holds after every step."""

from __future__ import annotations

import random

import pytest
from engine_testutil import tiny_config

from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams, Status


def prompts_of(seed: int, prefix_lens=(160, 90), per_prefix=(6, 4), vocab: int = 1024):
    rng = random.Random(seed)
    out = []
    for lp, n in zip(prefix_lens, per_prefix):
        prefix = [rng.randrange(vocab) for _ in range(lp)]
        for _ in range(n):
            out.append((prefix + [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))], lp))
    rng.shuffle(out)
    return out


def run(engine: Engine, prompts, hints: bool, steps: int = 16, late_after: int = 3):
    """Half the requests at t=0 (they decode while a promotion of their prefix commits), the rest
    after `late_after` steps; audit after every step."""
    params = SamplingParams(max_new_tokens=steps, ignore_eos=True)
    half = len(prompts) // 2
    reqs = [engine.add_request(p, params, shared_prefix_len=lp if hints else None) for p, lp in prompts[:half]]
    for _ in range(late_after):
        engine.step()
        engine.storage.audit()
    reqs += [engine.add_request(p, params, shared_prefix_len=lp if hints else None) for p, lp in prompts[half:]]
    while any(r.status != Status.FINISHED for r in reqs):
        engine.step()
        engine.storage.audit()
    return [r.output_ids for r in reqs]


@pytest.mark.parametrize("overlap", [False, True])
def test_promotion_commits_while_readers_decode_same_tokens(overlap):
    prompts = prompts_of(0)
    ref = run(Engine(tiny_config("paged", kernel_impl="torch")), prompts, hints=False)
    eng = Engine(tiny_config("granikv", kernel_impl="torch", overlap_schedule=overlap, min_prefix_for_hot=32,
                             prefix_pass_min_saved_mib=0))
    got = run(eng, prompts, hints=False)
    assert got == ref
    st = eng.stats()
    assert st["storage"]["promotions_committed"] > 0
    assert st["storage"]["promoted_readers"] > 0  # requests admitted before the commit moved to the slab
    att = st["attention"]
    assert att["dense_steps"] + att["cascade_steps"] > 0, att
    hinted = run(Engine(tiny_config("granikv", kernel_impl="torch", overlap_schedule=overlap, min_prefix_for_hot=32,
                                    prefix_pass_min_saved_mib=0)), prompts, hints=True)
    assert hinted == ref


def test_cold_prefixes_form_rows_classes_same_tokens():
    """No HOT space (hot_fraction ~0) and no promotion: shared COLD prefixes are read once per
    class through a slot-table row."""
    prompts = prompts_of(1)
    ref = run(Engine(tiny_config("paged", kernel_impl="torch")), prompts, hints=False)
    eng = Engine(tiny_config("granikv", kernel_impl="torch", hot_fraction=0.001, promote_min_refs=0,
                             min_prefix_for_hot=32, prefix_pass_min_saved_mib=0))
    got = run(eng, prompts, hints=False)
    assert got == ref
    att = eng.stats()["attention"]
    assert att["rows_steps"] > 0 and att["class_decisions"]["rows"] > 0, att
    assert eng.stats()["storage"]["promotions_committed"] == 0


def test_cold_classes_through_triton_kernels():
    """The rows pass through the Triton prefix kernel's page-row form (interpreter on CPU)."""
    prompts = prompts_of(2, prefix_lens=(40,), per_prefix=(4,))
    ref = run(Engine(tiny_config("paged", kernel_impl="torch")), prompts, hints=False, steps=4, late_after=1)
    eng = Engine(tiny_config("granikv", hot_fraction=0.001, promote_min_refs=0, min_prefix_for_hot=16,
                             prefix_pass_min_saved_mib=0))
    got = run(eng, prompts, hints=False, steps=4, late_after=1)
    assert got == ref
    assert eng.stats()["attention"]["rows_steps"] > 0
