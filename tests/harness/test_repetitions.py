"""harness.repetitions: each point's repetitions side by side, spreads and per-run ratios."""

from __future__ import annotations

import json

import pytest

from harness import repetitions


def _cell(folder, system, tok, rep=0, lp=4096, knobs="", k=1):
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{system}-llama-3.1-8b-tp1-sharegpt-lp{lp}-b256-k{k}-r{rep}{('-' + knobs) if knobs else ''}.json"
    doc = {"config": {"system": system, "rep": rep, "lp": lp, "batch": 256},
           "metrics": {"output_throughput": tok}, "env": {"git_sha": "abc1234"}}
    (folder / name).write_text(json.dumps(doc))


def test_complete_reps_spread_and_per_run_ratios(tmp_path):
    t9 = tmp_path / "table9"
    for rep, (paged, cascade, granikv) in enumerate(((100, 200, 220), (110, 200, 242), (105, 210, 231))):
        _cell(t9, "paged", paged, rep)
        _cell(t9, "cascade", cascade, rep)
        _cell(t9, "granikv", granikv, rep)
    _cell(t9, "paged", 999, rep=3)  # an incomplete rep: listed, not averaged
    _cell(t9, "cascade", 999, rep=3)
    (points,) = repetitions.collect(tmp_path)
    assert points.reps == [0, 1, 2, 3] and points.complete == [0, 1, 2]
    assert points.spread("paged") == pytest.approx(10 / 105)
    assert points.ratio(1, "paged") == pytest.approx(2.2)
    text = repetitions.render([points], tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| table9 |"))
    assert "| 0,1,2,3 | 0,1,2 | 105 | 9.5% | 203 | 4.9% | 231 | 9.5% |" in row
    assert "| 2.200, 2.200, 2.200 | 1.100, 1.210, 1.100 |" in row
    assert "Largest per-system spread: 9.5%" in text and "1 with two or more complete" in text


def test_knobbed_stand_in_one_system_points_and_skipped_folders(tmp_path):
    t21, t24 = tmp_path / "table21", tmp_path / "table24"
    _cell(t21, "paged", 100, k=4)
    _cell(t21, "cascade", 100, k=4)
    _cell(t21, "granikv", 250, k=4, knobs="hot_fraction0.3")  # the only granikv cell: it stands in
    _cell(t24, "cascade", 200, lp=8192)
    _cell(t24, "granikv", 210, lp=8192)
    _cell(t24, "granikv", 190, lp=8192, knobs="hot_fraction0.1")  # a plain cell exists: left out
    _cell(tmp_path / "table15", "granikv", 300)  # one system: no ratio, no row
    _cell(tmp_path / "history" / "table9", "paged", 1)  # superseded files are not the committed cells
    _cell(tmp_path / "history" / "table9", "granikv", 1)
    points = {p.sweep: p for p in repetitions.collect(tmp_path)}
    assert set(points) == {"table21", "table24"}
    assert points["table21"].complete == [0] and points["table21"].ratio(0, "paged") == pytest.approx(2.5)
    assert points["table24"].tok_s[0] == {"cascade": 200, "granikv": 210} and not points["table24"].complete
    text = repetitions.render(list(points.values()), tmp_path)
    assert "k4 (granikv hot_fraction0.3) |" in text
    row24 = next(line for line in text.splitlines() if line.startswith("| table24 |"))
    assert "| 200* |" in row24 and "*: the point has no complete repetition" in text


def test_rows_sort_by_number_and_main_writes_or_refuses(tmp_path, capsys):
    for lp in (16384, 512, 2048):
        for system in ("paged", "cascade", "granikv"):
            _cell(tmp_path / "table9", system, 100, lp=lp)
    out = tmp_path / "reps.md"
    assert repetitions.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    lps = [line.split("-lp")[1].split("-")[0] for line in out.read_text().splitlines() if line.startswith("| table9")]
    assert lps == ["512", "2048", "16384"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="no serving cells"):
        repetitions.main(["--results", str(empty)])
    with pytest.raises(SystemExit, match="not a folder"):
        repetitions.main(["--results", str(tmp_path / "missing")])
