"""A paper table with our numbers beside the paper's: `build_table(n, results)` -> `ComparedTable`.

Every compared column is held three times: the paper's value, ours, and ours/paper. A cell we
have no result for is missing (never filled in); a column we do not measure at all (a
qualitative label such as Table 19's "regime") is not applicable. A ratio of ours whose systems
come from different calls (the extractor lists it under `harness.report.tables.queries.MIXED`) is a
*mixed-call* cell; the row keeps the result files behind such ratios (`mixed_sources`), which
`harness.report.tables` counts per point. Rendering is `harness.report.tables.render`; what feeds each table is
`harness.report.tables.specs`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from harness.report.paper import PaperColumn, paper_table
from harness.report.tables.extract import EXTRACTORS, ours_rows
from harness.report.tables.queries import MIXED, is_number
from harness.report.tables.specs import TABLE_NUMBERS, TABLE_SPECS
from harness.run.results import ResultSet


@dataclass(frozen=True)
class ComparedCell:
    """One compared cell: the paper's printed value and ours (None = we have no result)."""

    paper: Any
    ours: Any
    applicable: bool = True  # False: a column we do not measure (n/a)
    comparable: bool = True  # False: ours/paper means nothing for this column
    mixed_call: bool = False  # ours is a ratio of systems measured in different calls (no rep of one call)

    @property
    def ratio(self) -> float | None:
        if not (self.applicable and self.comparable and is_number(self.paper) and is_number(self.ours)):
            return None
        return None if self.paper == 0 else self.ours / self.paper

    @property
    def missing(self) -> bool:
        """The paper printed a value and we have none (never the case for n/a columns)."""
        return self.applicable and self.paper is not None and self.ours is None


@dataclass(frozen=True)
class ComparedRow:
    keys: tuple[Any, ...]
    cells: tuple[ComparedCell, ...]
    ours_only: bool = False  # a row the paper does not print (its paper columns are n/a)
    sources: frozenset[str] = frozenset()  # the result files behind our numbers in this row
    stale: bool = False  # one of them predates a listed engine change (`mark_stale`)
    mixed_sources: frozenset[str] = frozenset()  # the result files behind its mixed-call ratios

    @property
    def mixed_call(self) -> bool:
        """A ratio of the row sets systems measured in different calls side by side."""
        return any(c.mixed_call for c in self.cells)


@dataclass(frozen=True)
class ComparedTable:
    number: int
    caption: str
    key_columns: tuple[PaperColumn, ...]
    value_columns: tuple[PaperColumn, ...]
    rows: tuple[ComparedRow, ...]
    notes: tuple[str, ...] = ()
    hardware: str = ""
    gpu: str | None = None
    sources: str = ""
    sweeps: tuple[str, ...] = field(default_factory=tuple)

    @property
    def filled(self) -> int:
        return sum(1 for r in self.rows for c in r.cells if c.applicable and c.ours is not None)

    @property
    def missing(self) -> int:
        return sum(1 for r in self.rows for c in r.cells if c.missing)


def build_table(number: int, results: ResultSet) -> ComparedTable:
    """Table `number` of the paper with our numbers from `results` beside the paper's."""
    if number not in TABLE_SPECS:
        raise KeyError(f"no table {number}; tables are {TABLE_NUMBERS}")
    spec = TABLE_SPECS[number]
    paper = paper_table(number)
    key_cols = tuple(paper.column(k) for k in spec.keys)
    value_cols = tuple(c for c in paper.columns if c.name not in spec.keys)
    extra = ours_rows(spec, paper, results)
    rows = []
    for prow, ours_only in [(r, False) for r in paper.rows] + [(r, True) for r in extra]:
        with results.recording() as sources:
            ours = EXTRACTORS[number](spec, paper, prow, results)
        mixed = ours.get(MIXED) or {}
        cells, mixed_sources = [], set()
        for col in value_cols:
            applicable = col.name not in spec.qualitative
            value = ours.get(col.name) if applicable else None
            pv = prow.get(col.name)
            comparable = col.name not in spec.no_ratio and (pv is None or is_number(pv))
            is_mixed = applicable and value is not None and col.name in mixed
            if is_mixed:
                mixed_sources |= mixed[col.name]
            cells.append(ComparedCell(paper=pv, ours=value, applicable=applicable, comparable=comparable,
                                      mixed_call=is_mixed))
        rows.append(ComparedRow(keys=tuple(prow.get(k) for k in spec.keys), cells=tuple(cells),
                                ours_only=ours_only, sources=frozenset(sources),
                                mixed_sources=frozenset(mixed_sources)))
    if extra and spec.grid:
        # a grid's ours-only rows go where they belong when the paper prints its rows in key order
        # (the grids do), else after the paper's rows; other tables' extra rows follow the paper's
        order = [tuple(float(k) for k in r.keys) for r in rows[:len(paper.rows)]]
        if order == sorted(order):
            rows.sort(key=lambda r: tuple(float(k) for k in r.keys))
    return ComparedTable(number=number, caption=paper.caption, key_columns=key_cols, value_columns=value_cols,
                         rows=tuple(rows), notes=paper.notes, hardware=results.hardware, gpu=results.gpu,
                         sources=spec.sources, sweeps=spec.sweeps)


def mark_stale(t: ComparedTable, stale: set[str]) -> ComparedTable:
    """`t` with each row whose numbers come from one of the `stale` result files marked."""
    rows = tuple(dataclasses.replace(r, stale=bool(r.sources & stale)) for r in t.rows)
    return dataclasses.replace(t, rows=rows)
