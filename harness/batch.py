"""Run a list of cells on a GPU host that has no Snakemake and no network, within a deadline.

The `h200` Snakemake profile is the normal way to fill results/. This is the one other way, for
lent GPU machines (one command at a time, a fixed time limit, no package index): workloads are
generated here, where the ShareGPT package and the tokenizer are installed, and carried there
compressed (a 16K-prefix ShareGPT file is 48 MB of JSON but 0.2 MB of xz: the prefix repeats).

    # here: a cell list (one `python -m harness.cell` override line per cell, `#` comments): a
    # sweep's cells under a profile, filtered, leaving out measured cells ...
    python -m harness.batch lines table9 --profile profiles/h200/pipeline.yaml \\
        --where lp=2048 --where batch=128,512 --missing results/h200 > cells.txt
    # ... or the cells measured before a listed engine change, as overwrite=true lines
    python -m harness.batch lines table6 --stale results/h200 --where lp=16384 > cells.txt
    # here: write the listed cells' workloads, xz-compressed, into .carry/workloads and the
    # commit the cells will record into .carry/src.sha; carry .carry (and the list) to the host
    python -m harness.batch prepare cells.txt
    # there: `source scripts/gpu-host-env.sh` (GIT_SHA, carried packages, NCCL settings, workloads
    # unpacked), then run every cell whose result file is missing, start no new cell once less
    # than --reserve-s of --budget-s is left, and tar the new result files and the cells' logs
    python -m harness.batch run cells.txt --budget-s 560 --tar "$OUT/results.tar.gz"
    # here: extract the tarball's result files into results/ (a re-measured cell replaces its
    # file; git keeps the old one), then re-render the tables and reports (README.md, "GPU host")
    python -m harness.batch land results.tar.gz

A cell that fails is reported and the batch goes on; its log is kept in the tarball. A cell whose
result file exists is skipped — by harness.cell, or here for an `overwrite=true` cell whose file
was measured at this very commit — so a list can be run again after a partial call.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
# granikv's own knobs (HOT share, COLD page size): a point's granikv cells may set them (Tables 18,
# 21, 24) while its baselines keep the defaults, so they do not split a point
GRANIKV_KNOBS = ("hot_fraction", "cold_page_size")


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
                stale: Path | None = None) -> list[str]:
    """The Hydra override lines of a sweep's cells under a pipeline profile (the same overrides
    Snakemake passes), keeping cells whose values match every `key=v1,v2` filter and, with
    `missing`, only those without a result file under `missing/<sweep>/`; with `stale`, only those
    whose result file under `stale/<sweep>/` predates a listed engine change
    (harness.engine_changes), as `overwrite=true` lines that re-measure them."""
    from harness.sweeps import load_profile, load_sweep, sweep_cells

    stale_files = None
    if stale is not None:
        stale_files = stale_paths(stale)

    prof = load_profile(profile)
    filters = {}
    for w in where:
        key, _, vals = w.partition("=")
        filters[key] = {v.strip() for v in vals.split(",")}
    # grouped by the point without its system (and granikv's knobs), in first-seen order: the
    # systems of one (Lp, B, ...) point run back to back, so their ratio comes from one run
    points: dict[tuple, list[str]] = {}
    cells = sweep_cells(load_sweep(sweep), prof)
    if stale is not None:
        cells = _with_measured_reps(cells, stale / sweep)
    for cell in cells:
        if any(str(cell.values.get(k)) not in vs for k, vs in filters.items()):
            continue
        if missing is not None and (missing / sweep / f"{cell.cell_id}.json").exists():
            continue
        extra = []
        if stale_files is not None:
            if (stale / sweep / f"{cell.cell_id}.json").resolve() not in stale_files:
                continue
            extra = ["overwrite=true"]
        point = tuple(sorted((k, str(v)) for k, v in cell.values.items()
                             if k != "system" and k not in GRANIKV_KNOBS))
        points.setdefault(point, []).append(shlex.join(cell.overrides(prof) + extra))
    return [line for lines in points.values() for line in lines]


def _with_measured_reps(cells: list, folder: Path) -> list:
    """The profile's cells plus every further repetition that has a result file in `folder`.

    Why: a profile runs `reps` repetitions (1 for h200), but batch lists add more (`rep=1`,
    `rep=2`) by hand, and the tables average every complete repetition of a point. Re-measuring
    only rep 0 of a stale point would average a new rep 0 with stale reps 1-2 — a mean across a
    code change — so the stale lines must cover the extra reps as well."""
    from dataclasses import replace

    from harness.sweeps import _identity, cell_id

    out, seen = [], {c.cell_id for c in cells}
    for cell in cells:  # each extra rep right after its cell: a point's reps stay together
        out.append(cell)
        rep = int(cell.values.get("rep", 0)) + 1
        while True:
            values = {**cell.values, "rep": rep}
            cid = cell_id(_identity(values))
            if not (folder / f"{cid}.json").exists():
                break
            if cid not in seen:
                seen.add(cid)
                out.append(replace(cell, cell_id=cid, values=values, paper={**cell.paper, "rep": rep}))
            rep += 1
    return out


def compose(overrides: list[str]):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hcompose(config_name="config", overrides=overrides)


def prepare(cells: list[list[str]], carry: Path) -> list[Path]:
    """Generate each cell's workload file (workloads/) and write an .xz copy into `carry`."""
    from harness.cell_config import ensure_workload, workload_config

    carry.mkdir(parents=True, exist_ok=True)
    done: dict[Path, Path] = {}
    for ov in cells:
        cfg = compose(ov)
        path = ensure_workload(workload_config(cfg), Path(cfg.workloads_dir))
        if path in done:
            continue
        dst = carry / (path.name + ".xz")
        if not dst.exists() or dst.stat().st_mtime < path.stat().st_mtime:
            with path.open("rb") as src, lzma.open(dst, "wb", preset=6) as out:
                shutil.copyfileobj(src, out, 1 << 20)
        done[path] = dst
        print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB -> {dst.stat().st_size / 1e6:.2f} MB xz", flush=True)
    return list(done.values())


