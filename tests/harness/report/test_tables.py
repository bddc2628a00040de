"""Tables 3-24, built from the FAKE fixture result set (tests/harness/fixtures).

The fixture numbers are round values written by fixtures/make_fixtures.py; the expected values
below are computed from those inputs, so these tests check the mapping from result cells to the
paper's rows and columns, the ratios, and that missing cells are flagged and never filled.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest

from harness.report.paper import paper_table
from harness.report.tables import compare as table_compare
from harness.report.tables import extract as table_extract
from harness.report.tables import queries as table_queries
from harness.report.tables import render as table_render
from harness.report.tables import specs as table_specs
from harness.report.tables import write as tables
from harness.run.results import (
    load_results,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "results" / "fixture-hw"


@pytest.fixture(scope="module")
def results():
    return load_results(FIXTURE)


def _row(t: table_compare.ComparedTable, *keys):
    for r in t.rows:
        if r.keys == tuple(keys):
            return {c.name: cell for c, cell in zip(t.value_columns, r.cells)}
    raise AssertionError(f"no row {keys} in table {t.number}")


# --------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("number", table_specs.TABLE_NUMBERS)
def test_every_table_renders_in_three_formats_with_paper_layout(results, number):
    t = table_compare.build_table(number, results)
    paper = paper_table(number)
    printed = [r for r in t.rows if not r.ours_only]
    assert [r.keys for r in printed] == [tuple(p.get(k) for k in table_specs.TABLE_SPECS[number].keys)
                                         for p in paper.rows]
    n = len(t.rows)
    assert len(t.key_columns) + len(t.value_columns) == len(paper.columns)

    md = table_render.render_markdown(t)
    table_lines = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table_lines) == 2 + n
    assert md.startswith(f"# Table {number}:")

    tex = table_render.render_latex(t)
    assert r"\begin{tabular}" in tex and r"\end{tabular}" in tex
    assert tex.count(r" \\") == 2 + n

    rows = list(csv.reader(io.StringIO(table_render.render_csv(t))))
    assert len(rows) == 1 + n
    assert len(rows[0]) == len(t.key_columns) + 3 * len(t.value_columns)
    assert all(len(r) == len(rows[0]) for r in rows)
    # the paper's values go through untouched
    header = rows[0]
    csv_printed = [out for row, out in zip(t.rows, rows[1:]) if not row.ours_only]
    for prow, out in zip(paper.rows, csv_printed):
        for col in t.value_columns:
            v = prow.get(col.name)
            printed = out[header.index(f"{col.name}.paper")]
            if isinstance(v, bool):
                assert printed == ("true" if v else "false")
            elif isinstance(v, int | float):
                assert float(printed) == pytest.approx(v)
            elif v is None:
                assert printed == "n/a"
            else:
                assert printed == str(v)


def test_a_measured_point_the_paper_does_not_print_gets_its_own_row(results):
    """Table 6's Lp=16K row (the paper dropped it): shown in key order, marked, paper columns n/a,
    never counted as missing."""
    t = table_compare.build_table(6, results)
    only = [r for r in t.rows if r.ours_only]
    assert [r.keys for r in only] == [(16384, 32)]
    assert [r.keys for r in t.rows][-1] == (16384, 32)  # after the paper's last row (8192, 256)
    cols = [c.name for c in t.value_columns]
    row = only[0]
    assert row.cells[cols.index("x_SGL")].ours == pytest.approx(645.0 / 300.0)
    assert all(c.paper is None and not c.missing for c in row.cells)
    md = re.sub(" +", " ", table_render.render_markdown(t))  # pandas pads the columns
    line = next(x for x in md.splitlines() if x.startswith("| 16384* | 32 |"))
    # the fixture files record no call id: the ratio is a mixed-call one, marked
    assert "| n/a | 645 | n/a |" in line and f"| n/a | 2.15{table_render.MIXED_MARK} | n/a |" in line
    assert "1 row(s) marked * are ours only" in md
    assert "Rows marked * are ours only." in table_render.render_latex(t)
    # the same point in the paper's grid of another table adds nothing there
    assert not any(r.ours_only for r in table_compare.build_table(9, results).rows)


def test_missing_cells_are_flagged_never_filled(results):
    t14 = table_compare.build_table(14, results)  # no fixture cell feeds Table 14
    assert t14.filled == 0
    assert t14.missing == len(t14.rows) * len(t14.value_columns)
    md = table_render.render_markdown(t14)
    body = [line for line in md.splitlines() if line.startswith("| Prefix attention")][0]
    assert body.count("—") == 2 * len(t14.value_columns)  # ours and ours/paper
    rows = list(csv.DictReader(io.StringIO(table_render.render_csv(t14))))
    assert all(r["SGL_ms.ours"] == "n/a" and r["SGL_ms.ratio"] == "n/a" for r in rows)

    t3 = table_compare.build_table(3, results)
    cells = _row(t3, "Llama-3.1-8B / TP=1", 4096)
    assert all(c.ours is None and c.missing for c in cells.values())


def test_table3_means_over_reps_and_ratios(results):
    t = table_compare.build_table(3, results)
    r = _row(t, "Llama-3.1-8B / TP=1", 8192)
    assert r["SGL_tok_s"].ours == 1000.0
    assert r["SGL-C_tok_s"].ours == 1600.0
    assert r["GKV_tok_s"].ours == 2000.0  # mean of reps 1900 and 2100
    assert r["x_SGL"].ours == pytest.approx(2.0)
    assert r["x_SGL-C"].ours == pytest.approx(1.25)
    assert r["x_SGL"].ratio == pytest.approx(2.0 / 1.71)
    assert r["GKV_tok_s"].ratio == pytest.approx(2000 / 3801)
    # a row absent from sweep table3 comes from the ShareGPT grid sweep (table9), whole
    r16 = _row(t, "Llama-3.1-8B / TP=1", 16384)
    assert r16["x_SGL"].ours == pytest.approx(2.0) and r16["x_SGL-C"].ours == pytest.approx(1000 / 900)


def test_a_rep_missing_a_system_is_left_out_of_every_mean():
    """Ratios come from one run: a rep whose GraniKV cell is missing must not lift paged's mean."""
    import pandas as pd

    rows = [("paged", 0, 100.0), ("granikv", 0, 200.0), ("cascade", 0, 150.0),
            ("paged", 1, 110.0), ("granikv", 1, 220.0), ("cascade", 1, 160.0),
            ("paged", 2, 500.0), ("cascade", 2, 900.0),  # rep 2: no granikv cell
            ("granikv_cascade", 0, 180.0)]  # an extra variant, measured once, never required
    cells = pd.DataFrame([{"variant": v, "config.rep": r, table_queries.TOK: x} for v, r, x in rows])
    kept = table_queries.complete_reps(cells)
    assert sorted(set(kept["config.rep"])) == [0, 1]
    assert "granikv_cascade" in set(kept["variant"])
    block = table_queries.system_block(cells)
    assert block["SGL_tok_s"] == pytest.approx(105.0) and block["GKV_tok_s"] == pytest.approx(210.0)
    assert block["x_SGL"] == pytest.approx(2.0)
    # no rep complete (only GraniKV ran the point): every cell counts
    alone = cells[cells["variant"] == "granikv"]
    assert len(table_queries.complete_reps(alone)) == 2
    assert len(table_queries.complete_reps(cells[cells["config.rep"] == 2])) == 2


