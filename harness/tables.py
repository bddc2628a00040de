"""Every table of the paper (3-24) rebuilt from our result files, the paper's numbers beside ours.

Tables are pure functions of result files: `build_table(n, results)` reads a `ResultSet`
(`harness.results`) and returns a `ComparedTable` laid out like the paper (same rows, same
columns); `render_markdown`, `render_latex` and `render_csv` print it. Every compared column is
shown three times: the paper's value, ours, and ours/paper. A cell we have no result for is
marked missing ("—" in Markdown/LaTeX, "n/a" in CSV) and never filled in; a column we do not
measure at all (a qualitative label such as Table 19's "regime") is "n/a".

The paper measured on A100-SXM4-40GB; we may measure on other hardware, so absolute values are
shown side by side and the meaningful comparison is between ratios (e.g. GKV/SGL ours vs paper).

Systems: `paged` = "SGLang default" (SGL), `cascade` = "SGLang-Cascade" (SGL-C), `granikv` =
"GraniKV" (GKV). "SGL-C/GKV" (cascade kernel on GraniKV's HOT/COLD storage, Tables 13-14) is a
`granikv` cell whose `config.m_sat >= 2**30` (dispatcher never picks dense; `variant` column
`granikv_cascade` in `harness.results`).

Where our numbers come from
---------------------------
Serving cells are `results/<hw>/<sweep>/<cell>.json` (DESIGN §7). Each table reads the sweeps
listed in `TABLE_SPECS[n].sweeps`, in order: for each paper row the *first* sweep holding any
cell for that row's configuration supplies all systems of that row (so a ratio never mixes two
runs). Reps (`config.rep`) are averaged (the paper prints 3-rep means) over the reps that hold
every system of the row (`complete_reps`); ratios are ratios of the means. Cells are matched on
config keys only (`model`, `tp`, `lp`, `batch`, `k`, `hot_fraction`, `cold_page_size`), never on
the workload name.

- 3: `table3`, then `table9/10/11`. Rows (model, TP, Lp) at B=256; SGL/SGL-C/GKV
  `metrics.output_throughput`, ratios GKV/SGL and GKV/SGL-C.
- 4: `table4`, then `table21` (heterogeneous multi-prefix, `config.k` in {4, 8}, B=256);
  output throughput of each system over paged's.
- 6, 7, 8 (synthetic grid, sweeps `table6/7/8`) and 9, 10, 11 (ShareGPT grid, `table9/10/11`):
  rows (Lp, B); output tok/s, GKV/SGL, median TPOT (`metrics.median_tpot_ms`), median TTFT
  (`metrics.median_ttft_ms` / 1000, in s). A point of the table's configuration that we measured
  and the paper does not print (Table 6's Lp=16K row, which the paper dropped) gets a row of its
  own, in key order, marked `*`, with the paper's columns n/a.
- 12: `table12`, then `table9/10/11`: GraniKV tok/s at Lp=16K for B in {256, 512, 1024} and
  the B with the highest throughput (only when all three are present).
- 13, 14 (profiler): `table13` / `table14`, cells at B=256, Lp=8K of every variant, each with
  a `"profile"` section (see below). Columns SGL / SGL-C / SGL-C/GKV / GKV.
- 15: `table15`, then `table6`: 100·Σ`engine.dense_steps`/Σ`engine.decode_steps` of the
  granikv cells per (Lp, B). "majority" (ours): the dense share averaged over the row's B
  columns is "cascade" below 1/3, "dense" above 2/3, else "mixed".
- 16: `table16`, then `table6`: Lp=8K, median TPOT of GKV and SGL-C and their ratio; M_eff =
  B·n_q/kv is a property of the row, printed once.
- 17 (nsys dispatch overhead): microbench file `dispatch.json` (harness.microbench.dispatch), one
  record (the first) with `{"window_s", "dense_launches", "dense_launches_per_15s",
  "kernel_us_per_launch", "wrapper_cpu_us_per_step", "step_us"}`; launches are the 15 s-scaled
  count when present; wrapper % = 100·wrapper_cpu_us_per_step/step_us.
- 18: `table18`: granikv cells at B=256, Lp=8K by `config.cold_page_size` in {1, 4, 16};
  |Δ|max = 100·(max−min)/min over the three page sizes.
- 19: `table19`, then `table6/7/8`: GKV/SGL at Lp=8K, B=256. H_kv/rank and NCCL follow from
  (model, TP); "KV mem" and "regime" are the paper's judgement (n/a for us).
- 20: `table20`: Lp=8K, B=256, by `config.k` in {1, 4, 16, 64}.
- 21: `table21`, then `table4`: by `config.k`; tok/s, ×default, TPOT p50/p99
  (`metrics.median_tpot_ms`, `metrics.p99_tpot_ms`), TTFT p50 in s; slab tokens (K) from the
  granikv cell's `engine.hot_slab_tokens` / 1000 when the engine reports it.
- 22 (Amdahl): `table22`: the paged cell at Lp=16K, B=256 with a `"profile"` section; α =
  prefix_attention_ms / decode_wall_ms (paged has no prefix kernel: its decode_attention_ms ×
  Lp / mean context, the context being prompt + half the output from the cell's metrics),
  β = nccl_ms / decode_wall_ms, γ = host_gap_ms / decode_wall_ms. s is *our* Table 5 speedup
  (the column keeps the paper's label "s=15.6");
  S(s) = 1/((1−α′) + α′/s) with α′ = α/(1−γ) (the kernel-time share, as the paper's numbers
  imply); S(+β,γ) = 1/((1−α−β−γ) + α/s + β + γ); measured = GKV/SGL output throughput from
  `table22`, else `table3`, `table9/10/11`; s_eff solves measured = 1/((1−α) + α/s_eff).
- 23 (ncu): microbench file `ncu.json`, one record per `layout` in {"shared", "unique"} with
  `{"layout", "B", "Lp", "dram_bytes_read", "byte_model_bytes", "l2_hit_rate_pct",
  "tensor_pipe_active_pct", "waves_per_sm", "wall_us", "useful_flops"}` (per launch);
  derived: excess over byte model %, useful TF/s, DRAM GB/s, FLOP/byte; shown in the paper's
  units.
- 24: `table24`: granikv cells at Lp=8K, B=256 by `config.hot_fraction`, and the cascade cell;
  † (ours) = the granikv cell reported `engine.hot_fallbacks > 0`.
- 5 (kernel microbench): microbench file `kernels.json`, records `{"op", "layout", "B", "Lp",
  "Hq", "Hkv", "d", "dtype", "us", "GBps", "TFLOPs"}` at B=256, Lp=8192, Llama head (Hq=32,
  Hkv=8, d=128 when given; records with `"table5": true` preferred): "shared (HOT)" = op
  `prefix_dense` layout `shared`, "unique (paged)" = op `decode_paged` layout `unique` (the
  paged system's decode over per-request pages; the paper ran its dense kernel on both
  storages). Wall = median `us`, effective traffic = `GBps` (minimum bytes / time), speedup =
  unique us / this row's us.

Profiler section of a cell (Tables 13, 14, 22): `"profile": {"<category>_ms": ms, ...}`,
summed over the capture window, with categories `prefix_attention`, `decode_attention`,
`linear_gemm`, `nccl`, `total_kernel` (all kernels), and the wall-clock terms `decode_wall_ms`
(decode-step wall time in the window) and `host_gap_ms` (wall time with the GPU idle).

CLI: `python -m harness.tables --results results/<hw> --out tables/<hw> [--table 3 ...]`.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import math
import numbers
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.paper import PAPER_HARDWARE, PaperColumn, PaperTable, paper_table
from harness.results import ResultSet, load_results

TABLE_NUMBERS: tuple[int, ...] = tuple(range(3, 25))
MISSING_TEXT = "—"  # Markdown / LaTeX
MISSING_CSV = "n/a"
NOT_APPLICABLE = "n/a"

# Paper column prefix -> our system variant.
SYSTEM_OF_PREFIX: Mapping[str, str] = {"SGL": "paged", "SGL-C": "cascade", "GKV": "granikv",
                                       "SGL-C/GKV": "granikv_cascade"}
SYSTEM_OF_NAME: Mapping[str, str] = {"SGLang default": "paged", "SGLang-Cascade": "cascade",
                                     "GraniKV": "granikv", "Cascade": "cascade"}

# Architecture constants (not measurements): query and KV heads of each model of the paper.
MODEL_HEADS: Mapping[str, tuple[int, int]] = {"llama-3.1-8b": (32, 8), "qwen2.5-14b": (40, 8),
                                              "qwen2.5-32b": (40, 8)}
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


def _is_number(v: Any) -> bool:
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
    if _is_number(value):
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


def _scale(v: float | None, factor: float) -> float | None:
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
        out[f"{prefix}_TTFT_s"] = _scale(mean_of(cells, TTFT, system=system), 1e-3)
    out["x_SGL"] = ratio(out["GKV_tok_s"], out["SGL_tok_s"])
    out["x_SGL-C"] = ratio(out["GKV_tok_s"], out["SGL-C_tok_s"])
    return out


def microbench(results: ResultSet, name: str) -> pd.DataFrame | None:
    frame = results.microbench.get(name)
    return frame if frame is not None and len(frame) else None


# --------------------------------------------------------------------------- per-table mapping

Ours = Callable[[PaperTable, Mapping[str, Any], ResultSet], Mapping[str, Any]]


@dataclass(frozen=True)
class TableSpec:
    """How our result cells map onto one paper table's rows and columns."""

    number: int
    keys: tuple[str, ...]  # paper columns that identify a row: printed once, not compared
    sweeps: tuple[str, ...]  # serving-cell sweeps read, in order of preference
    ours: Ours
    qualitative: tuple[str, ...] = ()  # columns we do not measure (judgements): ours is n/a
    no_ratio: tuple[str, ...] = ()  # compared columns where ours/paper means nothing
    sources: str = ""  # one line for the rendered notes
    # rows we measured that the paper does not print (their keys), shown after the paper's rows in
    # key order: e.g. Table 6's Lp=16K row, which the paper had to drop
    ours_rows: Callable[[PaperTable, ResultSet], list[dict[str, Any]]] | None = None


