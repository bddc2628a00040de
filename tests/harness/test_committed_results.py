"""Every committed result folder loads: the tables and plots read `results/<hardware>/` whole, so
one malformed file (a microbench JSON without a records list, a cell without its config) would
stop `python -m harness.tables` for every table of that hardware."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.results import load_results

RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.mark.parametrize("folder", sorted(p.name for p in RESULTS.iterdir() if p.is_dir()) if RESULTS.is_dir() else [])
def test_committed_results_load(folder):
    load_results(RESULTS / folder)


def test_committed_repetitions_table_is_current():
    """`tables/h200/repetitions.md` is rendered from the committed cells; landing cells without
    re-rendering it would leave a spread the files no longer show."""
    from harness import repetitions

    committed = RESULTS.parent / "tables" / "h200" / "repetitions.md"
    if not committed.is_file():
        pytest.skip("no committed repetitions table")
    results = Path("results/h200")  # the render names the folder as given on the command line
    rendered = repetitions.render(repetitions.collect(RESULTS / "h200"), results)
    assert rendered == committed.read_text(), (
        "re-render: python -m harness.repetitions --results results/h200 --out tables/h200/repetitions.md")
