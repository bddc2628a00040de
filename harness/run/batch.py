"""Run a list of cells on a GPU host that has no Snakemake and no network, within a deadline.

The `h200` Snakemake profile is the normal way to fill results/. This is the one other way, for
lent GPU machines (one command at a time, a fixed time limit, no package index): workloads are
generated here, where the ShareGPT package and the tokenizer are installed, and carried there
compressed (a 16K-prefix ShareGPT file is 48 MB of JSON but 0.2 MB of xz: the prefix repeats).

A list is measured point by point (harness.run.point: the cells of one sweep that differ only in
system and granikv's knobs, rep included), as Snakemake does: consecutive lines of one point form
that point, its cells run back to back in one call (one fresh GRANIKV_CALL_ID, recorded as every
cell's `env.call_id`), systems in the rep's rotated order, and a point is only ever started
whole, so no ratio mixes cells from two calls.

    # here: a cell list (one `python -m harness.run.cell` override line per cell, `#` comments): a
    # sweep's points under a profile, filtered, the ones with a cell still unmeasured ...
    python -m harness.run.batch lines table9 --profile profiles/h200/pipeline.yaml \\
        --where lp=2048 --where batch=128,512 --missing results/h200 > cells.txt
    # ... or the points whose measured cells come from more than one call ...
    python -m harness.run.batch lines table9 --mixed results/h200 > cells.txt
    # ... or the points with a cell measured before a listed engine change
    python -m harness.run.batch lines table6 --stale results/h200 --where lp=16384 > cells.txt
    # here: write the listed cells' workloads, xz-compressed, into .carry/workloads and the
    # commit the cells will record into .carry/src.sha; carry .carry (and the list) to the host
    python -m harness.run.batch prepare cells.txt
    # there: `source scripts/gpu-host-env.sh` (GIT_SHA, carried packages, NCCL settings, workloads
    # unpacked), then run every point not measured yet, start no point once the budget left is
    # below --reserve-s per cell of it, and tar the new result files and the cells' logs
    python -m harness.run.batch run cells.txt --budget-s 560 --tar "$OUT/results.tar.gz"
    # here: extract the tarball's result files into results/ (a re-measured cell replaces its
    # file; git keeps the old one), then re-render the tables and reports (README.md, "GPU host")
    python -m harness.run.batch land results.tar.gz

`lines` always prints whole points (`--where` picks the points that hold a matching cell), with
`overwrite=true` on each cell whose result file exists in a folder it was given, so a list never
completes a point with cells of another call. In `run`, a point whose cells all have result files
is skipped — without `overwrite=true`, or when they were all re-measured at this very commit in
one call — and any other point is measured whole (its measured cells with `overwrite=true`), so a
list can run again after a partial call. A cell that fails is reported, the point's other cells
and the batch go on; its log is kept in the tarball.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shlex
import shutil
import sys
import tarfile
import time
from pathlib import Path

from harness.run.config import Cell
from harness.run.env import new_call_id
from harness.run.point import call_of, group_lines, line_values, one_call, points, run_cell, run_order, with_overwrite
from harness.run.proc import ROOT, STOP_GRACE_S

# what every cell line names, so a fragment (e.g. server options alone, appended to an empty
# `lines` output) is refused up front instead of running as a default granikv cell
REQUIRED_KEYS = ("model", "system", "sweep")


def read_cells(path: Path) -> list[list[str]]:
    """A cell list: one cell's Hydra overrides per line, `#` comments. Every line must name
    REQUIRED_KEYS — a line that does not is an error (with its line number), not a default cell."""
    cells = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        ov = shlex.split(line)
        keys = {o.split("=", 1)[0] for o in ov}
        missing = [k for k in REQUIRED_KEYS if k not in keys]
        if missing:
            raise ValueError(f"{path}:{n}: a cell line must name {', '.join(k + '=' for k in missing)}"
                             f" (got {line[:80]!r})")
        cells.append(ov)
    return cells


def sweep_lines(sweep: str, profile: Path, where: list[str], missing: Path | None,
                stale: Path | None = None, mixed: Path | None = None) -> list[str]:
    """The Hydra override lines of a sweep's points under a pipeline profile (the same overrides
    Snakemake passes), whole points in first-seen order, each point's cells in canonical order.

    A point is kept when one of its cells matches every `key=v1,v2` filter and — when any of
    these is given, at least one of them holds — with `missing`, one of its cells has no result
    file under `missing/<sweep>/`; with `mixed`, its result files under `mixed/<sweep>/` do not
    all share one `env.call_id` (a file without one is a call of its own); with `stale`, one of
    its result files under `stale/<sweep>/` predates a listed engine change
    (harness.run.engine_changes). With any of those folders, the points of the further reps measured
    there (batch lists add reps beyond the profile's) are looked at too. A cell whose
    result file exists under one of those folders gets `overwrite=true`: the point is
    re-measured whole, never completed with cells of another call."""
    return [line for lines in point_lines(sweep, profile, where, missing, stale, mixed) for line in lines]


def point_lines(sweep: str, profile: Path, where: list[str], missing: Path | None,
                stale: Path | None = None, mixed: Path | None = None) -> list[list[str]]:
    """`sweep_lines`, one list of lines per point."""
    from harness.run.sweeps import load_profile, load_sweep, sweep_cells

    stale_files = stale_paths(stale) if stale is not None else None
    prof = load_profile(profile)
    filters = {}
    for w in where:
        key, _, vals = w.partition("=")
        filters[key] = {v.strip() for v in vals.split(",")}
    folders = [d / sweep for d in (missing, mixed, stale) if d is not None]
    cells = _with_measured_reps(sweep_cells(load_sweep(sweep), prof), folders)
    out = []
    for point in points(cells):
        if filters and not any(all(str(c.values.get(k)) in vs for k, vs in filters.items()) for c in point.cells):
            continue
        chosen = []
        if missing is not None:
            chosen.append(any(not (missing / sweep / f"{c.cell_id}.json").exists() for c in point.cells))
        if mixed is not None:
            chosen.append(not one_call(mixed / sweep / f"{c.cell_id}.json" for c in point.cells))
        if stale_files is not None:
            chosen.append(any((stale / sweep / f"{c.cell_id}.json").resolve() in stale_files for c in point.cells))
        if chosen and not any(chosen):
            continue
        lines = []
        for c in point.cells:
            ov = c.overrides(prof)
            if any((d / f"{c.cell_id}.json").exists() for d in folders):
                ov = with_overwrite(ov)
            lines.append(shlex.join(ov))
        out.append(lines)
    return out


def _with_measured_reps(cells: list, folders: list[Path]) -> list:
    """The profile's cells plus, for each point, every further repetition of which a result file
    is in one of `folders` (the whole point at that rep, right after the point).

    Why: a profile runs `reps` repetitions (1 for h200), but batch lists add more (`rep=1`,
    `rep=2`) by hand, and the tables average every complete repetition of a point. Re-measuring
    only rep 0 of a stale point would average a new rep 0 with stale reps 1-2 — a mean across a
    code change — so the stale lines must cover the extra reps as well, and the missing and mixed
    ones a partly measured or mixed extra rep."""
    from dataclasses import replace

    from harness.run.sweeps import _identity, cell_id

    def at_rep(cell, rep):
        values = {**cell.values, "rep": rep}
        return replace(cell, cell_id=cell_id(_identity(values)), values=values, paper={**cell.paper, "rep": rep})

    out, seen = [], set()
    for point in points(cells):
        rep, more = point.rep, list(point.cells)
        while True:
            out += [c for c in more if c.cell_id not in seen]
            seen.update(c.cell_id for c in more)
            rep += 1
            more = [at_rep(c, rep) for c in point.cells]
            if not any((d / f"{c.cell_id}.json").exists() for c in more for d in folders):
                break
    return out


def compose(overrides: list[str]) -> Cell:
    """A cell line's typed Cell: its overrides composed with conf/ (as `python -m harness.run.cell`
    would) and parsed once (harness.run.config)."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return Cell.from_config(hcompose(config_name="config", overrides=overrides))


