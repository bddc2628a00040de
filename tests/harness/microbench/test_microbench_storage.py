"""The storage microbenchmark's scenario at toy scale: it must do the bookkeeping it claims
(every request after the first shares the prefix, everything is released), not its timing."""

import json

import pytest

from harness.microbench import storage as bench


@pytest.mark.parametrize("system", ["paged", "cascade", "granikv"])
def test_scenario_shares_the_prefix_and_drains(system):
    r = bench.run_decode(system, num_slots=20000, lp=256, num_requests=40, output_len=8, batch=16)
    assert r["requests"] == 40 and r["live_after"] == 0
    assert r["steps"] == 3 * 8  # 40 requests in waves of 16 running, 8 decode steps each
    # every request after the first reuses the whole 256-token prefix (paged: page multiples)
    assert r["cached_tokens"] >= 39 * 256
    if system == "granikv":
        assert r["hot_admits"] == 1 and r["hot_hits"] == 39 and r["hot_fallbacks"] == 0


def test_suffix_lengths_in_range():
    s = bench.sharegpt_like_suffixes(500)
    assert s.min() >= 16 and s.max() <= 512 and len(s) == 500


def test_main_writes_json(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "NUM_SLOTS", 40000)
    monkeypatch.setattr(bench, "LP", 512)
    monkeypatch.setattr(bench, "NUM_REQUESTS", 20)
    monkeypatch.setattr(bench, "OUTPUT_LEN", 4)
    monkeypatch.setattr(bench, "BATCH", 8)
    out = tmp_path / "storage.json"
    bench.main(["--out", str(out), "--reps", "1"])
    data = json.loads(out.read_text())
    assert {"cpu", "python", "torch", "numpy", "git_sha", "started_at"} <= set(data["env"])
    ops = {(r["op"], r["system"]) for r in data["records"]}
    assert ("decode_step", "granikv") in ops and ("grow_batch", "paged") in ops
    assert all(r["us"] > 0 for r in data["records"])
    notes = tmp_path / "notes.md"
    notes.write_text(f"# x\n\n## Storage layer\n{bench.BEGIN}\nSTALE-BLOCK\n{bench.END}\nafter\n")
    bench.main(["--out", str(out), "--notes-into", str(notes)])
    text = notes.read_text()
    assert "STALE-BLOCK" not in text and "| granikv |" in text and text.endswith(f"{bench.END}\nafter\n")
