"""Which committed serving cells were measured before a change that moves their numbers.

Every result file records the commit it was measured at (`env.git_sha`). The engine keeps
changing after a cell is measured, and a cell re-measured at HEAD (as reviewers do, on cells of
their choosing) gives HEAD's number, not the file's. `harness/data/code_changes.yaml` lists the
commits that change what a serving cell measures, each with the cells it can touch (`scope`);
this module asks git, for every cell, which of those commits its own commit does not contain:

    python -m harness.staleness --results results/h200 --out tables/h200/staleness.md

The report says, per sweep and per point (the systems of one Lp/B/k... point run back to back),
the commits the point was measured at and the listed changes it predates: what to re-measure
first, and what a reader of a table should know about the numbers in it. A point whose systems
were measured at different commits is flagged too: its ratio then spans a code change.
`python -m harness.batch lines <sweep> --profile ... --stale results/h200` prints the cell lines
that re-measure a sweep's stale cells (with `overwrite=true`).

It never judges the size of an effect: a change's `why` says what it fixed and where it was
measured, and `docs/perf-notes.md` has the numbers.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from harness.batch import GRANIKV_KNOBS

ROOT = Path(__file__).resolve().parent.parent
CHANGES_PATH = Path(__file__).resolve().parent / "data" / "code_changes.yaml"
SCOPE_KEYS = frozenset({"systems", "workloads", "min_lp", "max_lp", "min_batch", "min_k", "max_k",
                        "tp"})
# the config keys that identify a point (its systems run back to back), besides the sweep and rep
POINT_KEYS = ("model", "tp", "workload", "lp", "batch", "k", "tag")
# granikv's own knobs label a cell within its point instead of splitting the point (as in batch)
CELL_KEYS = GRANIKV_KNOBS


@dataclass(frozen=True)
class CodeChange:
    """A commit that changes what a serving cell measures, and which cells it can touch."""

    commit: str
    title: str
    why: str = ""
    scope: Mapping[str, Any] = field(default_factory=dict)

    def applies(self, config: Mapping[str, Any]) -> bool:
        s = self.scope

        def num(key: str) -> float:
            v = pd.to_numeric(config.get(key), errors="coerce")
            return float("nan") if v is None else float(v)

        if "systems" in s and str(config.get("system")) not in s["systems"]:
            return False
        if "workloads" in s and str(config.get("workload")) not in s["workloads"]:
            return False
        if "tp" in s and int(num("tp")) not in s["tp"]:
            return False
        for key, bound in (("lp", "min_lp"), ("batch", "min_batch"), ("k", "min_k")):
            if bound in s and not num(key) >= s[bound]:  # a missing value (NaN) is out of scope
                return False
        for key, bound in (("lp", "max_lp"), ("k", "max_k")):  # e.g. a change measured not to move longer
            if bound in s and not num(key) <= s[bound]:  # prefixes; more prefixes than a path serves
                return False
        return True


def load_changes(path: Path | str = CHANGES_PATH) -> list[CodeChange]:
    """The registry, checked: every entry names a commit and a title, scopes use known keys."""
    raw = yaml.safe_load(Path(path).read_text()) or []
    out = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or not entry.get("commit") or not entry.get("title"):
            raise ValueError(f"{path}: entry {i} needs a commit and a title")
        scope = dict(entry.get("scope") or {})
        unknown = set(scope) - SCOPE_KEYS
        if unknown:
            raise ValueError(f"{path}: entry {i} ({entry['commit']}): unknown scope keys {sorted(unknown)}")
        out.append(CodeChange(commit=str(entry["commit"]), title=str(entry["title"]),
                              why=str(entry.get("why", "")), scope=scope))
    return out


class Ancestry:
    """`contains(sha, change)`: is `change` in the history of `sha`? (git merge-base, cached).
    None when git does not know one of them (a shallow clone, a fixture's fake commit)."""

    def __init__(self, repo: Path | str = ROOT) -> None:
        self.repo = Path(repo)

    @functools.cache  # noqa: B019 — one Ancestry per report, a few hundred calls
    def contains(self, sha: str, change: str) -> bool | None:
        sha = sha.removesuffix("-dirty")
        for rev in (sha, change):
            ok = subprocess.run(["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=self.repo,
                                capture_output=True).returncode == 0
            if not ok:
                return None
        rc = subprocess.run(["git", "merge-base", "--is-ancestor", change, sha], cwd=self.repo,
                            capture_output=True).returncode
        return {0: True, 1: False}.get(rc)


@dataclass(frozen=True)
class CellAudit:
    path: str
    sweep: str
    system: str  # the variant (granikv_cascade is granikv with the dense pass off)
    config: Mapping[str, Any]
    sha: str
    missing: tuple[str, ...]  # commits of in-scope changes its commit does not contain
    unknown: bool  # git could not place the cell's commit

    @property
    def stale(self) -> bool:
        return bool(self.missing)


def audit_cells(cells: pd.DataFrame, changes: Sequence[CodeChange], ancestry: Ancestry) -> list[CellAudit]:
    """One audit per serving cell (rows of `harness.results`' cell frame)."""
    out = []
    for _, row in cells.iterrows():
        config = {k.removeprefix("config."): v for k, v in row.items() if k.startswith("config.")}
        sha = str(row.get("env.git_sha") or "unknown")
        missing, unknown = [], False
        for ch in changes:
            if not ch.applies(config):
                continue
            has = ancestry.contains(sha, ch.commit)
            if has is None:
                unknown = True
            elif not has and ch.commit not in missing:
                missing.append(ch.commit)
        out.append(CellAudit(path=str(row["path"]), sweep=str(row["sweep"]), system=str(row.get("variant")),
                             config=config, sha=sha, missing=tuple(missing), unknown=unknown))
    return out


def _point(a: CellAudit) -> tuple:
    def norm(v: Any) -> str:
        if v is None or (isinstance(v, float) and v != v):
            return ""
        return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)

    return (a.sweep,) + tuple(norm(a.config.get(k)) for k in POINT_KEYS) + (norm(a.config.get("rep", 0)),)


def _points(audits: Sequence[CellAudit]) -> dict[tuple, list[CellAudit]]:
    points: dict[tuple, list[CellAudit]] = {}
    for a in audits:
        points.setdefault(_point(a), []).append(a)
    return points


def _point_labels(points: Mapping[tuple, Sequence[CellAudit]]) -> dict[tuple, str]:
    """A point is labelled by lp, batch and whatever else varies among its sweep's points."""
    varies: dict[str, set[int]] = {}
    for sweep in {k[0] for k in points}:
        keys = [k for k in points if k[0] == sweep]
        varies[sweep] = {i for i, name in enumerate(POINT_KEYS)
                         if name in ("lp", "batch") or len({k[1 + i] for k in keys}) > 1}
    return {key: " ".join(f"{name}={key[1 + i]}" for i, name in enumerate(POINT_KEYS)
                          if i in varies[key[0]] and key[1 + i]) for key in points}


def _cell_labels(group: Sequence[CellAudit]) -> list[str]:
    """Each cell of a point as its variant, plus the CELL_KEYS that vary among its granikv cells."""
    gk = [a for a in group if a.system.startswith("granikv")]
    vary = [k for k in CELL_KEYS if len({str(a.config.get(k)) for a in gk}) > 1]
    return [a.system + ("(" + ", ".join(f"{k}={a.config.get(k)}" for k in vary) + ")"
                        if vary and a.system.startswith("granikv") else "") for a in group]


def _short(sha: str) -> str:
    return sha[:7] + ("-dirty" if sha.endswith("-dirty") else "")


def render_markdown(audits: Sequence[CellAudit], changes: Sequence[CodeChange]) -> str:
    lines = ["# Committed cells against later engine changes", "",
             "Generated by `python -m harness.staleness` from the result files' `env.git_sha` and "
             "`harness/data/code_changes.yaml` (the commits that change what a serving cell measures). "
             "A cell is *stale* when its commit does not contain a listed change in its scope: "
             "re-measured at HEAD it would not give the number in its file. This says nothing of how "
             "large the difference is (`docs/perf-notes.md` has the measurements).", ""]
    stale = sum(a.stale for a in audits)
    unknown = sum(a.unknown for a in audits)
    lines += [f"{len(audits)} cells, {stale} stale, {len(audits) - stale} current"
              + (f"; {unknown} measured at a commit git cannot place" if unknown else "") + ".", ""]
    lines += ["| sweep | cells | stale | measured at | changes they predate |", "|---|---|---|---|---|"]
    sweeps: dict[str, list[CellAudit]] = {}
    for a in audits:
        sweeps.setdefault(a.sweep, []).append(a)
    for sweep, group in sorted(sweeps.items()):
        shas = sorted({_short(a.sha) for a in group})
        miss = sorted({c for a in group for c in a.missing}, key=[c.commit for c in changes].index)
        lines.append(f"| {sweep} | {len(group)} | {sum(a.stale for a in group)} | {', '.join(shas)} | "
                     f"{', '.join(miss) or '—'} |")
    lines += ["", "## Points", "",
              "One row per point and repetition (its systems run back to back). *mixed*: the systems of "
              "the point were measured at different commits, so its ratio spans a code change.", "",
              "| sweep | point | rep | systems | measured at | stale systems: changes they predate |",
              "|---|---|---|---|---|---|"]
    points = _points(audits)
    labels = _point_labels(points)
    for key, group in sorted(points.items(), key=lambda kv: kv[0]):
        label = labels[key]
        group = sorted(group, key=lambda a: (a.system, str(a.config.get("hot_fraction")),
                                             str(a.config.get("cold_page_size"))))
        names = _cell_labels(group)
        shas = sorted({_short(a.sha) for a in group})
        stale_txt = "; ".join(f"{n}: {', '.join(a.missing)}" for n, a in zip(names, group) if a.stale) or "—"
        lines.append(f"| {key[0]} | {label} | {key[-1]} | {', '.join(names)} | "
                     f"{', '.join(shas)}{' (*mixed*)' if len(shas) > 1 else ''} | {stale_txt} |")
    lines += ["", "## The listed changes", "", "| commit | change | scope | why |", "|---|---|---|---|"]
    for c in changes:
        scope = ", ".join(f"{k}={v}" for k, v in c.scope.items()) or "every cell"
        lines.append(f"| {c.commit} | {c.title} | {scope} | {c.why} |")
    return "\n".join(lines) + "\n"


def stale_paths(results: Path | str, changes: Sequence[CodeChange] | None = None,
                repo: Path | str = ROOT) -> set[Path]:
    """Result files under `results` (resolved paths) that predate an in-scope listed change."""
    from harness.results import load_results

    res = load_results(results)
    audits = audit_cells(res.cells, load_changes() if changes is None else changes, Ancestry(repo))
    return {Path(a.path).resolve() for a in audits if a.stale}


def main(argv: Sequence[str] | None = None) -> int:
    from harness.results import load_results

    ap = argparse.ArgumentParser(prog="python -m harness.staleness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True, help="results/<hardware>")
    ap.add_argument("--out", help="write the Markdown report here (else stdout)")
    ap.add_argument("--changes", default=str(CHANGES_PATH), help="the registry of code changes")
    ap.add_argument("--sweep", action="append", default=[], help="only these sweeps (repeatable)")
    args = ap.parse_args(argv)
    res = load_results(args.results)
    cells = res.cells if not args.sweep else res.cells[res.cells["sweep"].isin(args.sweep)]
    audits = audit_cells(cells, load_changes(args.changes), Ancestry())
    text = render_markdown(audits, load_changes(args.changes))
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}: {len(audits)} cells, {sum(a.stale for a in audits)} stale", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
