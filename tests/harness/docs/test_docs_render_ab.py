"""The api-ab block judges the completions API bar only when the tagged cell drove /v1/completions.

Why: a cell's tag says what it was meant to measure, its recorded `config.client.api` what the
client did; a ratio of two /generate runs must not be reported as the completions API's cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.docs import serving
from harness.docs.common import Sources


def _write(root: Path, rel: str, api: str, tok: float, call_id: str | None = "call-a") -> None:
    doc = {"config": {"client": {"api": api}}, "env": {"git_sha": "0123456789", "call_id": call_id},
           "metrics": {"output_throughput": tok, "median_ttft_ms": 900.0, "median_tpot_ms": 17.0},
           "engine": {"server_cpu_s": 7.0, "server_chunks_sent": 1032},
           "engine_after_warmup": {"server_cpu_s": 1.0, "server_chunks_sent": 32}}
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(json.dumps(doc))


@pytest.mark.parametrize(("api", "tok", "verdict"), [
    ("completions", 99.0, "met"), ("completions", 97.0, "not met"), ("generate", 99.0, "not judged")])
def test_api_ab_verdict(tmp_path, api, tok, verdict):
    for generate, tagged in serving.API_AB:
        _write(tmp_path, generate, "generate", 100.0)
        _write(tmp_path, tagged, api, tok)
    text = serving.render_api_ab(Sources(tmp_path))
    assert f"≥ {serving.API_AB_BAR}: {verdict}" in text
    assert "| 6.00 | 1000 |" in text  # the measured run's server CPU s and chunks, warm-up subtracted


def test_api_ab_not_judged_across_calls(tmp_path):
    """The four cells must come from one call: otherwise run-to-run spread decides the verdict."""
    for i, (generate, tagged) in enumerate(serving.API_AB):
        _write(tmp_path, generate, "generate", 100.0, call_id=f"call-{i}")
        _write(tmp_path, tagged, "completions", 99.0, call_id=f"call-{i}")
    text = serving.render_api_ab(Sources(tmp_path))
    assert f"≥ {serving.API_AB_BAR}: not judged (‡)" in text and "from 2 calls" in text
    for generate, tagged in serving.API_AB:  # files without a call id: each a call of its own
        _write(tmp_path, generate, "generate", 100.0, call_id=None)
        _write(tmp_path, tagged, "completions", 99.0, call_id=None)
    assert "from 4 calls" in serving.render_api_ab(Sources(tmp_path))


def test_api_ab_mean_of_alternated_reps(tmp_path):
    """The ratio is mean over mean: one slow /generate rep does not decide the verdict alone."""
    (g0, c0), (g1, c1) = serving.API_AB
    for rel, api, tok in ((g0, "generate", 100.0), (c0, "completions", 96.0),
                          (g1, "generate", 100.0), (c1, "completions", 100.0)):
        _write(tmp_path, rel, api, tok)
    text = serving.render_api_ab(Sources(tmp_path))
    assert "output tok/s: 0.980;" in text and ": met." in text


def test_api_ab_missing_cell_is_not_judged(tmp_path):
    _write(tmp_path, serving.API_AB[0][0], "generate", 100.0)
    text = serving.render_api_ab(Sources(tmp_path))
    assert "not judged" in text and "client.api=generate" not in text.split("`python")[0]
