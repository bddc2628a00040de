"""The dispatcher's choice (granikv.attention.dispatch): when a prefix class takes a prefix pass,
which one, and when it stays on the plain path; and the engine wiring of the saved-bytes rule."""

from __future__ import annotations

from engine_testutil import multi_prefix_prompts, tiny_config
from hypothesis import given
from hypothesis import strategies as st

from granikv.attention.dispatch import CASCADE, DENSE, PLAIN, DispatchPolicy
from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams, Status

LLAMA_KV = 2 * 8 * 128 * 2  # K/V bytes of a token per layer: 8 KV heads x d=128, bf16
MIB = 2**20


def _h200_policy(**kw) -> DispatchPolicy:
    return DispatchPolicy(group_size=4, m_sat=2048, min_prefix_len=256, kv_bytes_per_token=LLAMA_KV,
                          min_saved_bytes=192 * MIB, **kw)


def test_served_cells_fall_on_the_measured_side():
    """The Table 9 points the threshold was read from: a prefix pass at Lp=8K/B=8, Lp=2K/B=32 and
    Lp=512/B=128 (granikv won there with it), the plain path at Lp=512/B=8,32 and Lp=2K/B=8 (the
    pass lost there)."""
    p = _h200_policy()
    for n, lp in ((8, 8192), (32, 2048), (128, 512), (256, 512), (256, 16384)):
        assert p.choose(n, lp) in (CASCADE, DENSE), (n, lp)
    for n, lp in ((8, 512), (32, 512), (8, 2048), (1, 16384)):
        assert p.choose(n, lp) == PLAIN, (n, lp)
    assert p.choose(512, 8192) == DENSE  # 512 x 4 >= m_sat
    assert p.saved_bytes(32, 512) == 31 * 512 * LLAMA_KV


@given(n=st.integers(0, 1024), lp=st.integers(0, 1 << 16), mib=st.integers(0, 512))
def test_plain_exactly_when_a_pass_cannot_pay(n, lp, mib):
    p = DispatchPolicy(group_size=4, m_sat=2048, min_prefix_len=256, kv_bytes_per_token=LLAMA_KV,
                                 min_saved_bytes=mib * MIB)
    kind = p.choose(n, lp)
    pays = n >= 2 and lp >= 256 and (n - 1) * lp * LLAMA_KV >= mib * MIB
    assert (kind != PLAIN) == pays
    if kind != PLAIN:
        assert kind == (DENSE if n * 4 >= 2048 else CASCADE)
        # monotone: a bigger class or a longer prefix of a paying class pays too
        assert p.choose(n + 1, lp) != PLAIN and p.choose(n, lp + 1) != PLAIN


def test_zero_threshold_is_the_old_rule():
    p = DispatchPolicy(group_size=4, m_sat=16, min_prefix_len=16)
    assert p.choose(2, 16) == CASCADE and p.choose(4, 16) == DENSE and p.choose(1, 1000) == PLAIN


def test_engine_wires_the_threshold_per_rank_and_defaults_to_zero_on_cpu():
    eng = Engine(tiny_config("granikv", kernel_impl="torch"))
    pol = eng.backend.policy
    spec = eng.spec
    assert pol.min_saved_bytes == 0  # None on the CPU: every class of >= 2 may take a pass
    assert pol.kv_bytes_per_token == 2 * spec.num_kv_heads * spec.head_dim * 4  # float32
    eng = Engine(tiny_config("granikv", kernel_impl="torch", prefix_pass_min_saved_mib=1.5))
    pol = eng.backend.policy
    assert pol.min_saved_bytes == int(1.5 * MIB)


