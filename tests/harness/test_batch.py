"""harness.batch: cell lists, the xz carry round trip, the time budget."""

from __future__ import annotations

import pytest
from proc_testutil import wait_dead

from harness import batch


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


def test_every_committed_cell_list_parses():
    for f in sorted((batch.ROOT / "scripts" / "gpu-batches").glob("*.txt")):
        assert batch.read_cells(f), f


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


def test_sweep_lines_filter_group_systems_and_leave_out_measured(tmp_path):
    profile = batch.ROOT / "profiles" / "h200" / "pipeline.yaml"
    lines = batch.sweep_lines("table9", profile, ["lp=512,2048", "batch=256"], None)
    assert len(lines) == 6
    # the three systems of one (Lp, B) point are adjacent, in the sweep's system order
    systems = [next(t for t in ln.split() if t.startswith("system=")) for ln in lines]
    assert systems == ["system=paged", "system=cascade", "system=granikv"] * 2
    assert all("lp=512 " in ln for ln in lines[:3]) and all("lp=2048 " in ln for ln in lines[3:])
    (tmp_path / "table9").mkdir()
    (tmp_path / "table9" / "cascade-llama-3.1-8b-tp1-sharegpt-lp512-b256-k1-r0.json").write_text("{}")
    left = batch.sweep_lines("table9", profile, ["lp=512", "batch=256"], tmp_path)
    assert [ln for ln in left if "system=cascade" in ln] == [] and len(left) == 2


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


def test_supersede_moves_the_result_files_a_list_would_overwrite(tmp_path):
    cells = [["model=llama-3.1-8b", "tp=1", "workload=sharegpt", "rate=inf", f"system={s}", "lp=512", "batch=256",
              "rep=1", "sweep=table9", "hardware=h200", "results_dir=results", "overwrite=true"]
             for s in ("paged", "granikv")]
    res = tmp_path / "results"
    old = res / "h200" / "table9" / "paged-llama-3.1-8b-tp1-sharegpt-lp512-b256-k1-r1.json"
    old.parent.mkdir(parents=True)
    old.write_text('{"old": true}')
    into = res / "h200" / "history" / "why"
    hist = into / "table9" / old.name
    assert batch.supersede(cells, into, res, dry_run=True) == [(old, hist)]
    assert old.exists()  # a dry run moves nothing
    moves = batch.supersede(cells, into, res)
    assert moves == [(old, hist)] and not old.exists()  # the granikv cell had no file
    assert hist.read_text() == '{"old": true}'
    old.write_text("{}")
    with pytest.raises(FileExistsError):  # never overwrite an earlier superseded file
        batch.supersede(cells, into, res)
    assert old.exists()


def _tarball(path, files: dict[str, bytes]):
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_land_moves_only_the_files_a_call_replaced_then_extracts(tmp_path):
    res = tmp_path / "results"
    kept = res / "h200" / "table9" / "granikv-r0.json"  # its cell failed on the GPU: not in the tarball
    old = res / "h200" / "table9" / "paged-r0.json"
    for p, text in ((kept, "kept"), (old, "old")):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    tb = _tarball(tmp_path / "call1.tar.gz", {"results/h200/table9/paged-r0.json": b"new",
                                              "results/h200/table6/cascade-r0.json": b"fresh",
                                              "batch-logs/cell00.log": b"log"})
    into = res / "h200" / "history" / "why"
    hist = into / "table9" / "paged-r0.json"
    plan = batch.land(tb, into, res, dry_run=True)
    assert plan == {"replaced": [(old, hist)], "new": [res / "h200" / "table6" / "cascade-r0.json"]}
    assert old.read_text() == "old" and not into.exists()  # a dry run changes nothing
    batch.land(tb, into, res)
    assert hist.read_text() == "old" and old.read_text() == "new"
    assert (res / "h200" / "table6" / "cascade-r0.json").read_text() == "fresh"
    assert kept.read_text() == "kept" and not (into / "table9" / "granikv-r0.json").exists()
    assert not (res / "batch-logs").exists() and not list(res.rglob("*.landing"))
    # landing again into the same folder would overwrite a history file: refused, nothing moves
    with pytest.raises(FileExistsError):
        batch.land(tb, into, res)
    assert old.read_text() == "new" and hist.read_text() == "old"


