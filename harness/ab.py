"""A/B tables: ad hoc cells that change one server setting, against the sweep's own cells.

    python -m harness.ab --results results/h200 [--baseline table9] [--out tables/h200/ab.md]

Why: an engine option that is off by default (extend CUDA graphs, the long-key split rule) is
measured as a few cells in `results/<hw>/adhoc/` — the same points as the tables' cells, with
`+server.extra.<field>=...` and usually `tag=<label>` — and decided on by comparing them with
the baseline sweep's repetitions of the same point. This renders that comparison from the files
instead of by hand: per point and label, each system's baseline mean (over its reps) and the
A/B cell's output throughput, the gain, `engine.extend_time_s` on both sides, the run's time
beyond the engine's work on both sides (the client's `duration_s` minus the engine loop's step
seconds in the run: time spent waiting on the HTTP path, perf-notes "Session 13"), and granikv's
ratios over paged and cascade on both sides (A/B ratios from the A/B cells of one label).

A cell's label is its `tag` when set, else its `+server.extra.*` overrides; an ad hoc cell with
neither is a plain re-measure and is left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

SYSTEMS = ("paged", "cascade", "granikv")
POINT_KEYS = ("model", "tp", "workload", "lp", "batch", "k")


def label_of(config: dict[str, Any]) -> str | None:
    extra = [o.removeprefix("+server.extra.") for o in config.get("overrides", [])
             if o.startswith("+server.extra.")]
    if config.get("tag"):
        return str(config["tag"])
    return ", ".join(extra) or None


def _cells(folder: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        c, m, e = doc["config"], doc.get("metrics", {}), doc.get("engine", {})
        out.append({"point": tuple(c.get(k) for k in POINT_KEYS), "system": c["system"], "label": label_of(c),
                    "tok_s": m.get("output_throughput"), "extend_s": e.get("extend_time_s"),
                    "beyond_s": beyond_engine_s(doc),
                    "m_sat": c.get("m_sat"), "git": str(doc.get("env", {}).get("git_sha", ""))[:7]})
    return out


def run_step_s(doc: dict[str, Any]) -> float | None:
    """The engine loop's step seconds in the measured run: between the warm-up snapshot and the
    end (None without a loop clock)."""
    step, warm = doc.get("engine", {}).get("loop_step_s"), doc.get("engine_after_warmup", {}).get("loop_step_s")
    return None if step is None or warm is None else float(step) - float(warm)


def beyond_engine_s(doc: dict[str, Any]) -> float | None:
    """How much longer the measured run lasted than the engine's steps in it: `duration_s` minus
    `run_step_s` (None without a loop clock)."""
    step, dur = run_step_s(doc), doc.get("metrics", {}).get("duration_s")
    return None if step is None or dur is None else float(dur) - step


def write_or_print(text: str, out: str | None) -> None:
    """A rendered Markdown report: to `out` (folders made) when given, else to stdout."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        print(f"wrote {out}")
    else:
        print(text, end="")


def _span(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "—"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if len(values) == 1 else f"{fmt.format(lo)}–{fmt.format(hi)}"


def compare(results: Path, baseline: str = "table9") -> list[dict[str, Any]]:
    """One record per (point, label, system): baseline reps and the A/B cell."""
    base: dict[tuple, list[dict]] = defaultdict(list)
    for c in _cells(results / baseline):
        if c["label"] is None:  # the same point, system and dispatcher threshold (a forced-cascade
            base[(c["point"], c["system"], c["m_sat"])].append(c)  # cell has its own m_sat)
    ab = [c for c in _cells(results / "adhoc") if c["label"] is not None]
    recs = []
    for c in ab:
        b = base.get((c["point"], c["system"], c["m_sat"]), [])
        b_tok = [x["tok_s"] for x in b if x["tok_s"]]
        recs.append({
            "point": c["point"], "label": c["label"], "system": c["system"],
            "baseline_reps": len(b_tok), "baseline_tok_s": statistics.mean(b_tok) if b_tok else None,
            "ab_tok_s": c["tok_s"], "gain": (c["tok_s"] / statistics.mean(b_tok) - 1) if b_tok and c["tok_s"] else None,
            "baseline_extend_s": [x["extend_s"] for x in b if x["extend_s"] is not None], "ab_extend_s": c["extend_s"],
            "baseline_beyond_s": [x["beyond_s"] for x in b if x["beyond_s"] is not None], "ab_beyond_s": c["beyond_s"],
            "ab_git": c["git"], "baseline_git": sorted({x["git"] for x in b}),
        })
    return recs


def _ratio(recs: list[dict], key: str, num: str, den: str) -> float | None:
    by = {r["system"]: r[key] for r in recs}
    return by[num] / by[den] if by.get(num) and by.get(den) else None


def render(recs: list[dict[str, Any]], baseline: str) -> str:
    lines = [f"# A/B cells (`adhoc/`) against `{baseline}/`", "",
             "Generated by `python -m harness.ab`; baseline = the mean over the sweep's repetitions of the "
             "point (their count in brackets); gain = A/B over that mean. One A/B repetition each.", "",
             "| model / TP | workload | Lp | B | k | label | system | baseline tok/s | A/B tok/s | gain "
             "| extend_time_s baseline → A/B | run beyond engine s baseline → A/B | git (A/B) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in recs:
        groups[(r["point"], r["label"])].append(r)
    ratio_lines = ["", "| model / TP | Lp | B | label | GKV/SGL baseline → A/B | GKV/SGL-C baseline → A/B |",
                   "|---|---|---|---|---|---|"]
    for (point, label), rs in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        model, tp, workload, lp, batch, k = point
        rs.sort(key=lambda r: SYSTEMS.index(r["system"]) if r["system"] in SYSTEMS else 9)
        for r in rs:
            ext = _span(r["baseline_extend_s"])
            ext += f" → {r['ab_extend_s']:.1f}" if r["ab_extend_s"] is not None else " → —"
            beyond = _span(r["baseline_beyond_s"], "{:.2f}")
            beyond += f" → {r['ab_beyond_s']:.2f}" if r["ab_beyond_s"] is not None else " → —"
            bt = f"{r['baseline_tok_s']:.0f} ({r['baseline_reps']})" if r["baseline_tok_s"] else "—"
            gain = f"{100 * r['gain']:+.1f}%" if r["gain"] is not None else "—"
            lines.append(f"| {model} / TP={tp} | {workload} | {lp} | {batch} | {k} | {label} | {r['system']} | {bt} | "
                         f"{r['ab_tok_s']:.0f} | {gain} | {ext} | {beyond} | {r['ab_git']} |")
        cols = []
        for den in ("paged", "cascade"):
            b, a = (_ratio(rs, key, "granikv", den) for key in ("baseline_tok_s", "ab_tok_s"))
            cols.append(" → ".join(f"{x:.2f}" if x is not None else "—" for x in (b, a)))
        ratio_lines.append(f"| {model} / TP={tp} | {lp} | {batch} | {label} | {cols[0]} | {cols[1]} |")
    if not recs:
        lines.append("| — | — | — | — | — | — | — | — | — | — | — | — | — |")
    return "\n".join(lines + ratio_lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results/h200", help="results/<hardware>")
    ap.add_argument("--baseline", default="table9", help="the sweep whose cells are the baseline")
    ap.add_argument("--out", default=None, help="markdown file (default: print)")
    args = ap.parse_args(argv)
    results = Path(args.results)
    if not (results / "adhoc").is_dir():
        raise SystemExit(f"{results}/adhoc does not exist: no A/B cells to compare")
    write_or_print(render(compare(results, args.baseline), args.baseline), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