def test_dense_fraction_leaves_out_the_warm_up_steps_where_recorded():
    import pandas as pd

    old = pd.DataFrame([{"engine.dense_steps": 60, "engine.decode_steps": 100}])
    assert table_extract.dense_fraction(old) == pytest.approx(0.6)  # no snapshot: counts from start
    new = pd.DataFrame([{"engine.dense_steps": 60, "engine.decode_steps": 100,
                         "engine_after_warmup.dense_steps": 0, "engine_after_warmup.decode_steps": 20}])
    assert table_extract.dense_fraction(new) == pytest.approx(60 / 80)


def test_grid_tables_tpot_ttft_units(results):
    r = _row(table_compare.build_table(6, results), 8192, 256)
    assert r["GKV_TPOT_ms"].ours == pytest.approx(1000 * 256 / 1500, abs=1e-3)
    assert r["GKV_TTFT_s"].ours == pytest.approx(2.0)  # 2000 ms in the file
    partial = _row(table_compare.build_table(6, results), 8192, 8)
    assert partial["GKV_tok_s"].ours == 400.0 and partial["SGL_tok_s"].missing and partial["x_SGL"].missing


def test_table4_and_21_heterogeneous(results):
    t4 = table_compare.build_table(4, results)
    assert _row(t4, "GraniKV")["x_SGL_k4"].ours == pytest.approx(1.95)
    assert _row(t4, "SGLang-Cascade")["x_SGL_k4"].ours == pytest.approx(0.99)
    assert _row(t4, "GraniKV")["x_SGL_k8"].missing
    t21 = table_compare.build_table(21, results)
    g = _row(t21, "k=4: Lp ∈ {2K,4K,8K,16K} (30.7K slab tokens)", 4, "GraniKV")
    assert g["slab_tokens_K"].ours == pytest.approx(30.72)
    assert g["x_default"].ours == pytest.approx(1.95)
    assert g["TPOT_p99_ms"].ours == pytest.approx(1.5 * 1000 * 256 / 1950, abs=1e-3)


