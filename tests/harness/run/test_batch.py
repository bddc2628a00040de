"""harness.run.batch: cell lists, the xz carry round trip, the time budget, points run whole in one call."""

from __future__ import annotations

import json

import pytest
from fake_cell import fake_cells, write_result
from proc_testutil import wait_dead

from harness.run import batch, point
from harness.run import proc as cell_proc


def test_read_cells_skips_comments_and_blank_lines(tmp_path):
    f = tmp_path / "cells.txt"
    f.write_text("# head\n\nmodel=tiny sweep=t9 system=paged lp=512  # trailing\n"
                 "  model=tiny sweep=t9 system=granikv 'lp=1024'\n")
    assert batch.read_cells(f) == [["model=tiny", "sweep=t9", "system=paged", "lp=512"],
                                   ["model=tiny", "sweep=t9", "system=granikv", "lp=1024"]]


def test_read_cells_refuses_a_fragment_line_instead_of_running_a_default_cell(tmp_path):
    f = tmp_path / "cells.txt"
    f.write_text("model=tiny sweep=t9 system=paged lp=512\n server.ready_timeout_s=300\n")
    with pytest.raises(ValueError, match=r"cells.txt:2: .*model=, system=, sweep="):
        batch.read_cells(f)
    assert batch.main(["run", str(f)]) == 2  # before any cell runs


def test_lines_prints_no_empty_line_for_an_empty_selection(capsys):
    assert batch.main(["lines", "table18", "--where", "lp=1"]) == 0
    out = capsys.readouterr()
    assert out.out == "" and "0 cell lines" in out.err


def test_prepare_then_unpack_gives_the_same_workload_bytes(tmp_path):
    cells = [["model=tiny", "workload=burst", "lp=64", "batch=2", "num_prompts=3", "output_len=4",
              "hardware=cpu", f"workloads_dir={tmp_path / 'wl'}"]]
    (xz,) = batch.prepare(cells, tmp_path / "carry")
    original = next((tmp_path / "wl").glob("*.jsonl"))
    batch.unpack(tmp_path / "carry", tmp_path / "there")
    assert (tmp_path / "there" / original.name).read_bytes() == original.read_bytes()
    assert xz.stat().st_size < original.stat().st_size


def test_run_starts_no_cell_without_budget(tmp_path):
    report = batch.run([["system=paged"], ["system=granikv"]], budget_s=10.0, reserve_s=60.0, logs=tmp_path)
    assert [r["status"] for r in report] == ["not started (budget)"] * 2


def test_run_starts_a_point_only_when_the_budget_covers_all_its_cells(tmp_path, monkeypatch):
    """Two lines of one point with time left for one cell: neither starts (a point measured
    half would leave a ratio across two calls)."""
    monkeypatch.setattr(batch, "run_cell", lambda *a, **k: pytest.fail("a cell of an uncovered point started"))
    report = batch.run([["system=paged", "lp=512"], ["system=granikv", "lp=512"]], budget_s=100.0, reserve_s=60.0,
                       logs=tmp_path)
    assert [r["status"] for r in report] == ["not started (budget)"] * 2


def test_sweep_lines_filter_group_systems_and_leave_out_measured(tmp_path):
    profile = batch.ROOT / "profiles" / "h200" / "pipeline.yaml"
    lines = batch.sweep_lines("table9", profile, ["lp=512,2048", "batch=256"], None)
    assert len(lines) == 6
    # the three systems of one (Lp, B) point are adjacent, in the sweep's system order
    systems = [next(t for t in ln.split() if t.startswith("system=")) for ln in lines]
    assert systems == ["system=paged", "system=cascade", "system=granikv"] * 2
    assert all("lp=512 " in ln for ln in lines[:3]) and all("lp=2048 " in ln for ln in lines[3:])
    (tmp_path / "table9").mkdir()
    for system in ("paged", "cascade", "granikv"):  # Lp=2048 measured whole: left out
        (tmp_path / "table9" / f"{system}-llama-3.1-8b-tp1-sharegpt-lp2048-b256-k1-r0.json").write_text("{}")
    (tmp_path / "table9" / "cascade-llama-3.1-8b-tp1-sharegpt-lp512-b256-k1-r0.json").write_text("{}")
    left = batch.sweep_lines("table9", profile, ["lp=512,2048", "batch=256"], tmp_path)
    # Lp=512 lacks two cells: the whole point, its measured cascade cell re-measured in the same call
    assert len(left) == 3 and all("lp=512 " in ln for ln in left)
    assert [ln.endswith(" overwrite=true") for ln in left] == [False, True, False]


