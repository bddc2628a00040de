"""The cluster profiles (profiles/slurm, profiles/kubernetes; docs/scale-out.md): each renders as
Snakemake renders a profile (YTE, with the site's names read from the environment), its
pipeline.yaml loads the way the Snakefile loads it, and Snakemake plans the sweep as one job per
cell asking for exactly the cell's TP GPUs. The executors' own dry runs need their plugins, which
the test extra leaves out (the Slurm plugin needs pandas < 3); without them the Slurm profile is
planned with the local executor in the Slurm executor's place, which evaluates the same resources."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.run import sweeps

yte = pytest.importorskip("yte")  # Snakemake's profile templating, installed with snakemake (the harness extra)

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = ("slurm", "kubernetes")
SITE_VARS = ("GRANIKV_SLURM_PARTITION", "GRANIKV_SLURM_CPU_PARTITION", "GRANIKV_SLURM_ACCOUNT",
             "GRANIKV_SLURM_GPU_MODEL", "GRANIKV_SLURM_JOBS", "GRANIKV_K8S_IMAGE", "GRANIKV_K8S_NAMESPACE",
             "GRANIKV_STORAGE_PREFIX", "GRANIKV_K8S_JOBS")


@pytest.fixture(autouse=True)
def _no_site_vars(monkeypatch):
    for var in SITE_VARS:
        monkeypatch.delenv(var, raising=False)


def _render(name: str) -> dict:
    """The profile's CLI options as Snakemake reads them (snakemake.profiles: YTE, then YAML)."""
    with open(ROOT / "profiles" / name / "config.yaml") as f:
        return yte.process_yaml(f, require_use_yte=True)


def _pipeline(name: str) -> sweeps.PipelineProfile:
    """profiles/<name>/pipeline.yaml as the Snakefile turns its `config` into a PipelineProfile."""
    config = yaml.safe_load((ROOT / "profiles" / name / "pipeline.yaml").read_text())
    return sweeps.PipelineProfile.from_dict({k: v for k, v in config.items()
                                             if k != "python" and not k.startswith("gate_")})


def _gpu_settings(opts: dict) -> list[str]:
    """Every `gpu` a profile sets itself: none may, the count is each cell's own (Snakefile)."""
    found = ["default-resources"] if "gpu" in opts.get("default-resources", {}) else []
    return found + [rule for rule, res in opts.get("set-resources", {}).items() if "gpu" in res]


@pytest.mark.parametrize("name", CLUSTER)
def test_profile_defaults(name):
    opts = _render(name)
    assert opts["executor"] == name
    assert opts["configfile"] == f"profiles/{name}/pipeline.yaml"
    assert isinstance(opts["jobs"], int) and opts["jobs"] > 0
    assert _gpu_settings(opts) == []
    assert "view=1" in opts["resources"] and not any(r.startswith("gpu") for r in opts["resources"])
    if name == "slurm":
        res = opts["default-resources"]
        assert res["slurm_partition"] == "gpu" and "slurm_account" not in res
        assert opts["set-resources"]["point"]["slurm_partition"] == "gpu"
        assert "gpu_model" not in opts["set-resources"]["point"]
    else:
        assert opts["default-resources"]["gpu_manufacturer"] == "nvidia"  # the executor refuses `gpu` without it
        assert opts["default-resources"]["scale"] == 0  # limits: Kubernetes takes no GPU request without one
        assert opts["default-storage-provider"] and opts["default-storage-prefix"]  # no shared filesystem
        assert opts["container-image"] and opts["kubernetes-namespace"] == "default"
        assert opts["set-threads"]["point"] >= 2


def test_site_names_come_from_the_environment(monkeypatch):
    for var, value in [("GRANIKV_SLURM_PARTITION", "h200"), ("GRANIKV_SLURM_CPU_PARTITION", "cpu"),
                       ("GRANIKV_SLURM_ACCOUNT", "proj1"), ("GRANIKV_SLURM_GPU_MODEL", "h200"),
                       ("GRANIKV_SLURM_JOBS", "7"), ("GRANIKV_K8S_IMAGE", "reg/granikv:1"),
                       ("GRANIKV_K8S_NAMESPACE", "bench"), ("GRANIKV_STORAGE_PREFIX", "s3://b/p")]:
        monkeypatch.setenv(var, value)
    slurm = _render("slurm")
    assert slurm["jobs"] == 7
    assert (slurm["default-resources"]["slurm_partition"], slurm["default-resources"]["slurm_account"]) == (
        "cpu", "proj1")
    for rule in ("point", "microbench"):
        assert slurm["set-resources"][rule]["slurm_partition"] == "h200"
        assert slurm["set-resources"][rule]["gpu_model"] == "h200"
    k8s = _render("kubernetes")
    assert (k8s["container-image"], k8s["kubernetes-namespace"], k8s["default-storage-prefix"]) == (
        "reg/granikv:1", "bench", "s3://b/p")


