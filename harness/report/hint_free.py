"""Hint-free sharing A/B: GraniKV with and without the `shared_prefix_len` hint.

    python -m harness.report.hint_free --results results/h200 --out tables/h200/hint-free.md

Why a table of its own: GraniKV finds shared prefixes without the client's hint (promotions
re-point live readers, classes by shared run, COLD rows classes, nested agent classes;
docs/ARCHITECTURE.md "Storage" and "Attention"), and the claim that it needs no hint is a
comparison of cells meant to be measured back to back in one call: the `adhoc/` cells tagged
`hint` and `nohint` (`client.send_prefix_hint` true/false), beside the paged or cascade cell of
the same point. A ratio whose two cells do not carry one call id (`env.call_id`; a file without
one is a call of its own) is marked ‡, as the tables mark theirs. The table-9-style sweeps are not
mixed into these rows. The bar that spans Table 9 gets a section of its own below the rows
(`harness.report.sweep_bar`).

A row is one workload point (workload, Lp, B, k, arrival rate). Closed-loop points compare output
throughput; a Poisson point compares TPOT p50 (`metrics.median_tpot_ms`: at a fixed arrival rate
the throughput is the rate). Each row carries the hint-free bars for it, judged from the same
numbers, and the decode passes the no-hint cell's batches formed (the engine's step counters over
the measured run, warm-up left out), which tell whether the prefix classes formed without a hint.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.report.sweep_bar import render_section

ADHOC = "adhoc"
MIXED_MARK = "‡"  # harness.report.tables.render.MIXED_MARK
TAGS = ("hint", "nohint")
COLUMNS = ("paged", "cascade", "hint", "nohint")  # a row's cells: the baselines and granikv's two sides
PASSES = ("rows", "ext", "dense", "cascade")  # decode passes over a shared run (granikv's step counters)


@dataclass(frozen=True)
class Point:
    """One workload point of the A/B: the config values its cells share."""

    label: str
    workload: str
    lp: int
    batch: int
    k: int
    rate: float = float("inf")

    def matches(self, cfg: dict[str, Any]) -> bool:
        return (cfg.get("workload"), int(cfg.get("lp", -1)), int(cfg.get("batch", -1)), int(cfg.get("k") or 1),
                float(str(cfg.get("rate", "inf")))) == (self.workload, self.lp, self.batch, self.k, self.rate)

    @property
    def closed_loop(self) -> bool:
        return self.rate == float("inf")


@dataclass(frozen=True)
class Bar:
    """One of the hint-free bars: `nohint` over `other` at least (or at most) `ratio`. For a
    throughput row higher is better (at least); for a TPOT row lower is (at most)."""

    other: str
    ratio: float
    at_most: bool = False

    def text(self) -> str:
        return f"{'≤' if self.at_most else '≥'} {self.ratio:g} × {self.other}"

    def met(self, ratio: float | None) -> bool | None:
        if ratio is None:
            return None
        return ratio <= self.ratio if self.at_most else ratio >= self.ratio


POINTS: tuple[tuple[Point, tuple[Bar, ...]], ...] = (
    (Point("ShareGPT Lp=16K", "sharegpt", 16384, 256, 1), (Bar("hint", 0.97), Bar("cascade", 1.0))),
    (Point("multiprefix k=16 Lp=8K", "multiprefix", 8192, 256, 16), (Bar("hint", 0.97),)),
    (Point("hetero k=4 Lp=16K", "hetero", 16384, 256, 4), (Bar("hint", 0.97),)),
    (Point("multiprefix k=64 Lp=8K", "multiprefix", 8192, 256, 64), (Bar("paged", 1.4),)),
    (Point("agents k=8 Lp=8K La=2K", "agents", 8192, 256, 8), (Bar("cascade", 1.3), Bar("hint", 0.97))),
    (Point("ShareGPT Lp=16K, Poisson 16 req/s", "sharegpt", 16384, 256, 1, 16.0),
     (Bar("hint", 1.03, at_most=True),)),
)


@dataclass(frozen=True)
class Cell:
    path: str
    doc: dict[str, Any]

    @property
    def git(self) -> str:
        return str(self.doc.get("env", {}).get("git_sha") or "?")[:7]

    @property
    def call(self) -> str | None:
        """The call id the cell recorded (None: none)."""
        cid = self.doc.get("env", {}).get("call_id")
        return cid if isinstance(cid, str) and cid else None

    def value(self, closed_loop: bool) -> float:
        m = self.doc["metrics"]
        return float(m["output_throughput"] if closed_loop else m["median_tpot_ms"])


def load_cells(results: Path) -> list[Cell]:
    """The `adhoc/` cells tagged `hint` or `nohint`, named from the results folder's parent on
    (`results/h200/adhoc/...` when given `results/h200`), so the output does not depend on the cwd."""
    out = []
    for p in sorted((results / ADHOC).glob("*.json")):
        doc = json.loads(p.read_text())
        if doc.get("config", {}).get("tag") in TAGS:
            out.append(Cell(f"{results.parent.name}/{results.name}/{ADHOC}/{p.name}", doc))
    return out


def row_cells(point: Point, cells: Sequence[Cell]) -> dict[str, Cell]:
    """The point's cells by column: paged and cascade (either tag: they ignore the hint;
    admission waits on prompt blocks another request is computing, hint or not), granikv's
    `hint` and `nohint`."""
    out: dict[str, Cell] = {}
    for c in cells:
        cfg = c.doc["config"]
        if not point.matches(cfg):
            continue
        col = cfg["tag"] if cfg["system"] == "granikv" else cfg["system"]
        if col in COLUMNS:
            if col in out:
                raise ValueError(f"two cells for {point.label} / {col}: {out[col].path}, {c.path}")
            out[col] = c
    return out


def _run_counter(doc: dict[str, Any], key: str) -> int:
    """A step counter over the measured run: the end value minus the warm-up snapshot."""
    eng, warm = doc.get("engine", {}), doc.get("engine_after_warmup", {})
    return int(eng.get(key) or 0) - int(warm.get(key) or 0)


def class_summary(doc: dict[str, Any]) -> str:
    """Which shared-run passes the cell's decode steps ran, compactly: per pass the share of the
    measured run's decode steps that ran it and the classes per such step; the promoted readers."""
    eng = doc["engine"]
    steps = _run_counter(doc, "decode_steps")
    decisions = eng.get("class_decisions") or {}
    parts = []
    for name in PASSES:
        n = _run_counter(doc, f"{name}_steps")
        if n > 0 and steps > 0:
            parts.append(f"{name} {n / steps:.2f} ({decisions.get(name, 0) / n:.1f}/step)")
    if not parts:
        plain = decisions.get("plain", 0)
        parts.append(f"plain only ({plain / max(1, int(eng.get('decode_steps') or 0)):.1f} classes/step)")
    readers = (eng.get("storage") or {}).get("promoted_readers")
    if readers is not None:
        parts.append(f"promoted readers {readers}")
    return f"{steps} steps: " + ", ".join(parts)


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def one_call(*cells: Cell) -> bool:
    """Whether the cells all carry one call id."""
    ids = [c.call for c in cells]
    return None not in ids and len(set(ids)) == 1


