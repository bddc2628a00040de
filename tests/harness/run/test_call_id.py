"""The call a cell is measured in: `env.call_id` from GRANIKV_CALL_ID or a fresh id, and result
files written before cells recorded it still load."""

from __future__ import annotations

import json
import re

import pytest

from harness.run import env as cell_env
from harness.run.results import ResultFileError, load_cells


def test_a_cell_records_the_call_it_runs_in_or_one_of_its_own(monkeypatch):
    monkeypatch.setenv(cell_env.CALL_ID_ENV, "abc123")
    assert cell_env.call_id() == "abc123"
    assert cell_env.environment("now", None)["call_id"] == "abc123"
    monkeypatch.delenv(cell_env.CALL_ID_ENV)
    first, second = cell_env.call_id(), cell_env.call_id()
    assert re.fullmatch(r"[0-9a-f]{32}", first) and first != second  # a cell run alone: a call of its own


def _doc(**env):
    return {
        "config": {"system": "paged", "model": "m", "tp": 1, "workload": "w", "lp": 1, "batch": 1},
        "metrics": {
            "output_throughput": 1.0,
            "median_ttft_ms": 1.0,
            "median_tpot_ms": 1.0,
            "completed": 1,
            "failed": 0,
        },
        "engine": {"decode_steps": 1},
        "env": {"gpu": "g", "git_sha": "s", **env},
    }


def test_result_files_without_a_call_id_still_load(tmp_path):
    folder = tmp_path / "hw" / "table9"
    folder.mkdir(parents=True)
    (folder / "old.json").write_text(json.dumps(_doc()))
    assert len(load_cells(tmp_path / "hw")) == 1  # only old files: no call ids at all
    (folder / "new.json").write_text(json.dumps(_doc(call_id="c1")))
    cells = load_cells(tmp_path / "hw").set_index("cell_id")
    assert cells.loc["new", "env.call_id"] == "c1" and cells["env.call_id"].isna()["old"]
    (folder / "old.json").unlink()
    (folder / "bad.json").write_text(json.dumps(_doc(call_id=7)))
    with pytest.raises(ResultFileError, match="env.call_id must be a non-empty string"):
        load_cells(tmp_path / "hw")