@pytest.mark.parametrize("name", CLUSTER)
def test_pipeline_yaml_plans_every_paper_cell(name):
    profile = _pipeline(name)
    assert profile == sweeps.load_profile(name)
    assert (profile.grid, profile.reps) == ("paper", 3)
    plan = sweeps.plan(profile)
    assert all(sweeps.left_out(sw, profile) == 0 for sw in plan.sweeps.values())  # no TP too large for a node
    cells = plan.all_cells()
    assert {c.values["tp"] for c in cells} == {1, 2, 4}
    assert all(c.gpus == c.values["tp"] for c in cells)
    if name == "kubernetes":
        # no shared filesystem: a fit written into conf/hardware/ in one pod would never reach the others
        assert not profile.microbench and not profile.cells_after
    else:
        assert profile.cells_after == ("kernels",) and "kernels" in profile.microbench


def _jobs(text: str) -> list[tuple[str, str, dict[str, str]]]:
    """(rule, output, resources) of each job a dry run lists."""
    jobs = []
    for block in re.split(r"\n(?=rule \S+:\n)", text):
        m = re.match(r"rule (\S+):\n", block)
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        if m and res:
            out = re.search(r"^\s+output: (.*)$", block, re.M)
            jobs.append((m.group(1), out.group(1) if out else "",
                         dict(kv.split("=", 1) for kv in res.group(1).split(", "))))
    return jobs


def _dry_run(name: str, *extra: str, env: dict[str, str] | None = None) -> list[tuple[str, str, dict[str, str]]]:
    out = subprocess.run([sys.executable, "-m", "snakemake", "--profile", f"profiles/{name}", "-n", "all",
                          "--directory", str(ROOT), *extra], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    jobs = _jobs(out.stdout + out.stderr)
    assert any(rule.startswith("point_") for rule, _, _ in jobs), (out.stdout + out.stderr)[-2000:]
    return jobs


def _check_one_gpu_job_per_point(jobs, gpu_partition: str | None = None) -> None:
    """A point's job (all its systems, one call: harness.run.point) asks for the point's TP in GPUs."""
    for rule, output, res in jobs:
        if rule.startswith("point_"):
            tps = {int(t) for t in re.findall(r"-tp(\d+)-", output)}
            assert len(tps) == 1, (rule, output)
            tp = tps.pop()
            assert res.get("gpu") == str(tp), (output, res)
            if gpu_partition:
                assert res["slurm_partition"] == gpu_partition
                assert res["mem_mb"] == "131072" and res["cpus_per_task"] == "8", res  # the profile's `point` sizes
        elif rule in ("table", "tables", "plots"):
            assert res.get("gpu", "0") == "0", (rule, res)


def test_slurm_plan_asks_each_point_for_its_gpus():
    """The Slurm profile's plan, every resource evaluated, with the local executor standing in."""
    jobs = _dry_run("slurm", "--executor", "local",
                    env={"GRANIKV_SLURM_PARTITION": "h200", "GRANIKV_SLURM_CPU_PARTITION": "cpu"})
    _check_one_gpu_job_per_point(jobs, gpu_partition="h200")
    assert all(res["slurm_partition"] == "cpu" for rule, _, res in jobs if rule in ("tables", "plots"))


@pytest.mark.skipif(importlib.util.find_spec("snakemake_executor_plugin_slurm") is None,
                    reason="pip install snakemake-executor-plugin-slurm (docs/scale-out.md)")
def test_slurm_executor_dry_run():
    """The Slurm executor's own dry run: no sbatch, sinfo or sacct needed."""
    _check_one_gpu_job_per_point(_dry_run("slurm"), gpu_partition="gpu")


@pytest.mark.skipif(importlib.util.find_spec("snakemake_executor_plugin_kubernetes") is None
                    or importlib.util.find_spec("snakemake_storage_plugin_fs") is None,
                    reason="pip install snakemake-executor-plugin-kubernetes snakemake-storage-plugin-fs")
def test_kubernetes_executor_dry_run(tmp_path):
    """The Kubernetes executor's dry run. It asks the storage which results exist, so the profile's
    S3 prefix (credentials, network) is swapped for a local `fs` one: every cell is then missing."""
    jobs = _dry_run("kubernetes", "--default-storage-provider", "fs", "--default-storage-prefix", str(tmp_path))
    _check_one_gpu_job_per_point(jobs)
    assert all(res["gpu_manufacturer"] == "nvidia" and res["scale"] == "0" for _, _, res in jobs)