def test_land_keeps_two_sweeps_cells_of_one_name_apart_in_history(tmp_path):
    # Table 18's and Table 24's default granikv cells share a file name; one call re-measures both
    res = tmp_path / "results"
    name = "granikv-llama-3.1-8b-tp1-burst-lp8192-b256-k1-r0.json"
    for sweep in ("table18", "table24"):
        (res / "h200" / sweep).mkdir(parents=True)
        (res / "h200" / sweep / name).write_text(f"old {sweep}")
    tb = _tarball(tmp_path / "call.tar.gz", {f"results/h200/{sw}/{name}": f"new {sw}".encode()
                                             for sw in ("table18", "table24")})
    into = res / "h200" / "history" / "why"
    batch.land(tb, into, res)
    for sweep in ("table18", "table24"):
        assert (into / sweep / name).read_text() == f"old {sweep}"
        assert (res / "h200" / sweep / name).read_text() == f"new {sweep}"


@pytest.mark.parametrize("name", ["results/../escape.json", "/results/abs.json"])
def test_land_refuses_members_outside_results(tmp_path, name):
    res = tmp_path / "results"
    res.mkdir()
    tb = _tarball(tmp_path / "bad.tar.gz", {"results/h200/ok.json": b"{}", name: b"x"})
    with pytest.raises(ValueError):
        batch.land(tb, res / "history" / "x", res)
    assert not (res / "h200").exists() and not (tmp_path / "escape.json").exists()


def test_a_re_measure_list_run_again_skips_the_cells_this_commit_already_re_measured(tmp_path, monkeypatch):
    import json

    from harness.cell_config import result_path

    ov = ["model=llama-3.1-8b", "tp=1", "workload=sharegpt", "rate=inf", "system=paged", "lp=512", "batch=256",
          "rep=0", "sweep=table9", "hardware=h200", f"results_dir={tmp_path}", "overwrite=true"]
    path = result_path(batch.compose(ov[:-1]))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"env": {"git_sha": "a" * 40}}))
    assert batch.measured_at_this_commit(ov, sha="a" * 40) == "a" * 40
    assert batch.measured_at_this_commit(ov, sha="b" * 40) is None  # measured before: re-measure it
    assert batch.measured_at_this_commit(ov, sha="a" * 40 + "-dirty") is None
    assert batch.measured_at_this_commit(ov[:-1], sha="a" * 40) is None  # no overwrite: harness.cell skips it
    path.write_text("not json")
    assert batch.measured_at_this_commit(ov, sha="a" * 40) is None
    # run() skips such a cell without starting it
    monkeypatch.setattr(batch, "measured_at_this_commit", lambda o, sha=None: "c" * 40)
    monkeypatch.setattr(batch.subprocess, "run", lambda *a, **k: pytest.fail("a skipped cell was started"))
    report = batch.run([ov], budget_s=600.0, reserve_s=10.0, logs=tmp_path / "logs")
    assert report == [{"cell": ov, "status": 0, "skipped": "c" * 40}]


# A cell stand-in: it starts a "server" in a session of its own (as harness.systems does) and,
# like harness.cell, stops it on SIGTERM; the server's pid goes to a file.
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
        rc = batch.run_until([sys.executable, "-c", _CELL, str(pidfile), "stops"], log, timeout_s=3.0, grace_s=20.0)
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
        rc = batch.run_until([sys.executable, "-c", _CELL, str(pidfile), "ignores"], log, timeout_s=3.0, grace_s=1.0)
    took = time.monotonic() - t
    os.kill(_wait_for(pidfile), signal.SIGKILL)  # this stand-in's server is orphaned by design
    assert rc == "timeout" and took < 15


def test_a_cell_that_finishes_in_time_returns_its_exit_code(tmp_path):
    import sys

    with (tmp_path / "cell.log").open("w") as log:
        rc = batch.run_until([sys.executable, "-c", "print('done'); raise SystemExit(3)"], log, timeout_s=30.0)
    assert rc == 3 and (tmp_path / "cell.log").read_text().strip() == "done"
