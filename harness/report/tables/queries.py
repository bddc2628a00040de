"""Evidence queries over a `ResultSet`: which cells feed a table row, and their means and ratios.

Every table extractor (`harness.report.tables.extract`) reads result cells only through these, so the
matching rules live in one place: cells match on config keys only (never on the workload name),
a row's systems come from one sweep (`select`), and a row's numbers are means over the reps it
reads, chosen by `ratio_reps`:

- A rep is *from one call* when every cell of it that the row compares (by default its paged,
  cascade and granikv cells; a row of knobbed granikv cells names its own sides) carries the same
  non-empty `env.call_id`. When some reps are, the row reads those reps only — its ratios and its
  absolute numbers (tok/s, TPOT, TTFT) alike, so a printed ratio is the ratio of the printed means.
- When none is (files without a call id count as calls of their own), the row reads its complete
  reps (`complete_reps`: every compared system present), and every ratio it computes is
  a *mixed-call* ratio: the extractor lists it under `MIXED` and the rendered tables mark it
  (`harness.report.tables.render.MIXED_MARK`).

Ratios are ratios of the means over the reps read. The rules are spelled out per table in
`harness.report.tables.specs`.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from harness.run.results import CALL_ID, ResultSet

# Paper column prefix -> our system variant.
SYSTEM_OF_PREFIX: Mapping[str, str] = {"SGL": "paged", "SGL-C": "cascade", "GKV": "granikv",
                                       "SGL-C/GKV": "granikv_cascade"}
SYSTEM_OF_NAME: Mapping[str, str] = {"SGLang default": "paged", "SGLang-Cascade": "cascade",
                                     "GraniKV": "granikv", "Cascade": "cascade"}

_MODEL_ALIASES: Mapping[str, str] = {
    "llama318b": "llama-3.1-8b", "llama8b": "llama-3.1-8b",
    "qwen2514b": "qwen2.5-14b", "qwen14b": "qwen2.5-14b",
    "qwen2532b": "qwen2.5-32b", "qwen32b": "qwen2.5-32b",
}

TOK = "metrics.output_throughput"
TPOT = "metrics.median_tpot_ms"
TPOT99 = "metrics.p99_tpot_ms"
TTFT = "metrics.median_ttft_ms"
SYSTEMS = ("paged", "cascade", "granikv")  # the systems a point compares (not the extra variants)
# extractor output key: {column: the paths of the cells behind a ratio whose systems come from
# different calls}; `harness.report.tables.compare.build_table` turns it into marked cells
MIXED = "_mixed_call"


def _norm(value: Any) -> str:
    return re.sub(r"[^a-z0-9]", "", str(value).lower())


def canonical_model(name: Any) -> str:
    """Our model key for a paper label or a config value ("Llama-8B" -> "llama-3.1-8b")."""
    n = _norm(name)
    return _MODEL_ALIASES.get(n, n)


def parse_config(label: str) -> tuple[str, int]:
    """("Llama-3.1-8B / TP=1" | "Llama-8B/TP=1") -> ("llama-3.1-8b", 1)."""
    m = re.match(r"\s*(.+?)\s*/\s*TP\s*=\s*(\d+)", label)
    if not m:
        raise ValueError(f"cannot parse model/TP from {label!r}")
    return canonical_model(m.group(1)), int(m.group(2))


# --------------------------------------------------------------------------- evidence queries


def is_number(v: Any) -> bool:
    """A real number (numpy scalars included), not a bool and not NaN."""
    if isinstance(v, bool | np.bool_) or not isinstance(v, numbers.Real):
        return False
    return not math.isnan(float(v))


def _match(frame: pd.DataFrame, key: str, value: Any) -> pd.Series:
    col = key if "." in key or key in ("sweep", "variant") else f"config.{key}"
    if key == "system":
        col = "variant"
    if col not in frame.columns:
        return pd.Series(False, index=frame.index)
    series = frame[col]
    if key == "model":
        return series.map(canonical_model) == canonical_model(value)
    if is_number(value):
        return pd.to_numeric(series, errors="coerce").sub(value).abs() < 1e-9
    return series.astype(str) == str(value)


def where(frame: pd.DataFrame, **conds: Any) -> pd.DataFrame:
    """Rows of `frame` matching every condition (config keys, or `sweep`/`system`/dotted columns).

    One boolean mask, one row take: a table makes hundreds of these lookups."""
    mask = np.ones(len(frame), dtype=bool)
    for k, v in conds.items():
        if not mask.any():
            break
        mask &= _match(frame, k, v).to_numpy(dtype=bool)
    return frame[mask]


def select(results: ResultSet, sweeps: Sequence[str], require: Sequence[str] = (),
           **conds: Any) -> pd.DataFrame:
    """Cells of the first sweep (in order) with a cell matching `conds` of every `require`d system."""
    for sweep in sweeps:
        sub = where(results.sweep_cells(sweep), **conds)
        if len(sub) and all((sub["variant"] == system).any() for system in require):
            results.note_used(sub)
            return sub
    return results.cells.iloc[0:0]


def mean_of(frame: pd.DataFrame, column: str, **conds: Any) -> float | None:
    """Mean of `column` over the matching rows (reps); None when nothing matches."""
    sub = where(frame, **conds) if conds else frame
    if column not in sub.columns or not len(sub):
        return None
    values = pd.to_numeric(sub[column], errors="coerce").dropna()
    return float(values.mean()) if len(values) else None


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def scale(v: float | None, factor: float) -> float | None:
    return None if v is None else v * factor


def _reps(cells: pd.DataFrame) -> pd.Series:
    """Each cell's rep number (0 where the file has none)."""
    if "config.rep" not in cells.columns:
        return pd.Series(0, index=cells.index)
    return pd.to_numeric(cells["config.rep"], errors="coerce").fillna(0).astype(int)


