"""The paper's published numbers, as typed data.

Every table of the paper lives in `harness/data/paper_tables/`, one YAML file per group of tables
(setup, headline, the synthetic and ShareGPT grids, kernel time, dispatch, sensitivities), typed
in from the paper's text and split so each file stays readable; the notes on the paper's own
inconsistencies are in `harness/data/paper_tables/NOTES.md`. The values are kept exactly as
printed: tables and plots set our measurements *beside* them and never overwrite or "correct"
them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PAPER_TABLES_PATH = Path(__file__).resolve().parents[1] / "data" / "paper_tables"

# The paper's hardware: every absolute number in it was measured on A100-SXM4-40GB GPUs.
PAPER_HARDWARE = "A100-SXM4-40GB"

# Keys of a table entry that are not caption/columns/rows/notes: the cell the table holds fixed.
_META_KEYS = ("config", "B", "Lp")


@dataclass(frozen=True)
class PaperColumn:
    """One printed column: `name` is the row key in the YAML, `label` the printed header."""

    name: str
    unit: str | None
    label: str


@dataclass(frozen=True)
class PaperTable:
    """One table (or figure's quoted constants) of the paper, exactly as printed."""

    key: str  # "table3", "figure1", ...
    caption: str
    columns: tuple[PaperColumn, ...]
    rows: tuple[Mapping[str, Any], ...]
    notes: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)  # fixed config/B/Lp of the whole table

    @property
    def number(self) -> int | None:
        m = re.fullmatch(r"table(\d+)", self.key)
        return int(m.group(1)) if m else None

    def column(self, name: str) -> PaperColumn:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.key} has no column {name!r}; columns: {[c.name for c in self.columns]}")

    def find_rows(self, **where: Any) -> list[Mapping[str, Any]]:
        """Rows whose printed values equal every `where` item (e.g. `Lp=8192, B=256`)."""
        return [r for r in self.rows if all(r.get(k) == v for k, v in where.items())]


def _parse_table(key: str, raw: Mapping[str, Any]) -> PaperTable:
    missing = [k for k in ("caption", "columns", "rows") if k not in raw]
    if missing:
        raise ValueError(f"paper table {key!r} lacks {missing}")
    columns = tuple(PaperColumn(name=str(c["name"]), unit=c.get("unit"), label=str(c["label"]))
                    for c in raw["columns"])
    names = {c.name for c in columns}
    for i, row in enumerate(raw["rows"]):
        extra = set(row) - names
        if extra:
            raise ValueError(f"paper table {key!r} row {i} has keys {sorted(extra)} that are not columns")
    return PaperTable(
        key=key,
        caption=str(raw["caption"]),
        columns=columns,
        rows=tuple(dict(r) for r in raw["rows"]),
        notes=tuple(str(n) for n in raw.get("notes") or ()),
        meta={k: raw[k] for k in _META_KEYS if k in raw},
    )


def load_paper_tables(path: Path | str = PAPER_TABLES_PATH) -> dict[str, PaperTable]:
    """Parse the tables into `{key: PaperTable}`: every `*.yaml` of a folder (a key defined twice is
    an error), or one file (the shared extraction is one); raises ValueError on a malformed entry."""
    path = Path(path)
    files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"{path}: no paper tables")
    tables: dict[str, PaperTable] = {}
    for file in files:
        with open(file, encoding="utf-8") as f:
            raw = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        if not isinstance(raw, dict):
            raise ValueError(f"{file}: expected a mapping of tables")
        for key, entry in raw.items():
            if key in tables:
                raise ValueError(f"{file}: {key} is defined in another file of {path} too")
            tables[key] = _parse_table(key, entry)
    return tables


@functools.lru_cache(maxsize=1)
def _default_tables() -> dict[str, PaperTable]:
    return load_paper_tables(PAPER_TABLES_PATH)


def paper_table(number: int) -> PaperTable:
    """Table `number` of the paper (1-24) from the bundled data file."""
    tables = _default_tables()
    key = f"table{number}"
    if key not in tables:
        raise KeyError(f"the paper has no {key}")
    return tables[key]


def paper_figure(number: int) -> PaperTable:
    """The constants quoted for Figure `number` (only Figure 1, the roofline, exists)."""
    return _default_tables()[f"figure{number}"]