def test_where_picks_whole_points():
    """A filter on the system picks the points holding such a cell, all their cells listed."""
    profile = batch.ROOT / "profiles" / "h200" / "pipeline.yaml"
    lines = batch.sweep_lines("table21", profile, ["system=granikv", "k=4"], None)
    assert [next(t for t in ln.split() if t.startswith("system=")) for ln in lines] == \
        ["system=paged", "system=cascade", "system=granikv"]


def test_a_granikv_knob_does_not_split_a_point_from_its_baselines():
    """Table 21's granikv cells set hot_fraction, the baselines do not: each k's three systems
    still come out back to back (one run per ratio)."""
    profile = batch.ROOT / "profiles" / "h200" / "pipeline.yaml"
    lines = batch.sweep_lines("table21", profile, [], None)
    ks = [next(w for w in line.split() if w.startswith("k=")) for line in lines]
    assert len(lines) == 6 and ks == sorted(ks, key=ks.index) and ks[0::3] == ks[1::3] == ks[2::3]
    assert any("hot_fraction" in line for line in lines)


def test_tar_new_keeps_new_results_and_leaves_out_run_folders(tmp_path):
    import os
    import tarfile
    import time

    res = tmp_path / "results" / "h200" / "table9"
    (res / "cell.run").mkdir(parents=True)
    (res / "old.json").write_text("{}")
    os.utime(res / "old.json", (time.time() - 3600, time.time() - 3600))
    since = time.time()
    (res / "cell.json").write_text("{}")
    (res / "cell.run" / "server.log").write_text("x" * 1000)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "cell00.log").write_text("ok")
    for runs, want_run in ((False, False), (True, True)):
        dst = tmp_path / f"out-{runs}.tar.gz"
        batch.tar_new(dst, tmp_path / "results", logs, since, runs=runs)
        names = set(tarfile.open(dst).getnames())
        assert "results/h200/table9/cell.json" in names
        assert "results/h200/table9/old.json" not in names
        assert "batch-logs/cell00.log" in names
        assert ("results/h200/table9/cell.run/server.log" in names) == want_run


def _tarball(path, files: dict[str, bytes]):
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_land_replaces_only_the_files_a_call_brought_back(tmp_path):
    res = tmp_path / "results"
    kept = res / "h200" / "table9" / "granikv-r0.json"  # its cell failed on the GPU: not in the tarball
    old = res / "h200" / "table9" / "paged-r0.json"
    for p, text in ((kept, "kept"), (old, "old")):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    tb = _tarball(tmp_path / "results.tar.gz", {"results/h200/table9/paged-r0.json": b"new",
                                                "results/h200/table6/cascade-r0.json": b"fresh",
                                                "batch-logs/cell00.log": b"log"})
    fresh = res / "h200" / "table6" / "cascade-r0.json"
    assert batch.land(tb, res, dry_run=True) == {"replaced": [old], "new": [fresh]}
    assert old.read_text() == "old" and not fresh.exists()  # a dry run changes nothing
    assert batch.land(tb, res) == {"replaced": [old], "new": [fresh]}
    assert old.read_text() == "new" and fresh.read_text() == "fresh" and kept.read_text() == "kept"
    assert not (res / "batch-logs").exists() and not list(res.rglob("*.landing"))
    assert batch.main(["land", str(tb), "--results", str(res)]) == 0  # landing again is harmless
    assert old.read_text() == "new"


@pytest.mark.parametrize("name", ["results/../escape.json", "/results/abs.json"])
def test_land_refuses_members_outside_results(tmp_path, name):
    res = tmp_path / "results"
    res.mkdir()
    tb = _tarball(tmp_path / "bad.tar.gz", {"results/h200/ok.json": b"{}", name: b"x"})
    with pytest.raises(ValueError):
        batch.land(tb, res)
    assert batch.main(["land", str(tb), "--results", str(res)]) == 2
    assert not (res / "h200").exists() and not (tmp_path / "escape.json").exists()