def test_table5_kernel_microbench(results):
    """The paper's rows are prefix_dense on both layouts; decode_paged/unique is an extra row of ours."""
    t = table_compare.build_table(5, results)
    assert _row(t, "shared (HOT)")["wall_us"].ours == 100.0
    assert _row(t, "shared (HOT)")["speedup_x"].ours == pytest.approx(20.0)  # prefix_dense unique 2000 / 100
    assert _row(t, "unique (paged)")["wall_us"].ours == 2000.0
    assert _row(t, "unique (paged)")["speedup_x"].ours == pytest.approx(1.0)
    assert table_extract.kernel_speedup(results) == pytest.approx(20.0)
    extra = _row(t, table_extract.TABLE5_DECODE_ROW)
    assert extra["wall_us"].ours == 1000.0  # the table5 decode record, not the sweep's 5000
    assert extra["speedup_x"].ours == pytest.approx(10.0)  # its us / shared us
    assert extra["wall_us"].paper is None and not extra["wall_us"].missing
    assert table_extract.decode_kernel_speedup(results) == pytest.approx(10.0)
    [row] = [r for r in t.rows if r.ours_only]
    assert row.keys == (table_extract.TABLE5_DECODE_ROW,) and t.rows[-1] is row  # after the paper's rows
    md = table_render.render_markdown(t)
    assert f"{table_extract.TABLE5_DECODE_ROW}{table_render.OURS_ONLY_MARK}" in md


def _kernel_frame(*records):
    import pandas as pd

    base = {"B": 256, "Lp": 8192, "Hq": 32, "Hkv": 8, "d": 128, "dtype": "bf16", "table5": True}
    return pd.DataFrame([{**base, **r} for r in records])


def _synthetic(kernels=None, ncu=None):
    import pandas as pd

    from harness.run.results import ResultSet

    micro = {k: v for k, v in (("kernels", kernels), ("ncu", ncu)) if v is not None}
    return ResultSet(hardware="synthetic", cells=pd.DataFrame(columns=["hardware", "sweep", "cell_id", "path",
                                                                       "variant"]), microbench=micro)


def test_table5_picks_the_dense_unique_record_for_the_main_row():
    res = _synthetic(_kernel_frame(
        {"op": "prefix_dense", "layout": "shared", "us": 80.0, "GBps": 500.0},
        {"op": "prefix_dense", "layout": "unique", "us": 2400.0, "GBps": 3600.0},
        {"op": "decode_paged", "layout": "unique", "us": 2000.0, "GBps": 4300.0},
        {"op": "prefix_dense", "layout": "unique", "us": 2600.0, "GBps": 1.0, "table5": None,
         "table5_split_variant": True},  # the split variant: not the table5 record
    ))
    t = table_compare.build_table(5, res)
    assert _row(t, "unique (paged)")["wall_us"].ours == 2400.0
    assert _row(t, "unique (paged)")["effective_HBM_GB_s"].ours == 3600.0
    assert _row(t, "shared (HOT)")["speedup_x"].ours == pytest.approx(30.0)
    extra = _row(t, table_extract.TABLE5_DECODE_ROW)
    assert (extra["wall_us"].ours, extra["effective_HBM_GB_s"].ours) == (2000.0, 4300.0)
    assert extra["speedup_x"].ours == pytest.approx(25.0)


