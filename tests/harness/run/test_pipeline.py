"""The pipeline: sweeps -> cells, the Snakemake plan of every profile, and (slow) the whole
cpu-smoke pipeline end to end in a temporary copy of the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report.tables.specs import TABLE_NUMBERS
from harness.run import sweeps
from harness.run.results import load_results

ROOT = Path(__file__).resolve().parents[3]
PROFILES = ("cpu-smoke", "h200", "paper", "a100-40gb")


def _profile(name: str) -> sweeps.PipelineProfile:
    return sweeps.load_profile(ROOT / "profiles" / name / "pipeline.yaml")


def test_every_sweep_file_loads_and_every_paper_table_has_a_sweep():
    all_sweeps = sweeps.all_sweeps()
    covered = {t for s in all_sweeps.values() for t in s.tables}
    assert set(TABLE_NUMBERS) <= covered
    for s in all_sweeps.values():
        for r in s.reads:
            assert r.sweep in all_sweeps, f"{s.name} reads unknown sweep {r.sweep}"


@pytest.mark.parametrize("name", PROFILES)
def test_plan_cells_are_unique_and_runnable(name):
    p = sweeps.plan(_profile(name))
    cells = p.all_cells()
    assert cells
    paths = [c.path(p.profile) for c in cells]
    assert len(paths) == len(set(paths))
    for c in cells:
        assert c.gpus <= max(p.profile.gpus, 1) or p.profile.gpus == 0
        assert f"sweep={c.sweep}" in c.overrides(p.profile)


def test_paper_grid_sizes_match_the_paper():
    p = sweeps.plan(_profile("paper"))
    per_rep = {n: len(c) // 3 for n, c in p.cells.items()}
    assert per_rep["table6"] == 5 * 4 * 3      # Lp x B x systems (B.1)
    assert per_rep["table9"] == 6 * 6 * 3      # Lp x B x systems (B.2)
    assert per_rep["table20"] == 4 * 3         # k x systems (B.8)
    assert per_rep["table24"] == 6 + 1         # f_p values + cascade (B.12)
    assert per_rep["table13"] == 4             # SGL, SGL-C, SGL-C/GKV, GKV
    t3 = [c for c in p.inputs_of("table3")]
    assert {(c.paper["model"], c.paper["lp"]) for c in t3} == {
        (m, lp) for m in ("llama-3.1-8b", "qwen2.5-14b", "qwen2.5-32b") for lp in (4096, 8192, 16384)}
    assert {c.paper["batch"] for c in t3} == {256}


def test_gpu_count_filters_tp():
    p = sweeps.plan(_profile("h200"))
    assert {c.values["tp"] for c in p.all_cells()} == {1}


def test_stand_in_scales_and_records_the_paper_cell():
    si = _profile("cpu-smoke").stand_in
    cell = si.apply({"model": "qwen2.5-32b", "tp": 4, "lp": 8192, "batch": 256, "workload": "burst",
                     "num_prompts": 256, "system": "paged"})
    assert (cell["model"], cell["tp"], cell["lp"], cell["batch"]) == ("tiny-qwen", 1, 128, 4)
    assert cell["stands_for"] == {"model": "qwen2.5-32b", "tp": 4, "lp": 8192, "batch": 256, "num_prompts": 256}
    hetero = si.apply({"model": "llama-3.1-8b", "tp": 1, "lp": 16384, "batch": 256, "workload": "hetero", "k": 4})
    assert hetero["workload.lps"] == [32, 64, 128, 256]


def test_stand_in_collisions_are_refused():
    sw = sweeps.Sweep(name="t", tables=(), grids={"smoke": ({"system": ["paged"], "model": ["llama-3.1-8b"],
                                                             "lp": [8192], "batch": [8, 32]},)})
    prof = sweeps.PipelineProfile(name="x", hardware="cpu", grid="smoke", gpus=0,
                                  stand_in=_profile("cpu-smoke").stand_in)
    with pytest.raises(ValueError, match="two cells map to"):
        sweeps.sweep_cells(sw, prof)


def test_paper_view_puts_stand_ins_in_paper_units(tmp_path):
    src = tmp_path / "cpu" / "table6"
    src.mkdir(parents=True)
    doc = {"config": {"system": "paged", "model": "tiny", "tp": 1, "workload": "burst", "lp": 128, "batch": 4,
                      "stands_for": {"model": "llama-3.1-8b", "tp": 1, "lp": 8192, "batch": 256}},
           "metrics": {"output_throughput": 1.0, "median_ttft_ms": 1.0, "median_tpot_ms": 1.0, "completed": 1,
                       "failed": 0}, "engine": {"decode_steps": 1}, "env": {"gpu": "none", "git_sha": "x"}}
    (src / "c.json").write_text(json.dumps(doc))
    assert sweeps.paper_view(tmp_path / "cpu", tmp_path / "cpu-standin") == 1
    cells = load_results(tmp_path / "cpu-standin").cells
    row = cells.iloc[0]
    assert (row["config.model"], row["config.lp"], row["config.batch"]) == ("llama-3.1-8b", 8192, 256)
    assert row["config.ran.model"] == "tiny" and row["config.ran.lp"] == 128
    assert row["env.gpu"].startswith("stand-in")


@pytest.mark.parametrize("name", PROFILES)
def test_snakemake_dry_run_plans(name, tmp_path):
    out = subprocess.run([sys.executable, "-m", "snakemake", "--profile", f"profiles/{name}", "-n", "all",
                          "--directory", str(ROOT)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout + out.stderr
    assert "Job stats" in text or "Nothing to be done" in text


def test_one_target_per_table():
    out = subprocess.run([sys.executable, "-m", "snakemake", "--profile", "profiles/h200", "-n", "table24"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    assert "table24" in text and "microbench" in text  # cells wait for the m_sat fit


def _copy_repo(dst: Path) -> None:
    """The repository without its outputs: the top-level output folders (results/, tables/, plots/,
    workloads/) only, since packages share their names (harness/run/workloads/,
    harness/report/tables/)."""
    anywhere = shutil.ignore_patterns(".venv", ".git", ".snakemake", "__pycache__", ".pytest_cache", ".ruff_cache",
                                      "*.egg-info")
    top = {"results", "tables", "plots", "workloads"}

    def ignore(folder: str, names: list[str]) -> set[str]:
        return set(anywhere(folder, names)) | (top & set(names) if Path(folder) == ROOT else set())

    shutil.copytree(ROOT, dst, ignore=ignore)
    os.symlink(ROOT / ".venv", dst / ".venv")


@pytest.mark.slow
def test_cpu_smoke_pipeline_end_to_end(tmp_path):
    """`snakemake --profile profiles/cpu-smoke all` (scripts/smoke.sh) in a temporary copy."""
    repo = tmp_path / "repo"
    _copy_repo(repo)
    out = subprocess.run(["bash", "scripts/smoke.sh"], cwd=repo, capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "tables/cpu/README.md" in out.stdout
    plan = sweeps.plan(_profile("cpu-smoke"))
    for c in plan.all_cells():
        assert (repo / c.path(plan.profile)).is_file()
    for n in TABLE_NUMBERS:
        assert (repo / "tables" / "cpu" / f"table{n}.md").is_file()
    assert (repo / "plots" / "cpu").is_dir()
    # a second run measures nothing again
    again = subprocess.run(["bash", "scripts/smoke.sh", "-n"], cwd=repo, capture_output=True, text=True,
                           timeout=600)
    assert "Nothing to be done" in again.stdout + again.stderr
