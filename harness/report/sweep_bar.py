"""The hint-free sweep bar: GraniKV without the prefix hint at least matches cascade at every k = 1
ShareGPT point of Table 9 at Lp ≥ 2K.

Why a section of its own beside the A/B rows of `harness.report.hint_free`: the bar spans a whole sweep,
so it is judged from the Table 9 cells, not from `adhoc/` cells measured back to back. A point's
ratio is taken, as the tables take theirs, over the repetitions whose granikv and cascade cells
carry one call id (`env.call_id`) where there are any; else over all its repetitions, and marked ‡
(a mixed-call ratio: the two sides come from different calls, or from files without a call id).
Each side's commits are shown too. Only granikv repetitions measured without the hint count; a
point whose granikv cells all carry the hint is `pending` (re-measure it: `python -m harness.run.batch
lines table9 --stale results/h200`), never judged from the hinted numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.run.results import load_cells

SWEEP = "table9"
MIN_LP = 2048
MIXED_MARK = "‡"  # harness.report.tables.render.MIXED_MARK


@dataclass
class SweepPoint:
    """One (Lp, B) point: throughput per rep of cascade and of granikv without the hint (with each
    cell's rep and call id, in `*_at`), the number of granikv reps measured with it, and the
    commits of the cells read."""

    lp: int
    batch: int
    cascade: list[float] = field(default_factory=list)
    nohint: list[float] = field(default_factory=list)
    hinted: int = 0
    commits: dict[str, set[str]] = field(default_factory=lambda: {"cascade": set(), "granikv": set()})
    cascade_at: list[tuple[int, str | None]] = field(default_factory=list)
    nohint_at: list[tuple[int, str | None]] = field(default_factory=list)

    @property
    def one_call_reps(self) -> set[int]:
        """The reps whose cascade and no-hint granikv cells are there and carry one call id."""
        calls: dict[int, dict[str, list[str | None]]] = {}
        for side, at in (("cascade", self.cascade_at), ("nohint", self.nohint_at)):
            for rep, call in at:
                calls.setdefault(rep, {}).setdefault(side, []).append(call)
        out = set()
        for rep, sides in calls.items():
            ids = sides.get("cascade", []) + sides.get("nohint", [])
            if len(sides) == 2 and None not in ids and len(set(ids)) == 1:
                out.add(rep)
        return out

    def chosen(self) -> tuple[list[float], list[float]]:
        """(cascade, no-hint granikv) tok/s over the one-call reps where there are any, else all."""
        one = self.one_call_reps
        if not one:
            return self.cascade, self.nohint
        return ([t for t, (r, _) in zip(self.cascade, self.cascade_at, strict=True) if r in one],
                [t for t, (r, _) in zip(self.nohint, self.nohint_at, strict=True) if r in one])

    @property
    def ratio(self) -> float | None:
        if not self.cascade or not self.nohint:
            return None
        cascade, nohint = self.chosen()
        return (sum(nohint) / len(nohint)) / (sum(cascade) / len(cascade))

    @property
    def mixed(self) -> bool:
        """The ratio sets cells of different calls side by side (no rep of one call)."""
        return self.ratio is not None and not self.one_call_reps

    @property
    def verdict(self) -> str:
        if not self.nohint:
            return "pending (granikv hinted)" if self.hinted else "pending (no granikv cell)"
        if not self.cascade:
            return "pending (no cascade cell)"
        return "met" if self.ratio >= 1.0 else "not met"


def _value(row: Any, key: str, default: Any) -> Any:
    """The row's value of a config key, `default` where the cell has none (NaN in the frame)."""
    v = row.get(key)
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _eligible(row: Any) -> bool:
    """A plain Table 9 cell of the bar: ShareGPT, k = 1, TP = 1, closed loop, no A/B tag, cascade
    or GraniKV proper (`variant` tells a forced-cascade GraniKV cell apart)."""
    return (row["variant"] in ("cascade", "granikv") and row.get("config.workload") == "sharegpt"
            and int(_value(row, "config.k", 1)) == 1 and int(_value(row, "config.tp", 1)) == 1
            and str(_value(row, "config.rate", "inf")) == "inf" and not _value(row, "config.tag", "")
            and int(row["config.lp"]) >= MIN_LP)


def load_points(results: Path) -> list[SweepPoint]:
    frame = load_cells(results, [SWEEP]) if (results / SWEEP).is_dir() else None
    points: dict[tuple[int, int], SweepPoint] = {}
    for _, row in ([] if frame is None else frame.iterrows()):
        if not _eligible(row):
            continue
        key = (int(row["config.lp"]), int(row["config.batch"]))
        pt = points.setdefault(key, SweepPoint(*key))
        tok = float(row["metrics.output_throughput"])
        sha = str(row["env.git_sha"])[:7]
        call = _value(row, "env.call_id", None)
        at = (int(_value(row, "config.rep", 0)), call if isinstance(call, str) and call else None)
        if row["variant"] == "cascade":
            pt.cascade.append(tok)
            pt.cascade_at.append(at)
            pt.commits["cascade"].add(sha)
        elif bool(_value(row, "config.client.send_prefix_hint", False)):
            pt.hinted += 1
        else:
            pt.nohint.append(tok)
            pt.nohint_at.append(at)
            pt.commits["granikv"].add(sha)
    return [points[k] for k in sorted(points)]


def _mean(xs: Sequence[float]) -> str:
    return f"{sum(xs) / len(xs):.0f} ({len(xs)})" if xs else "—"


def render_section(results: Path) -> list[str]:
    """The section's Markdown lines; none when the results hold no Table 9 cell of the bar."""
    points = load_points(results)
    if not points:
        return []
    header = ("Lp", "B", "cascade (reps)", "granikv no hint (reps)", "granikv reps hinted", "no hint / cascade",
              "≥ 1 × cascade", "git cascade", "git granikv")
    lines = ["## Sweep bar: no hint ≥ cascade at every k = 1 ShareGPT point of Table 9, Lp ≥ 2K", "",
             f"Output tok/s, mean over the repetitions in `{results.name}/{SWEEP}/` (their number in brackets) "
             "whose cascade and granikv cells carry one call id (`env.call_id`) where there are any, else over "
             f"all of them, the ratio then marked {MIXED_MARK} (its two sides come from different calls, or from "
             "files without a call id); only granikv repetitions measured without the hint count, and a point "
             "with none is pending. A point whose two `git` columns agree was measured at one commit.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for pt in points:
        r = pt.ratio
        cascade, nohint = pt.chosen()
        lines.append("| " + " | ".join((
            str(pt.lp), str(pt.batch), _mean(cascade), _mean(nohint), str(pt.hinted),
            "—" if r is None else f"{r:.3f}" + (MIXED_MARK if pt.mixed else ""), pt.verdict,
            "/".join(sorted(pt.commits["cascade"])) or "—", "/".join(sorted(pt.commits["granikv"])) or "—")) + " |")
    judged = [pt for pt in points if pt.ratio is not None]
    met = sum(pt.verdict == "met" for pt in judged)
    mixed = sum(pt.mixed for pt in judged)
    lines += ["", f"Met at {met} of {len(judged)} judged points; {len(points) - len(judged)} pending; "
                  f"{mixed} of the judged ratios from mixed calls ({MIXED_MARK})."]
    return lines
