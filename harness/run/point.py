"""The point: the cells a ratio compares, measured together as one job in one call.

A *point* is the cells of one sweep that share every value but the system and granikv's own
knobs (GRANIKV_KNOBS) — the repetition included: paged, cascade and granikv at one (model, TP,
workload, Lp, B, k, rep, ...), with Table 18's COLD page sizes, Table 21's and 24's HOT shares and
Tables 13/14's forced-cascade GraniKV beside them. The tables' ratios compare the cells of a
point, and two calls on the same GPU differ by up to 7% per system, so a point is the unit of
measurement: its cells run back to back in one call, each recording the call's id
(`env.call_id`, from GRANIKV_CALL_ID: harness.run.env), and none is kept from another call.

    python -m harness.run.point list h200 [--sweep table9]          # a profile's points, in run order
    python -m harness.run.point run table9 llama-3.1-8b-tp1-sharegpt-lp16384-b256-k1-r0 \\
        --profile profiles/h200/pipeline.yaml                    # one point (Snakemake's job)

`run` measures every cell of the point with `python -m harness.run.cell`, one after the other with
one fresh GRANIKV_CALL_ID exported to each, re-measuring (overwrite=true) a cell whose result
file exists, so all the point's cells come out of this call. The systems run in the point's
canonical order (paged, cascade, granikv, then any other variant: knobbed granikv cells, other
systems) rotated by the rep — rep r starts at index r mod n — so over n reps each goes first once
and no system always runs on a cold or a warm machine. A cell that fails is reported, the others
still run, and the exit code is 1. The Snakefile runs one such job per point; `harness.run.batch run`
runs a cell list's points the same way within a time budget.

A point's id is its cells' id without the system and the knobs (`point_id`), unique in its sweep
and safe in file names, shell words and Snakemake rule names.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from harness.run.env import CALL_ID_ENV, new_call_id
from harness.run.proc import ROOT, cell_command, run_until
from harness.run.sweeps import (
    CELL_DEFAULTS,
    Cell,
    PipelineProfile,
    _fmt,
    _identity,
    cell_id,
    load_profile,
    load_sweep,
    plan,
    sweep_cells,
)

# granikv's own knobs (HOT share, COLD page size, the dispatcher's M_sat, the levels of a tree read
# once per step: the engine reads each only for granikv): a point's granikv cells may set them
# (Tables 13, 14, 18, 21, 24; the tree sweep's two-level A/B) while its baselines keep the
# defaults, so they do not split a point
GRANIKV_KNOBS = ("hot_fraction", "cold_page_size", "m_sat", "share_depth")
SYSTEM_ORDER = ("paged", "cascade", "granikv")
# what a cell line names besides its point: its system, its knobs, and whether it may overwrite
_NOT_POINT = frozenset({"system", "overwrite", *GRANIKV_KNOBS})

T = TypeVar("T")


# --------------------------------------------------------------------------- what a point is


def _norm(value: Any) -> str:
    """A value as text comparable between a sweep's values and a cell line's overrides."""
    if value is None or value in ("null", "None", "~"):
        return "None"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, sort_keys=True, default=str)
    try:
        return _fmt(float(value))
    except (TypeError, ValueError):
        return str(value)


def point_key(values: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """What the cells of a point share: every value but the system and granikv's knobs."""
    return tuple(sorted((k, _norm(v)) for k, v in values.items() if k not in _NOT_POINT))


def point_id(values: Mapping[str, Any]) -> str:
    """A cell's id without the system and the knobs: `{model}-tp{tp}-{workload}-lp{lp}-b{batch}-k{k}-r{rep}`
    plus the point's own id extras (`page_size`, `rate`, `tag`)."""
    v = {k: x for k, x in _identity(values).items() if k not in GRANIKV_KNOBS}
    return cell_id({**v, "system": "_"})[2:]


def is_plain(values: Mapping[str, Any]) -> bool:
    """No granikv knob away from its default (conf/config.yaml)."""
    return all(_norm(values.get(k, CELL_DEFAULTS[k])) == _norm(CELL_DEFAULTS[k]) for k in GRANIKV_KNOBS)


