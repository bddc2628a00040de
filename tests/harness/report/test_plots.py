"""The plots (harness.report.plots), drawn from the FAKE fixture result set (tests/harness/fixtures)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.report import plots
from harness.run.results import (
    load_results,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "results" / "fixture-hw"


@pytest.fixture(scope="module")
def results():
    return load_results(FIXTURE)


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_plot_renders_a_png(results, tmp_path):
    ceilings = plots.Ceilings(peak_tflops=989.0, hbm_tbps=4.8, source="test")
    out = plots.write_plots(results, tmp_path, ceilings)
    assert set(out) == {"roofline", "lp_ladder", "k_sweep", "fp_sweep", "dispatch_heatmap"}
    for r in out.values():
        assert r.has_data and _is_png(r.path)


def test_dispatch_share_takes_each_point_from_the_first_sweep_that_ran_it(results):
    share = plots.dispatch_share(results)
    assert share.loc[8192, 256] == pytest.approx(0.99)  # table15 wins over table6's 0.9
    assert share.loc[8192, 8] == 0.0
    assert share.loc[2048, 256] == pytest.approx(0.5)  # only table6 ran it
    assert math.isnan(share.loc[2048, 8])


def test_plots_without_data_say_so_and_do_not_crash(tmp_path, capsys):
    (tmp_path / "empty-hw").mkdir()
    assert plots.main(["--results", str(tmp_path / "empty-hw"), "--out", str(tmp_path / "p")]) == 0
    pngs = sorted((tmp_path / "p").glob("*.png"))
    assert len(pngs) == 5 and all(_is_png(p) for p in pngs)
    assert capsys.readouterr().out.count("(no data)") == 5


def test_roofline_ceilings_from_hardware_conf(tmp_path):
    (tmp_path / "h200.yaml").write_text("peak_bf16_tflops: 779\nhbm_read_tbps: 4.25\n")
    c = plots.load_ceilings("h200", tmp_path, peak_tflops=1.0, hbm_tbps=1.0)
    assert (c.peak_tflops, c.hbm_tbps) == (779.0, 4.25)
    c = plots.load_ceilings("a100", tmp_path, peak_tflops=312.0, hbm_tbps=None)
    assert c.peak_tflops == 312.0 and c.hbm_tbps is None and c.source == "arguments"
    assert math.isclose(plots.load_ceilings("none", tmp_path).peak_tflops or 0.0, 0.0)
    (tmp_path / "cpu.yaml").write_text("peak_bf16_tflops: null\nhbm_read_tbps: null\n")  # null = absent
    assert plots.load_ceilings("cpu", tmp_path, peak_tflops=5.0).peak_tflops == 5.0
