"""harness.microbench.tree_passes on the CPU (Triton interpreter, tiny shapes): the sweep runs end
to end, checks every form against the plain decode and writes its records; the numbers on a
CPU mean nothing and are not asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_smoke_sweep_checks_and_records_every_form(tmp_path):
    out = tmp_path / "tp.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-m", "harness.microbench.tree_passes", "--smoke", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    forms = [rec["form"] for rec in doc["records"]]
    assert forms[:5] == ["plain", "per_level", "flat", "flat_slab", "flat_slab"]
    assert all(rec["rel_err"] < 1e-4 for rec in doc["records"][:5])
    # each level alone, its runs as rows and as slabs (TMA only on a GPU), per config
    assert {(r["level"], r["load"]) for r in doc["records"][5:]} == {(0, "slab"), (1, "rows"), (1, "slab"),
                                                                       (2, "rows"), (2, "slab")}
    assert doc["config"]["levels"] == [[1, 40], [2, 24], [2, 17]] and doc["floor_us"] > 0


def test_without_a_gpu_it_asks_for_smoke(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-m", "harness.microbench.tree_passes"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--smoke" in r.stderr
