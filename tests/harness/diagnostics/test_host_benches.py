"""harness.diagnostics.http_parse and server_start: the server process's per-prompt work and the
server's start-up, both host-only, so the CPU suite runs them end to end."""

from __future__ import annotations

import json

from harness.diagnostics import http_parse, server_start


def test_http_parse_times_every_phase(tmp_path):
    out = tmp_path / "hp.json"
    assert http_parse.main(["--lp", "16,300", "--reps", "3", "--out", str(out)]) == 0
    recs = json.loads(out.read_text())["records"]
    assert [(r["lp"], r["tokens"]) for r in recs] == [(16, 16 + http_parse.SUFFIX), (300, 300 + http_parse.SUFFIX)]
    for r in recs:
        assert all(r[f"{p}_us"] >= 0 for p in ("json", "validate", "to_array"))
        assert r["total_us"] >= r["json_us"]


def test_server_start_records_ready_time_and_the_servers_split(tmp_path):
    out = tmp_path / "ss.json"
    assert server_start.main(["--runs", "1", "--extra", "--kernel-impl torch", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    run = doc["records"][0]
    assert run["ready_s"] > 0
    assert {"build_s", "capture_s", "engine_s", "process_s"} <= set(run)
    assert run["process_s"] <= run["ready_s"]  # spawn-to-ready lies inside launch-to-ready
    assert doc["median"]["ready_s"] == run["ready_s"]
