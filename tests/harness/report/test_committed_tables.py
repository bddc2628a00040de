"""The committed tables and the README's headline are what the committed results render, and what
decides which cells a table reads: tagged A/B cells are not table inputs, the k tables average
complete reps only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.report.tables import compare as table_compare
from harness.report.tables import queries as table_queries
from harness.report.tables import render as table_render
from harness.report.tables import specs as table_specs
from harness.run.results import (
    load_results,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "results" / "fixture-hw"


def test_readme_headline_block_is_rendered_from_committed_results():
    """The README's headline table is what `harness.report.tables --readme` renders from results/h200 now
    (re-render after committing results: `python -m harness.report.tables --results results/h200
    --out tables/h200 --readme README.md`)."""
    from harness.report.tables.compare import build_table
    from harness.report.tables.render import STALE_MARK, render_headline
    from harness.report.tables.write import README_BEGIN, README_END, headline_block, stale_cell_paths
    from harness.run.results import load_results

    root = Path(__file__).resolve().parents[3]
    text = (root / "README.md").read_text(encoding="utf-8")
    block = text[text.index(README_BEGIN) + len(README_BEGIN) + 1:text.index(README_END)]
    results = load_results(root / "results" / "h200")
    if stale_cell_paths(results) is not None:
        assert block == headline_block(results)
    else:  # a shallow clone: git cannot say which rows are stale, so compare without the § marks
        kept: list[str] = []
        for line in block.split("\n"):
            if line.startswith(STALE_MARK):  # the § legend, and the blank line before it
                if kept and kept[-1] == "":
                    kept.pop()
                continue
            kept.append(line.replace(STALE_MARK, ""))
        assert "\n".join(kept) == render_headline(build_table(3, results))


def test_update_readme_replaces_only_the_marked_block(tmp_path):
    from harness.report.tables.write import README_BEGIN, README_END, update_readme

    f = tmp_path / "README.md"
    f.write_text(f"intro\n{README_BEGIN}\nold\n{README_END}\noutro\n")
    assert update_readme(f, "| a |\n")
    assert f.read_text() == f"intro\n{README_BEGIN}\n| a |\n{README_END}\noutro\n"
    assert not update_readme(f, "| a |\n")
    g = tmp_path / "plain.md"
    g.write_text("no markers\n")
    with pytest.raises(ValueError, match="markers"):
        update_readme(g, "x")
    assert g.read_text() == "no markers\n"


def test_tagged_ab_cells_are_not_table_inputs(tmp_path):
    """A cell run with tag= (an A/B of a server setting) beside a sweep's cells must not become
    another repetition of the point: load_results leaves it to harness.report.repetitions."""
    import shutil

    root = tmp_path / "fixture-hw"
    shutil.copytree(FIXTURE, root)
    src = root / "table9" / "granikv-llama-3.1-8b-tp1-lp16384-b256-k1-r0.json"
    doc = json.loads(src.read_text())
    doc["config"]["tag"] = "long-keys"
    doc["metrics"]["output_throughput"] = 1.0
    (src.parent / (src.stem + "-taglong-keys.json")).write_text(json.dumps(doc))
    before, after = load_results(FIXTURE), load_results(root)
    assert len(after.cells) == len(before.cells)
    csv_of = lambda res: table_render.render_csv(table_compare.build_table(3, res))  # noqa: E731
    assert csv_of(after) == csv_of(before)


@pytest.mark.parametrize("number, sweep, extra", [(20, "table20", {"config.lp": 8192}), (21, "table21", {})])
def test_k_tables_average_complete_reps_only(number, sweep, extra):
    """Table 20/21 ratios come from one run: a rep missing its cascade cell (a device call ran
    out of time) is left out of every system's mean, as in the grid tables."""
    import pandas as pd

    from harness.run.results import ResultSet

    k = 64 if number == 20 else 4
    rows = [("paged", 0, 100.0), ("cascade", 0, 100.0), ("granikv", 0, 200.0),
            ("paged", 1, 100.0), ("cascade", 1, 100.0), ("granikv", 1, 220.0),
            ("paged", 2, 90.0), ("granikv", 2, 100.0)]  # rep 2: no cascade cell
    res = ResultSet(hardware="x", cells=pd.DataFrame([
        {"sweep": sweep, "variant": s, "config.system": s, "config.model": "llama-3.1-8b", "config.tp": 1,
         "config.batch": 256, "config.k": k, "config.rep": r, table_queries.TOK: x, "path": f"{s}{r}", **extra}
        for s, r, x in rows]))
    t = table_compare.build_table(number, res)
    if number == 20:
        by_key = {row.keys: row.cells for row in t.rows}
        assert by_key[("throughput", "SGLang default", 64)][0].ours == pytest.approx(100.0)
        assert by_key[("throughput", "GraniKV", 64)][0].ours == pytest.approx(210.0)
        assert by_key[("ratio", "GraniKV / SGL", 64)][1].ours == pytest.approx(2.1)
    else:
        gkv = next(row for row in t.rows if row.keys[-1] == "GraniKV" and 4 in row.keys)
        cols = [c.name for c in t.value_columns]
        assert gkv.cells[cols.index("tok_s")].ours == pytest.approx(210.0)
        assert gkv.cells[cols.index("x_default")].ours == pytest.approx(2.1)


ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def committed_h200():
    return load_results(ROOT / "results" / "h200")


@pytest.mark.parametrize("number", table_specs.TABLE_NUMBERS)
def test_committed_tables_are_what_the_committed_results_render(committed_h200, number):
    """tables/h200/table<n>.csv is exactly what the renderer makes of results/h200 now: every
    committed number is reproducible from the committed result files (re-render after a change:
    `python -m harness.report.tables --results results/h200 --out tables/h200 --readme README.md`)."""
    committed = ROOT / "tables" / "h200" / f"table{number}.csv"
    if not committed.exists():
        pytest.skip(f"{committed} is not committed")
    rendered = table_render.render_csv(table_compare.build_table(number, committed_h200))
    assert rendered == committed.read_text(encoding="utf-8")
