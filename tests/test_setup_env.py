"""`make env`'s torch choice (scripts/setup-env.sh, GRANIKV_TORCH=auto): a GPU host keeps the CUDA
torch its interpreter already has, a GPU host without one gets the CUDA build, a CPU host the CPU
build. Why a test: CI runs on a CPU host, so the GPU branches would otherwise never run before a
team switches the gate on. Stand-in interpreters and nvidia-smi play the hosts; the dry run
changes nothing on disk."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _exe(path: Path, body: str) -> Path:
    path.write_text(f"#!{shutil.which('bash')}\n" + body)  # PATH holds no bash
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _python(tmp: Path, cuda: bool) -> Path:
    """An interpreter whose `import torch` reports CUDA (or not); anything else runs the real one."""
    site = tmp / "site" / "torch"
    site.mkdir(parents=True, exist_ok=True)
    value = repr("13.0") if cuda else "None"
    (site / "__init__.py").write_text(f"class version:\n    cuda = {value}\n")
    return _exe(tmp / "python", f'PYTHONPATH="{tmp / "site"}" exec "{sys.executable}" "$@"\n')


def _setup(tmp: Path, python: Path, gpu: bool, mode: str | None = None) -> subprocess.CompletedProcess:
    bindir = tmp / "bin"  # the only PATH: the tools the script uses, and nvidia-smi when the host has a GPU
    bindir.mkdir(exist_ok=True)
    for tool in ("grep", "dirname", "sha1sum", "cut"):
        if not (bindir / tool).exists():
            (bindir / tool).symlink_to(shutil.which(tool))
    smi = bindir / "nvidia-smi"
    if gpu:
        _exe(smi, 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n')
    elif smi.exists():
        smi.unlink()
    env = {**os.environ, "PYTHON": str(python), "GRANIKV_SETUP_DRY_RUN": "1",
           "PATH": str(bindir)}
    env.pop("GRANIKV_TORCH", None)
    if mode is not None:
        env["GRANIKV_TORCH"] = mode
    return subprocess.run([shutil.which("bash"), str(ROOT / "scripts/setup-env.sh")], env=env,
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


@pytest.mark.parametrize(("cuda_torch", "gpu", "mode"), [
    (True, True, "host"),     # a GPU image: its CUDA torch is kept
    (False, True, "cuda"),    # a GPU host whose interpreter has no CUDA torch: the CUDA build
    (False, False, "cpu"),    # CI: the CPU build
])
def test_auto_picks_the_torch_the_host_needs(tmp_path, cuda_torch, gpu, mode):
    before = sorted(p.name for p in ROOT.iterdir())
    r = _setup(tmp_path, _python(tmp_path, cuda_torch), gpu)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"mode={mode} ")
    if mode == "host":
        assert str(tmp_path / "site") in r.stdout  # the directory holding the host's torch
    assert sorted(p.name for p in ROOT.iterdir()) == before  # the dry run wrote nothing


def test_an_explicit_mode_wins_and_a_bad_one_is_refused(tmp_path):
    py = _python(tmp_path, cuda=True)
    assert _setup(tmp_path, py, gpu=True, mode="cpu").stdout.startswith("mode=cpu ")
    r = _setup(tmp_path, py, gpu=True, mode="rocm")
    assert r.returncode == 2 and "GRANIKV_TORCH must be auto, cpu, host or cuda" in r.stderr