def test_a_threshold_no_class_meets_sends_every_step_down_the_plain_path_with_the_same_tokens():
    prompts = multi_prefix_prompts(seed=5, prefix_lens=(40, 24), per_prefix=(3, 3))
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    outs = {}
    for name, cfg in (("paged", tiny_config("paged", kernel_impl="torch")),
                      ("granikv", tiny_config("granikv", kernel_impl="torch")),
                      ("granikv-plain", tiny_config("granikv", kernel_impl="torch", prefix_pass_min_saved_mib=1e6))):
        eng = Engine(cfg)
        reqs = [eng.add_request(p, params, shared_prefix_len=lp) for p, lp in prompts]
        while any(r.status != Status.FINISHED for r in reqs):
            eng.step()
        outs[name] = [r.output_ids for r in reqs]
        if name.startswith("granikv"):
            att = eng.stats()["attention"]
            if name == "granikv":
                assert att["dense_steps"] + att["cascade_steps"] > 0, att
            else:
                assert att["dense_steps"] == att["cascade_steps"] == 0, att
                assert att["paged_steps"] == att["decode_steps"] > 0, att
                assert eng.stats()["hot_admits"] > 0  # the prefixes still sit in HOT slabs
    assert outs["granikv"] == outs["paged"] == outs["granikv-plain"]



def test_class_sizes_count_every_class_step_by_its_decision():
    from granikv.attention.dispatch import DispatchCounters

    c = DispatchCounters()
    c.record([CASCADE, CASCADE, PLAIN], [64, 65, 1])
    c.record([CASCADE, CASCADE], [64, 64])
    c.record([PLAIN])  # a step with no class: counted as a plain step, no size
    d = c.as_dict()
    assert d["class_sizes"] == {DENSE: {}, CASCADE: {"64": 3, "65": 1}, "rows": {}, "ext": {}, PLAIN: {"1": 1}}
    assert d["class_decisions"] == {DENSE: 0, CASCADE: 4, "rows": 0, "ext": 0, PLAIN: 2}
    assert sum(d["class_sizes"][CASCADE].values()) == d["class_decisions"][CASCADE]


def test_the_engine_reports_the_class_sizes_of_its_decode_steps():
    prompts = multi_prefix_prompts(seed=5, prefix_lens=(40, 24), per_prefix=(3, 2))
    eng = Engine(tiny_config("granikv", kernel_impl="torch"))
    reqs = [eng.add_request(p, SamplingParams(max_new_tokens=6, ignore_eos=True), shared_prefix_len=lp)
            for p, lp in prompts]
    while any(r.status != Status.FINISHED for r in reqs):
        eng.step()
    att = eng.stats()["attention"]
    sizes = {int(n) for kind in att["class_sizes"].values() for n in kind}
    assert sizes and sizes <= {1, 2, 3}, att["class_sizes"]
    assert sum(sum(h.values()) for h in att["class_sizes"].values()) >= att["decode_steps"] - att["paged_steps"]


@given(classes=st.lists(st.tuples(st.integers(0, 64), st.integers(0, 1 << 14)), max_size=80),
       mib=st.integers(0, 512))
def test_a_launch_pays_by_the_sum_over_its_classes(classes, mib):
    """One pass launch covers every class of its kind: it pays when their avoided re-reads,
    summed, reach the threshold; a class alone pays exactly when `choose` gives it a pass."""
    p = _h200_policy() if mib == 192 else DispatchPolicy(
        group_size=4, m_sat=2048, min_prefix_len=256, kv_bytes_per_token=LLAMA_KV, min_saved_bytes=mib * MIB)
    total = sum(max(n - 1, 0) * lp * LLAMA_KV for n, lp in classes)
    assert p.pays(classes) == (total >= p.min_saved_bytes)
    for n, lp in classes[:4]:
        assert (p.choose(n, lp) != PLAIN) == (p.kind(n, lp) != PLAIN and p.pays([(n, lp)]))


def test_k64_classes_pay_together_under_the_h200_threshold():
    """multiprefix k=64 at Lp=8K, B=256: ~4 requests per class avoid 96 MiB each, under 192 MiB
    alone; 64 such classes in one launch avoid 6 GiB."""
    p = _h200_policy()
    assert p.choose(4, 8192) == PLAIN
    assert p.pays([(4, 8192)] * 64) and p.kind(4, 8192) == CASCADE
