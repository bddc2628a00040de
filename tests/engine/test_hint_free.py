"""Sharing without hints: requests that send no `shared_prefix_len` get their prefix
read once per class all the same. A promotion that commits while its readers decode re-points
them to the slab (same tokens: the slab holds bit-identical K/V), prefixes without HOT space form
COLD classes (rows pass), and `storage.audit()` holds after every step."""

from __future__ import annotations

import random

import pytest
from engine_testutil import tiny_config

from granikv.attention.plan import EXT
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


@pytest.mark.parametrize("range_as_slab", [False, True])
def test_cold_prefixes_form_rows_classes_same_tokens(range_as_slab):
    """No HOT space (hot_fraction ~0) and no promotion: shared COLD prefixes are read once per
    class, through a slot-table row or, when the run is one slot range (prefilled from a fresh
    COLD pool, as here), by the slab form of the pass at the range's base."""
    prompts = prompts_of(1)
    ref = run(Engine(tiny_config("paged", kernel_impl="torch")), prompts, hints=False)
    eng = Engine(tiny_config("granikv", kernel_impl="torch", hot_fraction=0.001, promote_min_refs=0,
                             min_prefix_for_hot=32, prefix_pass_min_saved_mib=0, cold_range_as_slab=range_as_slab))
    got = run(eng, prompts, hints=False)
    assert got == ref
    att = eng.stats()["attention"]
    if range_as_slab:
        assert att["contiguous_cold"] > 0 and att["dense_steps"] + att["cascade_steps"] > 0, att
    else:
        assert att["rows_steps"] > 0 and att["class_decisions"]["rows"] > 0 and att["contiguous_cold"] == 0, att
    assert eng.stats()["storage"]["promotions_committed"] == 0


@pytest.mark.parametrize("range_as_slab", [False, True])
def test_cold_classes_through_triton_kernels(range_as_slab):
    """The rows pass through the Triton prefix kernel's page-row form, and a COLD range through
    its slab form (interpreter on CPU)."""
    prompts = prompts_of(2, prefix_lens=(40,), per_prefix=(4,))
    ref = run(Engine(tiny_config("paged", kernel_impl="torch")), prompts, hints=False, steps=4, late_after=1)
    eng = Engine(tiny_config("granikv", hot_fraction=0.001, promote_min_refs=0, min_prefix_for_hot=16,
                             prefix_pass_min_saved_mib=0, cold_range_as_slab=range_as_slab))
    got = run(eng, prompts, hints=False, steps=4, late_after=1)
    assert got == ref
    att = eng.stats()["attention"]
    assert (att["contiguous_cold"] > 0) if range_as_slab else (att["rows_steps"] > 0), att


def agent_prompts(seed: int, k: int = 3, per_agent: int = 3, lp: int = 64, la: int = 32, vocab: int = 1024):
    """The `agents` workload in small (harness/run/workloads/): k agents share an lp-token system
    prompt, each adds an la-token role prompt, every request a 5-20 token suffix. One seed request
    per agent first (its prompt gets cached), then the rest; (prompt, hint = lp + la) pairs."""
    rng = random.Random(seed)
    head = [rng.randrange(vocab) for _ in range(lp)]
    roles = [[rng.randrange(vocab) for _ in range(la)] for _ in range(k)]
    seeds, rest = [], []
    for a in range(k):
        for j in range(per_agent + 1):
            p = head + roles[a] + [rng.randrange(vocab) for _ in range(rng.randrange(5, 21))]
            (rest if j else seeds).append((p, lp + la, a))
    rng.shuffle(rest)
    return seeds + rest


def run_agents(engine: Engine, prompts, hints: bool, steps: int = 10, plans: list | None = None):
    """Seeds first (until their prompts are cached), then the rest; audit after every step. Each
    decode step's plan is appended to `plans` (with the agent of each batch index)."""
    params = SamplingParams(max_new_tokens=steps, ignore_eos=True)
    seeds = prompts[: len({a for _, _, a in prompts})]
    reqs = [engine.add_request(p, params, shared_prefix_len=h if hints else None) for p, h, _ in seeds]
    agent_of = {r.rid: a for r, (_, _, a) in zip(reqs, seeds, strict=True)}
    if plans is not None:
        plan_decode = engine.backend.plan_decode

        def spy(batch):
            plan = plan_decode(batch)
            plans.append((plan, [agent_of[v.key] for v in batch.reqs]))
            return plan

        engine.backend.plan_decode = spy
    while any(r.output_ids == [] for r in reqs):
        engine.step()
        engine.storage.audit()
    for p, h, a in prompts[len(seeds):]:
        r = engine.add_request(p, params, shared_prefix_len=h if hints else None)
        agent_of[r.rid] = a
        reqs.append(r)
    while any(r.status != Status.FINISHED for r in reqs):
        engine.step()
        engine.storage.audit()
    return [r.output_ids for r in reqs]


