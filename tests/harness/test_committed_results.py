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
