"""Which committed serving cells were measured before a change that moves their numbers.

Every result file records the commit it was measured at (`env.git_sha`), and the engine keeps
changing after a cell is measured: a cell re-measured at HEAD gives HEAD's number, not the file's.
`harness/data/engine_changes.yaml` lists the commits that change what a serving cell measures, each
with the cells it can touch (`scope`); a cell *predates* a change when the change is in its scope
and is not an ancestor of the cell's commit (`git merge-base --is-ancestor`). The tables mark each
row built from such a cell with § (`harness.report.tables.write.stale_cell_paths`); this module's command lists
the cells and the changes they predate — what to re-measure first:

    python -m harness.run.engine_changes --results results/h200 [--sweep table9 ...]

Git answers only for commits it has: in a shallow clone, or for a cell measured at a commit that
never reached this repository, `stale_cells` says it cannot tell (None) rather than marking a
subset. The file's commit is the only version a result has: a re-measured cell replaces its file,
and git keeps the old one.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHANGES_PATH = ROOT / "harness" / "data" / "engine_changes.yaml"
SCOPE_KEYS = frozenset({"systems", "workloads", "tp", "min_lp", "max_lp", "min_batch", "min_k", "max_k",
                        "min_cold_page_size", "untagged"})
_LOWER = (("lp", "min_lp"), ("batch", "min_batch"), ("k", "min_k"), ("cold_page_size", "min_cold_page_size"))
_UPPER = (("lp", "max_lp"), ("k", "max_k"))


def _num(value: Any) -> float:
    """A config value as a number; NaN when it is missing or not one number (a hetero Lp list)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _tagged(tag: Any) -> bool:
    """Whether a cell carries an A/B tag (a cell frame holds NaN where a cell has none)."""
    return tag is not None and tag == tag and str(tag) != ""


@dataclass(frozen=True)
class EngineChange:
    """A commit that changes what a serving cell measures, and which cells it can touch."""

    commit: str
    title: str
    why: str = ""
    scope: Mapping[str, Any] = field(default_factory=dict)

    def applies(self, config: Mapping[str, Any]) -> bool:
        """Whether a cell with this config is in the change's scope (every given key matches;
        a bound on a value the cell lacks excludes it: NaN compares false)."""
        s = self.scope
        if "systems" in s and str(config.get("system")) not in s["systems"]:
            return False
        if "workloads" in s and str(config.get("workload")) not in s["workloads"]:
            return False
        if "tp" in s and _num(config.get("tp")) not in s["tp"]:
            return False
        if s.get("untagged") and _tagged(config.get("tag")):  # a change of a default: an A/B sets it
            return False
        if any(bound in s and not _num(config.get(key)) >= s[bound] for key, bound in _LOWER):
            return False
        return not any(bound in s and not _num(config.get(key)) <= s[bound] for key, bound in _UPPER)


def load_changes(path: Path | str = CHANGES_PATH) -> list[EngineChange]:
    """The list, checked: every entry names a commit and a title, scopes use known keys."""
    raw = yaml.safe_load(Path(path).read_text()) or []
    out = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or not entry.get("commit") or not entry.get("title"):
            raise ValueError(f"{path}: entry {i} needs a commit and a title")
        scope = dict(entry.get("scope") or {})
        unknown = set(scope) - SCOPE_KEYS
        if unknown:
            raise ValueError(f"{path}: entry {i} ({entry['commit']}): unknown scope keys {sorted(unknown)}")
        out.append(EngineChange(commit=str(entry["commit"]), title=str(entry["title"]),
                                why=str(entry.get("why", "")), scope=scope))
    return out


class Ancestry:
    """Asks git whether one commit contains another, once per pair (a report asks hundreds of
    times about a few dozen commits)."""

    def __init__(self, repo: Path | str = ROOT) -> None:
        self.repo = Path(repo)
        self._known: dict[str, bool] = {}
        self._answers: dict[tuple[str, str], bool | None] = {}

    def _has(self, rev: str) -> bool:
        if rev not in self._known:
            self._known[rev] = subprocess.run(["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=self.repo,
                                              capture_output=True).returncode == 0
        return self._known[rev]

    def contains(self, sha: str, change: str) -> bool | None:
        """Is `change` in the history of `sha` (a "-dirty" suffix ignored)? None when git does
        not have one of the two commits (a shallow clone, a commit that never reached here)."""
        sha = sha.removesuffix("-dirty")
        key = (sha, change)
        if key not in self._answers:
            if not (self._has(sha) and self._has(change)):
                self._answers[key] = None
            else:
                rc = subprocess.run(["git", "merge-base", "--is-ancestor", change, sha], cwd=self.repo,
                                    capture_output=True).returncode
                self._answers[key] = {0: True, 1: False}.get(rc)
        return self._answers[key]


def predated(config: Mapping[str, Any], sha: str, changes: Sequence[EngineChange],
             ancestry: Ancestry) -> tuple[str, ...] | None:
    """The commits of the in-scope changes that `sha` does not contain; None when git cannot
    place one of them."""
    missing: list[str] = []
    for ch in changes:
        if not ch.applies(config):
            continue
        has = ancestry.contains(sha, ch.commit)
        if has is None:
            return None
        if not has and ch.commit not in missing:
            missing.append(ch.commit)
    return tuple(missing)


def stale_cells(cells: Any, changes: Sequence[EngineChange] | None = None,
                repo: Path | str | None = None) -> dict[str, tuple[str, ...]] | None:
    """{cell path: commits it predates} for the stale rows of `cells` (a `harness.run.results` cell
    frame: `path`, `env.git_sha`, `config.*`); None when git cannot place every cell in scope of
    a change (no git, a shallow clone): partial marks would mislead. `repo`: this repository
    unless given."""
    changes = load_changes() if changes is None else changes
    ancestry = Ancestry(ROOT if repo is None else repo)
    out: dict[str, tuple[str, ...]] = {}
    try:
        for row in cells.to_dict("records"):
            config = {k.removeprefix("config."): v for k, v in row.items() if k.startswith("config.")}
            missing = predated(config, str(row.get("env.git_sha") or "unknown"), changes, ancestry)
            if missing is None:
                return None
            if missing:
                out[str(row["path"])] = missing
    except (OSError, subprocess.SubprocessError):
        return None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from harness.run.results import load_cells

    ap = argparse.ArgumentParser(prog="python -m harness.run.engine_changes", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True, help="results/<hardware>")
    ap.add_argument("--sweep", action="append", default=[], help="only these sweeps (repeatable)")
    args = ap.parse_args(argv)
    # every cell, the tagged A/B cells of adhoc/ included (the tables' ResultSet leaves those out)
    cells = load_cells(args.results)
    if args.sweep and len(cells):
        cells = cells[cells["sweep"].isin(args.sweep)]
    changes = load_changes()
    stale = stale_cells(cells, changes)
    if stale is None:
        print("git cannot place every cell's commit here (a shallow clone?): no answer", file=sys.stderr)
        return 1
    for path in sorted(stale):
        print(f"{path}: predates {', '.join(stale[path])}")
    seen = {c for commits in stale.values() for c in commits}
    for ch in changes:
        if ch.commit in seen:
            print(f"  {ch.commit}: {ch.title}")
    print(f"{len(cells)} cells, {len(stale)} measured before a listed change in their scope", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
