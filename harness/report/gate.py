"""Throughput regression gate: compare a result set against a committed baseline.

Two modes (docs/design.md, "Result files"):

- `ratio` (default): per cell, GraniKV's output throughput over paged's, so machine drift
  (clocks, neighbours, driver) cancels out. This is the mode to gate CI on. The ratio is taken
  over the reps whose two cells carry one call id (`env.call_id`: measured back to back in one
  call) where there are any; else over every rep, and the check is marked mixed-call (‡ in the
  reports): its two systems were measured in different calls, so run-to-run spread enters it.
- `absolute`: per cell and system, the output throughput itself; only meaningful on the same
  hardware key, so the baseline's `hardware` must match the results directory's name.

A cell is identified by `key_fields` (config keys plus the sweep), never by file name, and reps
are averaged (a ratio: over its reps of one call, as above). A check regresses when
`current < baseline * (1 - tolerance)` (the boundary itself passes); a value above
`baseline * (1 + tolerance)` is reported as improved (consider refreshing the baseline) but passes.

Exit codes: 0 pass, 1 regression, 2 usage or missing-data error (no results, a baseline cell
with no current counterpart unless `--allow-missing`, hardware mismatch in absolute mode,
unreadable baseline). A regression wins over missing data: exit 1 if both.

Baseline file (`results/baselines/<hardware>.json`, written by `--write-baseline`):

    {"format": "granikv-gate-baseline/1", "hardware": "h200",
     "metric": "metrics.output_throughput", "numerator": "granikv", "denominator": "paged",
     "key_fields": ["sweep", "model", "tp", "workload", "lp", "batch", "k", ...],
     "tolerance": 0.05, "abs_tolerance": 0.10,
     "source": {"results": "results/h200", "git_sha": ["..."], "gpu": ["..."]},
     "cells": [{"key": {"sweep": "table3", "model": "llama-3.1-8b", ...},
                "ratio": 2.16, "absolute": {"paged": 1362.0, "granikv": 2943.0}}, ...]}

A baseline can be restricted to the cells of one sweep file (`--cells gate`: the CI gate's
cells, conf/sweep/gate.yaml, as a pipeline profile plans them). Such a baseline keys cells
without `sweep`, so cells measured by the `gate` sweep match the same configurations measured by
the reproduction sweeps (table9, table20): a cell is the same cell whichever sweep ran it.

CLI: `python -m harness.report.gate --results results/<hw> --baseline results/baselines/<hw>.json
[--mode ratio|absolute|both] [--tolerance 0.05] [--json F] [--markdown F]
[--write-baseline [--force] [--cells SWEEP [--profile NAME]]]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import numbers
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.run.results import ResultFileError, load_cells

if TYPE_CHECKING:
    from harness.run.sweeps import Cell

FORMAT = "granikv-gate-baseline/1"
METRIC = "metrics.output_throughput"
DEFAULT_KEY_FIELDS: tuple[str, ...] = ("sweep", "model", "tp", "workload", "lp", "batch", "k", "rate",
                                       "num_prompts", "output_len")
# a baseline written for a sweep file's cells (--cells) matches them whichever sweep measured them
CELL_KEY_FIELDS: tuple[str, ...] = tuple(f for f in DEFAULT_KEY_FIELDS if f != "sweep")
REPORT_FORMAT = "granikv-gate-report/1"
DEFAULT_TOLERANCE = 0.05
DEFAULT_ABS_TOLERANCE = 0.10
MODES = ("ratio", "absolute", "both")
_EPS = 1e-9  # relative slack so a value exactly on the threshold passes despite float rounding

MIXED_MARK = "‡"  # a ratio whose two systems were measured in different calls (harness.report.tables.render)
EXIT_PASS, EXIT_REGRESSION, EXIT_ERROR = 0, 1, 2
VERDICTS = {EXIT_PASS: "PASS", EXIT_REGRESSION: "FAIL (regression)", EXIT_ERROR: "ERROR (missing data)"}


class GateError(Exception):
    """Usage or missing-data problem: the gate cannot judge (exit 2)."""


Key = tuple[tuple[str, Any], ...]


def _norm_value(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, str):  # "inf" (the YAML's rate) and inf are the same rate
        try:
            v = float(v)
        except ValueError:
            return v
    if isinstance(v, numbers.Real):
        f = float(v)
        return None if math.isnan(f) else f
    return str(v)


def make_key(values: Mapping[str, Any], fields: Sequence[str]) -> Key:
    """A hashable, type-normalised cell key (8192 and 8192.0 are the same cell)."""
    return tuple((f, _norm_value(values.get(f))) for f in fields)


def key_text(key: Key) -> str:
    def show(v: Any) -> str:
        return f"{int(v)}" if isinstance(v, float) and v.is_integer() else str(v)

    return " ".join(f"{f}={show(v)}" for f, v in key if v is not None)


def _key_values(row: pd.Series, fields: Sequence[str]) -> dict[str, Any]:
    out = {}
    for f in fields:
        col = f if f in ("sweep", "hardware") else f"config.{f}"
        out[f] = row[col] if col in row.index else None
    return out


RepValues = Mapping[int, tuple[tuple[float, ...], tuple[str | None, ...]]]  # rep -> (metric values, call ids)


@dataclass(frozen=True)
class Measurement:
    """Mean metric per (cell key, system variant) of one result set, and per rep the values and
    call ids behind it."""

    values: Mapping[tuple[Key, str], float]
    key_values: Mapping[Key, Mapping[str, Any]]
    reps: Mapping[tuple[Key, str], RepValues] = field(default_factory=dict)

    def one_call_reps(self, key: Key, systems: Sequence[str]) -> list[int]:
        """The reps where every one of `systems` has a cell and all of them carry one call id."""
        per = [self.reps.get((key, s), {}) for s in systems]
        if not per or not all(per):
            return []
        out = []
        for r in sorted(set.intersection(*(set(p) for p in per))):
            ids = [c for p in per for c in p[r][1]]
            if None not in ids and len(set(ids)) == 1:
                out.append(r)
        return out

    def _mean(self, key: Key, system: str, reps: Sequence[int]) -> float:
        xs = [x for r in reps for x in self.reps[(key, system)][r][0]]
        return sum(xs) / len(xs)

    def ratio(self, key: Key, numerator: str, denominator: str) -> float | None:
        """numerator / denominator over their reps of one call where there are any, else over every rep."""
        one = self.one_call_reps(key, (numerator, denominator))
        if one:
            num, den = self._mean(key, numerator, one), self._mean(key, denominator, one)
        else:
            num, den = self.values.get((key, numerator)), self.values.get((key, denominator))
        return None if num is None or den is None or den == 0 else num / den

    def mixed(self, key: Key, numerator: str, denominator: str) -> bool:
        """The ratio exists and no rep holds its two systems in one call."""
        return (numerator != denominator and self.ratio(key, numerator, denominator) is not None
                and not self.one_call_reps(key, (numerator, denominator)))

    @property
    def keys(self) -> list[Key]:
        return list(self.key_values)


def measure(cells: pd.DataFrame, fields: Sequence[str], metric: str = METRIC) -> Measurement:
    """Average `metric` over reps for every (cell key, variant) of the result set."""
    if not len(cells) or metric not in cells.columns:
        return Measurement(values={}, key_values={})
    sums: dict[tuple[Key, str], list[float]] = {}
    reps: dict[tuple[Key, str], dict[int, tuple[list[float], list[str | None]]]] = {}
    key_values: dict[Key, Mapping[str, Any]] = {}
    for _, row in cells.iterrows():
        kv = _key_values(row, fields)
        key = make_key(kv, fields)
        key_values.setdefault(key, {f: _json_value(v) for f, v in kv.items()})
        value = pd.to_numeric(row[metric], errors="coerce")
        if pd.notna(value):
            sums.setdefault((key, str(row["variant"])), []).append(float(value))
            rep = pd.to_numeric(row.get("config.rep", 0), errors="coerce")
            call = row.get("env.call_id")
            values, calls = reps.setdefault((key, str(row["variant"])), {}).setdefault(
                0 if pd.isna(rep) else int(rep), ([], []))
            values.append(float(value))
            calls.append(call if isinstance(call, str) and call else None)
    return Measurement(values={k: sum(v) / len(v) for k, v in sums.items()}, key_values=key_values,
                       reps={k: {r: (tuple(v), tuple(c)) for r, (v, c) in by.items()} for k, by in reps.items()})


def _json_value(v: Any) -> Any:
    if v is None or isinstance(v, bool | str):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return None if math.isnan(float(v)) else float(v)
    return str(v)


@dataclass(frozen=True)
class BaselineCell:
    key: Mapping[str, Any]
    ratio: float | None
    absolute: Mapping[str, float]


@dataclass(frozen=True)
class Baseline:
    hardware: str
    key_fields: tuple[str, ...]
    cells: tuple[BaselineCell, ...]
    metric: str = METRIC
    numerator: str = "granikv"
    denominator: str = "paged"
    tolerance: float = DEFAULT_TOLERANCE
    abs_tolerance: float = DEFAULT_ABS_TOLERANCE
    source: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "hardware": self.hardware, "metric": self.metric,
                "numerator": self.numerator, "denominator": self.denominator,
                "key_fields": list(self.key_fields), "tolerance": self.tolerance,
                "abs_tolerance": self.abs_tolerance, "source": dict(self.source),
                "cells": [{"key": dict(c.key), "ratio": c.ratio, "absolute": dict(c.absolute)}
                          for c in self.cells]}


def load_baseline(path: Path | str) -> Baseline:
    """Parse a baseline file; GateError (exit 2) when it is absent or malformed."""
    p = Path(path)
    if not p.exists():
        raise GateError(f"baseline {p} does not exist (write one with --write-baseline)")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise GateError(f"baseline {p} is not valid JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise GateError(f"baseline {p}: expected \"format\": \"{FORMAT}\"")
    try:
        cells = tuple(BaselineCell(key=dict(c["key"]), ratio=c.get("ratio"),
                                   absolute={str(s): float(v) for s, v in (c.get("absolute") or {}).items()})
                      for c in doc["cells"])
        return Baseline(hardware=str(doc["hardware"]), key_fields=tuple(doc["key_fields"]), cells=cells,
                        metric=doc.get("metric", METRIC), numerator=doc.get("numerator", "granikv"),
                        denominator=doc.get("denominator", "paged"),
                        tolerance=float(doc.get("tolerance", DEFAULT_TOLERANCE)),
                        abs_tolerance=float(doc.get("abs_tolerance", DEFAULT_ABS_TOLERANCE)),
                        source=doc.get("source") or {})
    except (KeyError, TypeError, ValueError) as e:
        raise GateError(f"baseline {p} is malformed: {e!r}") from e


def build_baseline(cells: pd.DataFrame, hardware: str, *, key_fields: Sequence[str] = DEFAULT_KEY_FIELDS,
                   numerator: str = "granikv", denominator: str = "paged", metric: str = METRIC,
                   tolerance: float = DEFAULT_TOLERANCE, abs_tolerance: float = DEFAULT_ABS_TOLERANCE,
                   source: Mapping[str, Any] | None = None) -> Baseline:
    """A baseline holding every cell key of `cells`: its ratio (if both systems ran) and absolutes."""
    m = measure(cells, key_fields, metric)
    out = []
    for key in sorted(m.keys, key=key_text):
        absolute = {system: v for (k, system), v in sorted(m.values.items()) if k == key}
        out.append(BaselineCell(key=m.key_values[key], ratio=m.ratio(key, numerator, denominator),
                                absolute=absolute))
    if source is None:
        source = {col: sorted({str(v) for v in cells[f"env.{col}"].dropna()})
                  for col in ("git_sha", "gpu") if f"env.{col}" in cells.columns}
    return Baseline(hardware=hardware, key_fields=tuple(key_fields), cells=tuple(out), metric=metric,
                    numerator=numerator, denominator=denominator, tolerance=tolerance,
                    abs_tolerance=abs_tolerance, source=dict(source))


@dataclass(frozen=True)
class Check:
    """One comparison: a ratio of a cell, or an absolute value of (cell, system)."""

    mode: str  # ratio | absolute
    key: Key
    label: str  # "granikv/paged" or the system
    baseline: float
    current: float | None
    tolerance: float
    mixed_call: bool = False  # a ratio whose current two systems were measured in different calls

    @property
    def threshold(self) -> float:
        return self.baseline * (1 - self.tolerance)

    @property
    def status(self) -> str:
        if self.current is None:
            return "missing"
        if self.current < self.threshold - _EPS * abs(self.baseline):
            return "REGRESSION"
        if self.current > self.baseline * (1 + self.tolerance) + _EPS * abs(self.baseline):
            return "improved"
        return "ok"


@dataclass(frozen=True)
class GateReport:
    checks: tuple[Check, ...]
    notes: tuple[str, ...] = ()

    def count(self, status: str) -> int:
        return sum(1 for c in self.checks if c.status == status)

    def exit_code(self, allow_missing: bool = False) -> int:
        if self.count("REGRESSION"):
            return EXIT_REGRESSION
        if self.count("missing") and not allow_missing:
            return EXIT_ERROR
        if not any(c.status != "missing" for c in self.checks):
            return EXIT_ERROR  # nothing was compared: never a silent pass
        return EXIT_PASS

    def _sorted(self) -> list[Check]:
        order = {"REGRESSION": 0, "missing": 1, "improved": 2, "ok": 3}
        return sorted(self.checks, key=lambda c: (order[c.status], c.mode, key_text(c.key)))

    def summary(self) -> str:
        statuses = ("REGRESSION", "missing", "improved", "ok")
        return ", ".join(f"{self.count(s)} {s.lower()}" for s in statuses)

    def to_json(self, exit_code: int, **context: Any) -> dict[str, Any]:
        """The report as a result file: every check with its numbers, the verdict and `context`
        (which results, which baseline, which mode)."""
        return {"format": REPORT_FORMAT, "verdict": VERDICTS[exit_code], "exit_code": exit_code, **context,
                "counts": {s: self.count(s) for s in ("REGRESSION", "missing", "improved", "ok")},
                "checks": [{"status": c.status, "mode": c.mode, "what": c.label, "baseline": c.baseline,
                            "current": c.current, "threshold": c.threshold, "tolerance": c.tolerance,
                            "mixed_call": c.mixed_call,
                            "cell": {f: v for f, v in c.key if v is not None}} for c in self._sorted()],
                "notes": list(self.notes)}

    def markdown(self, exit_code: int, title: str = "Throughput gate") -> str:
        lines = [f"# {title}: {VERDICTS[exit_code]}", "",
                 f"{len(self.checks)} checks: {self.summary()}.", "",
                 "| status | mode | what | baseline | current | change | min ok | cell |",
                 "|---|---|---|--:|--:|--:|--:|---|"]
        for c in self._sorted():
            cur = "—" if c.current is None else f"{c.current:.4g}" + (MIXED_MARK if c.mixed_call else "")
            change = "" if c.current is None else f"{100 * (c.current / c.baseline - 1):+.1f}%"
            lines.append(f"| {c.status} | {c.mode} | {c.label} | {c.baseline:.4g} | {cur} | {change} | "
                         f"{c.threshold:.4g} | {key_text(c.key)} |")
        return "\n".join([*lines, "", *(f"- {n}" for n in self.notes)]).rstrip() + "\n"

    def text(self) -> str:
        lines = [f"{'status':<10} {'mode':<8} {'what':<14} {'baseline':>10} {'current':>10} {'change':>8} "
                 f"{'min ok':>10}  cell"]
        for c in self._sorted():
            cur = "—" if c.current is None else f"{c.current:.4g}" + (MIXED_MARK if c.mixed_call else "")
            change = "" if c.current is None else f"{100 * (c.current / c.baseline - 1):+.1f}%"
            lines.append(f"{c.status:<10} {c.mode:<8} {c.label:<14} {c.baseline:>10.4g} {cur:>10} "
                         f"{change:>8} {c.threshold:>10.4g}  {key_text(c.key)}")
        return "\n".join([*lines, "", f"gate: {len(self.checks)} checks: {self.summary()}", *self.notes]) + "\n"


def compare(baseline: Baseline, cells: pd.DataFrame, *, mode: str = "ratio", hardware: str | None = None,
            tolerance: float | None = None, abs_tolerance: float | None = None) -> GateReport:
    """Check `cells` against `baseline`; raises GateError when the comparison is meaningless."""
    if mode not in MODES:
        raise GateError(f"mode must be one of {MODES}, got {mode!r}")
    if not len(cells):
        raise GateError("no result cells to gate")
    notes = []
    if hardware is not None and hardware != baseline.hardware:
        if mode in ("absolute", "both"):
            raise GateError(f"absolute mode needs the same hardware key: results are {hardware!r}, "
                            f"baseline is {baseline.hardware!r}")
        notes.append(f"note: results hardware {hardware!r} differs from baseline {baseline.hardware!r}; "
                     "ratios only")
    tol = baseline.tolerance if tolerance is None else tolerance
    atol = baseline.abs_tolerance if abs_tolerance is None else abs_tolerance
    for t in (tol, atol):
        if not 0 <= t < 1:
            raise GateError(f"tolerance must be in [0, 1), got {t}")
    m = measure(cells, baseline.key_fields, baseline.metric)
    checks = []
    for bc in baseline.cells:
        key = make_key(bc.key, baseline.key_fields)
        if mode in ("ratio", "both") and bc.ratio is not None:
            checks.append(Check("ratio", key, f"{baseline.numerator}/{baseline.denominator}", float(bc.ratio),
                                m.ratio(key, baseline.numerator, baseline.denominator), tol,
                                mixed_call=m.mixed(key, baseline.numerator, baseline.denominator)))
        if mode in ("absolute", "both"):
            for system, value in bc.absolute.items():
                checks.append(Check("absolute", key, system, value, m.values.get((key, system)), atol))
    mixed = sum(c.mixed_call for c in checks)
    if mixed:
        notes.append(f"note: {mixed} current ratio(s) marked {MIXED_MARK} set {baseline.numerator} and "
                     f"{baseline.denominator} cells of different calls side by side (no rep holds both with one "
                     "env.call_id): taken over every rep, so run-to-run spread enters them")
    known = {make_key(bc.key, baseline.key_fields) for bc in baseline.cells}
    extra = [k for k in m.keys if k not in known]
    if extra:
        notes.append(f"note: {len(extra)} current cell(s) have no baseline entry (not gated), e.g. "
                     f"{key_text(extra[0])}")
    return GateReport(checks=tuple(checks), notes=tuple(notes))


_REP = re.compile(r"(-k\d+)-r\d+")


def point_id(cell_id: str) -> str:
    """A cell id without its repetition (`...-k1-r2` -> `...-k1`): every rep of a configuration
    shares it, whichever sweep ran it (harness.run.sweeps.cell_id)."""
    return _REP.sub(r"\1", cell_id, count=1)


def planned_cells(sweep: str, profile: str) -> list[Cell]:
    """The cells the pipeline profile `profile` runs for conf/sweep/<sweep>.yaml."""
    from harness.run.sweeps import load_profile, load_sweep, sweep_cells

    try:
        return sweep_cells(load_sweep(sweep), load_profile(profile))
    except (FileNotFoundError, ValueError) as e:
        raise GateError(f"cannot plan the cells of sweep {sweep!r} under profile {profile!r}: {e}") from e


def select_cells(cells: pd.DataFrame, wanted: Sequence[Cell], fields: Sequence[str]) -> pd.DataFrame:
    """The rows of `cells` that are one of the `wanted` configurations (any rep): same cell id but
    the rep, and the same value for every key field the planned cell sets (num_prompts and
    output_len are not in the id). GateError when a wanted configuration has no cell, or has
    cells from two sweeps (e.g. a profiled re-run beside the grid's: pass --sweep to pick)."""
    want: dict[str, dict[str, Any]] = {}
    for c in wanted:
        want[point_id(c.cell_id)] = {f: _norm_value(c.values[f]) for f in fields if f in c.values}
    keep, sweeps_of = [], {}
    for i, row in cells.iterrows():
        pid = point_id(str(row["cell_id"]))
        spec = want.get(pid)
        if spec is None:
            continue
        kv = _key_values(row, fields)
        if all(_norm_value(kv.get(f)) == v for f, v in spec.items()):
            keep.append(i)
            sweeps_of.setdefault(pid, set()).add(str(row["sweep"]))
    missing = sorted(set(want) - set(sweeps_of))
    if missing:
        raise GateError(f"{len(missing)} of the {len(want)} wanted cell(s) have no result, e.g. {missing[0]}")
    mixed = {pid: sorted(sw) for pid, sw in sweeps_of.items() if len(sw) > 1}
    if mixed:
        pid, sw = next(iter(sorted(mixed.items())))
        raise GateError(f"{len(mixed)} wanted cell(s) were measured by more than one sweep, e.g. {pid} in {sw}; "
                        "pick the sweeps with --sweep")
    return cells.loc[keep].reset_index(drop=True)


def _strict(obj: Any) -> Any:
    """`obj` with non-finite floats as the strings "inf", "-inf", "nan" (a cell's `rate` is inf):
    Python's `Infinity` token is not JSON, and the report is read by other tools in CI."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, Mapping):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_strict(v) for v in obj]
    return obj


def write_report(report_json: str | None, report_md: str | None, exit_code: int,
                 report: GateReport | None, context: Mapping[str, Any], error: str | None = None) -> None:
    """Write the JSON and Markdown reports (whichever is asked for), also when the gate could not
    judge: CI keeps them as the evidence of the verdict."""
    report = report or GateReport(checks=())
    ctx = {**context, **({"error": error} if error else {})}
    if report_json:
        path = Path(report_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_strict(report.to_json(exit_code, **ctx)), indent=1, allow_nan=False) + "\n",
                        encoding="utf-8")
    if report_md:
        path = Path(report_md)
        path.parent.mkdir(parents=True, exist_ok=True)
        md = report.markdown(exit_code)
        head = [f"- {k}: `{v if isinstance(v, str) else json.dumps(v)}`" for k, v in context.items()
                if v not in (None, [], "", {})]
        if error:
            head.append(f"- error: {error}")
        title, rest = md.split("\n", 1)
        path.write_text("\n".join([title, "", *head, rest]), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.report.gate", description=__doc__.split("\n")[0])
    p.add_argument("--results", required=True, help="results/<hardware> directory")
    p.add_argument("--baseline", required=True, help="baseline JSON (e.g. results/baselines/<hardware>.json)")
    p.add_argument("--mode", choices=MODES, default="ratio")
    p.add_argument("--tolerance", type=float, help="relative tolerance for ratios (default: baseline's)")
    p.add_argument("--abs-tolerance", type=float, help="relative tolerance for absolute values")
    p.add_argument("--sweep", action="append", help="only these sweeps (repeatable)")
    p.add_argument("--hardware", help="hardware key of the results (default: the results directory name)")
    p.add_argument("--allow-missing", action="store_true", help="baseline cells absent from the results pass")
    p.add_argument("--json", dest="report_json", help="also write the report as JSON here")
    p.add_argument("--markdown", dest="report_md", help="also write the report as Markdown here")
    p.add_argument("--write-baseline", action="store_true",
                   help="write the baseline from the results instead")
    p.add_argument("--force", action="store_true", help="with --write-baseline: overwrite an existing file")
    p.add_argument("--cells", metavar="SWEEP",
                   help="with --write-baseline: only the cells conf/sweep/SWEEP.yaml plans (keyed without "
                        "'sweep', so that sweep's runs match them)")
    p.add_argument("--profile", help="with --cells: the pipeline profile that plans them (default: the "
                                     "results directory name, e.g. h200)")
    p.add_argument("--key", nargs="+", default=None,
                   help="cell key fields for --write-baseline (config keys, plus 'sweep'; default: "
                        f"{' '.join(DEFAULT_KEY_FIELDS)}, without 'sweep' with --cells)")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors already; keep 0 for --help
        return int(e.code or 0)
    results_dir = Path(args.results)
    hardware = args.hardware or results_dir.name
    context = {"results": str(results_dir), "sweeps": args.sweep or [], "baseline": str(args.baseline),
               "mode": args.mode}
    try:
        cells = load_cells(results_dir, args.sweep)
        if not len(cells):
            only = f" for sweeps {args.sweep}" if args.sweep else ""
            raise GateError(f"no result cells under {results_dir}{only}")
        if args.write_baseline:
            return _write_baseline(args, cells, results_dir, hardware)
        if args.cells:
            raise GateError("--cells selects the cells of a baseline; use it with --write-baseline")
        baseline = load_baseline(args.baseline)
        report = compare(baseline, cells, mode=args.mode, hardware=hardware, tolerance=args.tolerance,
                         abs_tolerance=args.abs_tolerance)
        context["current"] = {col: sorted({str(v) for v in cells[f"env.{col}"].dropna()})
                              for col in ("git_sha", "gpu") if f"env.{col}" in cells.columns}
        context["baseline_source"] = dict(baseline.source)
    except (GateError, ResultFileError, FileNotFoundError) as e:
        print(f"gate error: {e}", file=sys.stderr)
        if not args.write_baseline:
            write_report(args.report_json, args.report_md, EXIT_ERROR, None, context, error=str(e))
        return EXIT_ERROR
    print(report.text(), end="")
    code = report.exit_code(args.allow_missing)
    write_report(args.report_json, args.report_md, code, report, context)
    print(f"gate: {VERDICTS[code]}")
    return code


def _write_baseline(args: argparse.Namespace, cells: pd.DataFrame, results_dir: Path, hardware: str) -> int:
    out = Path(args.baseline)
    if out.exists() and not args.force:
        raise GateError(f"{out} exists; pass --force to overwrite it")
    key_fields = args.key or (CELL_KEY_FIELDS if args.cells else DEFAULT_KEY_FIELDS)
    extra: dict[str, Any] = {"results": str(results_dir)}
    if args.cells:
        profile = args.profile or results_dir.name
        cells = select_cells(cells, planned_cells(args.cells, profile), key_fields)
        extra.update(cells_of={"sweep": args.cells, "profile": profile},
                     sweeps=sorted({str(s) for s in cells["sweep"]}))
    elif args.profile:
        raise GateError("--profile only goes with --cells")
    base = build_baseline(cells, hardware, key_fields=key_fields,
                          tolerance=DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance,
                          abs_tolerance=DEFAULT_ABS_TOLERANCE if args.abs_tolerance is None else args.abs_tolerance,
                          source=None)
    base = dataclasses.replace(base, source={**base.source, **extra})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(base.to_json(), indent=1) + "\n", encoding="utf-8")
    n_ratio = sum(1 for c in base.cells if c.ratio is not None)
    m = measure(cells, key_fields, base.metric)
    n_mixed = sum(m.mixed(make_key(c.key, key_fields), base.numerator, base.denominator) for c in base.cells)
    print(f"wrote {out}: {len(base.cells)} cells ({n_ratio} with a {base.numerator}/{base.denominator} ratio, "
          f"{n_mixed} of them from mixed calls: no rep holds both systems with one env.call_id)")
    return EXIT_PASS


if __name__ == "__main__":
    sys.exit(main())