@pytest.mark.parametrize("hot", [True, False])
def test_agents_head_once_and_each_extension_once_per_step(hot):
    """Nested sharing (agents share a system prompt, each agent's requests also share its role
    prompt) without hints: once every request decodes, one class reads the common head for all of
    them and one extension class per agent reads that agent's role prompt; tokens equal paged's
    and the hinted run's; audit after every step. `hot=False`: no HOT space, the head is a COLD
    rows class and the extensions follow it the same way."""
    prompts = agent_prompts(0)
    ref = run_agents(Engine(tiny_config("paged", kernel_impl="torch")), prompts, hints=False)
    kw = dict(kernel_impl="torch", min_prefix_for_hot=32, prefix_pass_min_saved_mib=0)
    if not hot:
        kw.update(hot_fraction=0.001, promote_min_refs=0)
    eng = Engine(tiny_config("granikv", **kw))
    plans: list = []
    got = run_agents(eng, prompts, hints=False, plans=plans)
    assert got == ref
    full = []
    for plan, agents in plans:
        n = len(agents)
        heads = [c for kind, c in plan.passes.items() if kind != EXT]
        if n < len(prompts) or len(heads) != 1 or heads[0].members != [list(range(n))] or EXT not in plan.passes:
            continue
        assert heads[0].lens == [64]
        ext = plan.passes[EXT]
        by_agent = sorted(sorted(m) for m in ext.members)
        want = sorted([i for i in range(n) if agents[i] == a] for a in set(agents))
        assert by_agent == want and ext.lens == [32] * len(want) and ext.starts == [64] * len(want)
        full.append(plan)
    assert full, "no step read the head once and each extension once"
    att = eng.stats()["attention"]
    assert att["ext_steps"] >= len(full) and att["class_sizes"]["ext"].get("4", 0) >= 3 * len(full), att
    if hot:
        assert eng.stats()["storage"]["promotions_committed"] > 0
    hinted = run_agents(Engine(tiny_config("granikv", **kw)), prompts, hints=True)
    assert hinted == ref


def test_extension_classes_through_triton_kernels():
    """The EXT pass through the Triton prefix kernel's page-row form over the flat slot table
    (interpreter on CPU)."""
    prompts = agent_prompts(3, k=2, per_agent=1, lp=32, la=16)
    ref = run_agents(Engine(tiny_config("paged", kernel_impl="torch")), prompts, hints=False, steps=3)
    eng = Engine(tiny_config("granikv", hot_fraction=0.001, promote_min_refs=0, min_prefix_for_hot=16,
                             prefix_pass_min_saved_mib=0))
    got = run_agents(eng, prompts, hints=False, steps=3)
    assert got == ref
    assert eng.stats()["attention"]["ext_steps"] > 0


def run_waves(engine: Engine, waves) -> list[list[int]]:
    """Each wave: (steps to run before it, [(prompt, hint, max_new_tokens), ...]); then run to the
    end. Audit after every step."""
    reqs = []
    for steps, wave in waves:
        for _ in range(steps):
            engine.step()
            engine.storage.audit()
        reqs += [engine.add_request(p, SamplingParams(max_new_tokens=n, ignore_eos=True), shared_prefix_len=h)
                 for p, h, n in wave]
    while any(r.status != Status.FINISHED for r in reqs):
        engine.step()
        engine.storage.audit()
    return [r.output_ids for r in reqs]


@pytest.mark.parametrize("case", ["other_prefix", "sibling_role"])
def test_promotion_leaves_hinted_slabs_of_other_prompts_alone(case):
    """Hinted and un-hinted requests together: a promotion of one prompt's prefix (two
    un-hinted readers) commits while a hinted request holds a slab of its own prefix, and must
    leave that request reading its own KV. `other_prefix`: an unrelated prompt is promoted while
    the hinted one decodes; `sibling_role`: the promoted prompt shares the hinted one's 33-token
    head (two roles of one system prompt) and commits before the hinted prefill is cached, with
    small prefill chunks. Tokens equal paged's."""
    rng = random.Random(0)
    head = [rng.randrange(1024) for _ in range(33)]
    if case == "other_prefix":
        other = [rng.randrange(1024) for _ in range(17)]
        waves = [(0, [(head, 33, 6)]), (1, [(other, None, 2)] * 3)]
        chunk = 256
    else:
        role_a = head + [rng.randrange(1024) for _ in range(19)]
        role_b = head + [rng.randrange(1024) for _ in range(20)]
        waves = [(0, [(role_a, None, 4)] * 3 + [(role_b, 53, 4)])]
        chunk = 24
    ref = run_waves(Engine(tiny_config("paged", kernel_impl="torch")), waves)
    eng = Engine(tiny_config("granikv", kernel_impl="torch", chunked_prefill_tokens=chunk, min_prefix_for_hot=16))
    assert run_waves(eng, waves) == ref
    assert eng.stats()["storage"]["promotions_committed"] > 0


