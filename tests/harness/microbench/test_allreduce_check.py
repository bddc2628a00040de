"""The TP all-reduce comparison (harness.microbench.allreduce --engine-cell): a TP cell's
profiled NCCL time per call against bytes over the peak bus bandwidth and against the isolated
per-call time at the same message size. Pure arithmetic on result files: runs on a CPU."""

from __future__ import annotations

import json

import pytest

from harness.microbench import allreduce


def _cell(nccl_ms=66.0, kernels=2000, steps=20, running=256):
    return {"config": {"model": "qwen2.5-14b", "tp": 2, "batch": 256},
            "profile": {"nccl_ms": nccl_ms, "kernel_counts": {"nccl": kernels}, "steps": steps,
                        "running": running, "decode_wall_ms": 1000.0}}


MEASURED = {"peak_busbw_GBps": 262.144, "records": [
    {"kind": "decode", "B": 128, "hidden": 5120, "us": 40.0},
    {"kind": "decode", "B": 256, "hidden": 5120, "us": 30.0},
    {"kind": "decode", "B": 256, "hidden": 4096, "us": 99.0},
    {"kind": "large", "B": None, "hidden": None, "us": 80.0}]}


def test_engine_all_reduce_against_both_floors():
    r = allreduce.engine_vs_isolated(_cell(), MEASURED)
    assert r["message_bytes"] == 256 * 5120 * 2
    assert r["engine_us_per_call"] == pytest.approx(33.0)
    assert r["calls_per_step"] == 100
    assert r["bytes_over_peak_busbw_us"] == pytest.approx(256 * 5120 * 2 / 262.144e9 * 1e6)
    assert r["isolated_B"] == 256 and r["engine_over_isolated"] == pytest.approx(1.1)
    assert r["nccl_share_of_step"] == pytest.approx(0.066)


def test_nearest_batch_of_the_same_hidden_size_and_no_nccl_is_an_error(tmp_path):
    assert allreduce.engine_vs_isolated(_cell(running=100), MEASURED)["isolated_B"] == 128
    with pytest.raises(ValueError, match="no NCCL"):
        allreduce.engine_vs_isolated(_cell(kernels=0), MEASURED)
    cell, meas = tmp_path / "c.json", tmp_path / "m.json"
    cell.write_text(json.dumps(_cell()))
    meas.write_text(json.dumps(MEASURED))
    out = tmp_path / "o.json"
    assert allreduce.main(["--engine-cell", str(cell), "--measured", str(meas), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["records"][0]["engine_over_isolated"] == pytest.approx(1.1)
    from harness.run.results import validate_microbench

    validate_microbench(doc, out)  # the tables load it with the other microbench files
