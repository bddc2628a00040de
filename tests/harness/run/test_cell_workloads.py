"""The tree and debate workloads end to end: one cell each through the real engine (tiny model,
CPU hardware profile), every request answered. The debate cell also shows the closed loop on a
real server: each round's prompt is longer than the last by the k outputs of that round."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.run import env as cell_env

ROOT = Path(__file__).resolve().parents[3]


def _cell(tmp_path: Path, *overrides: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != cell_env.CALL_ID_ENV}  # a cell run alone
    out = subprocess.run([sys.executable, "-m", "harness.run.cell", "system=granikv", "model=tiny", "hardware=cpu",
                          "batch=4", "output_len=4", "workload.suffix=synthetic", "workload.suffix_len=8",
                          f"results_dir={tmp_path}/results", f"workloads_dir={tmp_path}/workloads", *overrides],
                         cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = (tmp_path / "results" / "cpu" / "adhoc").glob("*.json")
    doc = json.loads(path.read_text())
    doc["client"] = json.loads((Path(doc["run"]["dir"]) / "client.json").read_text())
    return doc


@pytest.mark.slow
def test_a_tree_cell_on_the_engine(tmp_path):
    doc = _cell(tmp_path, "workload=tree", "workload.levels=[[1,32],[2,16],[2,8]]", "k=4", "num_prompts=8")
    m = doc["metrics"]
    assert (m["completed"], m["failed"]) == (8, 0)
    assert doc["config"]["cell_id"] == "granikv-tiny-tp1-tree-lp0-b4-k4-r0"
    assert doc["config"]["workload_prefix_lengths"] == [56] * 4
    assert [r["prompt_len"] for r in doc["client"]["records"]] == [64] * 8


@pytest.mark.slow
@pytest.mark.parametrize("api", ["generate", "completions"])
def test_a_debate_cell_runs_closed_loop_on_the_engine(tmp_path, api):
    """On /v1/completions the outputs come back as vLLM's `return_token_ids` ids."""
    doc = _cell(tmp_path, "workload=debate", "lp=32", "workload.la=8", "k=2", "workload.rounds=3", "num_prompts=12",
                f"client.api={api}")
    m = doc["metrics"]
    assert (m["completed"], m["failed"]) == (12, 0)
    recs = doc["client"]["records"]  # debate by debate, round by round, agent by agent
    static = 32 + 8 + 8  # system + topic + role
    want = [static + rnd * 2 * 4 for _debate in range(2) for rnd in range(3) for _agent in range(2)]
    assert [r["prompt_len"] for r in recs] == want
    assert doc["config"]["max_context"] >= static + 2 * 2 * 4 + 4


@pytest.mark.slow
def test_a_tree_cell_reads_level_two_once_with_the_share_depth_knob(tmp_path):
    """`share_depth=3` (granikv's knob, in the cell id like m_sat) reaches the engine: the leaves'
    runs are read by level-2 classes (`ext2`), which a two-level engine never forms."""
    doc = _cell(tmp_path, "workload=tree", "workload.levels=[[1,260],[2,260],[2,260]]", "k=4", "num_prompts=8",
                "batch=8", "share_depth=3")
    assert doc["config"]["cell_id"] == "granikv-tiny-tp1-tree-lp0-b8-k4-r0-share_depth3"
    assert (doc["metrics"]["completed"], doc["metrics"]["failed"]) == (8, 0)
    e = doc["engine"]
    assert e["deep_ext_steps"] > 0 and e["class_decisions"]["ext2"] > 0, e
