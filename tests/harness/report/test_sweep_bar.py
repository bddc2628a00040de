"""The sweep bar of hint-free.md (the hint-free sweep bar: no hint ≥ cascade at every k = 1 ShareGPT point of
Table 9, Lp ≥ 2K) is judged only from granikv repetitions measured without the hint.

Why: Table 9 holds hinted and hint-free granikv cells side by side while it is re-measured; a
verdict drawn from a hinted rep, or from an A/B or other-workload cell, would claim the bar for a
configuration no real client runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.report import sweep_bar


def _cell(root: Path, name: str, system: str, lp: int, batch: int, tok: float, hint: bool = False,
          sha: str = "aaaaaaa1", call: str | None = None, **cfg) -> None:
    doc = {"config": {"system": system, "model": "llama-3.1-8b", "workload": "sharegpt", "lp": lp, "batch": batch,
                      "k": 1, "tp": 1, "rate": "inf", "client": {"send_prefix_hint": hint}, **cfg},
           "metrics": {"output_throughput": tok, "median_ttft_ms": 1.0, "median_tpot_ms": 1.0, "completed": 1,
                       "failed": 0},
           "engine": {"decode_steps": 1}, "env": {"gpu": "test", "git_sha": sha, **({"call_id": call} if call else {})}}
    d = root / sweep_bar.SWEEP
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.json").write_text(json.dumps(doc))


def _rows(lines: list[str]) -> dict[tuple[str, str], list[str]]:
    out = {}
    for ln in lines:
        cols = [c.strip() for c in ln.strip("|").split("|")]
        if ln.startswith("| ") and cols[0].isdigit():
            out[(cols[0], cols[1])] = cols
    return out


def test_verdicts_use_only_hint_free_reps(tmp_path):
    r = tmp_path / "h200"
    # Lp 8K B 256: one hint-free rep below cascade, one hinted rep far above: not met.
    _cell(r, "c0", "cascade", 8192, 256, 100.0)
    _cell(r, "c1", "cascade", 8192, 256, 110.0)
    _cell(r, "g0", "granikv", 8192, 256, 104.0)
    _cell(r, "g1", "granikv", 8192, 256, 500.0, hint=True)
    # Lp 2K B 8: only hinted granikv reps: pending.
    _cell(r, "c2", "cascade", 2048, 8, 10.0)
    _cell(r, "g2", "granikv", 2048, 8, 20.0, hint=True)
    # Lp 16K B 32: met at one commit on both sides.
    _cell(r, "c3", "cascade", 16384, 32, 40.0, sha="bbbbbbb2")
    _cell(r, "g3", "granikv", 16384, 32, 41.0, sha="bbbbbbb2")
    # Left out: Lp below 2K, an A/B tag, another workload, paged.
    _cell(r, "x0", "granikv", 512, 256, 1.0)
    _cell(r, "x1", "granikv", 8192, 256, 1.0, tag="nohint")
    _cell(r, "x2", "granikv", 8192, 256, 1.0, workload="burst")
    _cell(r, "x3", "paged", 8192, 256, 1.0)
    _cell(r, "x4", "granikv", 8192, 256, 1.0, m_sat=2**31)

    lines = sweep_bar.render_section(r)
    rows = _rows(lines)
    assert set(rows) == {("2048", "8"), ("8192", "256"), ("16384", "32")}
    low = rows[("8192", "256")]
    assert low[2] == "105 (2)" and low[3] == "104 (1)" and low[4] == "1"
    assert low[5] == f"{104.0 / 105.0:.3f}‡" and low[6] == "not met"  # no call ids: a mixed-call ratio
    assert rows[("2048", "8")][6] == "pending (granikv hinted)" and rows[("2048", "8")][5] == "—"
    met = rows[("16384", "32")]
    assert met[6] == "met" and met[7] == met[8] == "bbbbbbb"
    assert lines[-1] == "Met at 1 of 2 judged points; 1 pending; 2 of the judged ratios from mixed calls (‡)."


def test_a_point_with_a_rep_of_one_call_is_judged_from_that_rep_only(tmp_path):
    r = tmp_path / "h200"
    _cell(r, "c0", "cascade", 8192, 256, 100.0, rep=0, call="one")
    _cell(r, "g0", "granikv", 8192, 256, 101.0, rep=0, call="one")
    _cell(r, "c1", "cascade", 8192, 256, 100.0, rep=1, call="two")
    _cell(r, "g1", "granikv", 8192, 256, 80.0, rep=1, call="three")  # re-measured alone: another call
    (pt,) = sweep_bar.load_points(r)
    assert pt.one_call_reps == {0} and not pt.mixed
    assert pt.ratio == pytest.approx(1.01) and pt.verdict == "met"
    row = _rows(sweep_bar.render_section(r))[("8192", "256")]
    assert row[2] == "100 (1)" and row[3] == "101 (1)" and row[5] == "1.010"


def test_no_cells_no_section(tmp_path):
    assert sweep_bar.render_section(tmp_path) == []
    _cell(tmp_path, "g", "granikv", 16384, 1024, 5.0)
    pt, = sweep_bar.load_points(tmp_path)
    assert pt.ratio is None and pt.verdict == "pending (no cascade cell)"