def _grid(sweeps: Sequence[str]) -> Ours:
    def ours(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
        model, tp = parse_config(t.meta["config"])
        return system_block(select(res, sweeps, model=model, tp=tp, lp=row["Lp"], batch=row["B"]))

    return ours


def _grid_rows(sweeps: Sequence[str]) -> Callable[[PaperTable, ResultSet], list[dict[str, Any]]]:
    """The (Lp, B) points of a grid table's configuration that our sweeps measured and the paper's
    table lacks, so a measured cell is never left out of the table it was measured for."""

    def rows(t: PaperTable, res: ResultSet) -> list[dict[str, Any]]:
        model, tp = parse_config(t.meta["config"])
        printed = {(int(r["Lp"]), int(r["B"])) for r in t.rows}
        ours: set[tuple[int, int]] = set()
        for sweep in sweeps:
            cells = where(res.sweep_cells(sweep), model=model, tp=tp)
            if len(cells) and {"config.lp", "config.batch"} <= set(cells.columns):
                pts = cells[["config.lp", "config.batch"]].apply(pd.to_numeric, errors="coerce").dropna()
                ours |= {(int(lp), int(b)) for lp, b in pts.itertuples(index=False)}
        return [{"Lp": lp, "B": b} for lp, b in sorted(ours - printed)]

    return rows


def _t3(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    model, tp = parse_config(row["config"])
    cells = select(res, TABLE_SPECS[3].sweeps, model=model, tp=tp, lp=row["Lp"], batch=t.meta["B"])
    return system_block(cells)


def _t4(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    model, tp = parse_config(t.meta["config"])
    system = SYSTEM_OF_NAME[row["system"]]
    out = {}
    for k in (4, 8):
        cells = select(res, TABLE_SPECS[4].sweeps, model=model, tp=tp, batch=t.meta["B"], k=k)
        out[f"x_SGL_k{k}"] = ratio(mean_of(cells, TOK, system=system), mean_of(cells, TOK, system="paged"))
    return out


# Table 5's two rows as records of microbench/kernels.json (op, layout). The paper runs one dense
# kernel on both storages; our engine's paged system decodes with decode_paged, so the "unique
# (paged)" row is decode_paged over per-request pages ("unique": no two requests share a byte),
# and the "shared (HOT)" row is the dense prefix pass over the contiguous slab.
TABLE5_RECORDS: Mapping[str, tuple[str, str]] = {"shared (HOT)": ("prefix_dense", "shared"),
                                                 "unique (paged)": ("decode_paged", "unique")}
LLAMA_HEAD = {"Hq": 32, "Hkv": 8, "d": 128}


def _kernel_us(res: ResultSet, op: str, layout: str, B: int, Lp: int) -> tuple[float | None, float | None]:
    """(median us, median GBps) of `op` on `layout` at (B, Lp) with the Llama-3.1-8B head shape;
    records flagged `table5` are preferred when the file has any."""
    recs = microbench(res, "kernels")
    if recs is None:
        return None, None
    conds: dict[str, Any] = {"op": op, "layout": layout, "B": B, "Lp": Lp}
    conds.update({k: v for k, v in LLAMA_HEAD.items() if k in recs.columns})
    sub = recs
    for k, v in conds.items():
        if k not in sub.columns:
            return None, None
        sub = sub[(pd.to_numeric(sub[k], errors="coerce") == v) if _is_number(v) else (sub[k] == v)]
    if "table5" in sub.columns and (sub["table5"] == True).any():  # noqa: E712 - object column
        sub = sub[sub["table5"] == True]  # noqa: E712
    if not len(sub):
        return None, None
    us = pd.to_numeric(sub["us"], errors="coerce").median() if "us" in sub.columns else None
    gbps = pd.to_numeric(sub["GBps"], errors="coerce").median() if "GBps" in sub.columns else None
    return (None if us is None or math.isnan(us) else float(us),
            None if gbps is None or math.isnan(gbps) else float(gbps))


def kernel_speedup(res: ResultSet, B: int = 256, Lp: int = 8192) -> float | None:
    """Our Table 5 speedup: the unique (paged) row's time over the shared (HOT) row's."""
    return ratio(_kernel_us(res, *TABLE5_RECORDS["unique (paged)"], B, Lp)[0],
                 _kernel_us(res, *TABLE5_RECORDS["shared (HOT)"], B, Lp)[0])


def _t5(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    us, gbps = _kernel_us(res, *TABLE5_RECORDS[row["storage"]], t.meta["B"], t.meta["Lp"])
    unique_us, _ = _kernel_us(res, *TABLE5_RECORDS["unique (paged)"], t.meta["B"], t.meta["Lp"])
    return {"wall_us": us, "effective_HBM_GB_s": gbps, "speedup_x": ratio(unique_us, us)}


def _t12(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    model, tp = parse_config(row["config"])
    out: dict[str, Any] = {}
    for b in (256, 512, 1024):
        cells = select(res, TABLE_SPECS[12].sweeps, model=model, tp=tp, lp=t.meta["Lp"], batch=b)
        out[f"B{b}_tok_s"] = mean_of(cells, TOK, system="granikv")
    values = {b: out[f"B{b}_tok_s"] for b in (256, 512, 1024)}
    out["peak_B"] = max(values, key=values.get) if all(v is not None for v in values.values()) else None
    return out


_PROFILE_CATEGORY = {"Prefix attention": "prefix_attention", "Decode attention": "decode_attention",
                     "Linear GEMM": "linear_gemm", "Total kernel": "total_kernel"}


def _profile(number: int) -> Ours:
    def ours(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
        model, tp = parse_config(t.meta["config"])
        cells = select(res, TABLE_SPECS[number].sweeps, model=model, tp=tp, lp=t.meta["Lp"],
                       batch=t.meta["B"])
        cells = complete_reps(cells)
        column = f"profile.{_PROFILE_CATEGORY[row['category']]}_ms"
        return {f"{p}_ms": mean_of(cells, column, system=s) for p, s in SYSTEM_OF_PREFIX.items()}

    return ours


def _run_counter(cells: pd.DataFrame, name: str) -> pd.Series:
    """`engine.<name>` of the measured run: less its value after the warm-up request
    (`engine_after_warmup.<name>`) where the cell recorded one; older cells count from start."""
    total = pd.to_numeric(cells[f"engine.{name}"], errors="coerce")
    warm = f"engine_after_warmup.{name}"
    if warm in cells.columns:
        total = total - pd.to_numeric(cells[warm], errors="coerce").fillna(0)
    return total


def dense_fraction(cells: pd.DataFrame) -> float | None:
    """Share of the measured run's decode steps the dispatcher sent to the dense pass, over all
    matching cells (the warm-up request's single-request steps left out where recorded)."""
    if "engine.dense_steps" not in cells.columns or not len(cells):
        return None
    dense = _run_counter(cells, "dense_steps").sum()
    steps = _run_counter(cells, "decode_steps").sum()
    return float(dense / steps) if steps > 0 else None


def majority(pcts: Sequence[float | None]) -> str | None:
    """Our "majority" label: mean dense share < 1/3 -> cascade, > 2/3 -> dense, else mixed."""
    values = [p for p in pcts if p is not None]
    if not values:
        return None
    mean = sum(values) / len(values)
    return "cascade" if mean < 100 / 3 else "dense" if mean > 200 / 3 else "mixed"


def _t15(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    model, tp = parse_config(t.meta["config"])
    out: dict[str, Any] = {}
    for b in (8, 32, 128, 256):
        cells = select(res, TABLE_SPECS[15].sweeps, model=model, tp=tp, lp=row["Lp"], batch=b)
        out[f"B{b}_pct"] = _scale(dense_fraction(where(cells, system="granikv")), 100.0)
    out["majority"] = majority([out[f"B{b}_pct"] for b in (8, 32, 128, 256)])
    return out


def _t16(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    model, tp = parse_config(t.meta["config"])
    cells = select(res, TABLE_SPECS[16].sweeps, model=model, tp=tp, lp=t.meta["Lp"], batch=row["B"])
    gkv, sglc = mean_of(cells, TPOT, system="granikv"), mean_of(cells, TPOT, system="cascade")
    return {"GKV_TPOT_ms": gkv, "SGL-C_TPOT_ms": sglc, "x_GKV_over_SGL-C": ratio(gkv, sglc)}


def _t17(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    recs = microbench(res, "dispatch")
    if recs is None:
        return {}
    rec = recs.iloc[0]

    def get(k: str) -> float | None:
        return float(rec[k]) if k in rec.index and _is_number(rec[k]) else None

    q = row["quantity"]
    if q.startswith("Dense-backend launches"):
        v = get("dense_launches_per_15s")
        v = get("dense_launches") if v is None else v
    elif q.startswith("Kernel wall"):
        v = get("kernel_us_per_launch")
    elif q.startswith("Wrapper CPU"):
        v = get("wrapper_cpu_us_per_step")
    else:
        v = _scale(ratio(get("wrapper_cpu_us_per_step"), get("step_us")), 100.0)
    return {"value": v}


def _t18(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    model, tp = parse_config(row["config"])
    cells = select(res, TABLE_SPECS[18].sweeps, model=model, tp=tp, lp=t.meta["Lp"], batch=t.meta["B"])
    out: dict[str, Any] = {f"PS{ps}_tok_s": mean_of(cells, TOK, system="granikv", cold_page_size=ps)
                           for ps in (1, 4, 16)}
    values = [out[f"PS{ps}_tok_s"] for ps in (1, 4, 16)]
    out["max_abs_delta_pct"] = (100 * (max(values) - min(values)) / min(values)
                                if all(v is not None for v in values) and min(values) > 0 else None)
    return out


def _t19(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    model, tp = parse_config(row["config"])
    cells = select(res, TABLE_SPECS[19].sweeps, model=model, tp=tp, lp=t.meta["Lp"], batch=t.meta["B"])
    return {"x_SGL": ratio(mean_of(cells, TOK, system="granikv"), mean_of(cells, TOK, system="paged"))}


def _t20(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    model, tp = parse_config(t.meta["config"])
    cells = complete_reps(select(res, TABLE_SPECS[20].sweeps, model=model, tp=tp, lp=t.meta["Lp"],
                                 batch=t.meta["B"], k=row["k"]))
    if row["row_type"] == "throughput":
        return {"output_tok_s": mean_of(cells, TOK, system=SYSTEM_OF_NAME[row["system"]])}
    den = "paged" if row["system"].endswith("/ SGL") else "cascade"
    return {"ratio": ratio(mean_of(cells, TOK, system="granikv"), mean_of(cells, TOK, system=den))}


def _t21(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    model, tp = parse_config(t.meta["config"])
    cells = complete_reps(select(res, TABLE_SPECS[21].sweeps, model=model, tp=tp, batch=t.meta["B"], k=row["k"]))
    system = SYSTEM_OF_NAME[row["system"]]
    tok = mean_of(cells, TOK, system=system)
    return {
        "slab_tokens_K": _scale(mean_of(cells, "engine.hot_slab_tokens", system="granikv"), 1e-3),
        "tok_s": tok,
        "x_default": ratio(tok, mean_of(cells, TOK, system="paged")),
        "TPOT_p50_ms": mean_of(cells, TPOT, system=system),
        "TPOT_p99_ms": mean_of(cells, TPOT99, system=system),
        "TTFT_p50_s": _scale(mean_of(cells, TTFT, system=system), 1e-3),
    }


def amdahl(alpha: float, beta: float, gamma: float, s: float) -> tuple[float, float]:
    """(S(s), S(+β,γ)) of the paper's Eq. 3/4, α′ = α/(1−γ) for the first (see module doc)."""
    a_kernel = alpha / (1 - gamma)
    s_plain = 1 / ((1 - a_kernel) + a_kernel / s)
    s_full = 1 / ((1 - alpha - beta - gamma) + alpha / s + beta + gamma)
    return s_plain, s_full


def effective_speedup(alpha: float, measured: float) -> float | None:
    """s_eff with measured = 1/((1−α) + α/s_eff); None when no finite s_eff explains it."""
    rest = 1 / measured - (1 - alpha)
    return alpha / rest if rest > 0 else None


def _paged_prefix_share(prof: pd.DataFrame, wall: float | None, lp: int) -> float | None:
    """α for a paged cell, whose one attention kernel reads prefix and suffix alike (no prefix
    kernel to time): its attention time × the prefix's share of the context tokens it reads.
    The mean context of a request in steady decode is its prompt plus half its output (from the
    cell's metrics), of which `lp` tokens are the shared prefix."""
    att = mean_of(prof, "profile.decode_attention_ms", system="paged")
    n = mean_of(prof, "metrics.completed", system="paged")
    tin = mean_of(prof, "metrics.total_input_tokens", system="paged")
    tout = mean_of(prof, "metrics.total_output_tokens", system="paged")
    if None in (att, wall, n, tin, tout) or not n or not wall:
        return None
    context = tin / n + tout / n / 2
    return att * min(1.0, lp / context) / wall


def _t22(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    model, tp = parse_config(row["config"])
    base = dict(model=model, tp=tp, lp=t.meta["Lp"], batch=t.meta["B"])
    prof = select(res, ("table22",), **base)
    wall = mean_of(prof, "profile.decode_wall_ms", system="paged")
    parts = {name: ratio(mean_of(prof, f"profile.{name}_ms", system="paged"), wall)
             for name in ("prefix_attention", "nccl", "host_gap")}
    if not parts["prefix_attention"]:
        parts["prefix_attention"] = _paged_prefix_share(prof, wall, t.meta["Lp"])
    alpha, beta, gamma = parts["prefix_attention"], parts["nccl"], parts["host_gap"]
    tput = select(res, TABLE_SPECS[22].sweeps, require=("paged", "granikv"), **base)
    measured = ratio(mean_of(tput, TOK, system="granikv"), mean_of(tput, TOK, system="paged"))
    s = kernel_speedup(res)
    out: dict[str, Any] = {"alpha_pct": _scale(alpha, 100.0), "beta_pct": _scale(beta, 100.0),
                           "gamma_pct": _scale(gamma, 100.0), "measured_x": measured}
    if None not in (alpha, beta, gamma) and s:
        out["S_s15.6_x"], out["S_plus_beta_gamma_x"] = amdahl(alpha, beta, gamma, s)
    if alpha is not None and measured:
        out["s_eff_x"] = effective_speedup(alpha, measured)
    return out


_UNIT_SCALE = {"MB": 1e-6, "GB": 1e-9}


def _t23(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    recs = microbench(res, "ncu")
    if recs is None or "layout" not in recs.columns:
        return {}
    out: dict[str, Any] = {}
    for col, layout in (("shared_HOT", "shared"), ("unique_paged", "unique")):
        sub = recs[recs["layout"] == layout]
        if not len(sub):
            continue

        def get(k: str, sub: pd.DataFrame = sub) -> float | None:
            return mean_of(sub, k)

        dram, model_bytes, wall, flops = (get("dram_bytes_read"), get("byte_model_bytes"), get("wall_us"),
                                          get("useful_flops"))
        metric = row["metric"]
        if metric.startswith("DRAM bytes"):
            v = _scale(dram, _UNIT_SCALE.get(row[f"{col}_unit"], 1.0))
        elif metric.startswith("vs. byte model"):
            r = ratio(dram, model_bytes)
            v = None if r is None else 100 * (r - 1)
        elif metric.startswith("L2 hit"):
            v = get("l2_hit_rate_pct")
        elif metric.startswith("Tensor-core"):
            v = get("tensor_pipe_active_pct")
        elif metric.startswith("Waves"):
            v = get("waves_per_sm")
        elif metric.startswith("Wall time"):
            v = wall
        elif metric.startswith("Useful throughput"):
            v = _scale(ratio(flops, wall), 1e-6)  # FLOP/us -> TF/s
        elif metric.startswith("Achieved DRAM"):
            v = _scale(ratio(dram, wall), 1e-3)  # B/us -> GB/s
        elif metric.startswith("Arithmetic intensity"):
            v = ratio(flops, dram)
        else:
            v = None
        out[col] = v
    return out


def _t24(t: PaperTable, row: Mapping[str, Any], res: ResultSet) -> Mapping[str, Any]:
    model, tp = parse_config(t.meta["config"])
    cells = select(res, TABLE_SPECS[24].sweeps, model=model, tp=tp, lp=t.meta["Lp"], batch=t.meta["B"])
    cascade_tok = mean_of(cells, TOK, system="cascade")
    if row["system"] == "Cascade":
        mine = where(cells, system="cascade")
    else:
        mine = where(cells, system="granikv", hot_fraction=row["fp"])
    tok = mean_of(mine, TOK)
    fallbacks = mean_of(mine, "engine.hot_fallbacks")
    return {
        "dagger": None if fallbacks is None or row["system"] == "Cascade" else bool(fallbacks > 0),
        "tok_s": tok,
        "x_Cascade": ratio(tok, cascade_tok),
        "TPOT_p50_ms": mean_of(mine, TPOT),
        "TPOT_p99_ms": mean_of(mine, TPOT99),
        "TTFT_p50_s": _scale(mean_of(mine, TTFT), 1e-3),
    }


def _spec(number: int, keys: tuple[str, ...], sweeps: tuple[str, ...], ours: Ours, sources: str,
          **kw: Any) -> TableSpec:
    return TableSpec(number=number, keys=keys, sweeps=sweeps, ours=ours, sources=sources, **kw)


_SERVING = "output throughput / TPOT / TTFT of serving cells"
TABLE_SPECS: dict[int, TableSpec] = {
    3: _spec(3, ("config", "Lp"), ("table3", "table9", "table10", "table11"), _t3, _SERVING),
    4: _spec(4, ("system",), ("table4", "table21"), _t4,
             "throughput over paged's, heterogeneous multi-prefix"),
    5: _spec(5, ("storage",), (), _t5, "microbench/kernels.json: prefix_dense/shared vs decode_paged/unique"),
    6: _spec(6, ("Lp", "B"), ("table6",), _grid(("table6",)), _SERVING, ours_rows=_grid_rows(("table6",))),
    7: _spec(7, ("Lp", "B"), ("table7",), _grid(("table7",)), _SERVING, ours_rows=_grid_rows(("table7",))),
    8: _spec(8, ("Lp", "B"), ("table8",), _grid(("table8",)), _SERVING, ours_rows=_grid_rows(("table8",))),
    9: _spec(9, ("Lp", "B"), ("table9",), _grid(("table9",)), _SERVING, ours_rows=_grid_rows(("table9",))),
    10: _spec(10, ("Lp", "B"), ("table10",), _grid(("table10",)), _SERVING, ours_rows=_grid_rows(("table10",))),
    11: _spec(11, ("Lp", "B"), ("table11",), _grid(("table11",)), _SERVING, ours_rows=_grid_rows(("table11",))),
    12: _spec(12, ("config",), ("table12", "table9", "table10", "table11"), _t12, "GraniKV output throughput",
              no_ratio=("peak_B",)),
    13: _spec(13, ("category",), ("table13",), _profile(13), "profile section of serving cells"),
    14: _spec(14, ("category",), ("table14",), _profile(14), "profile section of serving cells"),
    15: _spec(15, ("Lp",), ("table15", "table6"), _t15, "engine.dense_steps / engine.decode_steps (granikv)"),
    16: _spec(16, ("B", "M_eff"), ("table16", "table6"), _t16, "median TPOT of serving cells"),
    17: _spec(17, ("quantity", "comparator", "unit"), (), _t17, "microbench/dispatch.json"),
    18: _spec(18, ("config",), ("table18",), _t18, "granikv cells by config.cold_page_size"),
    19: _spec(19, ("config", "Hkv_per_rank", "NCCL"), ("table19", "table6", "table7", "table8"), _t19,
              "GKV/SGL output throughput", qualitative=("KV_mem", "regime")),
    20: _spec(20, ("row_type", "system", "k"), ("table20",), _t20, "serving cells by config.k"),
    21: _spec(21, ("config", "k", "system"), ("table21", "table4"), _t21, _SERVING),
    22: _spec(22, ("config",), ("table22", "table3", "table9", "table10", "table11"), _t22,
              "profile section of the paged cell (table22) + Table 5 speedup + GKV/SGL"),
    23: _spec(23, ("metric", "shared_HOT_unit", "unique_paged_unit"), (), _t23, "microbench/ncu.json",
              qualitative=("remark",)),
    24: _spec(24, ("system", "fp"), ("table24",), _t24, "granikv cells by config.hot_fraction + cascade",
              no_ratio=("dagger",)),
}


# --------------------------------------------------------------------------- the compared table


@dataclass(frozen=True)
class Cell:
    """One compared cell: the paper's printed value and ours (None = we have no result)."""

    paper: Any
    ours: Any
    applicable: bool = True  # False: a column we do not measure (n/a)
    comparable: bool = True  # False: ours/paper means nothing for this column

    @property
    def ratio(self) -> float | None:
        if not (self.applicable and self.comparable and _is_number(self.paper) and _is_number(self.ours)):
            return None
        return None if self.paper == 0 else self.ours / self.paper

    @property
    def missing(self) -> bool:
        """The paper printed a value and we have none (never the case for n/a columns)."""
        return self.applicable and self.paper is not None and self.ours is None


@dataclass(frozen=True)
class ComparedRow:
    keys: tuple[Any, ...]
    cells: tuple[Cell, ...]
    ours_only: bool = False  # a row the paper does not print (its paper columns are n/a)
    sources: frozenset[str] = frozenset()  # the result files behind our numbers in this row
    stale: bool = False  # one of them predates a listed engine change (`mark_stale`)


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
    extra = spec.ours_rows(paper, results) if spec.ours_rows else []
    rows = []
    for prow, ours_only in [(r, False) for r in paper.rows] + [(r, True) for r in extra]:
        with results.recording() as sources:
            ours = spec.ours(paper, prow, results)
        cells = []
        for col in value_cols:
            applicable = col.name not in spec.qualitative
            value = ours.get(col.name) if applicable else None
            pv = prow.get(col.name)
            comparable = col.name not in spec.no_ratio and (pv is None or _is_number(pv))
            cells.append(Cell(paper=pv, ours=value, applicable=applicable, comparable=comparable))
        rows.append(ComparedRow(keys=tuple(prow.get(k) for k in spec.keys), cells=tuple(cells),
                                ours_only=ours_only, sources=frozenset(sources)))
    if extra:
        # ours-only rows go where they belong when the paper prints its rows in key order (the
        # grids do), else after the paper's rows
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


def stale_cell_paths(results: ResultSet, changes: Sequence[Any] | None = None,
                     repo: Path | str | None = None) -> set[str] | None:
    """The cells (paths as `results` holds them) that predate a listed engine change
    (`harness/data/engine_changes.yaml` unless `changes` is given); None when git cannot answer
    (no git, or a clone without the cells' commits)."""
    from harness.engine_changes import stale_cells

    stale = stale_cells(results.cells, changes, repo)
    return None if stale is None else set(stale)


def headline_block(results: ResultSet) -> str:
    """The README's headline table: Table 3, stale rows marked where git can tell."""
    t = build_table(3, results)
    stale = stale_cell_paths(results)
    return render_headline(mark_stale(t, stale) if stale is not None else t)


# --------------------------------------------------------------------------- formatting


def _decimals(paper: Any) -> int:
    if isinstance(paper, bool) or not _is_number(paper):
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
    if _is_number(value):
        if like is None:
            return str(int(value)) if isinstance(value, numbers.Integral) else repr(float(value))
        d = _decimals(like)
        return f"{value:.{d}f}" if d else f"{round(value):d}"
    return str(value)


OURS_ONLY_MARK = "*"
STALE_MARK = "§"  # a row whose numbers include a cell measured before a listed engine change


def _ours_text(cell: Cell, missing: str) -> str:
    if not cell.applicable:
        return NOT_APPLICABLE
    if cell.ours is None:
        return missing if cell.paper is not None else NOT_APPLICABLE
    if cell.paper is None and _is_number(cell.ours):
        # no paper value to take the precision from: three significant figures or more
        v = float(cell.ours)
        return format_value(v, 100 if abs(v) >= 100 else 10.5 if abs(v) >= 10 else 1.25)
    return format_value(cell.ours, cell.paper)


def _key_texts(row: ComparedRow) -> list[str]:
    keys = [format_value(k) for k in row.keys]
    if row.ours_only and keys:
        keys[0] += OURS_ONLY_MARK
    if row.stale and keys:
        keys[0] += STALE_MARK
    return keys


def _paper_text(cell: Cell) -> str:
    return NOT_APPLICABLE if cell.paper is None else format_value(cell.paper)


def _ratio_text(cell: Cell, missing: str) -> str:
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
    ] + only + _stale_lines(t)


def _stale_lines(t: ComparedTable) -> list[str]:
    n = sum(r.stale for r in t.rows)
    if not n:
        return []
    return [f"{n} row(s) marked {STALE_MARK} include cells measured before a later engine change listed in "
            "`harness/data/engine_changes.yaml`: re-measured at HEAD they would not give these numbers "
            f"(which cells and changes: `python -m harness.engine_changes --results results/{t.hardware}`)."]


def render_markdown(t: ComparedTable) -> str:
    head = [c.label for c in t.key_columns]
    for c in t.value_columns:
        head += [f"{c.label} (paper)", f"{c.label} (ours)", f"{c.label} ours/paper"]
    lines = [f"# Table {t.number}: {t.caption}", ""] + [f"{line}  " for line in _header_lines(t)] + [""]
    lines.append("| " + " | ".join(h.replace("|", "\\|") for h in head) + " |")
    lines.append("|" + "---|" * len(head))
    for row in t.rows:
        cells = _key_texts(row)
        for cell in row.cells:
            cells += [_paper_text(cell), _ours_text(cell, MISSING_TEXT), _ratio_text(cell, MISSING_TEXT)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if t.notes:
        lines += ["", "Paper notes:", ""] + [f"- {n}" for n in t.notes]
    return "\n".join(lines) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                  "×": r"$\times$", "µ": r"$\mu$", "μ": r"$\mu$", "Δ": r"$\Delta$", "∈": r"$\in$",
                  "≥": r"$\geq$", "≤": r"$\leq$", "≈": r"$\approx$", "·": r"$\cdot$", "†": r"\dag{}",
                  "|": r"$|$", "—": "---", "–": "--", "α": r"$\alpha$", "β": r"$\beta$", "γ": r"$\gamma$",
                  "<": r"$<$", ">": r"$>$", "ℓ": r"$\ell$", "§": r"\S{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def render_latex(t: ComparedTable) -> str:
    nkeys, nvals = len(t.key_columns), len(t.value_columns)
    colspec = "l" * nkeys + "|rrr" * nvals
    top = [latex_escape(c.label) for c in t.key_columns]
    top += [rf"\multicolumn{{3}}{{c|}}{{{latex_escape(c.label)}}}" for c in t.value_columns]
    sub = [""] * nkeys + ["paper", "ours", "o/p"] * nvals
    lines = [
        f"% Table {t.number} of the paper beside our results ({t.hardware}); generated by harness.tables.",
        r"\begin{table}[t]", r"\centering", r"\scriptsize",
        rf"\begin{{tabular}}{{{colspec}}}", r"\hline",
        " & ".join(top) + r" \\", " & ".join(sub) + r" \\", r"\hline",
    ]
    for row in t.rows:
        cells = [latex_escape(k) for k in _key_texts(row)]
        for cell in row.cells:
            cells += [latex_escape(_paper_text(cell)), latex_escape(_ours_text(cell, MISSING_TEXT)),
                      latex_escape(_ratio_text(cell, MISSING_TEXT))]
        lines.append(" & ".join(cells) + r" \\")
    only = f" Rows marked {OURS_ONLY_MARK} are ours only." if any(r.ours_only for r in t.rows) else ""
    if any(r.stale for r in t.rows):
        only += f" Rows marked {STALE_MARK} include cells measured before a later engine change."
    caption = latex_escape(f"Table {t.number} (paper: {PAPER_HARDWARE}; ours: {t.hardware}). {t.caption}{only}")
    lines += [r"\hline", r"\end{tabular}", rf"\caption{{{caption}}}", rf"\label{{tab:ours-{t.number}}}",
              r"\end{table}"]
    return "\n".join(lines) + "\n"


def _csv_number(v: Any) -> str:
    if v is None:
        return MISSING_CSV
    if isinstance(v, bool):
        return "true" if v else "false"
    if _is_number(v):
        return f"{v:.6g}"
    return str(v)


def render_csv(t: ComparedTable) -> str:
    """Machine-readable: `<col>.paper`, `<col>.ours`, `<col>.ratio`; missing = "n/a"."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    head = [c.name for c in t.key_columns]
    for c in t.value_columns:
        head += [f"{c.name}.paper", f"{c.name}.ours", f"{c.name}.ratio"]
    w.writerow(head)
    for row in t.rows:
        out = [_csv_number(k) for k in row.keys]
        for cell in row.cells:
            r = cell.ratio
            out += [_csv_number(cell.paper), _csv_number(cell.ours if cell.applicable else None),
                    MISSING_CSV if r is None else f"{r:.4f}"]
        w.writerow(out)
    return buf.getvalue()


README_BEGIN = "<!-- headline table: generated by `python -m harness.tables ... --readme README.md` -->"
README_END = "<!-- end of headline table -->"


def render_headline(t: ComparedTable) -> str:
    """Compact Markdown of a table for the README: one column per value, "paper / ours" in each
    cell (rows where we have nothing are left out)."""
    head = [c.label for c in t.key_columns] + [f"{c.label} (paper / ours)" for c in t.value_columns]
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in head) + " |", "|" + "---|" * len(head)]
    for row in t.rows:
        if all(c.ours is None for c in row.cells):
            continue
        cells = _key_texts(row)
        cells += [f"{_paper_text(c)} / {_ours_text(c, MISSING_TEXT)}" for c in row.cells]
        lines.append("| " + " | ".join(cells) + " |")
    if any(r.stale for r in t.rows if not all(c.ours is None for c in r.cells)):
        lines += ["", f"{STALE_MARK}: measured before a later engine change; re-measured at HEAD these "
                      f"numbers would differ (`python -m harness.engine_changes --results results/{t.hardware}`)."]
    return "\n".join(lines) + "\n"


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


RENDERERS: Mapping[str, Callable[[ComparedTable], str]] = {"md": render_markdown, "tex": render_latex,
                                                            "csv": render_csv}


def write_tables(results: ResultSet, out_dir: Path | str,
                 numbers: Sequence[int] = TABLE_NUMBERS) -> list[Path]:
    """Write table<n>.{md,tex,csv} for each table and an index README.md; returns the files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    index = [f"# Paper tables beside our results: `{results.hardware}`", "",
             f"Generated by `python -m harness.tables` from `results/{results.hardware}`; paper numbers "
             f"were measured on {PAPER_HARDWARE}" + (f", ours on {results.gpu}." if results.gpu else "."), "",
             "Each result file names the commit it was measured at; rows marked § include cells measured "
             "before a later engine change of `harness/data/engine_changes.yaml` (which cells and changes: "
             f"`python -m harness.engine_changes --results results/{results.hardware}`). Each point's "
             "repetitions side by side (spread, per-run ratios) and the A/B cells of `adhoc/` beside their "
             f"baseline point are in `repetitions.md` (`python -m harness.report --results "
             f"results/{results.hardware} --out {out.as_posix()}/repetitions.md`).", "",
             "| table | caption | ours filled | missing | files |", "|---|---|---|---|---|"]
    stale = stale_cell_paths(results)
    for n in numbers:
        t = build_table(n, results)
        if stale is not None:
            t = mark_stale(t, stale)
        for ext, render in RENDERERS.items():
            path = out / f"table{n}.{ext}"
            path.write_text(render(t), encoding="utf-8")
            written.append(path)
        files = " ".join(f"[{ext}](table{n}.{ext})" for ext in RENDERERS)
        caption = t.caption.replace("|", "\\|")
        index.append(f"| {n} | {caption} | {t.filled} | {t.missing} | {files} |")
    readme = out / "README.md"
    readme.write_text("\n".join(index) + "\n", encoding="utf-8")
    written.append(readme)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.tables", description=__doc__.split("\n")[0])
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
