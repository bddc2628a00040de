"""harness.microbench.dispatch (the Table 17 analog) on CPU: the engine decodes a batch behind one
HOT prefix with m_sat low enough for the dense pass, the window counts steps and the dispatch
phase's host time, and the result file renders as Table 17."""

from __future__ import annotations

import json

from harness.microbench import dispatch
from harness.report.tables.compare import build_table
from harness.run.results import load_results


def test_choose_us_times_the_decision_rule():
    from granikv.attention.dispatch import DispatchPolicy

    us = dispatch.choose_us(DispatchPolicy(group_size=4, m_sat=1024), 256, 8192, calls=2000)
    assert 0 < us < 1000


def test_cpu_dry_run_renders_as_table_17(tmp_path):
    out = tmp_path / "cpu" / "microbench" / "dispatch.json"
    assert dispatch.main(["--device", "cpu", "--min-steps", "4", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())["records"][0]
    assert rec["steps"] >= 4
    assert rec["dense_steps"] == rec["steps"]  # M_eff = 8 * 4 >= m_sat = 8: dense every step
    assert rec["wrapper_cpu_us_per_step"] > 0 and rec["step_us"] > rec["wrapper_cpu_us_per_step"]
    assert rec["dense_launches"] == 0 and rec["kernel_us_per_launch"] is None  # no GPU timeline on CPU
    t = build_table(17, load_results(tmp_path / "cpu"))
    ours = {r.keys[0]: r.cells[0].ours for r in t.rows}
    assert ours["Wrapper CPU / step"] == rec["wrapper_cpu_us_per_step"]
    assert abs(ours["Wrapper % of step"] - 100 * rec["wrapper_cpu_us_per_step"] / rec["step_us"]) < 1e-9
    assert ours["Dense-backend launches in 15 s"] == 0