def test_table5_without_the_dense_unique_record_the_main_rows_are_missing():
    """A kernels.json from before the prefix_dense/unique record (as committed): the paper's unique row
    and every speedup of the main rows are missing; the decode kernel never stands in."""
    res = _synthetic(_kernel_frame(
        {"op": "prefix_dense", "layout": "shared", "us": 77.0, "GBps": 489.5},
        {"op": "decode_paged", "layout": "unique", "us": 1969.0, "GBps": 4369.0},
    ))
    t = table_compare.build_table(5, res)
    unique = _row(t, "unique (paged)")
    assert all(c.ours is None and c.missing for c in unique.values())
    assert _row(t, "shared (HOT)")["speedup_x"].missing
    assert _row(t, "shared (HOT)")["wall_us"].ours == 77.0  # the shared record itself is the paper's
    assert _row(t, table_extract.TABLE5_DECODE_ROW)["speedup_x"].ours == pytest.approx(1969.0 / 77.0)
    assert table_extract.kernel_speedup(res) is None
    md = table_render.render_markdown(t)
    line = next(ln for ln in md.splitlines() if ln.startswith("| unique (paged) "))
    assert line.count(table_render.MISSING_TEXT) == 6  # ours and ours/paper of the three columns
    csv_rows = list(csv.DictReader(io.StringIO(table_render.render_csv(t))))
    assert csv_rows[1]["speedup_x.ours"] == "n/a" and csv_rows[0]["speedup_x.ours"] == "n/a"


def test_table22_s_is_the_main_rows_speedup_or_missing():
    """Table 22's Amdahl s is Table 5's main-row speedup: without prefix_dense/unique there is no s
    (S columns missing), whatever decode_paged measured."""
    no_unique = _synthetic(_kernel_frame(
        {"op": "prefix_dense", "layout": "shared", "us": 77.0, "GBps": 489.5},
        {"op": "decode_paged", "layout": "unique", "us": 1969.0, "GBps": 4369.0},
    ))
    assert table_extract.kernel_speedup(no_unique) is None
    r = _row(table_compare.build_table(22, no_unique), "Llama-8B/TP=1")
    assert r["S_s15.6_x"].ours is None and r["S_plus_beta_gamma_x"].ours is None


def test_table23_columns_are_the_dense_kernel_the_decode_has_extra_rows():
    import pandas as pd

    def rec(op, layout, kernel, dram, wall):
        r = {"layout": layout, "kernel": kernel, "B": 256, "Lp": 8192, "dram_bytes_read": dram,
             "byte_model_bytes": 8.0e9 if layout == "unique" else 32e6, "l2_hit_rate_pct": 1.0,
             "tensor_pipe_active_pct": 10.0, "waves_per_sm": 4.0, "wall_us": wall, "useful_flops": 34.4e9}
        return {**r, "op": op} if op else r

    # as committed before the dense unique capture: shared + the decode (kernel only, no op)
    old = _synthetic(ncu=pd.DataFrame([rec(None, "shared", "_prefix_kernel", 36e6, 66.0),
                                       rec(None, "unique", "_decode_kernel", 8.65e9, 1958.0)]))
    t = table_compare.build_table(23, old)
    dram = _row(t, "DRAM bytes read / launch", "MB", "GB")
    assert dram["shared_HOT"].ours == pytest.approx(36.0) and dram["unique_paged"].missing
    extra = _row(t, f"DRAM bytes read / launch {table_extract.TABLE23_DECODE_SUFFIX}", None, "GB")
    assert extra["unique_paged"].ours == pytest.approx(8.65) and extra["shared_HOT"].ours is None
    assert sum(r.ours_only for r in t.rows) == len(paper_table(23).rows)
    # with the dense unique capture: it fills the paper's unique column
    new = _synthetic(ncu=pd.DataFrame([rec("prefix_dense", "shared", "_prefix_kernel", 36e6, 66.0),
                                       rec("prefix_dense", "unique", "_prefix_kernel", 8.6e9, 2500.0),
                                       rec("decode_paged", "unique", "_decode_kernel", 8.65e9, 1958.0)]))
    t = table_compare.build_table(23, new)
    assert _row(t, "Wall time (1410 MHz)", "µs", "µs")["unique_paged"].ours == pytest.approx(2500.0)
    assert _row(t, f"Wall time (1410 MHz) {table_extract.TABLE23_DECODE_SUFFIX}", None,
                "µs")["unique_paged"].ours == pytest.approx(1958.0)


