"""harness.run.cell: one cell end to end -> a valid result file; never overwrites; one-line summary.

End-to-end runs use tests/harness/fake_engine.py as the engine (`server.module=...`, a test
double: its numbers mean nothing); the composition tests use Hydra's compose API.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from proc_testutil import alive as _alive

from harness.run import cell, launch
from harness.run import env as cell_env
from harness.run.config import Cell, CellError, Hardware
from harness.run.results import validate_cell
from harness.run.sweeps import cell_id

ROOT = Path(__file__).resolve().parents[3]
FAKE = "server.module=tests.harness.fake_engine"


def _compose(*overrides: str) -> Cell:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return Cell.from_config(compose(config_name="config", overrides=list(overrides)))


def _run(*overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != cell_env.CALL_ID_ENV}  # a cell run alone
    return subprocess.run([sys.executable, "-m", "harness.run.cell", *overrides], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One small cell (tiny model, burst workload) measured against the fake engine."""
    root = tmp_path_factory.mktemp("cell")
    overrides = ["system=granikv", "model=tiny", "hardware=cpu", "workload=burst", "lp=32", "batch=4",
                 "num_prompts=6", "output_len=5", "workload.suffix_len=8", "sweep=table24", "hot_fraction=0.05",
                 f"results_dir={root}/results", f"workloads_dir={root}/workloads", FAKE,
                 "stands_for={model:llama-3.1-8b,lp:8192,batch:256}"]
    out = _run(*overrides)
    assert out.returncode == 0, out.stderr[-3000:]
    path = root / "results" / "cpu" / "table24" / "granikv-tiny-tp1-burst-lp32-b4-k1-r0-hot_fraction0.05.json"
    return overrides, out, path


def test_cell_writes_a_valid_result_file(measured):
    _, _, path = measured
    doc = json.loads(path.read_text())
    validate_cell(doc, path)
    c = doc["config"]
    assert (c["system"], c["model"], c["tp"], c["workload"], c["lp"], c["batch"], c["k"]) == \
        ("granikv", "tiny", 1, "burst", 32, 4, 1)
    assert c["hot_fraction"] == 0.05 and c["num_prompts"] == 6 and c["output_len"] == 5 and c["rate"] == "inf"
    assert c["sweep"] == "table24" and c["hardware"] == "cpu" and c["cell_id"] == path.stem
    assert c["stands_for"] == {"model": "llama-3.1-8b", "lp": 8192, "batch": 256}
    assert c["m_sat"] == 16  # from conf/hardware/cpu.yaml
    assert c["engine_args"]["hot_fraction"] == 0.05 and c["engine_args"]["max_running"] == 4
    assert c["workload_config"]["kind"] == "burst" and c["workload_config"]["vocab_size"] == 1024
    m = doc["metrics"]
    assert m["completed"] == 6 and m["failed"] == 0 and m["total_output_tokens"] == 30
    assert doc["engine"]["decode_steps"] > 0 and doc["engine"]["hot_admits"] == 1
    # the counters after the warm-up request: it decoded, and the measured run decoded more
    warm = doc["engine_after_warmup"]
    assert 0 < warm["decode_steps"] < doc["engine"]["decode_steps"]
    env = doc["env"]
    for key in ("gpu", "gpu_count", "torch", "triton", "python", "git_sha", "started_at"):
        assert key in env
    assert re.fullmatch(r"[0-9a-f]{32}", env["call_id"])  # run alone (no GRANIKV_CALL_ID): a call of its own
    assert doc["run"]["flush_status"] == 200
    # which side of the stream was busy: the client's CPU over the run, the HTTP process's CPU
    # and chunk count (from /server_info), before and after the warm-up
    assert doc["run"]["client_cpu_s"] > 0
    assert doc["engine"]["server_cpu_s"] >= warm["server_cpu_s"] > 0
    assert doc["engine"]["server_chunks_sent"] - warm["server_chunks_sent"] == 6 * 5


