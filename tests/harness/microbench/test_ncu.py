"""harness.microbench.ncu on a host without ncu: the command line, parsing ncu's CSV pages (hand-written
fixtures in ncu's documented layout; the numbers are made up), records in the ncu.json format,
and a clear message when ncu is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.microbench import ncu

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def test_command_profiles_named_kernels_at_boost_clocks(tmp_path):
    cmd = ncu.ncu_command(["-m", "harness.microbench.kernels"], "_prefix_kernel", tmp_path / "o.csv",
                          launch_skip=3, launch_count=2)
    assert cmd[0] == "ncu"
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:_prefix_kernel"
    assert cmd[cmd.index("--launch-skip") + 1] == "3" and cmd[cmd.index("--launch-count") + 1] == "2"
    assert cmd[cmd.index("--page") + 1] == "raw" and "--csv" in cmd
    assert cmd[cmd.index("--log-file") + 1] == str(tmp_path / "o.csv")
    assert set(cmd[cmd.index("--metrics") + 1].split(",")) == {
        "dram__bytes_read.sum", "lts__t_sector_hit_rate.pct", "launch__waves_per_multiprocessor",
        "gpu__time_duration.sum", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"}
    assert cmd[-2:] == ["-m", "harness.microbench.kernels"]  # the target runs under this python


def test_parse_raw_page_skips_prof_lines_and_reads_units():
    rows = ncu.parse_csv((FIX / "ncu_raw.csv").read_text())
    assert [r["id"] for r in rows] == [0, 1] and {r["kernel"] for r in rows} == {"_prefix_kernel"}
    r = rows[0]
    assert r[ncu.DRAM] == 36_175_872  # thousands separators removed, bytes
    assert r[ncu.DURATION] == pytest.approx(231.488)  # ns -> us
    assert r[ncu.L2_HIT] == pytest.approx(71.62) and r[ncu.WAVES] == pytest.approx(0.97)
    assert r[ncu.TENSOR] == pytest.approx(38.41)


def test_parse_details_page_groups_metrics_per_launch():
    [r] = ncu.parse_csv((FIX / "ncu_details.csv").read_text())
    assert r["kernel"] == "_decode_kernel"
    assert r[ncu.DRAM] == pytest.approx(8.71e9) and r[ncu.DURATION] == pytest.approx(2080.0)
    assert ncu.TENSOR not in r  # "n/a" is no value


def test_parse_rejects_text_without_a_csv_header():
    with pytest.raises(ncu.NcuError):
        ncu.parse_csv("==PROF== No kernels were profiled.\n")


def test_records_have_the_table23_fields():
    shape = ncu.Shape()  # Table 5: B=256, Lp=8K, Llama head
    assert shape.byte_model("unique") == 256 * 8192 * 4096 and shape.byte_model("shared") == 8192 * 4096
    assert shape.useful_flops() == 4 * 256 * 32 * 128 * 8192
    rows = ncu.parse_csv((FIX / "ncu_raw.csv").read_text())
    recs = ncu.to_records(rows, "shared", shape.useful_flops(), shape.byte_model("shared"), B=256, Lp=8192)
    assert len(recs) == 2
    rec = recs[0]
    for key in ("layout", "B", "Lp", "dram_bytes_read", "byte_model_bytes", "l2_hit_rate_pct",
                "tensor_pipe_active_pct", "waves_per_sm", "wall_us", "useful_flops"):
        assert rec[key] is not None, key
    assert rec["layout"] == "shared" and rec["wall_us"] == pytest.approx(231.488)
    [d] = ncu.to_records(ncu.parse_csv((FIX / "ncu_details.csv").read_text()), "unique", 1.0, 2.0)
    assert d["tensor_pipe_active_pct"] is None and d["dram_bytes_read"] == pytest.approx(8.71e9)


def test_cli_says_clearly_when_ncu_is_missing(tmp_path, capsys):
    out = tmp_path / "ncu.json"
    rc = ncu.main(["--ncu", "ncu-not-installed-here", "--workdir", str(tmp_path), "--out", str(out)])
    assert rc == 2 and not out.exists()
    assert "not installed" in capsys.readouterr().err


def test_records_feed_table23(tmp_path):
    """The records this module writes are what harness.report.tables reads for Table 23: the dense kernel's
    captures fill the paper's two columns, the paged decode's only its own extra rows."""
    from harness.report.tables.compare import build_table
    from harness.run.results import load_results

    shape = ncu.Shape()
    recs = []
    for name, fixture in (("shared", "ncu_raw.csv"), ("unique", "ncu_raw.csv"), ("unique-decode", "ncu_details.csv")):
        what = ncu.CAPTURES[name]
        recs += ncu.to_records(ncu.parse_csv((FIX / fixture).read_text()), what.layout, shape.useful_flops(),
                               shape.byte_model(what.layout), op=what.op, capture=name, B=shape.b, Lp=shape.lp)
    path = tmp_path / "h" / "microbench" / "ncu.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"env": {}, "records": recs}))
    table = build_table(23, load_results(tmp_path / "h"))
    cols = [c.name for c in table.value_columns]
    dram = next(r for r in table.rows if str(r.keys[0]) == "DRAM bytes read / launch")
    shared = dram.cells[cols.index("shared_HOT")].ours
    assert shared == pytest.approx((36_175_872 + 35_913_728) / 2 / 1e6)  # MB, mean of the two launches
    assert dram.cells[cols.index("unique_paged")].ours == pytest.approx((36_175_872 + 35_913_728) / 2 / 1e9)  # GB
    decode = next(r for r in table.rows if str(r.keys[0]).startswith("DRAM bytes") and r.ours_only)
    assert decode.cells[cols.index("unique_paged")].ours == pytest.approx(8.71)
    assert decode.cells[cols.index("shared_HOT")].ours is None
    assert table.filled >= 16


def test_op_of_a_record_without_op_comes_from_its_kernel():
    assert ncu.op_of({"op": "prefix_dense", "kernel": "_decode_kernel"}) == "prefix_dense"
    assert ncu.op_of({"kernel": "_decode_kernel"}) == "decode_paged"
    assert ncu.op_of({"kernel": "_prefix_kernel"}) == "prefix_dense"
    assert ncu.op_of({"layout": "unique"}) is None


def test_default_target_launches_every_capture(capsys):
    """The capture target runs (smoke shapes under the Triton interpreter on CPU)."""
    assert ncu.main(["--launch-table5", "--smoke", "--warmup", "1", "--launch-count", "1"]) == 0
    out = capsys.readouterr().out
    assert "launched shared" in out and "launched unique:" in out and "launched unique-decode" in out


def test_capture_skips_warmup_launches_of_the_default_target(tmp_path, monkeypatch):
    seen = {}

    def fake_capture(target, name, what, shape, workdir, skip, count, exe):
        seen[name] = (target, what.kernel_regex, skip, count)
        return ncu.to_records([], what.layout, 1.0, 1.0, op=what.op)

    monkeypatch.setattr(ncu, "capture", fake_capture)
    assert ncu.main(["--workdir", str(tmp_path), "--out", str(tmp_path / "n.json"), "--warmup", "2"]) == 0
    assert seen["shared"] == ("harness.microbench.ncu --launch-table5 --layouts shared --warmup 2 --launch-count 3",
                              "^_prefix_kernel$", 2, 3)
    # the paper's unique column: the same kernel as shared, captured with the same regex
    assert seen["unique"] == ("harness.microbench.ncu --launch-table5 --layouts unique --warmup 2 --launch-count 3",
                              "^_prefix_kernel$", 2, 3)
    assert seen["unique-decode"][1:] == ("^_decode_kernel$", 2, 3)
    assert json.loads((tmp_path / "n.json").read_text())["records"] == []


def test_captures_are_one_kernel_on_two_layouts_plus_the_decode():
    import re

    assert ncu.CAPTURES["shared"].op == ncu.CAPTURES["unique"].op == "prefix_dense"
    assert ncu.CAPTURES["shared"].kernel_regex == ncu.CAPTURES["unique"].kernel_regex
    assert (ncu.CAPTURES["unique"].layout, ncu.CAPTURES["unique-decode"].layout) == ("unique", "unique")
    assert ncu.CAPTURES["unique-decode"].op == "decode_paged"
    assert re.search(ncu.LAYOUT_KERNELS["shared"], "_prefix_kernel")
    assert not re.search(ncu.LAYOUT_KERNELS["shared"], "_combine_prefix_kernel")
    assert re.search(ncu.LAYOUT_KERNELS["unique-decode"], "_decode_kernel")
    assert not re.search(ncu.LAYOUT_KERNELS["unique-decode"], "_combine_decode_kernel")
