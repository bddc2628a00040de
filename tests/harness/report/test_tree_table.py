"""tables/<hw>/tree.md (harness.report.tree_table): a workload's four variants per repetition, ratios from
the repetitions of one call (else marked ‡ and left unjudged), each against the any-depth sharing bar."""

from __future__ import annotations

import json
from pathlib import Path

from harness.report import tree_table


def _cell(root: Path, workload: str, system: str, depth: int | None, rep: int, call: str | None, tok: float) -> None:
    name = f"{system}-{workload}-r{rep}" + (f"-share_depth{depth}" if depth else "")
    doc = {"config": {"system": system, "model": "llama-3.1-8b", "tp": 1, "workload": workload, "lp": 0, "batch": 256,
                      "rep": rep, "share_depth": depth, "cell_id": name, "workload_config": {"kind": workload}},
           "env": {"gpu": "NVIDIA H200", "git_sha": "a" * 40, **({"call_id": call} if call else {})},
           "metrics": {"output_throughput": tok, "median_ttft_ms": 1.0, "median_tpot_ms": 1.0, "completed": 1,
                       "failed": 0},
           "engine": {"decode_steps": 1}}
    path = root / "tree" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _point(root, workload, rep, call, toks, calls=None):
    for (_label, system, depth), tok, c in zip(tree_table.VARIANTS, toks, calls or [call] * 4, strict=True):
        _cell(root, workload, system, depth, rep, c, tok)


def test_ratios_from_reps_of_one_call_against_the_bars(tmp_path):
    _point(tmp_path, "tree", 0, "c0", (1000, 4000, 9600, 6800))  # 2.4x cascade, 1.41x two-level: met
    _point(tmp_path, "tree", 1, None, (1000, 1000, 1000, 1000), calls=["x", "y", "z", "w"])  # mixed: left out
    _point(tmp_path, "debate", 0, "d0", (1000, 3000, 3900, 3000))  # 1.3x cascade: not met
    out = tmp_path / "tree.md"
    assert tree_table.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| tree | 0 | 1000 | 4000 | 9600 | 6800 | 9.60 | 2.40 | 1.41 |" in text
    assert "- tree: granikv / cascade = 2.40, bar ≥ 2.2: met." in text
    assert "- tree: granikv / two-level = 1.41, bar ≥ 1.35: met." in text
    assert "- debate: granikv / cascade = 1.30, bar ≥ 1.4: not met." in text
    assert "| tree | 1.0 | 1.0 | 1.0 | 1.0 | 1.00 | 1 | 1 | 1 | 1 |" in text  # TPOT and TTFT per variant


def test_mixed_calls_are_marked_and_not_judged(tmp_path):
    _point(tmp_path, "tree", 0, None, (1000, 4000, 9600, 6800), calls=["a", "a", "b", "b"])
    text = tree_table.render(tree_table.point_rows(tree_table.load_cells(tmp_path, sweeps=["tree"])), "r")
    assert "| 2.40‡ |" in text and "not judged (calls mixed)" in text
    assert "| tree | 0 |" in text


def test_nothing_measured_says_how(tmp_path):
    out = tmp_path / "tree.md"
    assert tree_table.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    assert "Not measured yet" in out.read_text() and "harness.run.batch lines tree" in out.read_text()


def test_the_committed_page_is_current():
    root = Path(__file__).resolve().parents[3]
    committed = root / "tables" / "h200" / "tree.md"
    results = Path("results/h200")  # the render names the folder as given on the command line
    cells = (tree_table.load_cells(root / results, sweeps=["tree"]) if (root / results / "tree").is_dir()
             else tree_table.pd.DataFrame())
    assert tree_table.render(tree_table.point_rows(cells), str(results)) == committed.read_text(), (
        "re-render: python -m harness.report.tree_table --results results/h200 --out tables/h200/tree.md")
