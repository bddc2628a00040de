"""harness.run.systems: launch a server subprocess, wait for health, log to a file, always stop it.

The server here is tests/harness/fake_engine.py (a test double that speaks the engine's API);
its flags make it slow, never healthy, crash, ignore SIGTERM or spawn a child.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from proc_testutil import wait_dead as _wait_dead

from harness.run import systems

ROOT = Path(__file__).resolve().parents[3]


def _spec(tmp_path: Path, *flags: str, timeout: float = 60.0, grace: float = 5.0) -> systems.LaunchSpec:
    port = systems.free_port()
    argv = systems.engine_command({"model": "tiny", "system": "paged", "kv_budget_gb": None}, "127.0.0.1", port,
                                  module="tests.harness.fake_engine") + list(flags)
    return systems.LaunchSpec(name="fake", argv=tuple(argv), host="127.0.0.1", port=port,
                              log_path=tmp_path / "logs" / "server.log", ready_timeout_s=timeout,
                              stop_grace_s=grace, cwd=str(ROOT))


def test_engine_command_spells_flags():
    argv = systems.engine_command({"model": "tiny", "tp": 2, "cuda_graphs": False, "kv_budget_gb": None,
                                   "graph_batch_sizes": (1, 2)}, "127.0.0.1", 31000, python="py")
    assert argv == ["py", "-m", "granikv.server", "--host", "127.0.0.1", "--port", "31000", "--model", "tiny",
                    "--tp", "2", "--cuda-graphs", "false", "--graph-batch-sizes", "1,2"]


def test_external_command_template():
    argv = systems.external_command("{python} -m sglang.launch_server --port {port} --tp-size {tp}",
                                    {"python": "py", "port": 5, "tp": 2})
    assert argv == ["py", "-m", "sglang.launch_server", "--port", "5", "--tp-size", "2"]
    with pytest.raises(ValueError, match="needs 'port'"):
        systems.external_command("{python} --port {port}", {"python": "py"})


def test_start_health_stop_and_log(tmp_path):
    spec = _spec(tmp_path, "--fake-startup-delay", "0.5")
    with systems.launch(spec) as system:
        assert system.ready_after_s is not None and system.ready_after_s >= 0.5
        info = systems.get_json(system.base_url, "/server_info")
        assert "attention" in info
        pid = system.pid
    assert _wait_dead(pid)
    assert system.returncode == 0
    log = spec.log_path.read_text()
    assert "launching fake" in log and "granikv server ready" in log and "stopped, exit code 0" in log


def test_health_timeout_is_a_clear_error_and_the_server_is_killed(tmp_path):
    spec = _spec(tmp_path, "--fake-never-healthy", "--fake-pidfile", str(tmp_path / "pid"), timeout=2.0)
    with pytest.raises(systems.SystemStartError, match=r"did not answer /health with 200 within 2 s") as e:
        with systems.launch(spec):
            pass
    assert "server.log" in str(e.value) and "granikv server ready" in str(e.value)  # the log tail is quoted
    pid = int((tmp_path / "pid").read_text().split()[0])
    assert _wait_dead(pid)


def test_exit_before_ready_reports_code_and_log(tmp_path):
    spec = _spec(tmp_path, "--fake-exit-code", "7")
    with pytest.raises(systems.SystemStartError, match="exited with code 7 before it was ready") as e:
        with systems.launch(spec):
            pass
    assert "exiting on purpose" in str(e.value)


def test_failure_inside_the_cell_still_stops_the_whole_group(tmp_path):
    pidfile = tmp_path / "pid"
    spec = _spec(tmp_path, "--fake-ignore-sigterm", "--fake-spawn-child", "--fake-pidfile", str(pidfile), grace=1.0)
    with pytest.raises(RuntimeError, match="boom"):
        with systems.launch(spec):
            raise RuntimeError("boom")
    leader, child = (int(x) for x in pidfile.read_text().split())
    assert child > 0
    assert _wait_dead(leader) and _wait_dead(child)  # SIGTERM ignored -> SIGKILL to the process group


def test_missing_external_system_is_skipped_with_a_message():
    with pytest.raises(systems.SystemUnavailable, match="not installed on this host.*skipping"):
        systems.require_module("sglang", "no_such_module_granikv_test")


@pytest.mark.skipif(systems.module_available("sglang"), reason="SGLang is installed here")
def test_sglang_cell_is_skipped_when_sglang_is_absent(tmp_path):
    import subprocess

    out = subprocess.run([sys.executable, "-m", "harness.run.cell", "system=sglang", "model=tiny", "hardware=cpu",
                          f"results_dir={tmp_path}", f"workloads_dir={tmp_path}/w", "workload=burst",
                          "num_prompts=2", "lp=16", "batch=1", "output_len=2", "workload.suffix_len=4"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "skipped" in out.stdout and "sglang" in out.stdout and "not installed" in out.stdout
    assert not list(Path(tmp_path).glob("cpu/adhoc/*.json"))
