"""tables/h200/hint-free.md is rendered from the committed hint / no-hint cells, and its judgements
follow from the numbers in the result files.

Why: the table states whether the hint-free bars are met; a re-measured cell without a re-render,
or a bar judged on the wrong side of a ratio, would make it say something the results do not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.report import hint_free

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "results" / "h200"
TABLE = ROOT / "tables" / "h200" / "hint-free.md"


@pytest.fixture(scope="module")
def rendered() -> str:
    if not (RESULTS / hint_free.ADHOC).is_dir():
        pytest.skip("no committed H200 results")
    return hint_free.render(RESULTS)


def test_committed_table_is_current(rendered):
    assert TABLE.read_text() == rendered, "re-render: python -m harness.report.hint_free --results results/h200"


def test_cli_writes_the_same_table(tmp_path, rendered):
    out = tmp_path / "t.md"
    hint_free.main(["--results", str(RESULTS), "--out", str(out)])
    assert out.read_text() == rendered


def _row(text: str, label: str) -> list[str]:
    rows = [ln for ln in text.splitlines() if ln.startswith(f"| {label} |")]
    assert len(rows) == 1, label
    return [c.strip() for c in rows[0].strip("|").split("|")]


def test_ratios_and_bars_follow_the_result_files(rendered):
    """The ShareGPT row's ratio is the no-hint cell's throughput over the hint cell's, read
    independently of the renderer, and the bar's verdict is that ratio against 0.97."""
    name = "granikv-llama-3.1-8b-tp1-sharegpt-lp16384-b256-k1-r0-tag{}.json"
    docs = {t: json.loads((RESULTS / "adhoc" / name.format(t)).read_text()) for t in ("hint", "nohint")}
    tok = {t: d["metrics"]["output_throughput"] for t, d in docs.items()}
    row = _row(rendered, "ShareGPT Lp=16K")
    assert row[4] == f"{tok['hint']:.0f}" and row[5] == f"{tok['nohint']:.0f}"
    ratio = tok["nohint"] / tok["hint"]
    calls = {d["env"].get("call_id") for d in docs.values()}
    one_call = None not in calls and len(calls) == 1
    assert row[6] == f"{ratio:.3f}" + ("" if one_call else hint_free.MIXED_MARK)
    assert f"≥ 0.97 × hint: {'met' if ratio >= 0.97 else 'not met'}" in row[9]


def test_poisson_row_compares_tpot_lower_is_better(rendered):
    name = "granikv-llama-3.1-8b-tp1-sharegpt-lp16384-b256-k1-r0-rate16-tag{}.json"
    tpot = {t: json.loads((RESULTS / "adhoc" / name.format(t)).read_text())["metrics"]["median_tpot_ms"]
            for t in ("hint", "nohint")}
    row = _row(rendered, "ShareGPT Lp=16K, Poisson 16 req/s")
    assert row[1] == "TPOT p50 ms"
    ratio = tpot["nohint"] / tpot["hint"]
    assert f"≤ 1.03 × hint: {'met' if ratio <= 1.03 else 'not met'}" in row[9]


def test_missing_cells_are_dashes_and_unjudged():
    """A point whose baseline was not measured shows "—" for it and leaves the bar unjudged."""
    bar = hint_free.Bar("paged", 1.4)
    assert bar.met(None) is None
    assert bar.met(1.5) is True and bar.met(1.39) is False
    assert hint_free.Bar("hint", 1.03, at_most=True).met(1.04) is False


def _cell(tmp: Path, system: str, tag: str, tok: float, call: str | None = None, **engine) -> None:
    doc = {"config": {"system": system, "tag": tag, "workload": "sharegpt", "lp": 16384, "batch": 256, "k": 1,
                      "rate": "inf"},
           "metrics": {"output_throughput": tok, "median_tpot_ms": 10.0},
           "env": {"git_sha": "abcdef0123", **({"call_id": call} if call else {})},
           "engine": {"decode_steps": 110, "class_decisions": {"cascade": 100, "plain": 10}, **engine},
           "engine_after_warmup": {"decode_steps": 10}}
    (tmp / "adhoc").mkdir(exist_ok=True)
    (tmp / "adhoc" / f"{system}-{tag}.json").write_text(json.dumps(doc))


def test_render_of_a_small_results_folder(tmp_path):
    results = tmp_path / "h200"
    results.mkdir()
    _cell(results, "granikv", "hint", 100.0, call="c1")
    _cell(results, "granikv", "nohint", 96.0, call="c1", cascade_steps=100, storage={"promoted_readers": 3})
    _cell(results, "cascade", "hint", 90.0)  # no call id: a call of its own
    _cell(results, "granikv", "egraphs", 1.0)  # another A/B's tag: not part of this table
    text = hint_free.render(results)
    row = _row(text, "ShareGPT Lp=16K")
    assert row[2:6] == ["—", "90", "100", "96"]
    assert row[6] == "0.960" and row[7] == f"{96 / 90:.3f}‡"  # one call; then two calls: marked
    assert "Ratios from mixed calls (‡): 1." in text
    assert "≥ 0.97 × hint: not met" in row[9] and "≥ 1 × cascade: met" in row[9]
    assert row[10] == "100 steps: cascade 1.00 (1.0/step), promoted readers 3"
    assert "`h200/adhoc/granikv-egraphs.json`" not in text
    assert "multiprefix" not in text  # points without cells are left out


def test_a_row_with_a_cell_before_a_listed_change_is_marked():
    """§ follows git: a cell measured at a commit that lacks an in-scope change marks its row."""
    from harness.run.engine_changes import Ancestry, EngineChange

    if Ancestry().contains("9660414", "2983f80") is None:
        pytest.skip("this clone lacks the commits (shallow)")
    change = [EngineChange("2983f80", "steady multi-class captures", scope={"systems": ["granikv"], "min_k": 2})]
    cfg = {"system": "granikv", "k": 16}
    before = hint_free.Cell("a.json", {"config": cfg, "env": {"git_sha": "9660414"}})
    after = hint_free.Cell("b.json", {"config": cfg, "env": {"git_sha": "8eca57d"}})
    out_of_scope = hint_free.Cell("c.json", {"config": {**cfg, "k": 1}, "env": {"git_sha": "9660414"}})
    assert hint_free.stale_marker([after, before], change) == "§"
    assert hint_free.stale_marker([after, out_of_scope], change) == ""