def prepare(cells: list[list[str]], carry: Path) -> list[Path]:
    """Generate each cell's workload file (workloads/) and write an .xz copy into `carry`."""
    from harness.run.workloads.store import ensure_workload

    carry.mkdir(parents=True, exist_ok=True)
    done: dict[Path, Path] = {}
    for ov in cells:
        cell = compose(ov)
        path = ensure_workload(cell.workload, cell.paths.workloads_dir)
        if path in done:
            continue
        dst = carry / (path.name + ".xz")
        if not dst.exists() or dst.stat().st_mtime < path.stat().st_mtime:
            with path.open("rb") as src, lzma.open(dst, "wb", preset=6) as out:
                shutil.copyfileobj(src, out, 1 << 20)
        done[path] = dst
        print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB -> {dst.stat().st_size / 1e6:.2f} MB xz", flush=True)
    return list(done.values())


# what the cell app imports that a lent GPU image does not ship (hydra-core and its two dependencies);
# pure Python, so this host's copies run there
SITE_PACKAGES = ("hydra", "omegaconf", "antlr4")


def carry_site(site: Path, packages: tuple[str, ...] = SITE_PACKAGES) -> list[Path]:
    """Copy the installed `packages` into `site` (scripts/gpu-host-env.sh puts it on PYTHONPATH), so
    a host without a package index imports the same versions as this one."""
    import importlib

    site.mkdir(parents=True, exist_ok=True)
    out = []
    for name in packages:
        src = Path(importlib.import_module(name).__file__).parent
        dst = site / name
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        out.append(dst)
    return out