def rank(values: Mapping[str, Any]) -> int:
    """A cell's place in its point's canonical order: paged, cascade, granikv, then any other
    variant (a knobbed cell, another system)."""
    system = str(values.get("system"))
    return SYSTEM_ORDER.index(system) if system in SYSTEM_ORDER and is_plain(values) else len(SYSTEM_ORDER)


def run_order(items: Sequence[T], rep: int, values_of: Callable[[T], Mapping[str, Any]]) -> list[T]:
    """The point's items in canonical order (ties: as given) rotated by the rep: rep r starts at
    index r mod n, so over n reps each system runs first once."""
    ordered = sorted(items, key=lambda x: rank(values_of(x)))
    if not ordered:
        return ordered
    r = int(rep) % len(ordered)
    return ordered[r:] + ordered[:r]


@dataclass(frozen=True)
class Point:
    """The cells of one sweep at one point, in canonical order."""

    sweep: str
    point_id: str
    cells: tuple[Cell, ...]

    @property
    def rep(self) -> int:
        return int(self.cells[0].values.get("rep", 0))

    @property
    def gpus(self) -> int:
        return max(c.gpus for c in self.cells)

    def run_order(self) -> list[Cell]:
        return run_order(self.cells, self.rep, lambda c: c.values)

    def paths(self, profile: PipelineProfile) -> list[str]:
        return [c.path(profile) for c in self.cells]


def points(cells: Iterable[Cell]) -> list[Point]:
    """Cells grouped into points, in first-seen order (each point's cells in canonical order).
    Raises ValueError when two points of a sweep would share an id (they differ only in values a
    cell id does not name, e.g. num_prompts, and hold different systems)."""
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.sweep, point_key(c.values)), []).append(c)
    out, seen = [], {}
    for (sweep, key), members in groups.items():
        pid = point_id(members[0].values)
        if (sweep, pid) in seen:
            raise ValueError(
                f"sweep {sweep}: two points have the id {pid}: {dict(seen[(sweep, pid)])} and "
                f"{dict(key)} (they differ only in values the cell id does not name)"
            )
        seen[(sweep, pid)] = key
        out.append(Point(sweep=sweep, point_id=pid, cells=tuple(sorted(members, key=lambda c: rank(c.values)))))
    return out


def find_point(sweep: str, pid: str, profile: PipelineProfile) -> Point:
    for p in points(sweep_cells(load_sweep(sweep), profile)):
        if p.point_id == pid:
            return p
    raise LookupError(
        f"no point {pid!r} in sweep {sweep} under profile {profile.name} "
        f"(`python -m harness.run.point list {profile.name} --sweep {sweep}` lists them)"
    )


# --------------------------------------------------------------------------- cell lines


def line_values(overrides: Sequence[str]) -> dict[str, str]:
    """A cell line's `key=value` overrides as a mapping (a `+`/`++` prefix dropped)."""
    out = {}
    for o in overrides:
        key, sep, value = o.partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def line_key(overrides: Sequence[str]) -> frozenset[str]:
    """What a cell line shares with the other lines of its point: its overrides but the system,
    granikv's knobs and `overwrite`."""
    return frozenset(o for o in overrides if o.partition("=")[0].lstrip("+~") not in _NOT_POINT)


def group_lines(lines: Sequence[Sequence[str]]) -> list[list[int]]:
    """The points of a cell list: runs of consecutive lines with the same `line_key`, as indices."""
    groups: list[list[int]] = []
    for i, ov in enumerate(lines):
        if groups and line_key(lines[groups[-1][0]]) == line_key(ov):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def with_overwrite(overrides: Sequence[str]) -> list[str]:
    """The line with `overwrite=true` (once, replacing any overwrite=...)."""
    return [o for o in overrides if not o.startswith("overwrite=")] + ["overwrite=true"]


def call_of(path: Path) -> str | None:
    """The call id a result file records (None: none recorded, or not a readable result)."""
    try:
        cid = json.loads(Path(path).read_text()).get("env", {}).get("call_id")
    except (OSError, ValueError, AttributeError):
        return None
    return cid if isinstance(cid, str) and cid else None


def one_call(paths: Iterable[Path]) -> bool:
    """Whether the existing files among `paths` come from one call (a file without a call id is
    a call of its own; none or one file: trivially one)."""
    calls: list[object] = []
    for p in paths:
        if Path(p).exists():
            cid = call_of(Path(p))
            calls.append(cid if cid is not None else object())
    return len(set(calls)) <= 1