def test_a_re_measure_list_run_again_skips_the_points_this_commit_already_re_measured_in_one_call(tmp_path):
    ov = ["model=llama-3.1-8b", "tp=1", "workload=sharegpt", "rate=inf", "lp=512", "batch=256", "rep=0",
          "sweep=table9", "hardware=h200", f"results_dir={tmp_path}", "overwrite=true"]
    paths = [batch._result_path([f"system={s}", *ov]) for s in ("paged", "granikv")]
    for p in paths:
        write_result(p, "a" * 40, "c1")
    assert batch.remeasured_at_this_commit(paths, sha="a" * 40) == "a" * 40
    assert batch.remeasured_at_this_commit(paths, sha="b" * 40) is None  # measured before: re-measure
    assert batch.remeasured_at_this_commit(paths, sha="a" * 40 + "-dirty") is None
    write_result(paths[1], "a" * 40, "c2")  # a point cut short, finished by another call: again, whole
    assert batch.remeasured_at_this_commit(paths, sha="a" * 40) is None
    write_result(paths[1], "a" * 40, None)
    assert batch.remeasured_at_this_commit(paths, sha="a" * 40) is None
    paths[1].write_text("not json")
    assert batch.remeasured_at_this_commit(paths, sha="a" * 40) is None


def test_run_measures_each_point_whole_in_one_call_in_the_reps_rotated_order(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_SHA", "a" * 40)
    base = ["model=llama-3.1-8b", "tp=1", "workload=sharegpt", "rate=inf", "lp=512", "batch=256",
            "sweep=table9", "hardware=h200", f"results_dir={tmp_path / 'results'}"]
    systems = ("paged", "cascade", "granikv")
    cells = [[f"system={s}", *base, f"rep={r}"] for r in (0, 1) for s in systems]
    paths = {f"{s}@{r}": batch._result_path([f"system={s}", *base, f"rep={r}"]) for r in (0, 1) for s in systems}
    read = fake_cells(monkeypatch, tmp_path, paths)
    write_result(paths["cascade@1"], "0" * 40, None)  # rep 1 is partly measured: re-measured whole
    report = batch.run(cells, budget_s=600.0, reserve_s=1.0, logs=tmp_path / "logs")
    assert [r["status"] for r in report] == [0] * 6
    ran = read()
    # rep 0 starts with paged, rep 1 with cascade; each point's cells share one call of their own
    assert [(r["system"], r["rep"]) for r in ran] == [("paged", "0"), ("cascade", "0"), ("granikv", "0"),
                                                      ("cascade", "1"), ("granikv", "1"), ("paged", "1")]
    assert len({r["call"] for r in ran[:3]}) == 1 and len({r["call"] for r in ran[3:]}) == 1
    assert ran[0]["call"] != ran[3]["call"]
    assert [r["overwrite"] for r in ran[3:]] == ["true", None, None]  # the measured cell, overwritten
    # run again: every point is measured, nothing starts
    assert all(r.get("skipped") == "measured" for r in batch.run(cells, 600.0, 1.0, tmp_path / "logs"))
    # as a re-measure list: measured at this commit in one call each, nothing starts either
    again = [point.with_overwrite(c) for c in cells]
    assert all(r.get("skipped") == "a" * 40 for r in batch.run(again, 600.0, 1.0, tmp_path / "logs"))
    assert len(read()) == 6
    # a point whose cells come from two calls is re-measured whole
    write_result(paths["granikv@0"], "a" * 40, "another-call")
    report = batch.run(again, 600.0, 1.0, tmp_path / "logs")
    assert [r["system"] for r in read()[6:]] == ["paged", "cascade", "granikv"]
    assert [r.get("skipped") for r in report] == [None] * 3 + ["a" * 40] * 3


def test_a_failed_cell_is_reported_and_the_points_other_cells_still_run(tmp_path, monkeypatch):
    base = ["model=llama-3.1-8b", "tp=1", "workload=sharegpt", "rate=inf", "lp=512", "batch=256", "rep=0",
            "sweep=table9", "hardware=h200", f"results_dir={tmp_path / 'results'}"]
    cells = [[f"system={s}", *base] for s in ("paged", "cascade", "granikv")]
    paths = {f"{s}@0": batch._result_path(c) for s, c in zip(("paged", "cascade", "granikv"), cells)}
    read = fake_cells(monkeypatch, tmp_path, paths, fail="cascade")
    report = batch.run(cells, budget_s=600.0, reserve_s=1.0, logs=tmp_path / "logs")
    assert [r["status"] for r in report] == [0, 1, 0] and [r["system"] for r in read()] == ["paged", "cascade",
                                                                                           "granikv"]
    assert batch.main(["run", str(_cell_list(tmp_path, cells)), "--logs", str(tmp_path / "logs"),
                       "--carry", str(tmp_path / "carry")]) == 1


def _cell_list(tmp_path, cells):
    import shlex

    f = tmp_path / "cells.txt"
    f.write_text("".join(shlex.join(c) + "\n" for c in cells))
    return f


# A cell stand-in: it starts a "server" in a session of its own (as harness.run.systems does) and,
# like harness.run.cell, stops it on SIGTERM; the server's pid goes to a file.
_CELL = r"""
import os, signal, subprocess, sys, time
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(str(server.pid))
def stop(signum, frame):
    os.killpg(server.pid, signal.SIGKILL); server.wait(); sys.exit(143)
if sys.argv[2] == "stops":
    signal.signal(signal.SIGTERM, stop)
else:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(600)
"""


def _wait_for(path, timeout=20.0):
    import time

    t = time.monotonic()
    while not (path.exists() and path.read_text()):
        assert time.monotonic() - t < timeout, "the stand-in cell never started its server"
        time.sleep(0.05)
    return int(path.read_text())


def test_a_timed_out_cell_is_terminated_so_that_it_stops_its_server(tmp_path):
    """subprocess.run's timeout SIGKILLs the cell, which leaves its server (own session) running
    and holding the GPU for every later cell; run_until SIGTERMs, which the cell handles."""
    import os
    import signal
    import sys

    pidfile = tmp_path / "server.pid"
    with (tmp_path / "cell.log").open("w") as log:
        rc = cell_proc.run_until([sys.executable, "-c", _CELL, str(pidfile), "stops"], log, timeout_s=3.0, grace_s=20.0)
    assert rc == "timeout"
    server = _wait_for(pidfile)
    dead = wait_dead(server, 5.0)
    if not dead:
        os.kill(server, signal.SIGKILL)
    assert dead, "the timed-out cell's server outlived it"


def test_a_cell_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    import os
    import signal
    import sys
    import time

    pidfile = tmp_path / "server.pid"
    t = time.monotonic()
    with (tmp_path / "cell.log").open("w") as log:
        rc = cell_proc.run_until([sys.executable, "-c", _CELL, str(pidfile), "ignores"], log, timeout_s=3.0,
                                 grace_s=1.0)
    took = time.monotonic() - t
    os.kill(_wait_for(pidfile), signal.SIGKILL)  # this stand-in's server is orphaned by design
    assert rc == "timeout" and took < 15


def test_a_cell_that_finishes_in_time_returns_its_exit_code(tmp_path):
    import sys

    with (tmp_path / "cell.log").open("w") as log:
        rc = cell_proc.run_until([sys.executable, "-c", "print('done'); raise SystemExit(3)"], log, timeout_s=30.0)
    assert rc == 3 and (tmp_path / "cell.log").read_text().strip() == "done"


def test_a_runner_stopped_while_it_waits_stops_its_cell_first(tmp_path):
    """harness.run.point turns SIGTERM (Snakemake stopping the job) into SystemExit inside run_until's
    wait: the cell is SIGTERMed before the runner unwinds, so it stops its server."""
    import os
    import signal
    import sys

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    pidfile = tmp_path / "server.pid"
    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 3.0)
    try:
        with (tmp_path / "cell.log").open("w") as log, pytest.raises(SystemExit):
            cell_proc.run_until([sys.executable, "-c", _CELL, str(pidfile), "stops"], log, timeout_s=None,
                                grace_s=20.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    server = _wait_for(pidfile)
    dead = wait_dead(server, 5.0)
    if not dead:
        os.kill(server, signal.SIGKILL)
    assert dead, "the stopped runner's cell left its server running"


def test_prepare_writes_the_commit_the_host_records(tmp_path, monkeypatch):
    """The host's copy of the tree may have a stale or no .git: scripts/gpu-host-env.sh exports
    the commit `prepare` wrote as GIT_SHA, which harness.run.provenance records in every cell."""
    monkeypatch.setenv("GIT_SHA", "c" * 40)
    assert batch.write_sha(tmp_path / ".carry" / "src.sha") == "c" * 40
    assert (tmp_path / ".carry" / "src.sha").read_text().strip() == "c" * 40
    env = (batch.ROOT / "scripts" / "gpu-host-env.sh").read_text()
    assert ".carry/src.sha" in env and "GIT_SHA" in env


def test_carried_site_packages_import_from_a_bare_interpreter(tmp_path):
    """`prepare` copies hydra, omegaconf and antlr4 into .carry/site; with that first on the path
    (as scripts/gpu-host-env.sh puts it) every one of them imports from the copy."""
    import subprocess
    import sys

    site = tmp_path / "site"
    copied = batch.carry_site(site)
    assert sorted(p.name for p in copied) == sorted(batch.SITE_PACKAGES)
    assert not list(site.rglob("__pycache__"))
    code = (f"import sys; sys.path.insert(0, {str(site)!r}); import hydra, omegaconf, antlr4; "
            f"assert all(m.__file__.startswith({str(site)!r}) for m in (hydra, omegaconf, antlr4))")
    subprocess.run([sys.executable, "-c", code], check=True)
    batch.carry_site(site)  # again: replaces, does not nest


def test_batch_and_the_engine_change_check_do_not_import_each_other():
    import subprocess
    import sys

    for first, never in (("harness.run.engine_changes", "harness.run.batch"),
                         ("harness.report.repetitions", "harness.run.batch"),
                         ("harness.run.batch", "harness.run.engine_changes")):
        code = f"import sys, {first}; assert {never!r} not in sys.modules"
        subprocess.run([sys.executable, "-c", code], cwd=batch.ROOT, check=True)


def test_one_call_runs_a_tagged_ab_list_in_its_order_in_one_call(tmp_path, monkeypatch):
    """`run --one-call`: an A/B whose sides are one system's tagged cells (two points by their
    tags) runs as the list says, alternated, all in one call."""
    base = ["model=llama-3.1-8b", "tp=1", "workload=sharegpt", "rate=inf", "lp=512", "batch=256", "system=granikv",
            "sweep=adhoc", "hardware=h200", f"results_dir={tmp_path / 'results'}"]
    cells = [[*base, f"tag=v1-{api}", f"client.api={api}", f"rep={r}"] for r in (0, 1)
             for api in ("generate", "completions")]
    read = fake_cells(monkeypatch, tmp_path, {f"granikv@{r}": tmp_path / "fake" / f"r{r}.json" for r in (0, 1)})
    report = batch.run(cells, budget_s=600.0, reserve_s=1.0, logs=tmp_path / "logs", one_call=True)
    assert [r["status"] for r in report] == [0] * 4
    ran = read()
    assert [r["rep"] for r in ran] == ["0", "0", "1", "1"] and len({r["call"] for r in ran}) == 1
    # without it, each tag and rep is a point of its own: four calls
    batch.run(cells, budget_s=600.0, reserve_s=1.0, logs=tmp_path / "logs")
    assert len({r["call"] for r in read()[4:]}) == 4


def test_land_refuses_a_cell_measured_on_another_card_than_its_folder(tmp_path):
    """results/h200/ holds H200 numbers: a cell that ran on an H100 (hardware.gpu=null, or from a
    tree without the cell's own check) is refused whole, before anything is written; the emulated
    a100-40gb folder takes any card."""
    res = tmp_path / "results"

    def cell(gpu: str) -> bytes:
        return json.dumps({"config": {"hardware": {"name": "h200", "gpu": None}}, "env": {"gpu": gpu}}).encode()

    tb = _tarball(tmp_path / "h100.tar.gz", {"results/h200/table9/paged-r0.json": cell("NVIDIA H200"),
                                             "results/h200/table9/granikv-r0.json": cell("NVIDIA H100 80GB HBM3")})
    with pytest.raises(ValueError, match=r"granikv-r0\.json .*H100 80GB HBM3"):
        batch.land(tb, res)
    assert not res.exists()
    ok = _tarball(tmp_path / "ok.tar.gz", {"results/h200/table9/paged-r0.json": cell("NVIDIA H200"),
                                           "results/a100-40gb/table19/paged-r0.json": cell("NVIDIA H100 80GB HBM3"),
                                           "results/h200/microbench/notes.json": b"{\"env\": {\"gpu\": \"x\"}}"})
    assert len(batch.land(ok, res)["new"]) == 3