def stale_paths(results: Path) -> set[Path]:
    """Result files under `results` (resolved) measured before a listed engine change in their
    scope; refuses to guess when git cannot tell (a shallow clone)."""
    from harness.run.engine_changes import stale_cells
    from harness.run.results import load_cells

    # every cell, tagged A/B cells included: a stale adhoc line is re-measured like any other
    stale = stale_cells(load_cells(results))
    if stale is None:
        raise SystemExit("git cannot place every cell's commit here (a shallow clone?): no stale lines")
    return {Path(p).resolve() for p in stale}


def write_sha(path: Path) -> str | None:
    """Write the commit the cells will record (harness.run.provenance.git_sha) to `path`: a lent
    host's copy of the tree may have a stale or no `.git`, so scripts/gpu-host-env.sh exports it
    as GIT_SHA there."""
    from harness.run.provenance import git_sha

    sha = git_sha(default=None)
    if sha:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(sha + "\n")
    return sha


def _wrong_card(tf: tarfile.TarFile, member: tarfile.TarInfo) -> str | None:
    """Why a result file in a tarball must not land: a cell file under results/<hardware>/ whose
    `env.gpu` is not the card of conf/hardware/<hardware>.yaml (harness.run.env.gpu_matches), e.g.
    an h200 cell run with `hardware.gpu=null` on an H100: it would sit in the H200 tables. Exempt:
    a profile without a card or an emulated one (a100-40gb), files that are not cells. None when
    the file may land."""
    import yaml

    from harness.run.env import gpu_matches

    parts = Path(member.name).parts
    profile = ROOT / "conf" / "hardware" / f"{parts[1]}.yaml" if len(parts) > 2 else None
    if not member.name.endswith(".json") or profile is None or not profile.is_file():
        return None
    hw = yaml.safe_load(profile.read_text()) or {}
    if hw.get("emulate") or not hw.get("gpu") or str(hw.get("device", "cuda")) == "cpu":
        return None
    src = tf.extractfile(member)
    assert src is not None
    try:
        doc = json.load(src)
    except ValueError:
        return None
    env = doc.get("env") if isinstance(doc, dict) else None
    if not isinstance(env, dict) or not env.get("gpu") or "config" not in doc:
        return None
    if gpu_matches(str(hw["gpu"]), str(env["gpu"])):
        return None
    return f"env.gpu {env['gpu']!r}, results/{parts[1]}/ is {hw['gpu']!r}"


