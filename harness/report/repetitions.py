"""Run-to-run spread and A/B cells of the committed serving results, in one report.

    python -m harness.report.repetitions [--results results/h200] [--out tables/h200/repetitions.md]

Why: the tables print each point's mean over its complete repetitions (`harness.report.tables`), which
hides how far the repetitions lie apart, and that spread is what says whether a change of a
ratio (an A/B, a re-measure after an engine change, another engineer's run on cells of their
choosing) is a change or noise. Two sections, rendered from the result files alone:

- *Repetitions*: per point (a sweep's cell set without system and rep: the file name between
  `<system>-` and `-r<rep>`), the repetitions present, the complete ones (paged, cascade and
  granikv all measured: the only ones the tables average), each system's mean output throughput
  and spread ((max − min) / mean over the complete repetitions), granikv's ratio over paged and
  over cascade in each complete repetition, marked ‡ where its two cells do not carry one call id
  (`env.call_id`; a file without one is a call of its own), each repetition's call (its id's first
  8 characters, `+` between the calls of a repetition measured in several), and the commits the
  point's cells were measured at (more than one: its ratios span a code change). A cell with knobs
  in its name (Table 18's page sizes, Table 24's f_p) stands in for a system only where the point
  has no plain cell of it and exactly one knobbed one (Table 21); points of one system are left
  out: they have no ratio.
- *A/B cells*: the cells of `adhoc/` that change one server setting, labelled by their `tag` or
  else their `+server.extra.*` overrides (an ad hoc cell with neither is a plain re-measure and
  is left out), beside the untagged plain cells (no knobs in the file name) of the same point,
  system and dispatcher threshold in the sweep folders (the first sweep, in natural order, that
  has them): each side's mean over its
  repetitions, the gain, the engine's extend seconds, the run's time beyond the engine's steps
  (`beyond_engine_s`: time on the HTTP path) and granikv's ratios, baseline → A/B, each over the
  repetitions whose two cells share one call id where there are any (else over all, marked ‡), as
  `harness.report.tables` computes its ratios.

A re-measured cell replaces its file; the file it replaced is in git's history, not here.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SYSTEMS = ("paged", "cascade", "granikv")
MIXED_MARK = "‡"  # a ratio whose two cells do not carry one call id (harness.report.tables.render.MIXED_MARK)
SHORT_CALL = 8  # characters of a call id shown
ADHOC = "adhoc"
# folders under results/<hw>/ that hold no serving cells of the paper's sweeps
NOT_SWEEPS = frozenset({ADHOC, "microbench", "engine", "ncu", "baselines", "gate"})
# what identifies an A/B cell's point besides its system (its config, as `harness.run.cell` writes it)
POINT_KEYS = ("model", "tp", "workload", "lp", "batch", "k")


def run_step_s(doc: dict[str, Any]) -> float | None:
    """The engine loop's step seconds in the measured run: between the warm-up snapshot and the
    end (None without a loop clock)."""
    step, warm = doc.get("engine", {}).get("loop_step_s"), doc.get("engine_after_warmup", {}).get("loop_step_s")
    return None if step is None or warm is None else float(step) - float(warm)


def beyond_engine_s(doc: dict[str, Any]) -> float | None:
    """How much longer the measured run lasted than the engine's steps in it: the client's
    `duration_s` minus `run_step_s` (None without a loop clock)."""
    step, dur = run_step_s(doc), doc.get("metrics", {}).get("duration_s")
    return None if step is None or dur is None else float(dur) - step


def label_of(config: dict[str, Any]) -> str | None:
    """An A/B cell's label: its `tag`, else its `+server.extra.*` overrides; None for neither."""
    if config.get("tag"):
        return str(config["tag"])
    extra = [o.removeprefix("+server.extra.") for o in config.get("overrides", []) if o.startswith("+server.extra.")]
    return ", ".join(extra) or None