def call_id(value: Any) -> str | None:
    """A cell's call id: the non-empty string it recorded, else None (no call id: NaN, None, "")."""
    return value if isinstance(value, str) and value else None


Side = Mapping[str, Any]  # `where` conditions naming the cells of one side of a ratio


def system_sides(cells: pd.DataFrame) -> list[Side]:
    """The sides a point's ratios compare: each of paged, cascade and granikv present in `cells`."""
    if "variant" not in cells.columns:
        return []
    present = set(cells["variant"])
    return [{"system": s} for s in SYSTEMS if s in present]


def _side_masks(cells: pd.DataFrame, sides: Sequence[Side]) -> list[np.ndarray]:
    masks = []
    for side in sides:
        mask = np.ones(len(cells), dtype=bool)
        for k, v in side.items():
            mask &= _match(cells, k, v).to_numpy(dtype=bool)
        masks.append(mask)
    return masks


def held_reps(cells: pd.DataFrame, sides: Sequence[Side]) -> list[int]:
    """The reps holding a cell of every side."""
    reps = _reps(cells).to_numpy()
    masks = _side_masks(cells, sides)
    return [r for r in sorted(set(reps.tolist())) if all((m & (reps == r)).any() for m in masks)]


def one_call_reps(cells: pd.DataFrame, sides: Sequence[Side]) -> list[int]:
    """The reps whose cells of every side are there and all carry the same non-empty call id
    (`env.call_id`): the reps whose ratios compare cells measured back to back in one call."""
    if not sides or not len(cells):
        return []
    reps = _reps(cells).to_numpy()
    calls = cells[CALL_ID] if CALL_ID in cells.columns else pd.Series(None, index=cells.index)
    masks = _side_masks(cells, sides)
    out = []
    for r in held_reps(cells, sides):
        mine = np.zeros(len(cells), dtype=bool)
        for m in masks:
            mine |= m & (reps == r)
        ids = [call_id(v) for v in calls[mine]]
        if None not in ids and len(set(ids)) == 1:
            out.append(r)
    return out