def land(tarball: Path, results_root: Path, dry_run: bool = False) -> dict[str, list[Path]]:
    """Extract the result files of a call's tarball (`run --tar`) into `results_root`: a file in
    it replaces the one there (git keeps the old one), a cell that failed on the GPU keeps its
    old file. Checked before anything is written: every member under `results/` is a plain file
    inside the tree (no absolute paths, no `..`); other members (the cells' logs) stay in the
    tarball. Returns {"replaced": [path], "new": [path]}."""
    with tarfile.open(tarball, "r:*") as tf:
        members = []
        for m in tf.getmembers():
            parts = Path(m.name).parts
            if Path(m.name).is_absolute() or ".." in parts:
                raise ValueError(f"{tarball}: refusing member {m.name!r} (outside the tree)")
            if m.isdir() or not parts or parts[0] != "results":
                continue  # batch logs, folders
            if not m.isfile():
                raise ValueError(f"{tarball}: refusing member {m.name!r} (not a plain file)")
            members.append((m, results_root.joinpath(*parts[1:])))
        wrong = [f"{m.name} ({why})" for m, _dst in members if (why := _wrong_card(tf, m))]
        if wrong:
            raise ValueError(f"{tarball}: refusing to land cells measured on another card than their hardware "
                             f"profile's (nothing written): {'; '.join(wrong)}")
        done: dict[str, list[Path]] = {"replaced": [], "new": []}
        for _m, dst in members:
            done["replaced" if dst.exists() else "new"].append(dst)
        if dry_run:
            return done
        for m, dst in members:
            dst.parent.mkdir(parents=True, exist_ok=True)
            src = tf.extractfile(m)
            assert src is not None
            tmp = dst.with_name(dst.name + ".landing")
            with src, tmp.open("wb") as out:
                shutil.copyfileobj(src, out)
            os.replace(tmp, dst)
    return done


def unpack(carry: Path, workloads: Path) -> None:
    workloads.mkdir(parents=True, exist_ok=True)
    for xz in sorted(carry.glob("*.jsonl.xz")):
        dst = workloads / xz.name[: -len(".xz")]
        if not dst.exists():
            tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")  # lanes may unpack at once
            with lzma.open(xz, "rb") as src, tmp.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.replace(tmp, dst)