def test_run_dir_is_next_to_the_result(measured):
    _, _, path = measured
    run = path.with_suffix(".run")
    assert (run / "server.log").read_text().count("granikv server ready") == 1
    assert list(run.glob("hydra/*/config.yaml")) and (run / "client.json").is_file()
    assert json.loads((run / "server_info.json").read_text())["attention"]["decode_steps"] > 0


def test_one_line_summary(measured):
    _, out, path = measured
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith(f"cell {path.stem}: ") and "out tok/s" in lines[0] and str(path) in lines[0]


def test_refuses_to_overwrite(measured):
    overrides, _, path = measured
    before = path.read_bytes()
    out = _run(*overrides)
    assert out.returncode == cell.EXIT_EXISTS
    assert "exists; not overwriting" in out.stderr and "overwrite=true" in out.stderr
    assert path.read_bytes() == before
    assert (path.with_suffix(".run") / "server.log").read_text().count("launching") == 1  # nothing launched


def test_cell_id_names_the_grid_point():
    base = {"system": "paged", "model": "llama-3.1-8b", "tp": 1, "workload": "sharegpt", "lp": 16384,
            "batch": 256, "k": 1, "rep": 0}
    assert cell_id(base) == "paged-llama-3.1-8b-tp1-sharegpt-lp16384-b256-k1-r0"
    assert cell_id({**base, "hot_fraction": 0.2, "m_sat": None, "rate": "inf"}) == cell_id(base)
    assert cell_id({**base, "m_sat": 2**31}).endswith("-m_sat2147483648")
    assert cell_id({**base, "cold_page_size": 16, "rate": 4.0}).endswith("-cold_page_size16-rate4")


def test_identity_and_path_from_composed_config(tmp_path):
    cfg = _compose("system=cascade", "model=qwen2.5-14b", "tp=2", "workload=multiprefix", "batch=128",
                   "sweep=table20", f"results_dir={tmp_path}")
    assert cfg.identity.lp == 8192 and cfg.identity.k == 4  # the kind's defaults
    name = "cascade-qwen2.5-14b-tp2-multiprefix-lp8192-b128-k4-r0.json"
    assert cfg.result_path == tmp_path / "h200" / "table20" / name


def test_top_level_keys_win_over_the_workload_group():
    cfg = _compose("workload=multiprefix", "lp=1024", "workload.k=16", "num_prompts=40", "model=tiny")
    w = cfg.workload
    assert (w.kind, w.lp, w.k, w.num_requests, w.vocab_size) == ("multiprefix", 1024, 16, 40, 1024)
    hetero = _compose("workload=hetero", "workload.k=8").workload
    assert hetero.lps == (1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)


def test_hardware_m_sat_forms():
    assert launch.hardware_m_sat(None, 4) is None
    assert launch.hardware_m_sat(1024, 4) == 1024
    assert launch.hardware_m_sat({4: 900, 5: 1100}, 5) == 1100
    assert launch.hardware_m_sat({"g4": 768}, 4) == 768
    assert launch.hardware_m_sat({"by_group_size": {"4": 640}, "sweep": {"B": [1, 2]}}, 4) == 640
    assert launch.hardware_m_sat({"value": 512, "note": "x"}, 7) == 512


def test_m_sat_resolution_order():
    assert launch.effective_m_sat(_compose("hardware=a100-40gb")) == 1024
    assert launch.effective_m_sat(_compose("hardware=cpu", "model=tiny")) == 16
    assert launch.effective_m_sat(_compose("hardware=cpu", "m_sat=2147483648")) == 2**31


def test_a100_emulation_kv_budget():
    hw = {"name": "a100-40gb", "kv_budget_gb": None, "emulate": {"hbm_gib": 40, "static_fraction": 0.827}}
    a100 = Hardware.from_mapping(hw)
    assert launch.kv_budget_gb(a100, "llama-3.1-8b", 1) == pytest.approx(19.46, abs=0.01)
    assert launch.kv_budget_gb(a100, "qwen2.5-32b", 2) == pytest.approx(2.76, abs=0.01)
    assert launch.kv_budget_gb(Hardware.from_mapping({**hw, "kv_budget_gb": 7.5}), "llama-3.1-8b", 1) == 7.5
    h200 = Hardware.from_mapping({"name": "h200", "kv_budget_gb": None, "emulate": None})
    assert launch.kv_budget_gb(h200, "llama-3.1-8b", 1) is None
    with pytest.raises(CellError, match="does not fit"):
        launch.kv_budget_gb(a100, "qwen2.5-32b", 1)


