"""docs/generated/reproduction.md: the paper against ours for the ratio columns of the serving
tables, from the same compared tables harness.report.tables writes.
"""

from __future__ import annotations

from typing import Any

from harness.docs.common import H200, HEADER, MIXED_MARK, MIXED_NOTE, Sources, cite, md_table
from harness.report.tables.compare import build_table
from harness.report.tables.render import format_value
from harness.run.results import load_results

REPRO_COLUMNS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (3, ("x_SGL", "x_SGL-C")), (9, ("x_SGL",)), (6, ("x_SGL",)), (10, ("x_SGL",)), (20, ("ratio",)),
    (21, ("x_default",)), (24, ("x_Cascade",)), (18, ("max_abs_delta_pct",)),
    (22, ("alpha_pct", "beta_pct", "gamma_pct", "s_eff_x")), (5, ("speedup_x",)),
)


def _ours(v: Any, mixed: bool = False) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return (f"{v:.2f}" if isinstance(v, float | int) else str(v)) + (MIXED_MARK if mixed else "")


def render_reproduction(src: Sources) -> str:
    """Paper against ours for the ratio columns of the serving tables (harness.report.tables' numbers)."""

    res = load_results(src.root / H200)
    out = [HEADER, "", "Ratio columns of the rendered tables (`tables/h200/table<N>.md`, which hold the "
           "absolute numbers, TPOT, TTFT and the paper's notes): paper → ours. Rows we have not measured "
           f"are left out here; the tables list them as missing. {MIXED_NOTE}", ""]
    for number, cols in REPRO_COLUMNS:
        t = build_table(number, res)
        idx = [i for i, c in enumerate(t.value_columns) if c.name in cols]
        rows = []
        for row in t.rows:
            cells = [row.cells[i] for i in idx]
            if all(c.ours is None for c in cells):
                continue
            keys = [format_value(k) for k in row.keys]
            rows.append((*keys, *(f"{'n/a' if c.paper is None else format_value(c.paper)} → "
                                  f"{_ours(c.ours, c.mixed_call)}" for c in cells)))
        out += [f"Table {number} ([`tables/h200/table{number}.md`](../../tables/h200/table{number}.md)):", ""]
        out += md_table((*[c.label for c in t.key_columns], *[t.value_columns[i].label for i in idx]), rows)
        out.append("")
    out.append(cite(f"{H200}/") + " The paper's numbers: `harness/data/paper_tables/`.")
    return "\n".join(out) + "\n"
