"""harness.diagnostics.specialize: the prefix pass's kernels with and without Triton's int
specialization. On the CPU (interpreter) the script runs end to end on tiny shapes; the timings
mean nothing there, but both copies must compute the same prefix pass."""

from __future__ import annotations

import json

import pytest

from harness.diagnostics import specialize


def test_both_copies_compute_the_same_pass_and_every_case_is_recorded(tmp_path):
    out = tmp_path / "spec.json"
    assert specialize.main(["--cases", "1x4,3x2", "--reps", "1", "--rep-ms", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    recs = doc["records"]
    assert [(r["classes"], r["class_size"], r["batch"]) for r in recs] == [(1, 4, 4), (3, 2, 6)]
    for r in recs:
        assert r["max_abs_diff_o"] < 1e-5 and r["max_abs_diff_lse"] < 1e-5
        for name in ("unspecialized", "specialized"):
            assert r[name]["us"] > 0 and len(r[name]["us_reps"]) == 1 and r[name]["first_call_ms"] > 0
        assert r["unspecialized_over_specialized"] == pytest.approx(
            r["unspecialized"]["us"] / r["specialized"]["us"], rel=1e-3)
    assert doc["config"]["reps"] == 1 and "git_sha" in doc["env"]


def test_the_engine_runs_again_with_its_own_kernels_after_the_benchmark():
    mods = specialize._modules()
    engine = (mods[0]._prefix_kernel, mods[1]._combine_prefix_kernel)
    pairs = specialize.kernel_pairs()
    with specialize.using(*pairs["specialized"]):
        assert (mods[0]._prefix_kernel, mods[1]._combine_prefix_kernel) == pairs["specialized"]
    assert (mods[0]._prefix_kernel, mods[1]._combine_prefix_kernel) == engine == pairs["unspecialized"]


def test_cases_parse_and_bad_ones_are_refused():
    assert specialize.parse_cases("1x256, 16x16") == ((1, 256), (16, 16))
    for bad in ("16", "0x4", "ax2", "4x"):
        with pytest.raises(Exception, match="CLASSESxSIZE"):
            specialize.parse_cases(bad)
