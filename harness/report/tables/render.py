"""Print a `ComparedTable` as Markdown, LaTeX and CSV (pandas' `to_markdown`/`to_latex`/`to_csv`).

The texts of the cells are decided here, once for every format: the paper's values exactly as
printed, ours with the precision of the paper value beside them, a missing cell as "—" in
Markdown/LaTeX and "n/a" in CSV, a column we do not measure as "n/a"; `*` marks a row only we
have, `§` a row with a cell measured before a later engine change, and `‡` after one of our values
a mixed-call ratio (its systems measured in different calls: `harness.report.tables.queries.ratio_reps`).
Every mark is explained under the table (Markdown), in the caption (LaTeX) and under the README
headline; the CSV keeps bare numbers. pandas lays the table out.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from harness.report.paper import PAPER_HARDWARE
from harness.report.tables.compare import ComparedCell, ComparedRow, ComparedTable
from harness.report.tables.queries import is_number

MISSING_TEXT = "—"  # Markdown / LaTeX
MISSING_CSV = "n/a"
NOT_APPLICABLE = "n/a"


def _decimals(paper: Any) -> int:
    if isinstance(paper, bool) or not is_number(paper):
        return 2
    if isinstance(paper, int) or float(paper).is_integer():
        return 0 if abs(paper) >= 100 else 1
    text = repr(float(paper))
    return max(2 if abs(paper) < 10 else 1, len(text.split(".")[1]) if "." in text else 0)


def format_value(value: Any, like: Any = None) -> str:
    """A value for print: the paper's own values (`like` None) exactly as printed; ours with the
    precision of the paper value `like` they sit beside; bools as yes/no."""
    if value is None:
        return ""
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if is_number(value):
        if like is None:
            return str(int(value)) if isinstance(value, numbers.Integral) else repr(float(value))
        d = _decimals(like)
        return f"{value:.{d}f}" if d else f"{round(value):d}"
    return str(value)


OURS_ONLY_MARK = "*"
STALE_MARK = "§"  # a row whose numbers include a cell measured before a listed engine change
MIXED_MARK = "‡"  # one of our ratios whose systems were measured in different calls


def _ours_text(cell: ComparedCell, missing: str) -> str:
    if not cell.applicable:
        return NOT_APPLICABLE
    if cell.ours is None:
        return missing if cell.paper is not None else NOT_APPLICABLE
    if cell.paper is None and is_number(cell.ours):
        # no paper value to take the precision from: three significant figures or more
        v = float(cell.ours)
        text = format_value(v, 100 if abs(v) >= 100 else 10.5 if abs(v) >= 10 else 1.25)
    else:
        text = format_value(cell.ours, cell.paper)
    return text + MIXED_MARK if cell.mixed_call else text


def _key_texts(row: ComparedRow) -> list[str]:
    keys = [format_value(k) for k in row.keys]
    if row.ours_only and keys:
        keys[0] += OURS_ONLY_MARK
    if row.stale and keys:
        keys[0] += STALE_MARK
    return keys


def _paper_text(cell: ComparedCell) -> str:
    return NOT_APPLICABLE if cell.paper is None else format_value(cell.paper)


def _ratio_text(cell: ComparedCell, missing: str) -> str:
    r = cell.ratio
    if r is not None:
        return f"{r:.2f}"
    if cell.applicable and cell.comparable and cell.paper is not None and cell.ours is None:
        return missing
    return NOT_APPLICABLE


def _header_lines(t: ComparedTable) -> list[str]:
    ours_hw = f"`{t.hardware}`" + (f" ({t.gpu})" if t.gpu else "")
    extra = sum(r.ours_only for r in t.rows)
    only = ([f"{extra} row(s) marked {OURS_ONLY_MARK} are ours only: the paper prints no such row."]
            if extra else [])
    return [
        f"Paper: {PAPER_HARDWARE}. Ours: {ours_hw}. Ours from: {t.sources}"
        + (f"; sweeps {', '.join(t.sweeps)}" if t.sweeps else "") + ".",
        f"{t.filled} of our cells filled, {t.missing} missing (marked {MISSING_TEXT}); "
        "ours/paper compares absolute values across different hardware — compare the ratio columns.",
    ] + only + _stale_lines(t) + _mixed_lines(t)


def _stale_lines(t: ComparedTable) -> list[str]:
    n = sum(r.stale for r in t.rows)
    if not n:
        return []
    return [f"{n} row(s) marked {STALE_MARK} include cells measured before a later engine change listed in "
            "`harness/data/engine_changes.yaml`: re-measured at HEAD they would not give these numbers "
            f"(which cells and changes: `python -m harness.run.engine_changes --results results/{t.hardware}`)."]


MIXED_RULE = ("no repetition of the point holds the compared cells with one `env.call_id` (a file without one is a "
              "call of its own), so the ratio is of the means over the complete repetitions, and run-to-run "
              "spread enters it. A point with repetitions of one call takes its ratios, and the row's other "
              "numbers, from those repetitions only, unmarked.")
MIXED_LEGEND = f"{MIXED_MARK}: a ratio of ours whose systems were measured in different calls: {MIXED_RULE}"


def _mixed_lines(t: ComparedTable) -> list[str]:
    rows = [r for r in t.rows if r.mixed_call]
    if not rows:
        return []
    n = sum(c.mixed_call for r in rows for c in r.cells)
    return [f"{n} ratio(s) of ours in {len(rows)} row(s) marked {MIXED_MARK} set systems measured in different "
            f"calls side by side: {MIXED_RULE}"]


def _pipe_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _compared_texts(t: ComparedTable, escape: Callable[[str], str]) -> list[list[str]]:
    """Each row's keys, then (paper, ours, ours/paper) per value column, as printed."""
    rows = []
    for row in t.rows:
        cells = [escape(k) for k in _key_texts(row)]
        for cell in row.cells:
            cells += [escape(_paper_text(cell)), escape(_ours_text(cell, MISSING_TEXT)),
                      escape(_ratio_text(cell, MISSING_TEXT))]
        rows.append(cells)
    return rows


