"""harness.run.provenance.git_sha: GIT_SHA wins (a lent host's .git may be stale); otherwise HEAD,
marked -dirty when tracked files differ from it."""

from __future__ import annotations

import re
import subprocess

from harness.run import provenance


def test_env_override(monkeypatch):
    monkeypatch.setenv("GIT_SHA", "abc123")
    assert provenance.git_sha() == "abc123"


def test_head_and_dirty_flag(monkeypatch, tmp_path):
    monkeypatch.delenv("GIT_SHA", raising=False)
    repo = tmp_path / "r"
    repo.mkdir()
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (repo / "f.txt").write_text("a\n")
    run("add", "f.txt")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    monkeypatch.setattr(provenance, "ROOT", repo)
    clean = provenance.git_sha()
    assert re.fullmatch(r"[0-9a-f]{40}", clean)
    (repo / "untracked.txt").write_text("u\n")  # untracked files do not count
    assert provenance.git_sha() == clean
    (repo / "f.txt").write_text("b\n")
    assert provenance.git_sha() == clean + "-dirty"
    monkeypatch.setattr(provenance, "ROOT", tmp_path / "nowhere")
    assert provenance.git_sha(None) is None
