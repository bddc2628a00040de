"""The CI gate's cell set (conf/sweep/gate.yaml): baselines restricted to it (`--cells`), keyed
without the sweep so the gate's own runs match the reproduction sweeps' cells, the reports, the
committed baseline and the Snakemake `gate` target's plan.

Result sets written here are FAKE cells in tmp_path (round numbers); the committed baseline is
checked against the committed cells it was written from.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report import gate
from harness.run import sweeps

ROOT = Path(__file__).resolve().parents[3]
ENV = {"gpu": "FIXTURE (fake numbers)", "git_sha": "0000000"}
H200_GATE = sweeps.sweep_cells(sweeps.load_sweep("gate"), sweeps.load_profile("h200"))


def write(root: Path, sweep: str, cell: sweeps.Cell, tok: float, *, rep: int = 0, call: str | None = None,
          **config) -> None:
    """A result file for the planned `cell` under `root/<sweep>/`, as harness.run.cell names it (with
    `env.call_id` = `call` when given)."""
    values = {k: v for k, v in cell.values.items() if "." not in k and k != "stands_for"}
    values.setdefault("num_prompts", 500)
    values.setdefault("output_len", 256)
    values.setdefault("k", 1)
    cfg = {**values, "rep": rep, "sweep": sweep, **config}
    doc = {"config": cfg,
           "metrics": {"output_throughput": tok, "median_ttft_ms": 1.0, "median_tpot_ms": 1.0, "completed": 10,
                       "failed": 0},
           "engine": {"decode_steps": 1}, "env": {**ENV, **({"call_id": call} if call else {})}}
    cid = re.sub(r"-r0\b", f"-r{rep}", cell.cell_id)
    if config.get("tag"):
        cid += f"-tag{config['tag']}"
    path = root / sweep / f"{cid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


SPEED = {"paged": 1000.0, "cascade": 1800.0, "granikv": 2000.0}  # ratio 2.0 everywhere


def reproduction_set(root: Path) -> Path:
    """The gate's configurations as table9/table20 measured them (2 reps), plus cells the gate
    does not use: another Lp, a tagged A/B cell, and table9's Lp=8K B=32 cell at another
    num_prompts in a third sweep."""
    for c in H200_GATE:
        sweep = "table20" if c.values["workload"] == "multiprefix" else "table9"
        for rep in (0, 1):
            write(root, sweep, c, SPEED[c.values["system"]] * (1 + 0.01 * rep), rep=rep)
        write(root, "adhoc", c, 1.0, tag="egraphs")
    other = next(c for c in H200_GATE if c.values["lp"] == 16384)
    write(root, "table9", sweeps.Cell("table9", other.cell_id.replace("lp16384", "lp4096"),
                                      {**other.values, "lp": 4096}, other.paper, 1), 5.0)
    return root


def test_the_gate_is_not_part_of_all_and_plans_the_three_points():
    assert "gate" not in sweeps.all_sweeps()
    points = {(c.values["workload"], c.values["lp"], c.values["batch"], c.values.get("k", 1)) for c in H200_GATE}
    assert points == {("sharegpt", 16384, 256, 1), ("sharegpt", 8192, 32, 1), ("multiprefix", 8192, 256, 16)}
    assert sorted(c.values["system"] for c in H200_GATE if c.values["workload"] == "multiprefix") == [
        "granikv", "paged"]


def test_cells_baseline_holds_exactly_the_gate_points_keyed_without_sweep(tmp_path):
    res = reproduction_set(tmp_path / "h200")
    out = tmp_path / "h200.json"
    assert gate.main(["--results", str(res), "--sweep", "table9", "--sweep", "table20", "--baseline", str(out),
                      "--write-baseline", "--cells", "gate"]) == 0
    doc = json.loads(out.read_text())
    assert "sweep" not in doc["key_fields"]
    assert doc["source"]["cells_of"] == {"sweep": "gate", "profile": "h200"}
    assert doc["source"]["sweeps"] == ["table20", "table9"]
    keys = sorted((c["key"]["workload"], c["key"]["lp"], c["key"]["batch"], c["key"]["num_prompts"])
                  for c in doc["cells"])
    assert keys == [("multiprefix", 8192, 256, 500), ("sharegpt", 8192, 32, 256), ("sharegpt", 16384, 256, 500)]
    for c in doc["cells"]:
        assert c["ratio"] == pytest.approx(2.0)  # reps averaged: (2000 + 2020) / (1000 + 1010)
        assert c["absolute"]["paged"] == pytest.approx(1005.0)


def test_cells_baseline_refuses_ambiguous_or_missing_sources(tmp_path, capsys):
    res = reproduction_set(tmp_path / "h200")
    out = tmp_path / "h200.json"
    # without --sweep, table9's Lp=16K cells and a same-id copy in a profiling sweep both match
    first = next(c for c in H200_GATE if c.values["lp"] == 16384)
    write(res, "table22", first, 900.0)
    assert gate.main(["--results", str(res), "--baseline", str(out), "--write-baseline", "--cells", "gate"]) == 2
    assert "more than one sweep" in capsys.readouterr().err
    # a gate point with no result at all
    assert gate.main(["--results", str(res), "--sweep", "table9", "--baseline", str(out), "--write-baseline",
                      "--cells", "gate"]) == 2
    assert "have no result" in capsys.readouterr().err and not out.exists()


def test_gate_runs_match_the_reproduction_baseline_and_write_reports(tmp_path, capsys):
    res = reproduction_set(tmp_path / "h200")
    base = tmp_path / "h200.json"
    assert gate.main(["--results", str(res), "--sweep", "table9", "--sweep", "table20", "--baseline", str(base),
                      "--write-baseline", "--cells", "gate"]) == 0
    def call(c: sweeps.Cell) -> str:  # one call per point, as harness.run.point runs the gate's points
        return f"call-{c.values['workload']}-{c.values['lp']}-{c.values['batch']}"

    for c in H200_GATE:  # the gate's own run: same configurations, sweep "gate"
        write(res, "gate", c, SPEED[c.values["system"]], call=call(c))
    rep = tmp_path / "report"
    args = ["--results", str(res), "--sweep", "gate", "--baseline", str(base), "--json", str(rep / "r.json"),
            "--markdown", str(rep / "r.md")]
    assert gate.main(args) == 0
    strict = json.JSONDecoder(parse_constant=lambda c: pytest.fail(f"non-JSON constant {c} in the report"))
    doc = strict.decode((rep / "r.json").read_text())
    assert doc["format"] == gate.REPORT_FORMAT and doc["verdict"] == "PASS" and doc["counts"]["ok"] == 3
    assert {c["cell"]["rate"] for c in doc["checks"]} == {"inf"}  # strict JSON: no Infinity token
    assert "# Throughput gate: PASS" in (rep / "r.md").read_text()
    # granikv slows down 10 % at the headline: a regression, exit 1, and the report says so
    head = next(c for c in H200_GATE if c.values["lp"] == 16384 and c.values["system"] == "granikv")
    (res / "gate" / f"{head.cell_id}.json").unlink()
    write(res, "gate", head, 1800.0, call=call(head))
    assert gate.main(args) == 1
    doc = json.loads((rep / "r.json").read_text())
    assert doc["verdict"] == "FAIL (regression)" and doc["exit_code"] == 1
    bad = [c for c in doc["checks"] if c["status"] == "REGRESSION"]
    assert len(bad) == 1 and bad[0]["cell"]["lp"] == 16384 and bad[0]["current"] == pytest.approx(1.8)
    assert "| REGRESSION | ratio | granikv/paged | 2 | 1.8 | -10.0% |" in (rep / "r.md").read_text()
    assert not any(c["mixed_call"] for c in doc["checks"])  # each point's systems from one call
    # the headline's granikv re-measured alone (a call of its own): the ratio is marked mixed-call
    (res / "gate" / f"{head.cell_id}.json").unlink()
    write(res, "gate", head, 1800.0, call="another-call")
    assert gate.main(args) == 1
    doc = json.loads((rep / "r.json").read_text())
    assert [c["cell"]["lp"] for c in doc["checks"] if c["mixed_call"]] == [16384]
    assert "| REGRESSION | ratio | granikv/paged | 2 | 1.8‡ | -10.0% |" in (rep / "r.md").read_text()
    assert "1 current ratio(s) marked ‡" in (rep / "r.md").read_text()
    capsys.readouterr()


def test_a_gate_that_cannot_judge_still_writes_its_report(tmp_path):
    res = reproduction_set(tmp_path / "h200")
    out = tmp_path / "r.json"
    assert gate.main(["--results", str(res), "--sweep", "gate", "--baseline", str(tmp_path / "none.json"),
                      "--json", str(out)]) == 2
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == 2 and "no result cells" in doc["error"]


def test_committed_baseline_is_the_committed_cells_of_the_gate(tmp_path):
    """results/baselines/h200.json is exactly what --write-baseline --cells gate gives from the
    committed table9/table20 cells (so its numbers come from committed result files)."""
    committed = json.loads((ROOT / "results" / "baselines" / "h200.json").read_text())
    if not (ROOT / "results" / "h200" / "table9").is_dir():
        pytest.skip("no committed h200 cells")
    out = tmp_path / "h200.json"
    assert gate.main(["--results", str(ROOT / "results" / "h200"), "--sweep", "table9", "--sweep", "table20",
                      "--baseline", str(out), "--write-baseline", "--cells", "gate"]) == 0
    fresh = json.loads(out.read_text())
    fresh["source"]["results"] = committed["source"]["results"]
    assert fresh == committed


def test_snakemake_gate_target_plans_exactly_the_gate_cells():
    out = subprocess.run([sys.executable, "-m", "snakemake", "--profile", "profiles/h200", "-n", "gate"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    planned = {f for line in re.findall(r"output: (.*)", text) for f in line.split(", ")  # a job per point
               if re.fullmatch(r"results/h200/\S+\.json", f)}
    wanted = {f"results/h200/gate/{c.cell_id}.json" for c in H200_GATE}
    present = {p for p in wanted if (ROOT / p).exists()}  # a local gate run's cells are not re-planned
    assert planned | present == wanted
    assert "-m harness.report.gate --results results/h200 --sweep gate --baseline results/baselines/h200.json" in text
    assert "--mode ratio --json results/h200/gate/report/report.json" in text