def _markdown(head: list[str], rows: list[list[str]]) -> str:
    """A pipe table of the given texts, verbatim (tabulate would otherwise re-format numbers)."""
    frame = pd.DataFrame(rows, columns=range(len(head)), dtype=object)
    return frame.to_markdown(index=False, headers=head, tablefmt="pipe", disable_numparse=True, stralign="left")


def render_markdown(t: ComparedTable) -> str:
    head = [c.label for c in t.key_columns]
    for c in t.value_columns:
        head += [f"{c.label} (paper)", f"{c.label} (ours)", f"{c.label} ours/paper"]
    lines = [f"# Table {t.number}: {t.caption}", ""] + [f"{line}  " for line in _header_lines(t)] + [""]
    lines.append(_markdown([_pipe_escape(h) for h in head], _compared_texts(t, _pipe_escape)))
    if t.notes:
        lines += ["", "Paper notes:", ""] + [f"- {n}" for n in t.notes]
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "×": r"$\times$", "µ": r"$\mu$", "μ": r"$\mu$", "Δ": r"$\Delta$", "∈": r"$\in$",
                  "≥": r"$\geq$", "≤": r"$\leq$", "≈": r"$\approx$", "·": r"$\cdot$", "†": r"\dag{}",
                  "|": r"$|$", "—": "---", "–": "--", "α": r"$\alpha$", "β": r"$\beta$", "γ": r"$\gamma$",
                  "<": r"$<$", ">": r"$>$", "ℓ": r"$\ell$", "§": r"\S{}", "‡": r"\ddag{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def render_latex(t: ComparedTable) -> str:
    """A booktabs table: each value column spans (paper, ours, o/p) sub-columns."""
    nkeys, nvals = len(t.key_columns), len(t.value_columns)
    top = [latex_escape(c.label) for c in t.key_columns] + [latex_escape(c.label) for c in t.value_columns
                                                                for _ in range(3)]
    sub = [""] * nkeys + ["paper", "ours", "o/p"] * nvals
    frame = pd.DataFrame(_compared_texts(t, latex_escape), columns=pd.MultiIndex.from_arrays([top, sub]),
                         dtype=object)
    only = f" Rows marked {OURS_ONLY_MARK} are ours only." if any(r.ours_only for r in t.rows) else ""
    if any(r.stale for r in t.rows):
        only += f" Rows marked {STALE_MARK} include cells measured before a later engine change."
    if any(r.mixed_call for r in t.rows):
        only += f" Ratios marked {MIXED_MARK} set systems measured in different calls side by side."
    caption = latex_escape(f"Table {t.number} (paper: {PAPER_HARDWARE}; ours: {t.hardware}). {t.caption}{only}")
    body = frame.to_latex(index=False, escape=False, column_format="l" * nkeys + "|rrr" * nvals,
                          multicolumn=True, multicolumn_format="c|", caption=caption, label=f"tab:ours-{t.number}",
                          position="t")
    body = body.replace(r"\begin{table}[t]", r"\begin{table}[t]" + "\n" + r"\centering" + "\n" + r"\scriptsize", 1)
    head = f"% Table {t.number} of the paper beside our results ({t.hardware}); generated by harness.report.tables.\n"
    return head + body


def _csv_number(v: Any) -> str:
    if v is None:
        return MISSING_CSV
    if isinstance(v, bool):
        return "true" if v else "false"
    if is_number(v):
        return f"{v:.6g}"
    return str(v)


def render_csv(t: ComparedTable) -> str:
    """Machine-readable: `<col>.paper`, `<col>.ours`, `<col>.ratio`; missing = "n/a"."""
    head = [c.name for c in t.key_columns]
    for c in t.value_columns:
        head += [f"{c.name}.paper", f"{c.name}.ours", f"{c.name}.ratio"]
    rows = []
    for row in t.rows:
        out = [_csv_number(k) for k in row.keys]
        for cell in row.cells:
            r = cell.ratio
            out += [_csv_number(cell.paper), _csv_number(cell.ours if cell.applicable else None),
                    MISSING_CSV if r is None else f"{r:.4f}"]
        rows.append(out)
    frame = pd.DataFrame(rows, columns=range(len(head)), dtype=object)
    return frame.to_csv(index=False, header=head, lineterminator="\n")


def render_headline(t: ComparedTable) -> str:
    """Compact Markdown of a table for the README: one column per value, "paper / ours" in each
    cell (rows where we have nothing are left out)."""
    head = [c.label for c in t.key_columns] + [f"{c.label} (paper / ours)" for c in t.value_columns]
    shown = [row for row in t.rows if not all(c.ours is None for c in row.cells)]
    rows = [_key_texts(row) + [f"{_paper_text(c)} / {_ours_text(c, MISSING_TEXT)}" for c in row.cells]
            for row in shown]
    lines = [_markdown([_pipe_escape(h) for h in head], rows)]
    if any(r.stale for r in shown):
        lines += ["", f"{STALE_MARK}: measured before a later engine change; re-measured at HEAD these "
                      f"numbers would differ (`python -m harness.run.engine_changes --results results/{t.hardware}`)."]
    if any(r.mixed_call for r in shown):
        lines += ["", MIXED_LEGEND]
    return "\n".join(lines) + "\n"


RENDERERS: Mapping[str, Callable[[ComparedTable], str]] = {"md": render_markdown, "tex": render_latex,
                                                            "csv": render_csv}