def run(cells: list[list[str]], budget_s: float, reserve_s: float, logs: Path, one_call: bool = False) -> list[dict]:
    """Run the list point by point (consecutive lines of one point: harness.run.point.group_lines).

    A point is started only while the budget left covers `reserve_s` per cell of it (a Lp=16K
    B=256 cell takes about a minute on an H200); its cells then run back to back with one fresh
    GRANIKV_CALL_ID, systems in the rep's rotated order, each stopped cleanly at the budget's end.
    A point whose cells all have result files is skipped when its lines do not ask to overwrite,
    or when every cell was re-measured at this commit in one call (`remeasured_at_this_commit`);
    any other point is measured whole, its measured cells with `overwrite=true`.

    `one_call`: the whole list is one group, run in the list's order in one call. For A/B
    comparisons whose sides are not one point's systems (tagged cells of one system that differ
    in a client or server option, e.g. the API A/B or the hint A/B): the list is the comparison."""
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    report: list[dict] = []
    groups = [list(range(len(cells)))] if one_call else group_lines(cells)
    for g, group in enumerate(groups):
        head = f"[point {g + 1}/{len(groups)}]"
        left = budget_s - (time.monotonic() - t0)
        if left < reserve_s * len(group):
            report += [{"cell": cells[i], "status": "not started (budget)"} for i in group]
            print(f"{head} not started: {left:.0f}s left, {len(group)} cells need {reserve_s * len(group):.0f}s",
                  flush=True)
            continue
        try:
            paths = [_result_path(cells[i]) for i in group]
        except Exception as exc:  # noqa: BLE001 - a line Hydra cannot compose: report it, go on
            report += [{"cell": cells[i], "status": f"invalid: {exc}"} for i in group]
            print(f"{head} not started: a line does not compose: {exc}", flush=True)
            continue
        if all(p.exists() for p in paths):
            done = "measured" if not any("overwrite=true" in cells[i] for i in group) \
                else remeasured_at_this_commit(paths)
            if done:
                report += [{"cell": cells[i], "status": 0, "skipped": done} for i in group]
                why = "measured already" if done == "measured" else f"re-measured at {done[:7]} in one call already"
                print(f"{head} skipped: {why}", flush=True)
                continue
        rep = int(line_values(cells[group[0]]).get("rep", 0) or 0)
        order = list(group) if one_call else run_order(group, rep, lambda i: line_values(cells[i]))
        call = new_call_id()
        print(f"{head} {len(group)} cells in one call {call}", flush=True)
        for i in order:
            ov = with_overwrite(cells[i]) if paths[group.index(i)].exists() else list(cells[i])
            left = budget_s - (time.monotonic() - t0)
            log = logs / f"cell{i:02d}.log"
            t = time.monotonic()
            with log.open("w") as f:
                rc = run_cell(ov, call, f, timeout_s=max(30.0, left - 5 - STOP_GRACE_S))
            tail = log.read_text().strip().splitlines()[-1:] or [""]
            report.append({"cell": ov, "status": rc, "s": round(time.monotonic() - t, 1), "call_id": call})
            print(f"[{i + 1}/{len(cells)}] rc={rc} {time.monotonic() - t:.0f}s {' '.join(ov)}\n    {tail[0][:300]}",
                  flush=True)
    return report


def _result_path(ov: list[str]) -> Path:
    return ROOT / compose([o for o in ov if not o.startswith("overwrite=")]).result_path


def remeasured_at_this_commit(paths: list[Path], sha: str | None = None) -> str | None:
    """For a point of `overwrite=true` lines whose result files all exist: this commit when every
    file was measured at it and all in one call, else None. Why: a list of re-measures is run
    again after a partial call (the budget ran out), and the points it already re-measured must
    not run twice, while a point cut short (some cells re-measured, some not) runs again whole.
    A dirty tree never counts as the same commit."""
    from harness.run.provenance import git_sha

    sha = sha or git_sha(default=None)
    if not sha or sha.endswith("-dirty"):
        return None
    for path in paths:
        try:
            recorded = json.loads(path.read_text()).get("env", {}).get("git_sha")
        except (OSError, ValueError, AttributeError):
            return None
        if recorded != sha:
            return None
    calls = {call_of(p) for p in paths}
    return sha if len(calls) == 1 and None not in calls else None