@dataclass(frozen=True)
class CellResult:
    """The numbers of one serving cell's result file that this report reads."""

    sweep: str
    point: str  # the file name without `<system>-` and `-r<rep>[-knobs]`
    system: str
    knobs: str  # the file name's suffix after the rep (e.g. `hot_fraction0.3`), "" for a plain cell
    rep: int
    config: dict[str, Any]
    tok_s: float | None
    extend_s: float | None
    beyond_s: float | None
    git: str
    call: str | None = None  # env.call_id (None: the file records no call)

    @property
    def label(self) -> str | None:
        return label_of(self.config)

    def key(self) -> tuple:
        """The A/B identity: the point's config values, the system, the dispatcher threshold (a
        forced-cascade cell has its own m_sat) and the arrival rate (a Poisson cell is not a
        repetition of the saturating one)."""
        return (tuple(self.config.get(k) for k in POINT_KEYS), self.system, self.config.get("m_sat"),
                str(self.config.get("rate", "inf")))


def read_cell(path: Path) -> CellResult | None:
    """One serving cell's numbers; None for a file that is not a serving cell's."""
    doc = json.loads(path.read_text())
    c = doc.get("config")
    if not isinstance(c, dict) or "system" not in c or "metrics" not in doc:
        return None
    system, rep = str(c["system"]), int(c.get("rep", 0))
    head, sep, tail = path.stem.partition(f"-r{rep}")
    if not sep or not head.startswith(system + "-"):
        raise ValueError(f"{path}: file name does not read <system>-...-r<rep>[-knobs] (system={system}, rep={rep})")
    tok = doc["metrics"].get("output_throughput")
    ext = doc.get("engine", {}).get("extend_time_s")
    call = doc.get("env", {}).get("call_id")
    return CellResult(sweep=path.parent.name, point=head[len(system) + 1:], system=system, knobs=tail.lstrip("-"),
                      rep=rep, config=c, tok_s=None if tok is None else float(tok),
                      extend_s=None if ext is None else float(ext), beyond_s=beyond_engine_s(doc),
                      git=str(doc.get("env", {}).get("git_sha", ""))[:7],
                      call=call if isinstance(call, str) and call else None)


def read_results(results: Path) -> list[CellResult]:
    """Every serving cell under `results/<folder>/` (the sweeps and `adhoc/`)."""
    cells = []
    for path in sorted(results.glob("*/*.json")):
        if path.parent.name in NOT_SWEEPS - {ADHOC}:
            continue
        cell = read_cell(path)
        if cell is not None:
            cells.append(cell)
    return cells


# --------------------------------------------------------------------------- repetitions


@dataclass
class Point:
    """One point's cells: output tok/s and call id per repetition and system, and their commits."""

    sweep: str
    name: str
    tok_s: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    calls: dict[int, dict[str, str | None]] = field(default_factory=lambda: defaultdict(dict))
    knobs: set[str] = field(default_factory=set)  # "<system> <knobs>" where a knobbed cell stands in
    gits: set[str] = field(default_factory=set)

    @property
    def reps(self) -> list[int]:
        return sorted(self.tok_s)

    @property
    def complete(self) -> list[int]:
        return [r for r in self.reps if all(s in self.tok_s[r] for s in SYSTEMS)]

    def ratio(self, rep: int, den: str) -> float:
        return self.tok_s[rep]["granikv"] / self.tok_s[rep][den]

    def one_call(self, rep: int, systems: Sequence[str] = SYSTEMS) -> bool:
        """Whether the rep's cells of `systems` are all there and carry one call id."""
        ids = [self.calls.get(rep, {}).get(s) for s in systems]
        return all(s in self.tok_s.get(rep, {}) for s in systems) and None not in ids and len(set(ids)) == 1

    def ratio_text(self, rep: int, den: str) -> str:
        """The rep's granikv/`den` ratio, marked when its two cells come from different calls."""
        return f"{self.ratio(rep, den):.3f}" + ("" if self.one_call(rep, ("granikv", den)) else MIXED_MARK)

    def call_text(self, rep: int) -> str:
        """The rep's call: the short id, `+` between several, `—` for a cell without one."""
        ids = set(self.calls.get(rep, {}).values())
        return "+".join(sorted((i[:SHORT_CALL] if i else "—") for i in ids)) or "—"

    def spread(self, system: str) -> float | None:
        """(max − min) / mean of the system's tok/s over the complete reps; None below two."""
        xs = [self.tok_s[r][system] for r in self.complete]
        return (max(xs) - min(xs)) / statistics.mean(xs) if len(xs) > 1 else None