# --------------------------------------------------------------------------- running a point


def run_cell(
    overrides: Sequence[str],
    call_id: str,
    log: IO[str] | None,
    timeout_s: float | None = None,
    python: str | None = None,
) -> int | str:
    """One cell of a point: `python -m harness.run.cell <overrides>` with GRANIKV_CALL_ID=call_id,
    its output into `log` (None: this process's stdout), stopped cleanly past `timeout_s`
    (harness.run.proc.run_until)."""
    (log or sys.stdout).flush()
    env = {**os.environ, CALL_ID_ENV: call_id}
    return run_until(cell_command(overrides, python), log, timeout_s, env=env)


def run_point(point: Point, profile: PipelineProfile, timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Measure every cell of `point` in one call (see the module docstring), the cells' output on
    this process's stdout; a report per cell."""
    call = new_call_id()
    order = point.run_order()
    print(
        f"point {point.sweep}/{point.point_id}: {len(order)} cells in one call {call}, order: "
        f"{', '.join(c.cell_id for c in order)}",
        flush=True,
    )
    report = []
    for i, cell in enumerate(order):
        path = ROOT / cell.path(profile)
        ov = cell.overrides(profile)
        if path.exists():
            ov = with_overwrite(ov)
        t = time.monotonic()
        rc = run_cell(ov, call, None, timeout_s)
        if rc == 0 and not path.exists():
            rc = "no result file"  # harness.run.cell skipped it (a system not installed here)
        s = round(time.monotonic() - t, 1)
        report.append({"cell": cell.cell_id, "status": rc, "s": s, "call_id": call})
        print(
            f"point {point.point_id} [{i + 1}/{len(order)}] {cell.cell_id}: "
            f"{'ok' if rc == 0 else f'FAILED ({rc})'} in {s:.0f} s",
            flush=True,
        )
    failed = [r["cell"] for r in report if r["status"] != 0]
    if failed:
        print(f"point {point.point_id}: {len(failed)} of {len(order)} cells failed: {', '.join(failed)}", flush=True)
    return report


# --------------------------------------------------------------------------- CLI


def profile_of(arg: str) -> PipelineProfile:
    """A pipeline profile from a file, a profile name, or its mapping as JSON (the Snakefile
    passes JSON when `--config` changed the profile's file)."""
    if arg.lstrip().startswith("{"):
        return PipelineProfile.from_dict(json.loads(arg))
    return load_profile(arg)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.run.point",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure one point's cells in one call")
    r.add_argument("sweep")
    r.add_argument("point_id")
    r.add_argument("--profile", required=True, help="pipeline.yaml, a profile name, or the profile as JSON")
    r.add_argument("--timeout-s", type=float, default=None, help="stop a cell running longer (default: none)")
    ls = sub.add_parser("list", help="a profile's points: id, GPUs, cells in run order")
    ls.add_argument("profile", help="pipeline.yaml or a profile name")
    ls.add_argument("--sweep", action="append", help="only this sweep (repeatable; `gate` too)")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        prof = profile_of(args.profile)
        cells = (
            [c for s in args.sweep for c in sweep_cells(load_sweep(s), prof)] if args.sweep else plan(prof).all_cells()
        )
        found = points(cells)
        for p in found:
            systems = " ".join(str(c.values["system"]) + _knobs(c.values) for c in p.run_order())
            print(f"{p.sweep} {p.point_id} gpus={p.gpus}: {systems}")
        print(f"{len(found)} points, {sum(len(p.cells) for p in found)} cells", file=sys.stderr)
        return 0
    prof = profile_of(args.profile)
    try:
        point = find_point(args.sweep, args.point_id, prof)
    except (LookupError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = run_point(point, prof, timeout_s=args.timeout_s)
    return 0 if all(r["status"] == 0 for r in report) else 1


def _knobs(values: Mapping[str, Any]) -> str:
    set_ = [
        f"{k}={_norm(values[k])}" for k in GRANIKV_KNOBS if k in values and _norm(values[k]) != _norm(CELL_DEFAULTS[k])
    ]
    return f"[{','.join(set_)}]" if set_ else ""


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # SIGTERM (Snakemake stopping the job) unwinds through run_until, which stops the running cell
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    sys.exit(main())