def stale_paths(results: Path) -> set[Path]:
    """Result files under `results` (resolved) measured before a listed engine change in their
    scope; refuses to guess when git cannot tell (a shallow clone)."""
    from harness.engine_changes import stale_cells
    from harness.results import load_results

    stale = stale_cells(load_results(results).cells)
    if stale is None:
        raise SystemExit("git cannot place every cell's commit here (a shallow clone?): no stale lines")
    return {Path(p).resolve() for p in stale}


def write_sha(path: Path) -> str | None:
    """Write the commit the cells will record (harness.provenance.git_sha) to `path`: a lent
    host's copy of the tree may have a stale or no `.git`, so scripts/gpu-host-env.sh exports it
    as GIT_SHA there."""
    from harness.provenance import git_sha

    sha = git_sha(default=None)
    if sha:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(sha + "\n")
    return sha


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


STOP_GRACE_S = 40.0  # the server's stop_grace_s (30 s) and the cell's own unwinding


def run_until(cmd: list[str], log: IO[str], timeout_s: float, grace_s: float = STOP_GRACE_S) -> int | str:
    """Run `cmd` into `log`; past `timeout_s`, SIGTERM it and SIGKILL it only after `grace_s`.

    Why not subprocess.run(timeout=...): that SIGKILLs the cell at once, so harness.cell never
    reaches launch()'s finally, and its server — started in a session of its own so that it and
    its TP workers can be signalled as one group — lives on, holding most of the GPU's memory
    (the engine sizes its KV pool from the memory it finds free). Every later cell of the call
    then measures a smaller engine next to an idle one, or fails to start. SIGTERM is what
    harness.cell turns into SystemExit, which stops the server. Returns the exit code, or
    "timeout" when the deadline passed."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return "timeout"


def run(cells: list[list[str]], budget_s: float, reserve_s: float, logs: Path) -> list[dict]:
    """Run the cells in order; a cell is started only while more than `reserve_s` of the budget
    is left (a Lp=16K B=256 cell takes about a minute on an H200)."""
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    report = []
    for i, ov in enumerate(cells):
        left = budget_s - (time.monotonic() - t0)
        if left < reserve_s:
            report.append({"cell": ov, "status": "not started (budget)"})
            print(f"[{i + 1}/{len(cells)}] not started: {left:.0f}s left", flush=True)
            continue
        done_at = measured_at_this_commit(ov)
        if done_at:
            report.append({"cell": ov, "status": 0, "skipped": done_at})
            print(f"[{i + 1}/{len(cells)}] skipped: re-measured at {done_at[:7]} already (this commit)", flush=True)
            continue
        log = logs / f"cell{i:02d}.log"
        t = time.monotonic()
        cmd = [sys.executable, "-m", "harness.cell", *ov]
        with log.open("w") as f:
            rc = run_until(cmd, f, timeout_s=max(30.0, left - 5 - STOP_GRACE_S), grace_s=STOP_GRACE_S)
        tail = log.read_text().strip().splitlines()[-1:] or [""]
        report.append({"cell": ov, "status": rc, "s": round(time.monotonic() - t, 1)})
        print(f"[{i + 1}/{len(cells)}] rc={rc} {time.monotonic() - t:.0f}s {' '.join(ov)}\n    {tail[0][:300]}",
              flush=True)
    return report


def measured_at_this_commit(ov: list[str], sha: str | None = None) -> str | None:
    """For an `overwrite=true` cell: the commit of its existing result file when that is this
    commit (GIT_SHA on a lent host), else None. Why: a list of re-measures is run again after a
    partial call (the budget ran out), and the cells it already re-measured must not run twice;
    cells without overwrite are skipped by harness.cell itself when their file exists. A dirty
    tree never counts as the same commit."""
    if "overwrite=true" not in ov:
        return None
    from harness.cell_config import result_path
    from harness.provenance import git_sha

    sha = sha or git_sha(default=None)
    if not sha or sha.endswith("-dirty"):
        return None
    cfg = compose([o for o in ov if not o.startswith("overwrite=")])
    path = ROOT / result_path(cfg)
    try:
        recorded = json.loads(path.read_text()).get("env", {}).get("git_sha")
    except (OSError, ValueError, AttributeError):
        return None
    return recorded if recorded == sha else None


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
    ap = argparse.ArgumentParser(prog="python -m harness.batch", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    carry = ROOT / ".carry" / "workloads"
    p = sub.add_parser("prepare", help="generate and compress the cells' workloads, write the commit to record")
    p.add_argument("cells", type=Path)
    p.add_argument("--carry", type=Path, default=carry)
    p.add_argument("--sha-file", type=Path, default=ROOT / ".carry" / "src.sha",
                   help="where to write the commit the cells record (GIT_SHA on the host)")
    r = sub.add_parser("run", help="run the cells (on the GPU host)")
    r.add_argument("cells", type=Path)
    r.add_argument("--carry", type=Path, default=carry)
    r.add_argument("--budget-s", type=float, default=560.0)
    r.add_argument("--reserve-s", type=float, default=75.0, help="do not start a cell with less time left")
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
    ln = sub.add_parser("lines", help="print a sweep's cell lines (filtered) for a cell list")
    ln.add_argument("sweep")
    ln.add_argument("--profile", type=Path, default=ROOT / "profiles" / "h200" / "pipeline.yaml")
    ln.add_argument("--where", action="append", default=[], help="key=v1,v2 (repeatable)")
    ln.add_argument("--missing", type=Path, default=None, help="leave out cells with a result under this folder")
    ln.add_argument("--stale", type=Path, default=None,
                    help="only cells whose result under this folder predates a listed engine change "
                         "(harness.engine_changes), with overwrite=true")
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
        found = sweep_lines(args.sweep, args.profile, args.where, args.missing, args.stale)
        if found:  # no empty line for an empty selection: `... | sed 's/$/ opts/'` would make it a cell
            print("\n".join(found))
        print(f"{args.sweep}: {len(found)} cell lines", file=sys.stderr)
        return 0
    try:
        cells = read_cells(args.cells)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.cmd == "prepare":
        prepare(cells, args.carry)
        sha = write_sha(args.sha_file)
        print(f"{args.sha_file}: {sha or 'no commit (not a git checkout): set GIT_SHA on the host'}", flush=True)
        return 0
    unpack(args.carry, ROOT / "workloads")
    started = time.time()
    report = run(cells, args.budget_s, args.reserve_s, args.logs)
    if args.tar:
        tar_new(args.tar, ROOT / "results", args.logs, started, runs=args.tar_runs)
    failed = [c for c in report if c["status"] not in (0,)]
    print(f"{len(report) - len(failed)}/{len(report)} cells ok", flush=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
