"""harness.microbench.engine_steps on the CPU (tiny model, torch kernels): the script that fills
results/h200/engine/steps.json runs end to end — decode-step cells with their roofline floor and
host-gap share, and the HTTP-vs-in-process check in both streaming modes — so a GPU session
never finds a broken code path. Its numbers on a CPU mean nothing and are not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("w") / "burst.jsonl"
    subprocess.run([sys.executable, "-m", "harness.run.workloads", "--kind", "burst", "--num-requests", "6",
                    "--lp", "48", "--suffix-len", "8", "--output-len", "12", "--vocab-size", "1024",
                    "--out", str(out)], cwd=ROOT, check=True, capture_output=True)
    return out


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "steps.json"
    r = subprocess.run([sys.executable, "-m", "harness.microbench.engine_steps", "--model", "tiny", "--device", "cpu",
                        "--kernel-impl", "torch", "--kv-budget-gb", "0.05", "--out", str(out), *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("streaming", ["cumulative", "incremental"])
def test_http_check_serves_the_whole_workload(tmp_path, workload, streaming):
    doc = _run(tmp_path, "--cells", "", "--http", str(workload), "--http-streaming", streaming,
               "--http-repeats", "1")
    h = doc["http"]
    assert h["incremental_streaming_output"] == (streaming == "incremental")
    assert h["http_metrics"]["completed"] == 6 and h["http_metrics"]["failed"] == 0
    assert h["http_metrics"]["total_output_tokens"] == 6 * 12
    assert h["http_output_throughput"] > 0 and h["inprocess_output_throughput"] > 0
    assert h["server_engine"]["step_log"]["decode"]["count"] > 0


def test_decode_step_cell_records_floor_and_host_gap(tmp_path):
    doc = _run(tmp_path, "--cells", "64x4", "--systems", "paged,granikv", "--steps", "4", "--prof-steps", "2")
    recs = {r["system"]: r for r in doc["records"]}
    assert set(recs) == {"paged", "granikv"}
    for r in recs.values():
        assert (r["Lp"], r["B"], r["steps"]) == (64, 4, 4)
        assert r["step_ms"] > 0 and r["floor_ms"] > 0
        assert r["host_gap_share"] is None  # GPU idle time: there is no GPU timeline on a CPU
    assert recs["granikv"]["attention"]["decode_steps"] > 0


def test_cpu_dry_run_defaults_to_the_tiny_model(tmp_path):
    """`--device cpu` without `--model` must not build Llama-8B's random weights (32 GB in float32:
    the process was killed by the OOM killer without a word)."""
    out = tmp_path / "steps.json"
    r = subprocess.run([sys.executable, "-m", "harness.microbench.engine_steps", "--device", "cpu",
                        "--kernel-impl", "torch", "--kv-budget-gb", "0.05", "--out", str(out),
                        "--cells", "32x2", "--systems", "paged", "--steps", "2", "--prof-steps", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["config"]["model"] == "tiny"
    assert doc["records"][0]["model"] == "tiny"


def test_sampled_share_runs_the_sampler_in_the_cell(tmp_path):
    """`--sampled-share`: part of the batch samples (top-p, logprobs, per-request seeds), the
    rest stays greedy; the record says how many sampled and with what."""
    doc = _run(tmp_path, "--cells", "64x4", "--systems", "granikv", "--steps", "3", "--prof-steps", "1",
               "--sampled-share", "0.5", "--sampled-params", "temperature=0.8,top_p=0.9,logprobs=5,seed=3")
    r = doc["records"][0]
    assert r["sampled_requests"] == 2
    assert r["sampled_params"] == {"temperature": 0.8, "top_p": 0.9, "logprobs": 5, "seed": 3}
    assert r["step_ms"] > 0


def test_tree_cell_records_the_floor_of_each_depth(tmp_path):
    """`--trees`: requests over a tree of shared runs, no hint; the record holds the tree, the K/V
    floor for each depth of sharing, and each system's floor is the one its sharing allows."""
    doc = _run(tmp_path, "--cells", "", "--trees", "1x32,2x16@4", "--systems", "paged,granikv", "--steps", "3",
               "--prof-steps", "1")
    recs = {r["system"]: r for r in doc["records"]}
    for system, depth in (("paged", "paged"), ("granikv", "any_depth")):
        r = recs[system]
        assert r["tree"] == [[1, 32], [2, 16]] and (r["Lp"], r["B"]) == (48, 4)
        by = r["floor_kv_ms_by_depth"]
        assert by["paged"] > by["root"] > by["any_depth"] and by["two_level"] == by["any_depth"]
        assert r["floor_kv_ms"] == by[depth] and r["step_ms"] > 0
    assert recs["granikv"]["share_depth"] == 5  # every level by default


def test_tree_cell_at_a_capped_depth_is_held_to_that_depths_floor(tmp_path):
    """`--share-depth 1`: granikv reads only the root once, so its floor is the root's."""
    doc = _run(tmp_path, "--cells", "", "--trees", "1x32,2x16@4", "--systems", "granikv", "--share-depth", "1",
               "--steps", "3", "--prof-steps", "1")
    (r,) = doc["records"]
    assert r["share_depth"] == 1 and r["floor_kv_ms"] == r["floor_kv_ms_by_depth"]["root"]


def test_tree_cell_runs_granikv_once_per_listed_depth(tmp_path):
    """`--share-depth 5,2 --flat both`: granikv at every level and at the two-level cap, each with
    the flattened launch and without, back to back, each held to its depth's floor; the other
    systems once."""
    doc = _run(tmp_path, "--cells", "", "--trees", "1x32,2x16,2x8@8", "--systems", "cascade,granikv",
               "--share-depth", "5,2", "--flat", "both", "--steps", "2", "--prof-steps", "1")
    got = [(r["system"], r["share_depth"], r["flat_prefix"]) if r["system"] == "granikv" else r["system"]
           for r in doc["records"]]
    assert got == ["cascade", ("granikv", 5, True), ("granikv", 5, False), ("granikv", 2, True), ("granikv", 2, False)]
    by = {r["share_depth"]: r for r in doc["records"] if r["system"] == "granikv" and r["flat_prefix"]}
    assert by[5]["floor_kv_ms"] == by[5]["floor_kv_ms_by_depth"]["any_depth"]
    assert by[2]["floor_kv_ms"] == by[2]["floor_kv_ms_by_depth"]["two_level"]
    assert all(isinstance(r["kernels"], list) for r in doc["records"])
