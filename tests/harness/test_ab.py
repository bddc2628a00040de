"""harness.ab: A/B cells (adhoc/, labelled by tag or their server.extra overrides) against the
baseline sweep's repetitions of the same point, system and dispatcher threshold."""

from __future__ import annotations

import json

from harness import ab


def _cell(folder, system, tok, ext, rep=0, tag=None, extra=(), lp=16384, m_sat=2048, run=None):
    c = {"model": "llama-3.1-8b", "tp": 1, "workload": "sharegpt", "lp": lp, "batch": 256, "k": 1,
         "system": system, "rep": rep, "m_sat": m_sat, "overrides": [f"system={system}", *extra]}
    if tag:
        c["tag"] = tag
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{system}-lp{lp}-r{rep}-{tag or 'x'}-{m_sat}.json"
    doc = {"config": c, "metrics": {"output_throughput": tok}, "engine": {"extend_time_s": ext},
           "env": {"git_sha": "abcdef123"}}
    if run is not None:  # (duration_s, loop_step_s at the end, loop_step_s after the warm-up)
        doc["metrics"]["duration_s"], doc["engine"]["loop_step_s"] = run[0], run[1]
        doc["engine_after_warmup"] = {"loop_step_s": run[2]}
    (folder / name).write_text(json.dumps(doc))


def test_gain_and_ratios_against_the_mean_of_the_baseline_reps(tmp_path):
    t9, ad = tmp_path / "table9", tmp_path / "adhoc"
    for rep, (p, c, g) in enumerate(((100, 300, 330), (110, 300, 340))):
        _cell(t9, "paged", p, 7.0 + rep, rep, run=(10.0 + rep, 9.9, 0.2))  # 0.3 s, 1.3 s beyond the engine
        _cell(t9, "cascade", c, 6.5, rep)
        _cell(t9, "granikv", g, 6.6, rep)
    _cell(t9, "granikv", 999, 1.0, 0, m_sat=2**31)  # forced cascade: not this point's baseline
    for system, tok in (("paged", 105), ("cascade", 330), ("granikv", 350)):
        _cell(ad, system, tok, 5.5, tag="long-keys", extra=["+server.extra.extend_split_rule=long-keys"],
              run=(9.0, 9.1, 0.25))
        _cell(ad, system, tok + 1, 5.0, extra=["+server.extra.extend_graph_tokens=[32,64]"])
    _cell(ad, "paged", 1, 1.0, rep=3)  # no label: a plain re-measure, left out
    recs = ab.compare(tmp_path)
    assert {r["label"] for r in recs} == {"long-keys", "extend_graph_tokens=[32,64]"}
    g = next(r for r in recs if r["label"] == "long-keys" and r["system"] == "granikv")
    assert g["baseline_reps"] == 2 and g["baseline_tok_s"] == 335 and abs(g["gain"] - (350 / 335 - 1)) < 1e-12
    text = ab.render(recs, "table9")
    assert "| llama-3.1-8b / TP=1 | 16384 | 256 | long-keys | 3.19 → 3.33 | 1.12 → 1.06 |" in text
    assert "7.0–8.0 → 5.5 | 0.30–1.30 → 0.15 |" in text  # paged: extend_time_s, time beyond the engine
    assert "| 6.6–6.6 → 5.5 | — → 0.15 |" in text  # granikv: its baseline has no loop clock


def test_main_writes_the_table_and_refuses_without_adhoc(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit, match="adhoc does not exist"):
        ab.main(["--results", str(tmp_path)])
    _cell(tmp_path / "adhoc", "paged", 1, 1.0, tag="t")
    out = tmp_path / "ab.md"
    assert ab.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    assert "| t | paged | — | 1 | — | — → 1.0 | — → — |" in out.read_text()
