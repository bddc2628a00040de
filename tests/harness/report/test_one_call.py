"""Ratios come only from cells of one call (the one-call bar): a rep whose compared systems carry one
`env.call_id` is the only kind a ratio is taken over; a point with none still shows its ratio, from
its complete reps, marked ‡ and counted, so a reader sees which ratios carry run-to-run spread.

Every result set here is synthetic (a frame of round numbers, or fake files in tmp_path)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from harness.report.tables import compare as table_compare
from harness.report.tables import queries as table_queries
from harness.report.tables import render as table_render
from harness.report.tables import write as tables
from harness.run.results import ResultSet, load_cells

MODEL = {1: "llama-3.1-8b", 2: "qwen2.5-14b"}
SWEEP = {1: "table9", 2: "table10"}


def cell(system: str, rep: int, tok: float, call: str | None, *, tp: int = 1, lp: int = 16384, **extra) -> dict:
    """One cell as a row of `ResultSet.cells` (the columns the tables read)."""
    cid = f"{system}-{MODEL[tp]}-tp{tp}-sharegpt-lp{lp}-b256-k1-r{rep}"
    return {
        "sweep": SWEEP[tp],
        "variant": system,
        "config.system": system,
        "config.model": MODEL[tp],
        "config.tp": tp,
        "config.workload": "sharegpt",
        "config.lp": lp,
        "config.batch": 256,
        "config.k": 1,
        "config.rep": rep,
        table_queries.TOK: tok,
        table_queries.TPOT: 1000.0 / tok,
        table_queries.TTFT: 1000.0,
        "env.call_id": call,
        "cell_id": cid,
        "path": f"{SWEEP[tp]}/{cid}.json",
        **extra,
    }


def frame(*rows: dict) -> pd.DataFrame:
    return pd.DataFrame(list(rows))


def trio(rep: int, paged: float, cascade: float, granikv: float, calls: tuple, **kw) -> list[dict]:
    """paged, cascade and granikv of one rep; `calls`: their call ids in that order."""
    return [cell(s, rep, tok, c, **kw) for s, tok, c in zip(SYSTEMS, (paged, cascade, granikv), calls, strict=True)]


SYSTEMS = ("paged", "cascade", "granikv")


# --------------------------------------------------------------------------- the rule


def test_all_reps_of_one_call_give_the_ratio_of_the_means_unmarked():
    cells = frame(*trio(0, 100.0, 150.0, 200.0, ("a",) * 3), *trio(1, 110.0, 160.0, 240.0, ("b",) * 3))
    block = table_queries.system_block(cells)
    assert block["SGL_tok_s"] == pytest.approx(105.0) and block["GKV_tok_s"] == pytest.approx(220.0)
    assert block["x_SGL"] == pytest.approx(220.0 / 105.0)
    assert block["x_SGL-C"] == pytest.approx(220.0 / 155.0)
    assert table_queries.MIXED not in block
    assert table_queries.one_call_reps(cells, table_queries.system_sides(cells)) == [0, 1]


def test_only_the_reps_of_one_call_feed_the_ratio_and_the_rows_other_numbers():
    # rep 0: one call; rep 1: granikv re-measured alone (another call); rep 2: no call ids (old files)
    cells = frame(
        *trio(0, 100.0, 150.0, 200.0, ("a",) * 3),
        *trio(1, 100.0, 150.0, 400.0, ("b", "b", "c")),
        *trio(2, 50.0, 150.0, 400.0, (None,) * 3),
    )
    reps = table_queries.ratio_reps(cells)
    assert not reps.mixed and sorted(set(reps.cells["config.rep"])) == [0]
    block = table_queries.system_block(cells)
    assert block["x_SGL"] == pytest.approx(2.0) and block["x_SGL-C"] == pytest.approx(200.0 / 150.0)
    assert block["GKV_tok_s"] == pytest.approx(200.0)  # absolute numbers from the same rep
    assert table_queries.MIXED not in block


def test_without_call_ids_the_ratio_is_shown_from_the_complete_reps_and_marked():
    rows = [*trio(0, 100.0, 150.0, 200.0, (None,) * 3), *trio(1, 110.0, 160.0, 220.0, (None,) * 3)]
    rows.append(cell("paged", 2, 999.0, None))  # an incomplete rep stays out, as before
    block = table_queries.system_block(frame(*rows))
    assert block["x_SGL"] == pytest.approx(210.0 / 105.0) and block["SGL_tok_s"] == pytest.approx(105.0)
    marked = block[table_queries.MIXED]
    assert set(marked) == {"x_SGL", "x_SGL-C"}
    assert len(marked["x_SGL"]) == 6  # the cells of the two complete reps


def test_an_empty_call_id_or_one_system_is_not_a_call():
    cells = frame(*trio(0, 100.0, 150.0, 200.0, ("", "", "")))
    assert table_queries.ratio_reps(cells).mixed
    alone = frame(cell("granikv", 0, 200.0, None), cell("granikv", 1, 220.0, "x"))
    reps = table_queries.ratio_reps(alone)  # no ratio to compare: every cell, never marked
    assert not reps.mixed and len(reps.cells) == 2


def test_extra_variants_do_not_split_a_call_unless_they_are_a_side():
    """A forced-cascade GraniKV cell measured elsewhere does not make paged/cascade/granikv mixed;
    where a ratio is taken over it (named as a side), its call counts."""
    cells = frame(*trio(0, 100.0, 150.0, 200.0, ("a",) * 3), cell("granikv_cascade", 0, 180.0, "z"))
    assert not table_queries.ratio_reps(cells).mixed
    sides = [{"system": "granikv_cascade"}, {"system": "cascade"}]
    assert table_queries.ratio_reps(cells, sides).mixed


def test_knobbed_sides_table24_and_table18():
    cells = frame(
        cell("cascade", 0, 100.0, "a", lp=8192),
        cell("granikv", 0, 110.0, "a", lp=8192, **{"config.hot_fraction": 0.05}),
        cell("granikv", 0, 120.0, "b", lp=8192, **{"config.hot_fraction": 0.2}),
    )
    one = table_queries.ratio_reps(cells, [{"system": "granikv", "hot_fraction": 0.05}, {"system": "cascade"}])
    other = table_queries.ratio_reps(cells, [{"system": "granikv", "hot_fraction": 0.2}, {"system": "cascade"}])
    assert not one.mixed and other.mixed


def test_load_cells_always_has_the_call_id_column(tmp_path):
    doc = {
        "config": {"system": "paged", "model": "m", "tp": 1, "workload": "w", "lp": 1, "batch": 1},
        "metrics": {
            "output_throughput": 1.0,
            "median_ttft_ms": 1.0,
            "median_tpot_ms": 1.0,
            "completed": 1,
            "failed": 0,
        },
        "engine": {"decode_steps": 1},
        "env": {"gpu": "x", "git_sha": "0"},
    }
    (tmp_path / "hw" / "s").mkdir(parents=True)
    (tmp_path / "hw" / "s" / "old.json").write_text(json.dumps(doc))
    cells = load_cells(tmp_path / "hw")
    assert "env.call_id" in cells.columns and table_queries.call_id(cells["env.call_id"].iloc[0]) is None
    assert "env.call_id" in load_cells(tmp_path / "hw", sweeps=["none"]).columns


# --------------------------------------------------------------------------- tables: marks and counts


def result_set() -> ResultSet:
    """Table 3's Llama TP=1 16K row from one call; its 8K row and the Qwen TP=2 16K row without
    call ids; Table 9's TP=1 16K point is the same point as Table 3's."""
    rows = [
        *trio(0, 100.0, 150.0, 200.0, ("a",) * 3),
        *trio(1, 100.0, 150.0, 220.0, ("b", "b", "x")),
        *trio(0, 200.0, 250.0, 300.0, (None,) * 3, lp=8192),
        *trio(0, 300.0, 350.0, 400.0, (None, None, "y"), tp=2),
    ]
    return ResultSet(hardware="synthetic", cells=frame(*rows))


def _row(t: table_compare.ComparedTable, *keys) -> dict:
    row = next(r for r in t.rows if r.keys == tuple(keys))
    return {c.name: cell for c, cell in zip(t.value_columns, row.cells, strict=True)}


def test_tables_mark_only_mixed_call_ratios():
    res = result_set()
    t = table_compare.build_table(3, res)
    one = _row(t, "Llama-3.1-8B / TP=1", 16384)
    assert one["x_SGL"].ours == pytest.approx(2.0) and not one["x_SGL"].mixed_call  # rep 0 only
    mixed = _row(t, "Llama-3.1-8B / TP=1", 8192)
    assert mixed["x_SGL"].ours == pytest.approx(1.5) and mixed["x_SGL"].mixed_call
    assert not mixed["GKV_tok_s"].mixed_call  # absolute numbers are never marked
    md = re.sub(" +", " ", table_render.render_markdown(t))
    line = next(x for x in md.splitlines() if x.startswith("| Llama-3.1-8B / TP=1 | 8192 |"))
    assert f"| 1.50{table_render.MIXED_MARK} |" in line and line.count(table_render.MIXED_MARK) == 2
    line = next(x for x in md.splitlines() if x.startswith("| Llama-3.1-8B / TP=1 | 16384 |"))
    assert table_render.MIXED_MARK not in line
    assert f"4 ratio(s) of ours in 2 row(s) marked {table_render.MIXED_MARK}" in md
    assert r"\ddag{}" in table_render.render_latex(t)
    assert table_render.MIXED_MARK not in table_render.render_csv(t)  # the CSV keeps bare numbers
    head = table_render.render_headline(t)
    assert f"1.71 / 1.50{table_render.MIXED_MARK}" in head and table_render.MIXED_LEGEND in head


def test_count_of_points_with_mixed_call_ratios_by_tp(tmp_path):
    res = result_set()
    by_table = tables.mixed_call_points_by_table(res, (3, 9, 10))
    assert {p.name: p.tp for p in by_table[3]} == {
        "llama-3.1-8b-tp1-sharegpt-lp8192-b256-k1": 1,
        "qwen2.5-14b-tp2-sharegpt-lp16384-b256-k1": 2,
    }
    assert {p.name for p in by_table[9]} == {"llama-3.1-8b-tp1-sharegpt-lp8192-b256-k1"}  # same point
    assert tables.count_mixed_call_points(res, tp=1, numbers=(3, 9, 10)) == 1  # counted once
    assert tables.count_mixed_call_points(res, tp=2, numbers=(3, 9, 10)) == 1
    assert tables.count_mixed_call_points(res, tp=None, numbers=(3, 9, 10)) == 2
    tables.write_tables(res, tmp_path, (3, 9))
    index = (tmp_path / "README.md").read_text()
    assert "| 3 | " in index and "| TP=1: 1, TP=2: 1 |" in index
    assert "at TP=1: 1 (the one-call bar: 0" in index


def test_a_point_measured_in_one_call_counts_nothing():
    res = ResultSet(hardware="synthetic", cells=frame(*trio(0, 100.0, 150.0, 200.0, ("a",) * 3)))
    assert tables.count_mixed_call_points(res, tp=None) == 0


def test_point_of_drops_the_system_the_rep_and_granikvs_knobs():
    row = pd.Series(
        {
            "sweep": "table24",
            "config.system": "granikv",
            "config.rep": 2,
            "config.tp": 1,
            "cell_id": "granikv-llama-3.1-8b-tp1-burst-lp8192-b256-k1-r2-hot_fraction0.05",
        }
    )
    assert tables.point_of(row) == tables.PointRef("table24", 1, "llama-3.1-8b-tp1-burst-lp8192-b256-k1")


def test_docs_render_reads_a_points_reps_of_one_call_as_the_tables_do():
    from harness.docs.common import point_reps

    def doc(system: str, rep: int, tok: float, call: str | None) -> tuple[str, dict]:
        env = {"call_id": call} if call else {}
        return f"{system}{rep}", {
            "config": {"system": system, "rep": rep, "lp": 1},
            "metrics": {"output_throughput": tok},
            "env": env,
        }

    cells = [
        doc("paged", 0, 100.0, "a"),
        doc("granikv", 0, 200.0, "a"),
        doc("paged", 1, 100.0, None),
        doc("granikv", 1, 400.0, None),
    ]
    pt, mixed = point_reps(cells, lp=1)
    assert not mixed and [d["metrics"]["output_throughput"] for d in pt["granikv"]] == [200.0]
    pt, mixed = point_reps(cells[2:], lp=1)
    assert mixed and len(pt["granikv"]) == 1
