"""Evidence queries over a `ResultSet`: which cells feed a table row, and their means and ratios.

Every table extractor (`harness.table_extract`) reads result cells only through these, so the
matching rules live in one place: cells match on config keys only (never on the workload name),
reps are averaged over complete reps (`complete_reps`), and a row's systems come from one sweep
(`select`). The rules are spelled out per table in `harness.table_specs`.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from harness.results import ResultSet

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


def complete_reps(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells of the reps that hold every one of paged/cascade/granikv present in `cells`.

    Why: a ratio is GraniKV over a baseline measured in the same run. When one system of a rep
    is missing (a device call ran out of time), averaging each system over its own reps would
    set a baseline's rep 2 against GraniKV's reps 0-1; the incomplete rep is left out instead.
    When no rep is complete (e.g. only GraniKV ran that point) every cell is kept."""
    if "config.rep" not in cells.columns or not len(cells):
        return cells
    reps = pd.to_numeric(cells["config.rep"], errors="coerce").fillna(0).astype(int)
    systems = set(cells["variant"]) & {"paged", "cascade", "granikv"}  # not the extra variants
    complete = [r for r in sorted(set(reps)) if systems <= set(cells.loc[reps == r, "variant"])]
    return cells[reps.isin(complete)] if complete else cells


def system_block(cells: pd.DataFrame) -> dict[str, Any]:
    """SGL/SGL-C/GKV throughput, TPOT, TTFT and the GKV ratios of one configuration."""
    cells = complete_reps(cells)
    out: dict[str, Any] = {}
    for prefix, system in SYSTEM_OF_PREFIX.items():
        out[f"{prefix}_tok_s"] = mean_of(cells, TOK, system=system)
        out[f"{prefix}_TPOT_ms"] = mean_of(cells, TPOT, system=system)
        out[f"{prefix}_TTFT_s"] = scale(mean_of(cells, TTFT, system=system), 1e-3)
    out["x_SGL"] = ratio(out["GKV_tok_s"], out["SGL_tok_s"])
    out["x_SGL-C"] = ratio(out["GKV_tok_s"], out["SGL-C_tok_s"])
    return out


def microbench(results: ResultSet, name: str) -> pd.DataFrame | None:
    frame = results.microbench.get(name)
    return frame if frame is not None and len(frame) else None