def stale_marker(cells: Sequence[Cell], changes: Sequence[Any] | None = None, ancestry: Any = None) -> str:
    """"§" when a row's cell predates a listed engine change in its scope (harness.run.engine_changes),
    "" when none does or git cannot tell (a shallow clone). `changes` and `ancestry` (its git
    answers cached) are loaded once per table by the caller, else here."""
    from harness.run.engine_changes import Ancestry, load_changes, predated

    changes = load_changes() if changes is None else changes
    ancestry = Ancestry() if ancestry is None else ancestry
    for c in cells:
        missing = predated(c.doc["config"], str(c.doc.get("env", {}).get("git_sha") or "unknown"), changes, ancestry)
        if missing:
            return "§"
    return ""


def render(results: Path) -> str:
    from harness.run.engine_changes import Ancestry, load_changes

    cells = load_cells(results)
    changes, ancestry = load_changes(), Ancestry()
    header = ("workload point (B=256)", "metric", "paged", "cascade", "granikv hint", "granikv no hint",
              "no hint / hint", "no hint / cascade", "no hint / paged", "hint-free bars", "no-hint classes",
              "git")
    lines = ["# Hint-free sharing: GraniKV with and without the prefix hint", "",
             "<!-- generated by `python -m harness.report.hint_free`; do not edit: re-render -->", "",
             "GraniKV with (`hint`) and without (`no hint`) the client's `shared_prefix_len` field "
             "(`client.send_prefix_hint`), beside the paged and cascade cells of the same point "
             "(one rep each; `—`: not measured). Closed-loop rows: output tok/s (higher is "
             "better); the Poisson row: TPOT p50 ms (lower is better). No-hint classes: of the measured run's "
             "decode steps, the share that ran each shared-run pass (classes per such step), and the readers "
             "re-pointed by promotions (docs/ARCHITECTURE.md, Storage and Attention). § after a row's "
             "label: one of its cells predates a later engine change listed in "
             "`harness/data/engine_changes.yaml` (`python -m harness.run.engine_changes --results <dir> "
             f"--sweep adhoc`). {MIXED_MARK} after a ratio: its two cells do not carry one call id "
             "(`env.call_id`; a file without one is a call of its own), so it sets cells of different calls "
             "side by side and run-to-run spread enters it.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    sources, n_mixed = [], 0
    for point, bars in POINTS:
        by = row_cells(point, cells)
        if not by:
            continue
        sources += [c.path for c in by.values()]
        val = {col: (by[col].value(point.closed_loop) if col in by else None) for col in COLUMNS}
        nohint = val["nohint"]
        ratio = {o: (nohint / val[o] if nohint is not None and val[o] else None) for o in ("hint", "cascade", "paged")}
        mixed = {o: ratio[o] is not None and not one_call(by["nohint"], by[o]) for o in ratio}
        n_mixed += sum(mixed.values())
        judged = []
        for bar in bars:
            met = bar.met(ratio[bar.other])
            judged.append(f"{bar.text()}: {'—' if met is None else ('met' if met else 'not met')}")
        spec = ".0f" if point.closed_loop else ".2f"
        label = point.label + stale_marker(list(by.values()), changes, ancestry)
        lines.append("| " + " | ".join((
            label, "output tok/s" if point.closed_loop else "TPOT p50 ms",
            *(_fmt(val[c], spec) for c in COLUMNS),
            *(_fmt(ratio[o], ".3f") + (MIXED_MARK if mixed[o] else "") for o in ("hint", "cascade", "paged")),
            "; ".join(judged), class_summary(by["nohint"].doc) if "nohint" in by else "—",
            "/".join(sorted({c.git for c in by.values()})))) + " |")
    lines += ["", f"Ratios from mixed calls ({MIXED_MARK}): {n_mixed}.", "",
              "Source: " + ", ".join(f"`{p}`" for p in sources) + "."]
    section = render_section(results)
    if section:
        lines += ["", *section]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/h200", help="results folder of one hardware (holds adhoc/)")
    ap.add_argument("--out", default="tables/h200/hint-free.md", help="Markdown file to write")
    args = ap.parse_args(argv)
    Path(args.out).write_text(render(Path(args.results)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