def points(cells: Sequence[CellResult]) -> list[Point]:
    """The points of the sweep folders' cells that hold more than one system."""
    found: dict[tuple[str, str], Point] = {}
    knobbed: dict[tuple[str, str, int, str], list[CellResult]] = defaultdict(list)
    for c in cells:
        if c.sweep in NOT_SWEEPS or c.system not in SYSTEMS or not c.tok_s:
            continue
        p = found.setdefault((c.sweep, c.point), Point(c.sweep, c.point))
        if c.knobs:
            knobbed[(c.sweep, c.point, c.rep, c.system)].append(c)
        else:
            p.tok_s[c.rep][c.system] = c.tok_s
            p.calls[c.rep][c.system] = c.call
            p.gits.add(c.git)
    for (sweep, name, rep, system), group in knobbed.items():
        p = found[(sweep, name)]
        if system not in p.tok_s.get(rep, {}) and len(group) == 1:
            p.tok_s[rep][system] = group[0].tok_s
            p.calls[rep][system] = group[0].call
            p.knobs.add(f"{system} {group[0].knobs}")
            p.gits.add(group[0].git)
    return [p for p in found.values() if len({s for r in p.reps for s in p.tok_s[r]}) > 1]


def _natural(text: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def render_repetitions(pts: Sequence[Point]) -> list[str]:
    multi = [p for p in pts if len(p.complete) > 1]
    worst_sys = max(((p.spread(s), s, p) for p in multi for s in SYSTEMS), key=lambda t: t[0], default=None)
    worst_ratio = max(((max(p.ratio(r, "paged") for r in p.complete) - min(p.ratio(r, "paged") for r in p.complete), p)
                       for p in multi), key=lambda t: t[0], default=None)
    one_call = [p for p in pts if any(p.one_call(r) for r in p.complete)]
    lines = ["## Repetitions", "",
             "Per point: the repetitions present, the complete ones (paged, cascade and granikv all measured; the "
             "tables average only these, and only those of them measured in one call where there are any), each "
             "system's mean output tok/s and its spread ((max − min) / mean over the complete repetitions), "
             "granikv's ratio over paged (×SGL) and cascade (×SGL-C) per complete repetition, in rep order, "
             f"marked {MIXED_MARK} where its two cells do not carry one call id (`env.call_id`; a file without one "
             "is a call of its own), each repetition's call (the first 8 characters of its id; `+` between the "
             "calls of a repetition measured in several, `—` for cells without one), and the commits the point's "
             "cells were measured at.", "",
             f"{len(pts)} points, {len(multi)} with two or more complete repetitions; {len(one_call)} with a "
             "complete repetition whose three systems come from one call."]
    if worst_sys and worst_ratio:
        spread, system, p = worst_sys
        lines.append(f"Largest per-system spread: {_pct(spread)} ({system}, {p.sweep} {p.name}); largest range of "
                     f"×SGL across repetitions: {worst_ratio[0]:.3f} ({worst_ratio[1].sweep} {worst_ratio[1].name}).")
    lines += ["", "| sweep | point | reps | complete | SGL tok/s | spread | SGL-C tok/s | spread | GKV tok/s | spread "
              "| ×SGL per rep | ×SGL-C per rep | call per rep | git |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(pts, key=lambda p: (_natural(p.sweep), _natural(p.name))):
        cols = []
        for s in SYSTEMS:  # no complete rep: the mean of what ran, marked
            xs = [p.tok_s[r][s] for r in p.complete] or [p.tok_s[r][s] for r in p.reps if s in p.tok_s[r]]
            mark = "" if p.complete else "*"
            cols += [f"{statistics.mean(xs):.0f}{mark}" if xs else "—", _pct(p.spread(s))]
        per = [", ".join(p.ratio_text(r, den) for r in p.complete) or "—" for den in ("paged", "cascade")]
        name = p.name + "".join(f" ({k})" for k in sorted(p.knobs))
        calls = [p.call_text(r) for r in p.reps]
        call_col = "—" if set(calls) == {"—"} else ", ".join(f"{r}: {c}" for r, c in zip(p.reps, calls, strict=True))
        lines.append(f"| {p.sweep} | {name} | {','.join(map(str, p.reps))} | {','.join(map(str, p.complete)) or '—'} "
                     f"| {' | '.join(cols)} | {per[0]} | {per[1]} | {call_col} | {', '.join(sorted(p.gits))} |")
    if any(not p.complete for p in pts):
        lines += ["", "*: the point has no complete repetition; the mean over the repetitions of that system present."]
    return lines


# --------------------------------------------------------------------------- A/B cells


@dataclass(frozen=True)
class ABRow:
    """One system of one A/B label at one point: the A/B cells beside their baseline cells."""

    point: tuple
    label: str
    system: str
    baseline_sweep: str | None
    baseline: tuple[CellResult, ...]
    ab: tuple[CellResult, ...]

    @staticmethod
    def _mean(cells: Sequence[CellResult]) -> float | None:
        xs = [c.tok_s for c in cells if c.tok_s]
        return statistics.mean(xs) if xs else None

    @property
    def baseline_tok_s(self) -> float | None:
        return self._mean(self.baseline)

    @property
    def ab_tok_s(self) -> float | None:
        return self._mean(self.ab)

    @property
    def gain(self) -> float | None:
        b, a = self.baseline_tok_s, self.ab_tok_s
        return a / b - 1 if a and b else None


def one_call_ratio(num: Sequence[CellResult], den: Sequence[CellResult]) -> tuple[float | None, bool]:
    """Mean tok/s of `num` over mean of `den`, over the reps where both have a cell and all those
    cells carry one call id; with no such rep, over every cell, flagged mixed (True)."""
    def one(rep: int) -> bool:
        ids = [c.call for c in (*num, *den) if c.rep == rep]
        return (any(c.rep == rep for c in num) and any(c.rep == rep for c in den) and None not in ids
                and len(set(ids)) == 1)

    reps = {c.rep for c in num} & {c.rep for c in den}
    chosen = {r for r in reps if one(r)}
    n, d = ([c for c in side if c.rep in chosen] if chosen else side for side in (num, den))
    n_tok, d_tok = ABRow._mean(n), ABRow._mean(d)
    if not n_tok or not d_tok:
        return None, False
    return n_tok / d_tok, not chosen


def ab_rows(cells: Sequence[CellResult]) -> list[ABRow]:
    """The labelled cells of `adhoc/`, grouped by (point, label, system), each beside the untagged
    cells of the same point, system and m_sat in the first sweep (natural order) that has them."""
    base: dict[tuple, dict[str, list[CellResult]]] = defaultdict(lambda: defaultdict(list))
    groups: dict[tuple, list[CellResult]] = defaultdict(list)
    for c in cells:
        if c.sweep == ADHOC:
            if c.label is not None:
                groups[(c.key(), c.label)].append(c)
        elif c.sweep not in NOT_SWEEPS and c.label is None and not c.knobs:
            base[c.key()][c.sweep].append(c)
    rows = []
    for (key, label), ab in groups.items():
        sweeps = sorted(base.get(key, {}), key=_natural)
        sweep = sweeps[0] if sweeps else None
        shown = label if key[3] in ("inf", "None") else f"{label} (rate {key[3]})"
        rows.append(ABRow(point=key[0], label=shown, system=key[1], baseline_sweep=sweep,
                          baseline=tuple(sorted(base[key][sweep], key=lambda c: c.rep)) if sweep else (),
                          ab=tuple(sorted(ab, key=lambda c: c.rep))))
    return rows


def _span(values: Sequence[float | None], fmt: str = "{:.1f}") -> str:
    xs = [x for x in values if x is not None]
    if not xs:
        return "—"
    lo, hi = fmt.format(min(xs)), fmt.format(max(xs))
    return lo if lo == hi else f"{lo}–{hi}"


def _tok(x: float | None, n: int) -> str:
    return "—" if x is None else f"{x:.0f} ({n})"


def render_ab(rows: Sequence[ABRow]) -> list[str]:
    lines = ["## A/B cells", "",
             "Cells of `adhoc/` that change one server setting, by label (`tag`, else the `+server.extra` overrides), "
             "beside the untagged cells of the same point, system and m_sat in the sweep named. tok/s: the mean over "
             "each side's repetitions (their count in brackets); gain: A/B over baseline. *beyond engine*: the run's "
             "duration minus the engine loop's step seconds in it (time on the HTTP path).", "",
             "| model / TP | workload | Lp | B | k | label | system | baseline | baseline tok/s | A/B tok/s | gain "
             "| extend s baseline → A/B | beyond engine s baseline → A/B | git (A/B) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by_label: dict[tuple, list[ABRow]] = defaultdict(list)
    for r in rows:
        by_label[(r.point, r.label)].append(r)
    ratio_lines = ["", f"granikv's ratios, baseline → A/B: each over the repetitions whose two cells carry one call id "
                   f"where there are any, else over all of them and marked {MIXED_MARK}.", "",
                   "| model / TP | workload | Lp | B | k | label | ×SGL baseline → A/B | ×SGL-C baseline → A/B |",
                   "|---|---|---|---|---|---|---|---|"]

    def order(item: tuple) -> tuple:
        (point, label), _ = item
        return tuple(_natural(str(v)) for v in point) + (label,)

    for (point, label), rs in sorted(by_label.items(), key=order):
        model, tp, workload, lp, batch, k = point
        rs.sort(key=lambda r: SYSTEMS.index(r.system) if r.system in SYSTEMS else len(SYSTEMS))
        head = f"| {model} / TP={tp} | {workload} | {lp} | {batch} | {k} | {label} |"
        for r in rs:
            gain = "—" if r.gain is None else f"{100 * r.gain:+.1f}%"
            ext = f"{_span([c.extend_s for c in r.baseline])} → {_span([c.extend_s for c in r.ab])}"
            beyond = (f"{_span([c.beyond_s for c in r.baseline], '{:.2f}')} → "
                      f"{_span([c.beyond_s for c in r.ab], '{:.2f}')}")
            lines.append(f"{head} {r.system} | {r.baseline_sweep or '—'} | {_tok(r.baseline_tok_s, len(r.baseline))} "
                         f"| {_tok(r.ab_tok_s, len(r.ab))} | {gain} | {ext} | {beyond} "
                         f"| {', '.join(sorted({c.git for c in r.ab}))} |")
        by_sys = {r.system: r for r in rs}
        cols = []
        for den in ("paged", "cascade"):
            vals = []
            for side in ("baseline", "ab"):
                num_, den_ = (getattr(by_sys[s], side) if s in by_sys else () for s in ("granikv", den))
                value, mixed = one_call_ratio(num_, den_)
                vals.append("—" if value is None else f"{value:.2f}" + (MIXED_MARK if mixed else ""))
            cols.append(" → ".join(vals))
        ratio_lines.append(f"{head} {cols[0]} | {cols[1]} |")
    if not rows:
        lines.append("| — |" + " — |" * 13)
    return lines + ratio_lines


def render(cells: Sequence[CellResult], results: Path) -> str:
    lines = [f"# Repetitions and A/B cells of the committed serving results (`{results.as_posix()}`)", "",
             "Generated by `python -m harness.report.repetitions` from the result files.", ""]
    return "\n".join(lines + render_repetitions(points(cells)) + [""] + render_ab(ab_rows(cells))) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.report.repetitions", description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/h200", help="results/<hw>")
    ap.add_argument("--out", default=None, help="markdown file (default: print)")
    args = ap.parse_args(argv)
    results = Path(args.results)
    if not results.is_dir():
        raise SystemExit(f"{results} is not a folder")
    cells = read_results(results)
    if not cells:
        raise SystemExit(f"no serving cells under {results}/<sweep>/")
    text = render(cells, results)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
