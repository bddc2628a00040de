"""Every table of the paper (3-24) rebuilt from our result files, the paper's numbers beside ours.

    python -m harness.report.tables --results results/<hw> --out tables/<hw> [--table 3 ...] [--readme README.md]

writes table<n>.{md,tex,csv} and an index README.md. Tables are pure functions of result files:
what feeds each table is `harness.report.tables.specs`, the extraction `harness.report.tables.extract`, the
compared table `harness.report.tables.compare.build_table`, its printing `harness.report.tables.render`. Rows
whose cells predate a later engine change (`harness.run.engine_changes`) are marked where git can tell;
ratios whose systems come from different calls (`harness.report.tables.queries.ratio_reps`) are marked ‡,
and the index counts, per table and TP, the points behind such ratios (`mixed_call_points`;
`count_mixed_call_points(results, tp=1)` is the number for one TP over every table).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.report.paper import PAPER_HARDWARE
from harness.report.tables.compare import ComparedTable, build_table, mark_stale
from harness.report.tables.render import MIXED_MARK, RENDERERS, render_headline
from harness.report.tables.specs import TABLE_NUMBERS
from harness.run.results import ResultSet, load_results


def stale_cell_paths(results: ResultSet, changes: Sequence[Any] | None = None,
                     repo: Path | str | None = None) -> set[str] | None:
    """The cells (paths as `results` holds them) that predate a listed engine change
    (`harness/data/engine_changes.yaml` unless `changes` is given); None when git cannot answer
    (no git, or a clone without the cells' commits)."""
    from harness.run.engine_changes import stale_cells

    stale = stale_cells(results.cells, changes, repo)
    return None if stale is None else set(stale)


def headline_block(results: ResultSet) -> str:
    """The README's headline table: Table 3, stale rows marked where git can tell."""
    t = build_table(3, results)
    stale = stale_cell_paths(results)
    return render_headline(mark_stale(t, stale) if stale is not None else t)



# granikv's own knobs (harness.run.point.GRANIKV_KNOBS): a cell id suffix that does not split a point
_KNOBS = ("hot_fraction", "cold_page_size", "m_sat", "share_depth")


@dataclass(frozen=True, order=True)
class PointRef:
    """A point of a table: the cells of one sweep that differ only in system, granikv's knobs and
    rep (`name`: their cell id without those), and its TP."""

    sweep: str
    tp: int
    name: str


def _value(row: pd.Series, col: str) -> Any:
    v = row.get(col)
    return None if v is None or (isinstance(v, float) and v != v) else v


def point_of(row: pd.Series) -> PointRef:
    """The point a result cell (a row of `ResultSet.cells`) belongs to."""
    system, rep = str(_value(row, "config.system") or row.get("variant")), int(_value(row, "config.rep") or 0)
    cid = _value(row, "cell_id") or Path(str(row.get("path", ""))).stem
    head, sep, tail = re.sub(rf"^{re.escape(system)}-", "", str(cid)).partition(f"-r{rep}")
    extras = [x for x in tail.split("-") if x and not x.startswith(_KNOBS)]
    name = "-".join([head, *extras]) if sep else "-".join(
        str(_value(row, f"config.{k}")) for k in ("model", "tp", "workload", "lp", "batch", "k"))
    return PointRef(sweep=str(row.get("sweep", "")), tp=int(_value(row, "config.tp") or 1), name=name)


def mixed_call_points(t: ComparedTable, results: ResultSet) -> set[PointRef]:
    """The points behind the ratios of `t` whose systems come from different calls (marked ‡)."""
    paths = set().union(*(r.mixed_sources for r in t.rows)) if t.rows else set()
    if not paths or "path" not in results.cells.columns:
        return set()
    cells = results.cells[results.cells["path"].astype(str).isin(paths)]
    return {point_of(row) for _, row in cells.iterrows()}


def mixed_call_points_by_table(results: ResultSet, numbers: Iterable[int] = TABLE_NUMBERS,
                               tables: Iterable[ComparedTable] | None = None) -> dict[int, set[PointRef]]:
    """Per table, the points whose printed ratios set systems of different calls side by side."""
    tables = [build_table(n, results) for n in numbers] if tables is None else tables
    return {t.number: mixed_call_points(t, results) for t in tables}


def count_mixed_call_points(results: ResultSet, tp: int | None = 1,
                            numbers: Iterable[int] = TABLE_NUMBERS) -> int:
    """How many distinct points (over every table; TP `tp`, or any with None) have a printed ratio
    whose systems come from different calls: the one-call bar is 0 at TP=1. A/B cells are not table
    inputs, and extra variants (forced-cascade GraniKV) count only where a ratio is computed from
    them."""
    found = set().union(*mixed_call_points_by_table(results, numbers).values())
    return sum(1 for p in found if tp is None or p.tp == tp)


def _by_tp(points: Iterable[PointRef]) -> str:
    counts: dict[int, int] = {}
    for p in points:
        counts[p.tp] = counts.get(p.tp, 0) + 1
    return ", ".join(f"TP={tp}: {n}" for tp, n in sorted(counts.items())) or "0"


README_BEGIN = "<!-- headline table: generated by `python -m harness.report.tables ... --readme README.md` -->"
README_END = "<!-- end of headline table -->"

def update_readme(path: Path | str, block: str) -> bool:
    """Replace the text between README_BEGIN and README_END in `path` with `block`; True when the
    file changed. Raises ValueError when the markers are missing (nothing is written)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    i, j = text.find(README_BEGIN), text.find(README_END)
    if i < 0 or j < i:
        raise ValueError(f"{path} has no headline-table markers ({README_BEGIN!r} ... {README_END!r})")
    new = text[: i + len(README_BEGIN)] + "\n" + block + text[j:]
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text



def write_tables(results: ResultSet, out_dir: Path | str,
                 numbers: Sequence[int] = TABLE_NUMBERS) -> list[Path]:
    """Write table<n>.{md,tex,csv} for each table and an index README.md; returns the files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    index = [f"# Paper tables beside our results: `{results.hardware}`", "",
             f"Generated by `python -m harness.report.tables` from `results/{results.hardware}`; paper numbers "
             f"were measured on {PAPER_HARDWARE}" + (f", ours on {results.gpu}." if results.gpu else "."), "",
             "Each result file names the commit it was measured at; rows marked § include cells measured "
             "before a later engine change of `harness/data/engine_changes.yaml` (which cells and changes: "
             f"`python -m harness.run.engine_changes --results results/{results.hardware}`). Each point's "
             "repetitions side by side (spread, per-run ratios) and the A/B cells of `adhoc/` beside their "
             f"baseline point are in `repetitions.md` (`python -m harness.report.repetitions --results "
             f"results/{results.hardware} --out {out.as_posix()}/repetitions.md`).", "",
             f"A ratio of ours is computed from the repetitions whose compared systems were measured in one "
             f"call (the same `env.call_id`); where a point has none, it comes from the complete repetitions "
             f"and is marked {MIXED_MARK} (a mixed-call ratio). *mixed-call points* counts, per TP, the points "
             f"behind a table's marked ratios.", "",
             "| table | caption | ours filled | missing | mixed-call points | files |", "|---|---|---|---|---|---|"]
    stale = stale_cell_paths(results)
    mixed: dict[int, set[PointRef]] = {}
    for n in numbers:
        t = build_table(n, results)
        if stale is not None:
            t = mark_stale(t, stale)
        mixed[n] = mixed_call_points(t, results)
        for ext, render in RENDERERS.items():
            path = out / f"table{n}.{ext}"
            path.write_text(render(t), encoding="utf-8")
            written.append(path)
        files = " ".join(f"[{ext}](table{n}.{ext})" for ext in RENDERERS)
        caption = t.caption.replace("|", "\\|")
        index.append(f"| {n} | {caption} | {t.filled} | {t.missing} | {_by_tp(mixed[n])} | {files} |")
    every = set().union(*mixed.values()) if mixed else set()
    tp1 = sum(1 for p in every if p.tp == 1)
    index += ["", f"Points whose printed ratios set systems of different calls side by side, over the tables "
                  f"above (a point counted once): {_by_tp(every)}; at TP=1: {tp1} (the one-call bar: 0; "
                  f"`harness.report.tables.write.count_mixed_call_points`)."]
    readme = out / "README.md"
    readme.write_text("\n".join(index) + "\n", encoding="utf-8")
    written.append(readme)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.report.tables", description=__doc__.split("\n")[0])
    p.add_argument("--results", required=True, help="results/<hardware> directory")
    p.add_argument("--out", required=True, help="output directory, e.g. tables/<hardware>")
    p.add_argument("--table", type=int, action="append", choices=TABLE_NUMBERS,
                   help="only this table (repeatable); default all of 3-24")
    p.add_argument("--readme", default=None,
                   help="also write the compact Table 3 (headline) between the markers of this README")
    args = p.parse_args(argv)
    if not Path(args.results).is_dir():
        print(f"error: results directory {args.results} does not exist", file=sys.stderr)
        return 2
    results = load_results(args.results)
    written = write_tables(results, args.out, args.table or TABLE_NUMBERS)
    print(f"wrote {len(written)} files to {args.out} ({len(results.cells)} cells, "
          f"{len(results.microbench)} microbench files)")
    mixed = set().union(*mixed_call_points_by_table(results, args.table or TABLE_NUMBERS).values())
    print(f"points with a ratio from mixed calls ({MIXED_MARK}): {_by_tp(mixed)}")
    if args.readme:
        try:
            changed = update_readme(args.readme, headline_block(results))
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{args.readme}: headline table {'updated' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
