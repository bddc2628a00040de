"""harness.microbench.server on the CPU with a few requests: the simulated engine behind the real
server and client serves every request in both streaming modes and both engine placements,
and the record carries what the notes table reads. Its ratios on a shared CI host are not
asserted (a benchmark's goal never lives in a test)."""

from __future__ import annotations

import json
import socket

import pytest

from harness.microbench import server as S


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("streaming", ["cumulative", "incremental"])
def test_every_request_is_served_in_both_streaming_modes(streaming):
    r = S.measure(4, 2.0, 8, 12, host_ms=0.5, port=_free_port(),
                  mode="thread", streaming=streaming)
    assert r["completed"] == 8 and r["streaming"] == streaming
    assert r["engine_decode_steps"] >= 12 and r["output_throughput"] > 0


def test_cli_writes_records_and_the_notes_table_reads_them(tmp_path):
    out = tmp_path / "server.json"
    assert S.main(["--mode", "process", "--batch", "2", "--step-ms", "2", "--output-len", "6", "--waves", "1",
                   "--host-ms", "0.5", "--streaming", "incremental", "--port", str(_free_port()),
                   "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["streaming"] for r in doc["records"]] == ["incremental"]
    table = S.notes_table(str(out))
    assert "| process | incremental | 6 | 2 |" in table


def test_arrival_quantiles_are_measured_from_the_first_arrival():
    times = [10.0 + i / 100 for i in range(100)][::-1]  # any order
    assert S.arrival_quantile(times, 0.0) == 0.0
    assert S.arrival_quantile(times, 0.5) == pytest.approx(0.5)
    assert S.arrival_quantile(times, 1.0) == pytest.approx(0.99)


def test_wave_ramps_are_each_later_waves_spread_in_arrival_order():
    # two waves of 3: the first arrives at once, the second over 0.4 s; a partial third wave of 1
    times = [5.0, 5.0, 5.0, 6.0, 6.1, 6.4, 9.0][::-1]
    assert S.wave_ramps(times, 3) == pytest.approx([0.4, 0.0])
    assert S.wave_ramps(times[:3], 3) == []  # one wave: no later wave


def test_a_two_wave_run_records_the_second_waves_ramp():
    r = S.measure(4, 2.0, 8, 6, host_ms=0.5, port=_free_port(), mode="thread", streaming="incremental")
    assert len(r["wave_ramps_s"]) == 1 and 0.0 <= r["wave_ramps_s"][0] < r["duration_s"]


def test_backlog_is_recorded_and_a_small_one_still_serves_everyone():
    from granikv.server.app import LISTEN_BACKLOG

    r = S.measure(4, 2.0, 8, 6, host_ms=0.5, port=_free_port(), mode="thread", streaming="incremental")
    assert r["backlog"] == LISTEN_BACKLOG and set(r["arrival_quantiles_s"]) == {"0.5", "0.75", "0.9", "1.0"}
    r = S.measure(4, 2.0, 8, 6, host_ms=0.5, port=_free_port(), mode="thread", streaming="incremental", backlog=8)
    assert r["backlog"] == 8 and r["completed"] == 8
