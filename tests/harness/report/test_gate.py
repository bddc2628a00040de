"""The throughput gate: pass, fail, tolerance edges and exit codes, in ratio and absolute mode.

Every result set here is a handful of FAKE cells written into tmp_path (round numbers, so the
ratios are exact); nothing is read from results/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.report import gate

ENV = {"gpu": "FIXTURE (fake numbers)", "git_sha": "0000000"}


def write_cell(root: Path, system: str, tok: float, *, sweep: str = "table3", lp: int = 8192, rep: int = 0,
               call: str | None = None, **config) -> None:
    doc = {
        "config": {"system": system, "model": "llama-3.1-8b", "tp": 1, "workload": "sharegpt", "lp": lp,
                   "batch": 256, "k": 1, "rep": rep, "fixture": True, **config},
        "metrics": {"output_throughput": tok, "median_ttft_ms": 1.0, "median_tpot_ms": 1.0, "completed": 10,
                    "failed": 0},
        "engine": {"decode_steps": 1},
        "env": {**ENV, **({"call_id": call} if call else {})},
    }
    extra = "".join(f"-{k}{v}" for k, v in sorted(config.items()))
    path = root / sweep / f"{system}-lp{lp}-r{rep}{extra}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def result_set(root: Path, cells: dict[int, tuple[float, float]]) -> Path:
    """cells: lp -> (paged tok/s, granikv tok/s)."""
    for lp, (paged, granikv) in cells.items():
        write_cell(root, "paged", paged, lp=lp)
        write_cell(root, "granikv", granikv, lp=lp)
    return root


@pytest.fixture
def base(tmp_path) -> Path:
    """Baseline from a run with ratios 2.0 (Lp=8K) and 3.0 (Lp=16K); hardware key 'h200'."""
    run = result_set(tmp_path / "base" / "h200", {8192: (1000.0, 2000.0), 16384: (500.0, 1500.0)})
    path = tmp_path / "baselines" / "h200.json"
    assert gate.main(["--results", str(run), "--baseline", str(path), "--write-baseline"]) == 0
    return path


def run_gate(results: Path, baseline: Path, *extra: str) -> int:
    return gate.main(["--results", str(results), "--baseline", str(baseline), *extra])


def test_baseline_file_format(base):
    doc = json.loads(base.read_text())
    assert doc["format"] == gate.FORMAT and doc["hardware"] == "h200"
    ratios = sorted(c["ratio"] for c in doc["cells"])
    assert ratios == [2.0, 3.0]
    assert {tuple(sorted(c["absolute"])) for c in doc["cells"]} == {("granikv", "paged")}


def test_same_numbers_pass(tmp_path, base, capsys):
    run = result_set(tmp_path / "h200", {8192: (1000.0, 2000.0), 16384: (500.0, 1500.0)})
    assert run_gate(run, base, "--mode", "both") == gate.EXIT_PASS
    assert "gate: PASS" in capsys.readouterr().out


def test_ratio_regression_fails_with_a_readable_report(tmp_path, base, capsys):
    run = result_set(tmp_path / "h200", {8192: (1000.0, 1800.0), 16384: (500.0, 1500.0)})  # 2.0 -> 1.8
    assert run_gate(run, base) == gate.EXIT_REGRESSION
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("REGRESSION"))
    assert "granikv/paged" in line and "lp=8192" in line and "-10.0%" in line
    assert "1 regression" in out and "gate: FAIL" in out


@pytest.mark.parametrize("granikv, tolerance, code", [
    (1900.0, "0.05", gate.EXIT_PASS),  # exactly on the threshold: 2.0 * 0.95
    (1899.0, "0.05", gate.EXIT_REGRESSION),  # just below it
    (1800.0, "0.10", gate.EXIT_PASS),
    (1799.0, "0.10", gate.EXIT_REGRESSION),
    (2000.0, "0", gate.EXIT_PASS),  # zero tolerance: equal still passes
    (1999.0, "0", gate.EXIT_REGRESSION),
    (3000.0, "0.05", gate.EXIT_PASS),  # improvements pass
])
def test_ratio_tolerance_edges(tmp_path, base, granikv, tolerance, code):
    run = result_set(tmp_path / "h200", {8192: (1000.0, granikv), 16384: (500.0, 1500.0)})
    assert run_gate(run, base, "--tolerance", tolerance) == code


def test_ratio_mode_cancels_machine_drift_absolute_mode_does_not(tmp_path, base, capsys):
    # everything twice as slow, ratios unchanged
    slow = result_set(tmp_path / "h200", {8192: (500.0, 1000.0), 16384: (250.0, 750.0)})
    assert run_gate(slow, base, "--mode", "ratio") == gate.EXIT_PASS
    assert run_gate(slow, base, "--mode", "absolute") == gate.EXIT_REGRESSION
    assert run_gate(slow, base, "--mode", "both") == gate.EXIT_REGRESSION
    assert "REGRESSION absolute paged" in capsys.readouterr().out


@pytest.mark.parametrize("paged, code", [(900.0, gate.EXIT_PASS), (899.0, gate.EXIT_REGRESSION)])
def test_absolute_tolerance_edge(tmp_path, base, paged, code):
    run = result_set(tmp_path / "h200", {8192: (paged, 2000.0 * paged / 1000.0), 16384: (500.0, 1500.0)})
    assert run_gate(run, base, "--mode", "absolute", "--abs-tolerance", "0.10") == code


def test_absolute_mode_needs_the_same_hardware_key(tmp_path, base, capsys):
    other = result_set(tmp_path / "a100", {8192: (1000.0, 2000.0), 16384: (500.0, 1500.0)})
    assert run_gate(other, base, "--mode", "absolute") == gate.EXIT_ERROR
    assert "same hardware key" in capsys.readouterr().err
    assert run_gate(other, base, "--mode", "ratio") == gate.EXIT_PASS  # ratios travel, with a note
    assert run_gate(other, base, "--mode", "absolute", "--hardware", "h200") == gate.EXIT_PASS


def test_missing_cells_are_an_error_unless_allowed(tmp_path, base, capsys):
    run = result_set(tmp_path / "h200", {8192: (1000.0, 2000.0)})  # the 16K cell did not run
    assert run_gate(run, base) == gate.EXIT_ERROR
    assert "missing" in capsys.readouterr().out
    assert run_gate(run, base, "--allow-missing") == gate.EXIT_PASS
    half = tmp_path / "half" / "h200"
    result_set(half, {8192: (1000.0, 1000.0)})  # regression and missing: regression wins
    assert run_gate(half, base, "--allow-missing") == gate.EXIT_REGRESSION
    assert run_gate(half, base) == gate.EXIT_REGRESSION


def test_reps_are_averaged(tmp_path, base):
    root = tmp_path / "h200"
    result_set(root, {16384: (500.0, 1500.0)})
    write_cell(root, "paged", 1000.0, lp=8192, rep=0)
    write_cell(root, "granikv", 1700.0, lp=8192, rep=0)
    write_cell(root, "granikv", 2100.0, lp=8192, rep=1)  # mean 1900 -> ratio 1.9, on the 5% edge
    assert run_gate(root, base) == gate.EXIT_PASS
    write_cell(root, "granikv", 1600.0, lp=8192, rep=2)  # mean 1800 -> 1.8
    assert run_gate(root, base) == gate.EXIT_REGRESSION


def test_a_ratio_is_taken_over_its_reps_of_one_call(tmp_path, base, capsys):
    """Rep 0 measured paged and granikv in one call; rep 1's granikv was re-measured alone (another
    call): the ratio is rep 0's, unmarked. With no rep of one call it is the mean over every rep,
    marked mixed-call in the reports."""
    root = tmp_path / "h200"
    result_set(root, {16384: (500.0, 1500.0)})
    write_cell(root, "paged", 1000.0, lp=8192, rep=0, call="a")
    write_cell(root, "granikv", 2000.0, lp=8192, rep=0, call="a")
    write_cell(root, "paged", 1000.0, lp=8192, rep=1, call="b")
    write_cell(root, "granikv", 1000.0, lp=8192, rep=1, call="c")  # over every rep: 1.5, a regression
    m = gate.measure(gate.load_cells(root), gate.DEFAULT_KEY_FIELDS)
    key = next(k for k in m.keys if dict(k)["lp"] == 8192)
    assert m.one_call_reps(key, ("granikv", "paged")) == [0]
    assert m.ratio(key, "granikv", "paged") == pytest.approx(2.0) and not m.mixed(key, "granikv", "paged")
    report = tmp_path / "r.json"
    assert run_gate(root, base, "--json", str(report)) == gate.EXIT_PASS
    checks = {c["cell"]["lp"]: c for c in json.loads(report.read_text())["checks"]}
    assert not checks[8192]["mixed_call"] and checks[16384]["mixed_call"]  # the 16K cells record no call
    out = capsys.readouterr().out
    assert "1 current ratio(s) marked ‡" in out and "3‡" in out


def test_usage_and_missing_data_errors_exit_2(tmp_path, base):
    (tmp_path / "empty").mkdir()
    assert run_gate(tmp_path / "empty", base) == gate.EXIT_ERROR  # no cells
    assert run_gate(tmp_path / "absent", base) == gate.EXIT_ERROR  # no results directory
    run = result_set(tmp_path / "h200", {8192: (1000.0, 2000.0)})
    assert run_gate(run, tmp_path / "nope.json") == gate.EXIT_ERROR  # no baseline
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert run_gate(run, bad) == gate.EXIT_ERROR  # not a baseline file
    assert run_gate(run, base, "--mode", "sideways") == 2  # argparse usage error
    assert run_gate(run, base, "--tolerance", "1.5") == gate.EXIT_ERROR
    assert run_gate(run, base, "--write-baseline") == gate.EXIT_ERROR  # refuses to overwrite
    assert run_gate(run, base, "--write-baseline", "--force") == gate.EXIT_PASS


def test_nothing_comparable_is_never_a_silent_pass(tmp_path):
    root = tmp_path / "h200"
    write_cell(root, "paged", 1000.0)  # no granikv cell: no ratio in the baseline
    path = tmp_path / "b.json"
    assert run_gate(root, path, "--write-baseline") == 0
    assert json.loads(path.read_text())["cells"][0]["ratio"] is None
    assert run_gate(root, path, "--mode", "ratio") == gate.EXIT_ERROR
    assert run_gate(root, path, "--mode", "absolute") == gate.EXIT_PASS


def test_compare_api_statuses():
    b = gate.Baseline(hardware="h", key_fields=("lp",), cells=(gate.BaselineCell(key={"lp": 1}, ratio=2.0,
                                                                                 absolute={}),))
    check = gate.Check("ratio", gate.make_key({"lp": 1}, ("lp",)), "g/p", 2.0, 2.2, 0.05)
    assert check.status == "improved" and check.threshold == pytest.approx(1.9)
    assert gate.Check("ratio", check.key, "g/p", 2.0, None, 0.05).status == "missing"
    assert gate.make_key({"lp": 8192}, ("lp",)) == gate.make_key({"lp": 8192.0}, ("lp",))
    assert b.to_json()["cells"][0]["ratio"] == 2.0