def test_engine_args_are_validated():
    cfg = _compose("model=tiny", "hardware=cpu", "+server.extra.not_a_field=1")
    with pytest.raises(CellError, match="not EngineConfig fields"):
        launch.engine_args(cfg, 256)
    cfg = _compose("model=tiny", "hardware=cpu", "hot_fraction=1.5")
    with pytest.raises(CellError, match="hot_fraction"):
        launch.engine_args(cfg, 256)


def test_granikv_gets_the_hardware_dispatch_threshold_and_the_others_do_not():
    h200 = launch.engine_args(_compose("system=granikv", "hardware=h200"), 1024)
    assert h200["prefix_pass_min_saved_mib"] == 192
    assert launch.engine_args(_compose("system=granikv", "hardware=cpu", "model=tiny"), 256)[
        "prefix_pass_min_saved_mib"] == 0
    a100 = launch.engine_args(_compose("system=granikv", "hardware=a100-40gb"), 1024)
    assert a100["prefix_pass_min_saved_mib"] is None
    for system in ("paged", "cascade"):
        args = launch.engine_args(_compose(f"system={system}", "hardware=h200"), 1024)
        assert "prefix_pass_min_saved_mib" not in args


def test_gpu_memory_rows_parse_nvidia_smi_and_skip_noise():
    text = "0, 1024, 143771\n1, 61000, 143771\n\n[N/A], 3, 4\n"
    assert cell_env.parse_gpu_memory(text) == [{"index": 0, "used_mib": 1024, "total_mib": 143771},
                                           {"index": 1, "used_mib": 61000, "total_mib": 143771}]
    assert cell_env.parse_gpu_memory("") == []


def test_busy_gpus_looks_at_the_gpus_the_server_will_use():
    rows = [{"index": 0, "used_mib": 0, "total_mib": 143771}, {"index": 1, "used_mib": 120000, "total_mib": 143771},
            {"index": 2, "used_mib": 5000, "total_mib": 143771}]
    assert cell_env.busy_gpus(rows, tp=1, visible=None, limit_mib=2048) == []
    assert [r["index"] for r in cell_env.busy_gpus(rows, tp=2, visible=None, limit_mib=2048)] == [1]
    assert [r["index"] for r in cell_env.busy_gpus(rows, tp=1, visible="2,0", limit_mib=2048)] == [2]
    assert cell_env.busy_gpus(rows, tp=1, visible="2,0", limit_mib=8192) == []
    # UUIDs or an empty value: no mapping to nvidia-smi's indices is known, so the first GPUs
    assert [r["index"] for r in cell_env.busy_gpus(rows, tp=3, visible="GPU-abc", limit_mib=2048)] == [1, 2]
    assert cell_env.busy_gpus(rows, tp=1, visible="", limit_mib=2048) == []


def test_a_cell_refuses_a_busy_gpu_before_starting_its_server(tmp_path, monkeypatch):
    busy = [{"index": 0, "used_mib": 120000, "total_mib": 143771}]
    monkeypatch.setattr(cell_env, "gpu_memory", lambda: busy)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    launched = []
    monkeypatch.setattr(cell.systems, "launch", lambda spec: launched.append(spec))
    cfg = _compose("model=tiny", "hardware=cpu", "workload=burst", "lp=16", "batch=1", "num_prompts=1",
                   "output_len=2", "workload.suffix_len=4", f"results_dir={tmp_path / 'res'}",
                   f"workloads_dir={tmp_path / 'wl'}")
    assert cell_env.check_gpus_idle(cfg) == busy  # a CPU cell on a GPU host: recorded, not refused
    cfg = replace(cfg, hardware=replace(cfg.hardware, device="cuda"))
    with pytest.raises(CellError, match=r"GPU 0: 120000 of 143771 MiB.*busy_gpu_mib=null"):
        cell.run_cell(cfg, tmp_path / "run")
    assert launched == []
    # the knob turns the check off; the reading is still what the result records
    assert cell_env.check_gpus_idle(replace(cfg, server=replace(cfg.server, busy_gpu_mib=None))) == busy
    monkeypatch.setattr(cell_env, "gpu_memory", lambda: None)  # no nvidia-smi (a CPU host): no check
    assert cell_env.check_gpus_idle(cfg) is None


