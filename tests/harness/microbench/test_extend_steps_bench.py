"""harness.microbench.extend_steps on CPU (Triton interpreter, tiny shapes): the script runs
end to end, times one split against the splits the policy picks, checks both against the
float32 reference, and writes its records; the cost model counts causal keys."""

from __future__ import annotations

import json

from harness.microbench import extend_steps


def test_cost_counts_causal_keys_and_reads_each_request_once():
    flops, nbytes = extend_steps._cost(lp=10, n=2, new=3, hq=8, hkv=2, d=64, elt=2)
    assert flops == 4.0 * 8 * 64 * 2 * (11 + 12 + 13)
    assert nbytes == 2 * 13 * 2 * 2 * 64 * 2 + 2 * 2 * 3 * 8 * 64 * 2


def test_cpu_dry_run_writes_records(tmp_path):
    out = tmp_path / "extend.json"
    rc = extend_steps.main(["--device", "cpu", "--lp", "70", "--cases", "1x3,2x5", "--rep-ms", "1",
                            "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    recs = doc["records"]
    assert {(r["n"], r["new"]) for r in recs} == {(1, 3), (2, 5)}
    assert all(r["rel_err"] is not None and r["rel_err"] < 1e-4 for r in recs)
    # each case has its one-split record and the policy's (> 1 at min_split_len 32, 70 keys)
    assert all(any(r["splits"] > 1 for r in recs if r["n"] == n) for n in (1, 2))
    assert "| 70 | 1 x 3 |" in extend_steps.table(recs, 32)


def test_cpu_engine_mode_times_one_extend_step_per_case(tmp_path):
    out = tmp_path / "engine.json"
    rc = extend_steps.main(["--engine", "--device", "cpu", "--lp", "40", "--cases", "1x5,2x7", "--reps", "2",
                            "--extend-graphs", "8,16", "--py-profile", "--out", str(out)])
    assert rc == 0
    recs = json.loads(out.read_text())["records"]
    assert {(r["n"], r["new"], r["variant"]) for r in recs} == {(n, k, v) for n, k in ((1, 5), (2, 7))
                                                                for v in ("split", "no-split", "split+graphs")}
    assert all(r["split"] == (r["variant"] != "no-split") for r in recs)
    # every timed step was one extend step of exactly the case's requests and tokens
    assert all([list(x) for x in r["step_shapes"]] == [[r["n"] * r["new"], r["n"]]] for r in recs)
    assert all(r["step_ms"] > 0 for r in recs)
    # the profiled step's host time by engine phase, and its costliest host ops
    assert all({"plan", "forward"} <= set(r["host_phase_ms"]) for r in recs)
    # an eager step's forward is host time on CPU (the GPU-side annotation must not mask it)
    assert all(r["host_phase_ms"]["forward"] > 0 for r in recs if r["variant"] != "split+graphs")
    # --py-profile: the Python functions of one more step, by own time
    assert all(r["host_top_python"] and all(len(x) == 4 and x[2] <= x[3] + 1e-3 for x in r["host_top_python"])
               for r in recs)
    assert all(r["host_top_ops"] and all(len(o) == 3 and o[2] >= 0 for o in r["host_top_ops"]) for r in recs)
    assert "| 40 | 1 x 5 |" in extend_steps.engine_table(recs)


def test_cpu_rule_long_keys_adds_its_engine_variant_and_picks_kernel_auto_splits(tmp_path):
    out = tmp_path / "engine.json"
    assert extend_steps.main(["--engine", "--device", "cpu", "--lp", "40", "--cases", "1x5", "--reps", "1",
                              "--rule", "long-keys", "--out", str(out)]) == 0
    recs = json.loads(out.read_text())["records"]
    assert {(r["variant"], r["split_rule"]) for r in recs} == {
        ("split", "fill"), ("no-split", "fill"), ("split:long-keys", "long-keys")}
    out2 = tmp_path / "kernel.json"
    assert extend_steps.main(["--device", "cpu", "--lp", "70", "--cases", "1x3", "--rep-ms", "1",
                              "--rule", "long-keys", "--out", str(out2)]) == 0
    doc = json.loads(out2.read_text())
    assert doc["config"]["rule"] == "long-keys" and doc["records"]


def test_cpu_engine_mode_at_tp2_steps_tp_engines_and_stops_their_workers(tmp_path):
    """--tp 2: the default variant as a TP engine (gloo ranks on CPU; one TP engine per process,
    so no on/off pair), the records say so, and the workers are gone when the run returns."""
    import multiprocessing

    out = tmp_path / "engine-tp2.json"
    assert extend_steps.main(["--engine", "--device", "cpu", "--tp", "2", "--lp", "40", "--cases", "1x5",
                              "--reps", "1", "--out", str(out)]) == 0
    recs = json.loads(out.read_text())["records"]
    assert [(r["variant"], r["tp"]) for r in recs] == [("split", 2)]
    assert all([list(x) for x in r["step_shapes"]] == [[5, 1]] for r in recs)
    assert not [p for p in multiprocessing.active_children() if p.is_alive()]
