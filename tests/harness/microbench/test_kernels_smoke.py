"""The kernel microbenchmark's whole path (tuning, Table 5 analog, sweep, M_sat fit) on the CPU
under Triton's interpreter with its tiny smoke plan: the script runs and writes a result file
whose records carry what the tables and the M_sat fit read. Its numbers are not measurements."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_kernels_smoke_plan_runs_under_the_interpreter(tmp_path):
    out = tmp_path / "kernels.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-m", "harness.microbench.kernels", "--smoke", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["records"] and {"op", "layout", "B", "Lp", "us"} <= set(doc["records"][0])
    assert {"extend", "decode", "prefix_dense", "prefix_cascade"} <= set(doc["tuning"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is Triton's backend")
def test_kernels_without_a_backend_says_how_to_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "harness.microbench.kernels", "--smoke", "--out",
                        str(tmp_path / "k.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "TRITON_INTERPRET=1" in r.stderr
