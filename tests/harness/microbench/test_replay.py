"""The CPU replay (harness/microbench/replay.py): the real scheduler and storage under a stub
runner, on small synthetic multi-prefix workloads."""

import json

import pytest

from harness.microbench import replay as R
from harness.run.results import validate_microbench
from harness.run.workloads.build import generate, write
from harness.run.workloads.config import WorkloadConfig


def workload(k, lp, n, suffix_len=4, output_len=4):
    cfg = WorkloadConfig.for_kind("multiprefix", k=k, lp=lp, num_requests=n, suffix="synthetic",
                                  suffix_len=suffix_len, output_len=output_len, vocab_size=1024, arrival="burst")
    return generate(cfg)


def rc(num_slots, batch, **kw):
    kw.setdefault("warmup_requests", 0)
    kw.setdefault("max_context", 256)
    return R.ReplayConfig(num_slots=num_slots, batch=batch, model="tiny", chunked_prefill_tokens=512, page_size=4,
                          **kw)


def test_no_pressure_computes_each_prefix_once_and_every_output():
    reqs = workload(k=4, lp=64, n=32)
    for system in ("paged", "granikv"):
        r = R.replay(system, reqs, rc(20000, 8))
        assert r.requests == 32 and r.retractions == 0 and r.evicted_slots == 0
        # every prefix once, every suffix, and nothing else (64 is a whole number of pages)
        assert r.prefill_tokens == 4 * 64 + sum(len(q.input_ids) - 64 for q in reqs)
        assert r.decode_tokens == sum(q.output_len - 1 for q in reqs)  # the first comes from prefill
        assert r.storage["live_requests"] == 0


def test_one_prefix_goes_to_a_slab():
    r = R.replay("granikv", workload(k=1, lp=64, n=32), rc(2000, 16))
    assert r.storage["hot_admits"] >= 1 and r.storage["hot_hits"] >= 16
    assert r.scheduler["hot_admits"] == 32 and r.scheduler["hot_fallbacks"] == 0


@pytest.mark.parametrize("lp,num_slots", [(64, 665), (128, 1228)])
def test_more_prefixes_than_fit_granikv_recomputes_no_more_than_paged(lp, num_slots):
    """k=8 prefixes, KV for about 1.2-1.3 of the working set, HOT for 1-3 slabs: the Table 20 k=64
    regime at toy scale. Before HOT admission stopped evicting cached slabs that LRU would keep
    (promotions, new explicit prefixes), granikv computed 1.4-1.6x paged's prefill here."""
    reqs = workload(k=8, lp=lp, n=64)
    paged = R.replay("paged", reqs, rc(num_slots, 32))
    granikv = R.replay("granikv", reqs, rc(num_slots, 32))
    assert paged.evicted_slots > 0  # the cache is under pressure
    assert granikv.storage["hot_hits"] > 0  # and slabs are still used
    assert granikv.prefill_tokens <= paged.prefill_tokens * 1.05


def test_cli_writes_results(tmp_path):
    cfg = WorkloadConfig.for_kind("multiprefix", k=2, lp=64, num_requests=8, suffix="synthetic", suffix_len=4,
                                  output_len=4, vocab_size=1024, arrival="burst")
    wl = write(cfg, tmp_path / "wl.jsonl")
    out = tmp_path / "replay.json"
    assert R.main(["--workload", str(wl), "--systems", "paged,granikv", "--num-slots", "4000", "--batch", "4",
                   "--model", "tiny", "--max-context", "256", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    validate_microbench(doc, out)  # the results/<hw>/microbench contract
    assert [r["system"] for r in doc["records"]] == ["paged", "granikv"]
    assert doc["config"]["num_slots"] == 4000 and doc["config"]["workload_config"]["k"] == 2
    assert all(r["prefill_tokens"] > 0 and r["decode_tokens"] > 0 for r in doc["records"])


def test_eviction_causes_add_up_to_the_storage_counters():
    """replay_causes' ledger: evictions by call site sum to the storage's own counter, and every
    request's named prefix is accounted for exactly once (served from a slab or COLD, or computed)."""
    from harness.diagnostics import replay_causes as C

    reqs = workload(k=8, lp=64, n=64)
    cfg = rc(700, 16)
    got = C.explain(reqs, cfg)
    plain = R.replay("granikv", reqs, cfg)
    assert sum(got["evicted_slots"].values()) == plain.evicted_slots > 0
    assert got["prefill_tokens"] == plain.prefill_tokens
    assert sum(got["named_prefix_tokens"].values()) == 64 * 64
    assert sum(got["slab_allocs"].values()) >= 1


def test_class_sizes_follow_file_order_and_tiles_count_whole_m_tiles():
    """Requests go to prefix i mod k in file order and the client refills in that order, so a wave
    of `batch` requests splits into classes of batch/k whatever the arrival lag; the prefix pass
    then needs ceil(n * g / 64) M tiles per class (tiny: g = 4)."""
    reqs = workload(k=4, lp=64, n=64, output_len=6)
    for lag in (0, 3):
        r = R.replay("granikv", reqs, rc(20000, 16, arrival_lag_steps=lag, seed=1))
        assert r.decode_tokens == sum(q.output_len - 1 for q in reqs)  # the lag loses no request
        assert r.storage["live_requests"] == 0
        assert set(r.class_sizes) <= {str(n) for n in range(1, 5)} and "4" in r.class_sizes
        assert r.full_batch_steps > 0
        # classes of 4 requests, 4 query heads each: 16 rows, one M tile; four classes a step
        assert set(r.full_batch_tiles) <= {"1", "2", "3", "4"} and "4" in r.full_batch_tiles
    assert R.replay("paged", reqs, rc(20000, 16)).class_sizes == {}  # no HOT slabs, no classes


def test_an_arrival_lag_delays_refills_but_serves_everything():
    reqs = workload(k=2, lp=64, n=24, output_len=5)
    fast = R.replay("granikv", reqs, rc(20000, 8))
    slow = R.replay("granikv", reqs, rc(20000, 8, arrival_lag_steps=6, seed=3))
    again = R.replay("granikv", reqs, rc(20000, 8, arrival_lag_steps=6, seed=3))
    assert slow.decode_tokens == fast.decode_tokens
    assert slow.decode_steps >= fast.decode_steps  # refills wait, so steps run smaller batches
    assert (slow.decode_steps, slow.class_sizes) == (again.decode_steps, again.class_sizes)  # seeded


@pytest.mark.parametrize("system", ["paged", "cascade", "granikv"])
def test_agents_compute_the_head_and_each_role_prompt_once(system):
    """k agents behind one system prompt, no hint from the client: a request waits on whatever
    part of its prompt another request is computing (the scheduler compares prompts by blocks of
    16 tokens), so the common head is prefilled once and each agent's role prompt once, not again by
    the agent's requests admitted while it is being computed."""
    cfg = WorkloadConfig.for_kind("agents", k=3, lp=128, la=128, num_requests=24, suffix="synthetic", suffix_len=4,
                                  output_len=4, vocab_size=1024, arrival="burst")
    reqs = generate(cfg)
    r = R.replay(system, reqs, rc(20000, 8, send_prefix_hint=False, max_context=512))
    assert r.requests == 24 and r.retractions == 0
    assert r.prefill_tokens == 128 + 3 * 128 + sum(len(q.input_ids) - 256 for q in reqs)
