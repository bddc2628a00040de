"""The repository's shape: what a reader finds where, held as tests so it cannot drift.

- harness/ is a few stages (run, report, docs, microbench, diagnostics), not a flat hall of
  modules: a reader finds a concept by its stage;
- no source or document file grows past 600 lines: a file that long holds more than one idea;
- the tree is self-contained: no citation of a design file outside the clone and no reference to
  an issue tracker (the design lives in docs/design.md, history in the commit messages);
- tests mirror the packages: tests/<package>/... for every package they test.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600
HARNESS_TOP_LEVEL_MAX = 8
# written by programs, not people: measured results, tokenizer files, the generated docs
GENERATED = ("results/", "granikv/data/tokenizers/", "docs/generated/", "tables/", "plots/")
AUTHORED_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini")


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.splitlines() if (ROOT / p).is_file()]


def _authored() -> list[str]:
    return [p for p in _tracked() if not p.startswith(GENERATED)
            and (p.endswith(AUTHORED_SUFFIXES) or Path(p).name in ("Snakefile", "Makefile"))]


def test_harness_top_level_is_a_few_stages():
    entries = sorted(p.name for p in (ROOT / "harness").iterdir() if p.name != "__pycache__")
    assert len(entries) <= HARNESS_TOP_LEVEL_MAX, entries


def test_no_authored_file_is_longer_than_the_limit():
    long = {}
    for path in _authored():
        with open(ROOT / path, encoding="utf-8", errors="replace") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            long[path] = n
    assert not long, long


@pytest.mark.parametrize("pattern", [r"DESIGN(\.md)? *§", r"(?i)issue #\d", r"\.\./shared/"])
def test_no_reference_outside_the_clone(pattern):
    this = Path(__file__).relative_to(ROOT).as_posix()
    regex = re.compile(pattern)
    hits = []
    for path in _authored() + [p for p in _tracked() if p.startswith(("docs/generated/", "tables/"))]:
        if path == this:
            continue
        text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
        hits += [f"{path}:{i}" for i, line in enumerate(text.splitlines(), 1) if regex.search(line)]
    assert not hits, hits


def _packages(top: str) -> set[str]:
    """Dotted names of the packages under `top` (directories with an __init__.py)."""
    return {p.parent.relative_to(ROOT).as_posix().replace("/", ".") for p in (ROOT / top).rglob("__init__.py")}


def test_tests_mirror_the_packages():
    """Every folder of tests/ is named after a package: tests/<sub>/ for granikv's subpackages,
    tests/harness/<stage>/ for the harness's (fixtures and test utilities aside)."""
    known = {name.split(".", 1)[1] for name in _packages("granikv") if "." in name}
    known |= {name.replace(".", "/") for name in _packages("harness")}
    strays = []
    for folder in sorted(p for p in (ROOT / "tests").rglob("*") if p.is_dir()):
        rel = folder.relative_to(ROOT / "tests").as_posix()
        if "__pycache__" in rel or "fixtures" in rel or not any(folder.glob("test_*.py")):
            continue
        if rel.replace("/", ".") not in known and rel not in known:
            strays.append(rel)
    assert not strays, f"test folders named after no package: {strays}"