def test_table12_peak_b_only_when_complete(results):
    t = table_compare.build_table(12, results)
    llama = _row(t, "Llama-8B/TP=1")
    assert llama["B256_tok_s"].ours == 1000.0  # from sweep table9
    assert llama["peak_B"].ours == 512 and llama["peak_B"].ratio is None
    assert _row(t, "Qwen-14B/TP=2")["peak_B"].missing


def test_table13_profile_columns_by_variant(results):
    r = _row(table_compare.build_table(13, results), "Prefix attention")
    assert (r["SGL_ms"].ours, r["SGL-C_ms"].ours, r["SGL-C/GKV_ms"].ours, r["GKV_ms"].ours) == (
        1000.0, 300.0, 310.0, 250.0)


def test_table15_dispatch_fraction_and_majority(results):
    r = _row(table_compare.build_table(15, results), 8192)
    assert r["B8_pct"].ours == 0.0 and r["B256_pct"].ours == pytest.approx(99.0)
    assert r["B8_pct"].ratio is None  # paper 0 %: no ratio
    assert r["majority"].ours == "mixed" and r["majority"].ratio is None
    assert table_extract.majority([0.0, 0.0, 5.0, 98.0]) == "cascade"
    assert table_extract.majority([90.0, 100.0]) == "dense"
    assert table_extract.majority([None]) is None


def test_table16_18_19_20(results):
    r16 = _row(table_compare.build_table(16, results), 256, 1024)
    assert r16["x_GKV_over_SGL-C"].ours == pytest.approx(1250 / 1500, rel=1e-4)  # TPOTs rounded in the file
    r18 = _row(table_compare.build_table(18, results), "Llama-8B / TP=1")
    assert r18["max_abs_delta_pct"].ours == pytest.approx(100 * 4 / 998)
    assert _row(table_compare.build_table(18, results), "Qwen-32B / TP=4")["PS1_tok_s"].missing
    t19 = table_compare.build_table(19, results)
    r19 = _row(t19, "Llama-8B / TP=1", 8, "none")
    assert r19["x_SGL"].ours == pytest.approx(1.5)
    assert not r19["regime"].applicable and not r19["regime"].missing
    t20 = table_compare.build_table(20, results)
    assert _row(t20, "ratio", "GraniKV / SGL-C", 4)["ratio"].ours == pytest.approx(1.4)
    assert _row(t20, "throughput", "GraniKV", 1)["output_tok_s"].ours == 1800.0
    assert _row(t20, "throughput", "GraniKV", 64)["output_tok_s"].missing


def test_table17_and_23_microbench_derivations(results):
    t17 = table_compare.build_table(17, results)
    assert _row(t17, "Wrapper % of step", "<", "%")["value"].ours == pytest.approx(0.2)
    assert _row(t17, "Dense-backend launches in 15 s", "=", "launches")["value"].ours == 80
    t23 = table_compare.build_table(23, results)
    assert _row(t23, "Arithmetic intensity", "F/B", "F/B")["shared_HOT"].ours == pytest.approx(860.0)
    assert _row(t23, "DRAM bytes read / launch", "MB", "GB")["shared_HOT"].ours == pytest.approx(40.0)
    assert _row(t23, "DRAM bytes read / launch", "MB", "GB")["unique_paged"].ours == pytest.approx(8.0)
    assert _row(t23, "vs. byte model", "% (excess over byte model)",
                "% (excess over byte model)")["shared_HOT"].ours == pytest.approx(25.0)
    assert _row(t23, "Useful throughput", "TF/s", "TF/s")["unique_paged"].ours == pytest.approx(4.3)
    # the fixture's decode record has only `kernel` (as ncu.json had before `op`): its own rows
    decode = _row(t23, f"Useful throughput {table_extract.TABLE23_DECODE_SUFFIX}", None, "TF/s")
    assert decode["unique_paged"].ours == pytest.approx(34.4e9 / 2000.0 / 1e6)


