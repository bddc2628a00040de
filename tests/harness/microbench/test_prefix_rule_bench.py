"""harness.microbench.prefix_rule on CPU (Triton interpreter, tiny shapes) and its fit.

The smoke grid runs end to end: every point's pass output (suffix decode + one prefix pass over
all classes + merge) matches the plain decode before it is timed, the dispatcher's kinds (dense,
cascade, rows) all occur, and the result file has the shape the render reads. The fit is checked
on synthetic records: a cleanly separable sweep, and one that only the total-saving rule
separates (many small classes win together while one class of the same size loses).
"""

from __future__ import annotations

import json

import torch

from harness.microbench import prefix_rule as pr
from harness.microbench.prefix_rule_report import fit_rule, overlap_lines, render, render_doc

KV = 4096


def _rec(form: str, c: int, n: int, lp: int, gain: float) -> dict:
    per = (n - 1) * lp * KV / 2**20
    return {"C": c, "n": n, "Lp": lp, "form": form, "B": c * n, "kind": "cascade" if form == "slab" else "rows",
            "saved_mib_total": c * per, "saved_mib_per_class": per, "t_plain_us": 100.0 + gain,
            "t_pass_us": 100.0, "gain_us": gain, "check": {"ok": True}}


def test_smoke_grid_checks_every_point_and_writes_the_result(tmp_path):
    out = tmp_path / "prefix-rule.json"
    assert pr.main(["--smoke", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {"env", "config", "records", "fit", "status"} <= set(doc)
    recs = doc["records"]
    assert {(r["C"], r["n"], r["Lp"], r["form"]) for r in recs} == set(pr.grid(pr.SMOKE))
    assert len(recs) == len(pr.grid(pr.SMOKE)) and doc["status"]["complete"]
    assert {r["kind"] for r in recs} == {"dense", "cascade", "rows"}  # m_sat 16: n = 4 dense, n = 2 cascade
    kv = doc["config"]["kv_token_bytes"]
    assert kv == 2 * pr.SMOKE.hkv * pr.SMOKE.d * 4
    for r in recs:
        assert r["check"]["ok"] and r["check"]["rel_err"] < 1e-4
        assert r["B"] == r["C"] * r["n"] and r["t_plain_us"] > 0 and r["t_pass_us"] > 0
        assert abs(r["gain_us"] - (r["t_plain_us"] - r["t_pass_us"])) < 0.02
        assert r["saved_mib_per_class"] == (r["n"] - 1) * r["Lp"] * kv / 2**20
        assert r["saved_mib_total"] == r["C"] * r["saved_mib_per_class"]
    assert doc["fit"]["points"] == len(recs) and set(doc["fit"]["by_form"]) == {"slab", "rows"}
    md = render(out)
    assert "| Lp | n | C=1 | C=2 |" in md and "form `rows`" in md and "Incomplete" not in md


def test_budget_stops_before_the_first_point_and_keeps_the_file(tmp_path):
    out = tmp_path / "p.json"
    assert pr.main(["--smoke", "--budget-s", "0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["records"] == [] and doc["status"]["complete"] is False and doc["status"]["measured"] == 0
    assert "**Incomplete:** 0 of" in render(out)


def test_smoke_without_out_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert pr.main(["--smoke", "--budget-s", "0"]) == 0
    assert not any(tmp_path.rglob("*"))


def test_check_refuses_a_wrong_plan():
    o, lse = torch.randn(3, 4, 8), torch.randn(3, 4)
    assert pr.check(lambda: (o, lse), lambda: (o.clone(), lse.clone()), "float32")["ok"]
    assert not pr.check(lambda: (o, lse), lambda: (o * 1.01, lse), "float32")["ok"]
    assert not pr.check(lambda: (o, lse), lambda: (o, lse + 0.1), "bfloat16")["ok"]


def test_grid_skips_batches_over_512_and_names_hardware():
    pts = pr.grid(pr.FULL)
    assert all(c * n <= 512 for c, n, _, _ in pts) and (64, 8, 8192, "rows") in pts and (32, 32, 512, "slab") not in pts
    assert len(pts) == 2 * 5 * (7 + 7 + 7 + 5)
    assert pr.kv_token_bytes(pr.FULL) == KV
    assert pr.hardware_name("NVIDIA H200") == "h200" and pr.hardware_name("NVIDIA A100-SXM4-40GB") is None
    assert pr.yaml_m_sat("h200", 4) >= 1


def test_fit_separable_sweep():
    recs = []
    for form, be in (("slab", 300.0), ("rows", 150.0)):  # gain = 0.2 us/MiB * (saved - break-even)
        for c in (1, 4, 16):
            for lp in (512, 2048, 8192):
                r = _rec(form, c, 2, lp, 0.0)
                r["gain_us"] = 0.2 * (r["saved_mib_total"] - be)
                recs.append(r)
    fit = fit_rule(recs)
    slab, rows = fit["by_form"]["slab"], fit["by_form"]["rows"]
    assert slab["lost_max_mib"] < 300 < slab["won_min_mib"] == slab["threshold_mib"]
    assert rows["lost_max_mib"] < 150 < rows["won_min_mib"]
    assert abs(slab["lsq"]["break_even_mib"] - 300) < 1e-6 and abs(slab["lsq"]["a_us_per_mib"] - 0.2) < 1e-9
    assert abs(rows["lsq"]["r2"] - 1) < 1e-9
    # pooled: the first total above every loss of both forms
    assert fit["lost_max_mib"] == slab["lost_max_mib"] and fit["min_saved_mib"] == slab["won_min_mib"]
    assert fit["separation"]["slab"]["total"]["misclassified"] == 0
    assert fit["separation"]["slab"]["total"]["threshold_mib"] == slab["won_min_mib"]
    assert overlap_lines(recs, fit) == []


def test_fit_only_the_total_rule_separates():
    # one class avoiding 64 MiB loses, eight such classes in one launch (512 MiB) win; one class
    # avoiding 256 MiB wins: no per-class threshold gets all three right, a total one does
    recs = [_rec("slab", 1, 2, 16384, -5.0), _rec("slab", 8, 2, 16384, 40.0), _rec("slab", 1, 5, 16384, 12.0)]
    assert [r["saved_mib_per_class"] for r in recs] == [64, 64, 256]
    fit = fit_rule(recs)
    sep = fit["separation"]["all"]
    assert sep["total"] == {"threshold_mib": 256, "misclassified": 0}
    assert sep["per_class"]["misclassified"] == 1
    assert fit["better_rule"] == "total" and fit["min_saved_mib"] == 256
    # every point losing: no threshold, and the best cut is "never"
    lost = fit_rule([_rec("rows", 1, 2, 512, -1.0), _rec("rows", 2, 2, 512, -2.0)])
    assert lost["min_saved_mib"] is None and lost["separation"]["all"]["total"] == {"threshold_mib": None,
                                                                                    "misclassified": 0}
    md = render_doc({"config": {"kv_token_bytes": KV}, "records": recs, "fit": fit})
    assert "best separates wins from losses: **256 MiB** (0 points misclassified" in md
    assert "| 16384 | 2 | 1.05 | 0.71 |" in md
