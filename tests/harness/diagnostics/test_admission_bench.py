"""harness.diagnostics.admission: the engine's per-request host path (add_request, admission,
prompt caching, finish) runs for every system and writes one record per (system, Lp)."""

from __future__ import annotations

import json
import re

from harness.diagnostics import admission


def test_runs_every_phase_and_writes_records(tmp_path):
    out = tmp_path / "admission.json"
    assert admission.main(["--lp", "40,700", "--batch", "3", "--rounds", "2", "--label", "t",
                           "--prompts", "list,array", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    recs = doc["records"]
    assert {(r["system"], r["Lp"], r["prompts"]) for r in recs} == {
        (s, lp, f) for s in admission.SYSTEMS for lp in (40, 700) for f in ("list", "array")}
    for r in recs:
        parts = [r[f"{p}_us"] for p in admission.PHASES]
        assert all(x > 0 for x in parts) and r["label"] == "t"
        assert r["us_per_request"] > 0 and r["unpickle_us"] > 0
    sha = doc["env"]["git_sha"]
    assert sha is None or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", sha)