def tar_new(dst: Path, results: Path, logs: Path, since: float, runs: bool = False) -> None:
    """Tar the files under `results` written since `since` (and the batch logs) into `dst`. The
    cells' `<cell-id>.run/` folders (server log, per-request records: megabytes per cell) are
    left out unless `runs`: a lent machine returns only a few files of limited size."""
    def new_only(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if info.isdir():
            return None if (info.name.endswith(".run") and not runs) else info
        return info if info.mtime >= since - 1 else None

    with tarfile.open(dst, "w:gz") as tf:
        tf.add(results, arcname="results", filter=new_only)
        if logs.exists():
            tf.add(logs, arcname="batch-logs")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.run.batch", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    carry = ROOT / ".carry" / "workloads"
    p = sub.add_parser("prepare", help="generate and compress the cells' workloads, write the commit to record")
    p.add_argument("cells", type=Path)
    p.add_argument("--carry", type=Path, default=carry)
    p.add_argument("--sha-file", type=Path, default=ROOT / ".carry" / "src.sha",
                   help="where to write the commit the cells record (GIT_SHA on the host)")
    p.add_argument("--site", type=Path, default=ROOT / ".carry" / "site",
                   help=f"copy the packages the GPU image lacks ({', '.join(SITE_PACKAGES)}) here")
    p.add_argument("--no-site", action="store_true", help="do not copy them (the host has them)")
    r = sub.add_parser("run", help="run the list point by point (on the GPU host)")
    r.add_argument("cells", type=Path)
    r.add_argument("--carry", type=Path, default=carry)
    r.add_argument("--budget-s", type=float, default=560.0)
    r.add_argument("--one-call", action="store_true",
                   help="run every line in one call, in the list's order (an A/B of tagged cells of one system)")
    r.add_argument("--reserve-s", type=float, default=75.0,
                   help="the time a cell may need: a point starts only with this much left per cell of it")
    r.add_argument("--logs", type=Path, default=ROOT / "batch-logs")
    r.add_argument("--tar", type=Path, default=None,
                   help="tar the new result files and the logs into this file at the end (lent machines "
                        "return few, small files: the cells' .run folders are left out unless --tar-runs)")
    r.add_argument("--tar-runs", action="store_true", help="also tar the cells' .run folders")
    la = sub.add_parser("land", help="extract a call's tarball into results/ (replacing the files it re-measured)")
    la.add_argument("tarball", type=Path)
    la.add_argument("--results", type=Path, default=ROOT / "results", help="the results root to extract into")
    la.add_argument("--dry-run", action="store_true", help="print what would land, change nothing")
    u = sub.add_parser("unpack", help="only unpack the carried workloads into workloads/ (on the GPU host)")
    u.add_argument("--carry", type=Path, default=carry)
    ln = sub.add_parser("lines", help="print a sweep's cell lines, whole points (filtered), for a cell list")
    ln.add_argument("sweep")
    ln.add_argument("--profile", type=Path, default=ROOT / "profiles" / "h200" / "pipeline.yaml")
    ln.add_argument("--where", action="append", default=[],
                    help="key=v1,v2 (repeatable): the points holding a cell that matches every filter")
    ln.add_argument("--missing", type=Path, default=None,
                    help="only points with a cell that has no result under this folder")
    ln.add_argument("--mixed", type=Path, default=None,
                    help="only points whose results under this folder do not all share one env.call_id")
    ln.add_argument("--stale", type=Path, default=None,
                    help="only points with a result under this folder that predates a listed engine change "
                         "(harness.run.engine_changes)")
    args = ap.parse_args(argv)
    if args.cmd == "unpack":
        unpack(args.carry, ROOT / "workloads")
        return 0
    if args.cmd == "land":
        try:
            done = land(args.tarball, args.results, dry_run=args.dry_run)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for verb, paths in (("replaced", done["replaced"]), ("added", done["new"])):
            for path in paths:
                print(f"{'would be ' if args.dry_run else ''}{verb} {path}")
        print(f"{len(done['replaced'])} replaced, {len(done['new'])} new", flush=True)
        return 0
    if args.cmd == "lines":
        found = point_lines(args.sweep, args.profile, args.where, args.missing, args.stale, args.mixed)
        lines = [line for point in found for line in point]
        if lines:  # no empty line for an empty selection: `... | sed 's/$/ opts/'` would make it a cell
            print("\n".join(lines))
        print(f"{args.sweep}: {len(lines)} cell lines, {len(found)} points", file=sys.stderr)
        return 0
    try:
        cells = read_cells(args.cells)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "prepare":
        prepare(cells, args.carry)
        if not args.no_site:
            print(f"{args.site}: {', '.join(p.name for p in carry_site(args.site))}", flush=True)
        sha = write_sha(args.sha_file)
        print(f"{args.sha_file}: {sha or 'no commit (not a git checkout): set GIT_SHA on the host'}", flush=True)
        return 0
    unpack(args.carry, ROOT / "workloads")
    started = time.time()
    report = run(cells, args.budget_s, args.reserve_s, args.logs, one_call=args.one_call)
    if args.tar:
        tar_new(args.tar, ROOT / "results", args.logs, started, runs=args.tar_runs)
    failed = [c for c in report if c["status"] not in (0,)]
    print(f"{len(report) - len(failed)}/{len(report)} cells ok", flush=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
