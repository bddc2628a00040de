"""harness.remeasure: superseded cells (history/<why>/<sweep>/) against their re-measured namesakes."""

from __future__ import annotations

import json

import pytest

from harness import remeasure


def _cell(folder, system, tok, rep=0, git="aaaaaaa", run=(10.0, 9.8, 0.2), knobs="", lp=4096):
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{system}-llama-3.1-8b-tp1-sharegpt-lp{lp}-b256-k1-r{rep}{('-' + knobs) if knobs else ''}.json"
    doc = {"config": {"system": system, "rep": rep, "lp": lp, "batch": 256},
           "metrics": {"output_throughput": tok, "duration_s": run[0]},
           "engine": {"loop_step_s": run[1]}, "engine_after_warmup": {"loop_step_s": run[2]},
           "env": {"git_sha": git + "0123"}}
    (folder / name).write_text(json.dumps(doc))


def test_pairs_means_residues_and_ratios(tmp_path):
    hist, res = tmp_path / "history" / "why", tmp_path / "results"
    for rep in (0, 1):
        for system, old, new in (("paged", 100, 101), ("cascade", 200, 210), ("granikv", 220, 240)):
            _cell(hist / "table9", system, old + rep, rep, git="aaaaaaa", run=(10.0, 9.4 + 0.2 * rep, 0.2))
            _cell(res / "table9", system, new + rep, rep, git="bbbbbbb", run=(10.0, 9.7, 0.2))
    _cell(res / "table9", "paged", 555, rep=2)  # no old file: not a pair
    _cell(hist / "table24", "granikv", 300, knobs="hot_fraction0.3")
    _cell(res / "table24", "granikv", 330, knobs="hot_fraction0.3")
    (hist / "engine").mkdir()
    (hist / "engine" / "steps.json").write_text(json.dumps({"config": {"cells": []}, "records": []}))
    (res / "engine").mkdir()
    (res / "engine" / "steps.json").write_text(json.dumps({"config": {"cells": []}, "records": []}))

    ps = remeasure.pairs(hist, res)
    assert len(ps) == 7  # 6 table9 cells and the knob cell; the microbenchmark file is not a cell
    knob = next(new for old, new in ps if old["sweep"] == "table24")
    assert knob["label"] == "granikv-hot_fraction0.3" and knob["point"] == "llama-3.1-8b-tp1-sharegpt-lp4096-b256-k1"

    text = remeasure.render(ps, hist)
    row = next(line for line in text.splitlines() if "| table9 |" in line and "| cascade |" in line)
    assert "| 0,1 | 200 → 210 | +5.0% |" in row  # means over reps 0,1: 200.5 → 210.5
    assert "| 0.60–0.80 → 0.50 |" in row  # beyond engine: 10 - (9.6 - 0.2), 10 - (9.4 - 0.2) → 10 - 9.5 twice
    assert "| 9.30 → 9.50 |" in row  # the engine loop's step seconds in the run
    assert "aaaaaaa → bbbbbbb" in row
    ratio = next(line for line in text.splitlines() if line.startswith("| table9 |") and line.count("→") == 2)
    assert "| 2.19 → 2.37 |" in ratio  # 220.5/100.5 → 240.5/101.5
    # a point without a plain cell of every system has no ratio row
    assert not any(line.startswith("| table24 |") and line.count("→") == 2 for line in text.splitlines())


def test_a_file_name_that_does_not_match_its_config_is_an_error(tmp_path):
    hist, res = tmp_path / "h", tmp_path / "r"
    for folder in (hist / "table9", res / "table9"):
        folder.mkdir(parents=True)
        (folder / "odd.json").write_text(json.dumps({"config": {"system": "paged", "rep": 0}, "metrics": {}}))
    with pytest.raises(ValueError, match="does not read"):
        remeasure.pairs(hist, res)


def test_main_refuses_a_history_without_namesakes(tmp_path):
    (tmp_path / "h").mkdir()
    with pytest.raises(SystemExit, match="namesake"):
        remeasure.main(["--history", str(tmp_path / "h"), "--results", str(tmp_path)])