def complete_reps(cells: pd.DataFrame, sides: Sequence[Side] | None = None) -> pd.DataFrame:
    """The cells of the reps that hold every side (default: every one of paged/cascade/granikv
    present in `cells`), whichever calls they come from.

    Why: a ratio sets the sides of one rep against each other. When one system of a rep is missing
    (a device call ran out of time), averaging each system over its own reps would set a
    baseline's rep 2 against GraniKV's reps 0-1; the incomplete rep is left out instead. When no
    rep is complete (e.g. only GraniKV ran that point) every cell is kept. A complete rep may still
    hold systems of different calls: `ratio_reps` prefers the reps of one call and says when it
    had to fall back to these."""
    if "config.rep" not in cells.columns or not len(cells):
        return cells
    sides = system_sides(cells) if sides is None else sides
    complete = held_reps(cells, sides)
    return cells[_reps(cells).isin(complete)] if complete else cells


@dataclass(frozen=True)
class Reps:
    """The cells a row reads (every cell of the chosen reps) and whether its ratios are
    mixed-call: no rep holds its compared sides in one call."""

    cells: pd.DataFrame
    mixed: bool

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(str(p) for p in self.cells["path"]) if "path" in self.cells.columns else frozenset()


def ratio_reps(cells: pd.DataFrame, sides: Sequence[Side] | None = None) -> Reps:
    """The reps a row's ratios and means are computed over: those whose compared sides (default:
    `system_sides`) come from one call (`one_call_reps`) when there are any; else the complete
    reps (`complete_reps`), flagged mixed. With fewer than two distinct sides present there is no
    ratio to compare: the complete reps, not flagged."""
    sides = system_sides(cells) if sides is None else sides
    distinct = {tuple(sorted((k, str(v)) for k, v in s.items())) for s in sides}
    present = [s for s, m in zip(sides, _side_masks(cells, sides), strict=True) if m.any()]
    if len(distinct) < 2 or len(present) < 2:
        return Reps(complete_reps(cells, sides), mixed=False)
    one = one_call_reps(cells, present)
    if one:
        return Reps(cells[_reps(cells).isin(one)], mixed=False)
    return Reps(complete_reps(cells, present), mixed=True)


def mark_mixed(out: dict[str, Any], reps: Reps, *columns: str) -> dict[str, Any]:
    """Note under `out[MIXED]` each of `columns` that holds a ratio computed from mixed-call `reps`."""
    if reps.mixed:
        marks = out.setdefault(MIXED, {})
        for c in columns:
            if out.get(c) is not None:
                marks[c] = reps.paths
    return out


def system_block(cells: pd.DataFrame) -> dict[str, Any]:
    """SGL/SGL-C/GKV throughput, TPOT, TTFT and the GKV ratios of one configuration, all over the
    reps `ratio_reps` chooses; ratios from mixed calls noted under `MIXED`."""
    reps = ratio_reps(cells)
    cells = reps.cells
    out: dict[str, Any] = {}
    for prefix, system in SYSTEM_OF_PREFIX.items():
        out[f"{prefix}_tok_s"] = mean_of(cells, TOK, system=system)
        out[f"{prefix}_TPOT_ms"] = mean_of(cells, TPOT, system=system)
        out[f"{prefix}_TTFT_s"] = scale(mean_of(cells, TTFT, system=system), 1e-3)
    out["x_SGL"] = ratio(out["GKV_tok_s"], out["SGL_tok_s"])
    out["x_SGL-C"] = ratio(out["GKV_tok_s"], out["SGL-C_tok_s"])
    return mark_mixed(out, reps, "x_SGL", "x_SGL-C")


def microbench(results: ResultSet, name: str) -> pd.DataFrame | None:
    frame = results.microbench.get(name)
    return frame if frame is not None and len(frame) else None

