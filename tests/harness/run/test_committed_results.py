"""Every committed result folder loads: the tables and plots read `results/<hardware>/` whole, so
one malformed file (a microbench JSON without a records list, a cell without its config) would
stop `python -m harness.report.tables` for every table of that hardware."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.run.results import load_results

RESULTS = Path(__file__).resolve().parents[3] / "results"


@pytest.mark.parametrize("folder", sorted(p.name for p in RESULTS.iterdir() if p.is_dir()) if RESULTS.is_dir() else [])
def test_committed_results_load(folder):
    load_results(RESULTS / folder)


def test_committed_report_is_current():
    """`tables/h200/repetitions.md` is rendered from the committed cells; landing cells without
    re-rendering it would leave a spread or an A/B the files no longer show."""
    from harness.report import repetitions as report

    committed = RESULTS.parent / "tables" / "h200" / "repetitions.md"
    if not committed.is_file():
        pytest.skip("no committed report")
    results = Path("results/h200")  # the render names the folder as given on the command line
    rendered = report.render(report.read_results(RESULTS / "h200"), results)
    assert rendered == committed.read_text(), (
        "re-render: python -m harness.report.repetitions --results results/h200 --out tables/h200/repetitions.md")


def _committed(root: Path) -> list[Path]:
    """The files git tracks under `root`; every file when there is no git checkout (a tarball).
    What `make smoke` writes (results/cpu/, ignored) is not committed and not checked."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", str(root)], cwd=root.parent, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return [p for p in root.rglob("*") if p.is_file()]
    return [root.parent / rel for rel in out.decode().split("\0") if rel]


def test_results_hold_current_cells_only():
    """Superseded cells and run logs live in git's history, not in results/: a re-measured cell
    replaces its file (`python -m harness.run.batch land`)."""
    for path in _committed(RESULTS):
        rel = path.relative_to(RESULTS)
        assert "history" not in rel.parts and "batch-logs" not in rel.parts, rel
        assert path.suffix != ".log", rel