def tree_prompts(seed: int, levels=((1, 64), (2, 32), (2, 24)), per_leaf: int = 3, vocab: int = 1024):
    """The `tree` workload in small: a run per node, request on leaf j = the root-to-leaf runs and a
    5-20 token suffix; one seed request per leaf first, then the rest; (prompt, hint, leaf)."""
    rng = random.Random(seed)
    runs, count = [], 1
    for fanout, length in levels:
        count *= fanout
        runs.append([[rng.randrange(vocab) for _ in range(length)] for _ in range(count)])
    seeds, rest = [], []
    for leaf in range(count):
        path, below = [], count
        for d, (fanout, _) in enumerate(levels):
            below //= fanout
            path += runs[d][leaf // below]
        for j in range(per_leaf + 1):
            p = path + [rng.randrange(vocab) for _ in range(rng.randrange(5, 21))]
            (rest if j else seeds).append((p, len(path), leaf))
    rng.shuffle(rest)
    return seeds + rest


@pytest.mark.parametrize("hot", [True, False])
def test_a_tree_reads_each_shared_level_once_per_step(hot):
    """Sharing at any depth: with share_depth 3 the root, each mid node and each leaf run are read once per
    step (head, EXT and ext2 classes); tokens equal paged's and the two-level engine's, which never
    forms a level-2 class; audit after every step."""
    prompts = tree_prompts(0)
    ref = run_agents(Engine(tiny_config("paged", kernel_impl="torch")), prompts, hints=False)
    kw = dict(kernel_impl="torch", min_prefix_for_hot=16, prefix_pass_min_saved_mib=0)
    if not hot:
        kw.update(hot_fraction=0.001, promote_min_refs=0)
    eng = Engine(tiny_config("granikv", share_depth=3, **kw))
    plans: list = []
    assert run_agents(eng, prompts, hints=False, plans=plans) == ref
    full = [p for p, leaves in plans if len(leaves) == len(prompts) and "ext2" in p.passes]
    assert full, "no step read a level-2 class"
    for plan in full:
        leaves = next(lv for p, lv in plans if p is plan)
        by_leaf = sorted(sorted(m) for m in plan.passes["ext2"].members)
        assert by_leaf == sorted([i for i, lf in enumerate(leaves) if lf == leaf] for leaf in set(leaves))
        assert plan.passes["ext2"].lens == [24] * 4 and plan.kv_start == [120] * len(prompts)
        assert plan.flat  # the three levels in one flattened launch
    att = eng.stats()["attention"]
    assert att["deep_ext_steps"] >= len(full) and att["flat_steps"] >= len(full)
    two: list = []
    assert run_agents(Engine(tiny_config("granikv", share_depth=2, **kw)), prompts, hints=False, plans=two) == ref
    assert not any("ext2" in p.passes for p, _ in two)
    # one launch and one merge per level instead: the same tokens
    per_level = Engine(tiny_config("granikv", share_depth=3, flat_prefix=False, **kw))
    assert run_agents(per_level, prompts, hints=False) == ref
    assert "flat_steps" not in per_level.stats()["attention"]


@pytest.mark.parametrize("hot,flat", [(False, True), (True, True), (False, False)])
def test_level_two_classes_through_triton_kernels(hot, flat):
    """ext2 through the Triton prefix kernel (interpreter on CPU): the levels in one flattened
    launch (a HOT slab head and row-form levels mixed in it with `hot`), or one launch per level."""
    prompts = tree_prompts(3, levels=((1, 32), (2, 16), (2, 16)), per_leaf=1)
    ref = run_agents(Engine(tiny_config("paged", kernel_impl="torch")), prompts, hints=False, steps=3)
    kw = dict(m_sat=1 << 20) if hot else dict(hot_fraction=0.001, promote_min_refs=0)  # hot: a cascade head
    eng = Engine(tiny_config("granikv", share_depth=3, min_prefix_for_hot=16, prefix_pass_min_saved_mib=0,
                             flat_prefix=flat, **kw))
    assert run_agents(eng, prompts, hints=False, steps=3) == ref
    att = eng.stats()["attention"]
    assert att.get("deep_ext_steps", 0) > 0 and (att.get("flat_steps", 0) > 0) == flat, att
    if hot:
        assert eng.stats()["storage"]["promotions_committed"] > 0 and att["cascade_steps"] > 0, att