def test_amdahl_reproduces_the_papers_table22():
    for row in paper_table(22).rows:
        a, b, g = row["alpha_pct"] / 100, row["beta_pct"] / 100, row["gamma_pct"] / 100
        s_plain, s_full = table_extract.amdahl(a, b, g, 15.6)
        assert s_plain == pytest.approx(row["S_s15.6_x"], abs=0.01)
        assert s_full == pytest.approx(row["S_plus_beta_gamma_x"], abs=0.01)
        assert table_extract.effective_speedup(a, row["measured_x"]) == pytest.approx(row["s_eff_x"], abs=0.1)
    assert table_extract.effective_speedup(0.5, 10.0) is None  # no finite kernel speedup explains it


def test_table22_from_profile_and_kernel_speedup(results):
    r = _row(table_compare.build_table(22, results), "Llama-8B/TP=1")
    assert r["alpha_pct"].ours == pytest.approx(60.0) and r["gamma_pct"].ours == pytest.approx(5.0)
    a_kernel = 0.6 / 0.95
    assert r["S_s15.6_x"].ours == pytest.approx(1 / ((1 - a_kernel) + a_kernel / 20))  # s = Table 5's main rows
    assert r["measured_x"].ours == pytest.approx(2.0)  # GKV/SGL from sweep table9
    assert r["s_eff_x"].ours == pytest.approx(6.0)


def test_table24_fp_sweep(results):
    t = table_compare.build_table(24, results)
    r = _row(t, "GraniKV", 0.05)
    assert r["dagger"].ours is True and r["dagger"].ratio is None
    assert r["x_Cascade"].ours == pytest.approx(1.1)
    assert _row(t, "GraniKV", 0.2)["dagger"].ours is False
    assert _row(t, "Cascade", None)["x_Cascade"].ours == pytest.approx(1.0)
    assert _row(t, "GraniKV", 0.8)["tok_s"].missing


def test_cli_writes_every_table_and_an_index(tmp_path):
    out = tmp_path / "tables" / "fixture-hw"
    assert tables.main(["--results", str(FIXTURE), "--out", str(out)]) == 0
    for n in table_specs.TABLE_NUMBERS:
        for ext in ("md", "tex", "csv"):
            assert (out / f"table{n}.{ext}").stat().st_size > 0
    index = (out / "README.md").read_text()
    assert all(f"(table{n}.md)" in index for n in table_specs.TABLE_NUMBERS)
    assert tables.main(["--results", str(FIXTURE), "--out", str(tmp_path / "one"), "--table", "3"]) == 0
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == [
        "README.md", "table3.csv", "table3.md", "table3.tex"]
    assert tables.main(["--results", str(tmp_path / "absent"), "--out", str(tmp_path / "x")]) == 2



def test_paged_alpha_is_its_attention_time_times_the_prefix_share_of_the_context():
    """A paged profile has no prefix kernel (prefix_attention_ms = 0): α is derived from its one
    attention kernel's time and the prefix's share of a decoding request's mean context."""
    import pandas as pd

    prof = pd.DataFrame([{"variant": "paged", "system": "paged", "profile.decode_attention_ms": 80.0,
                          "metrics.completed": 10, "metrics.total_input_tokens": 10 * 1500,
                          "metrics.total_output_tokens": 10 * 1000}])
    # mean context = 1500 + 1000 / 2 = 2000 tokens, 1000 of them prefix: half the attention time
    assert table_extract._paged_prefix_share(prof, 100.0, 1000) == pytest.approx(0.4)
    assert table_extract._paged_prefix_share(prof, 100.0, 10**6) == pytest.approx(0.8)  # capped at all of it
    assert table_extract._paged_prefix_share(prof.iloc[0:0], 100.0, 1000) is None
