"""Which commit a result was measured at (the `git_sha` of every result file's environment).

One rule for the cells and the microbenchmarks: GIT_SHA when the caller sets it (a lent GPU host
gets a copy of the working tree whose `.git` may be stale or absent: `scripts/gpu-host-env.sh`
sets it from `.carry/src.sha`, which `harness.run.batch prepare` writes), otherwise HEAD with "-dirty"
when tracked files differ from it — so a run on a tree that HEAD does not describe says so
instead of naming HEAD (a stale `.git` would name a commit the code was not at).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def git_sha(default: str | None = "unknown") -> str | None:
    if os.environ.get("GIT_SHA"):
        return os.environ["GIT_SHA"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=30).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return default