def test_a_cell_stopped_during_its_run_writes_no_result(tmp_path):
    """SIGTERM raised inside aiohttp's protocol callback is caught there and becomes one failed
    request (harness.run.batch's deadline once left such a cell's 499-of-500 result behind): the
    handler's event, not the exception, is what keeps the result file from being written."""
    cfg = _compose("model=tiny", "hardware=cpu", "workload=burst", "lp=16", "batch=2", "num_prompts=2",
                   "output_len=3", "workload.suffix_len=4", "warmup=0", f"results_dir={tmp_path}/r",
                   f"workloads_dir={tmp_path}/w", FAKE)
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(SystemExit):
        cell.run_cell(cfg, tmp_path / "run", stopped=stopped)
    assert not cfg.result_path.exists()
    assert (tmp_path / "run" / "client.json").exists()  # the run itself happened
    handler = cell._terminator(ev := threading.Event())
    with pytest.raises(SystemExit):
        handler(signal.SIGTERM, None)
    assert ev.is_set()


def test_sigterm_to_the_cell_stops_the_server_and_writes_nothing(tmp_path):
    pidfile = tmp_path / "server.pid"
    proc = subprocess.Popen([sys.executable, "-m", "harness.run.cell", "model=tiny", "hardware=cpu", "workload=burst",
                             "lp=16", "batch=1", "num_prompts=1", "output_len=1000", "workload.suffix_len=4",
                             "warmup=0", f"results_dir={tmp_path}/r", f"workloads_dir={tmp_path}/w", FAKE,
                             "+hardware.env.FAKE_TOKEN_DELAY=1", f"+hardware.env.FAKE_PIDFILE={pidfile}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not pidfile.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert pidfile.exists(), proc.communicate()[1][-2000:]
        server = int(pidfile.read_text().split()[0])
        time.sleep(1.0)  # the measured run is streaming now
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    end = time.monotonic() + 30
    while _alive(server) and time.monotonic() < end:
        time.sleep(0.1)
    assert not _alive(server)
    assert not list((tmp_path / "r").rglob("*.json"))


def test_a_stalled_engine_fails_the_cell_instead_of_hanging(tmp_path):
    out = _run("model=tiny", "hardware=cpu", "workload=burst", "lp=16", "batch=2", "num_prompts=2", "output_len=4",
               "workload.suffix_len=4", "warmup=0", f"results_dir={tmp_path}/r", f"workloads_dir={tmp_path}/w", FAKE,
               "+hardware.env.FAKE_STALL=1", "server.stall_timeout_s=3")
    assert out.returncode == 1
    assert "holds 2 requests but made no step for 3 s" in out.stderr
    assert not list((tmp_path / "r").rglob("*.json"))


def test_engine_counters_flatten_the_loop_clock_so_the_warm_up_snapshot_keeps_it():
    from harness.run.cell import engine_counters, warmup_counters

    info = {"steps": {"extend": 3, "decode": 9}, "step_time_s": {"extend": 0.5, "decode": 1.5},
            "loop": {"idle_s": 0.2, "add_s": 0.1, "adds": 4, "step_s": 2.1, "steps": 12, "send_s": 0.05,
                     "cmd_s": 0.0}}
    out = engine_counters({**info, "startup": {"build_s": 3.0, "capture_s": 2.5, "engine_s": 7.0}})
    assert out["loop_step_s"] == 2.1 and out["loop_adds"] == 4 and out["extend_time_s"] == 0.5
    assert out["startup"] == {"build_s": 3.0, "capture_s": 2.5, "engine_s": 7.0}
    assert warmup_counters(info)["loop_idle_s"] == 0.2


def test_engine_counters_keep_the_dispatchers_class_sizes():
    from harness.run.cell import engine_counters, warmup_counters

    attn = {"decode_steps": 3, "cascade_steps": 2, "class_decisions": {"dense": 0, "cascade": 4, "plain": 1},
            "class_sizes": {"dense": {}, "cascade": {"64": 3, "65": 1}, "plain": {"1": 1}}, "other": {"x": 1}}
    out = engine_counters({"attention": attn})
    assert out["class_sizes"] == attn["class_sizes"] and out["class_decisions"] == attn["class_decisions"]
    assert "other" not in out and out["cascade_steps"] == 2
    assert "class_sizes" not in warmup_counters({"attention": attn})  # the snapshot stays scalar


def test_a_tag_names_an_ab_cell_apart_and_is_absent_by_default():
    from harness.run.sweeps import cell_id

    base = {"system": "granikv", "model": "llama-3.1-8b", "tp": 1, "workload": "sharegpt", "lp": 16384,
            "batch": 256, "k": 1, "rep": 0}
    assert cell_id(base) == "granikv-llama-3.1-8b-tp1-sharegpt-lp16384-b256-k1-r0"
    assert cell_id({**base, "tag": None}) == cell_id(base)
    assert cell_id({**base, "tag": "long-keys"}) == cell_id(base) + "-taglong-keys"


@pytest.mark.parametrize("api", ["generate", "completions"])
def test_the_client_gets_the_configured_api(api):
    """`client.api` reaches the client, and the result file's `config.client` (the client's own
    settings) records it: an A/B of the two APIs is two runs of the API each cell names."""
    cfg = _compose("system=granikv", f"client.api={api}", "client.model=m")
    client = cell.client_config(cfg)
    assert client.api == api and client.model == "m"
    assert client.to_dict()["api"] == api


def test_gpu_matches_the_profile_card_by_word():
    assert cell_env.gpu_matches("NVIDIA H200", "NVIDIA H200")
    assert cell_env.gpu_matches("NVIDIA H200", "NVIDIA H200 NVL, NVIDIA H200")
    assert not cell_env.gpu_matches("NVIDIA H200", "NVIDIA H100 80GB HBM3")
    assert not cell_env.gpu_matches("NVIDIA H200", "NVIDIA H200, NVIDIA H100 80GB HBM3")  # every card
    assert not cell_env.gpu_matches("NVIDIA H20", "NVIDIA H200")  # a prefix of another card's name
    assert not cell_env.gpu_matches("NVIDIA H200", "none")
    assert cell_env.gpu_matches(None, "NVIDIA H100 80GB HBM3")


def test_a_cell_refuses_another_card_than_its_hardware_profile(tmp_path, monkeypatch):
    """An h200 cell on an H100 would land in the H200 tables as an H200 number: refused before any
    work, with the way out in the message; an emulated card (a100-40gb) runs on any host."""
    monkeypatch.setattr(cell_env, "gpus", lambda: ("NVIDIA H100 80GB HBM3", 1))
    launched = []
    monkeypatch.setattr(cell.systems, "launch", lambda spec: launched.append(spec))
    cfg = _compose("model=tiny", "hardware=h200", "workload=burst", "lp=16", "batch=1", "num_prompts=1",
                   "output_len=2", "workload.suffix_len=4", f"results_dir={tmp_path / 'res'}",
                   f"workloads_dir={tmp_path / 'wl'}")
    with pytest.raises(CellError, match=r"GPU is NVIDIA H100 80GB HBM3.*hardware\.gpu=null"):
        cell.run_cell(cfg, tmp_path / "run")
    assert launched == [] and not (tmp_path / "wl").exists()
    cell_env.check_gpu_model(replace(cfg, hardware=replace(cfg.hardware, gpu=None)))
    a100 = _compose("model=tiny", "hardware=a100-40gb", "workload=burst", "lp=16", "batch=1")
    cell_env.check_gpu_model(a100)
    monkeypatch.setattr(cell_env, "gpus", lambda: ("NVIDIA H200", 1))
    cell_env.check_gpu_model(_compose("model=tiny", "hardware=h200", "workload=burst", "lp=16", "batch=1"))
