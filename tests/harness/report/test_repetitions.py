"""harness.report.repetitions: each point's repetitions side by side (spread, per-run ratios, commits), and
the A/B cells of adhoc/ beside the untagged cells of their point."""

from __future__ import annotations

import json

import pytest

from harness.report import repetitions as report


def _cell(folder, system, tok, rep=0, lp=4096, knobs="", k=1, git="abc1234", tag=None, extra=(), m_sat=2048,
          ext=None, run=None, workload="sharegpt", rate=None, call=None):
    """A result file as harness.run.cell names and writes it (the fields the report reads); `call`:
    its env.call_id (None: a file from before cells recorded their call)."""
    folder.mkdir(parents=True, exist_ok=True)
    knobs = knobs or (f"rate{rate:g}" if rate is not None else "")
    name = (f"{system}-llama-3.1-8b-tp1-{workload}-lp{lp}-b256-k{k}-r{rep}{('-' + knobs) if knobs else ''}"
            f"{('-tag' + tag) if tag else ''}.json")
    c = {"system": system, "rep": rep, "model": "llama-3.1-8b", "tp": 1, "workload": workload, "lp": lp,
         "batch": 256, "k": k, "m_sat": m_sat, "overrides": [f"system={system}", *extra]}
    if tag:
        c["tag"] = tag
    if rate is not None:
        c["rate"] = rate
    doc = {"config": c, "metrics": {"output_throughput": tok}, "engine": {}, "env": {"git_sha": git}}
    if call is not None:
        doc["env"]["call_id"] = call
    if ext is not None:
        doc["engine"]["extend_time_s"] = ext
    if run is not None:  # (duration_s, loop_step_s at the end, loop_step_s after the warm-up)
        doc["metrics"]["duration_s"], doc["engine"]["loop_step_s"] = run[0], run[1]
        doc["engine_after_warmup"] = {"loop_step_s": run[2]}
    (folder / name).write_text(json.dumps(doc))


def _row(text, start):
    return next(line for line in text.splitlines() if line.startswith(start))


def test_complete_reps_spread_per_run_ratios_and_commits(tmp_path):
    t9 = tmp_path / "table9"
    for rep, (paged, cascade, granikv) in enumerate(((100, 200, 220), (110, 200, 242), (105, 210, 231))):
        _cell(t9, "paged", paged, rep)
        _cell(t9, "cascade", cascade, rep)
        _cell(t9, "granikv", granikv, rep, git="def5678" if rep == 2 else "abc1234")
    _cell(t9, "paged", 999, rep=3)  # an incomplete rep: listed, not averaged
    _cell(t9, "cascade", 999, rep=3)
    (p,) = report.points(report.read_results(tmp_path))
    assert p.reps == [0, 1, 2, 3] and p.complete == [0, 1, 2]
    assert p.spread("paged") == pytest.approx(10 / 105)
    assert p.ratio(1, "paged") == pytest.approx(2.2)
    text = report.render(report.read_results(tmp_path), tmp_path)
    row = _row(text, "| table9 |")
    assert "| 0,1,2,3 | 0,1,2 | 105 | 9.5% | 203 | 4.9% | 231 | 9.5% |" in row
    assert "| 2.200‡, 2.200‡, 2.200‡ | 1.100‡, 1.210‡, 1.100‡ | — | abc1234, def5678 |" in row  # no call ids
    assert "Largest per-system spread: 9.5%" in text and "1 with two or more complete" in text
    assert "0 with a complete repetition whose three systems come from one call" in text


def test_per_run_ratios_are_marked_where_their_two_cells_come_from_different_calls(tmp_path):
    """Each rep's call (short id) is listed; a per-run ratio whose two cells do not carry one call
    id is marked ‡ (granikv re-measured alone in rep 1; rep 2 from files without a call id)."""
    t9 = tmp_path / "table9"
    calls = {0: ("aaaaaaaa0000",) * 3, 1: ("bbbbbbbb0000", "bbbbbbbb0000", "cccccccc0000"), 2: (None,) * 3}
    for rep, ids in calls.items():
        for system, tok, call in zip(report.SYSTEMS, (100, 200, 220), ids, strict=True):
            _cell(t9, system, tok, rep, call=call)
    (p,) = report.points(report.read_results(tmp_path))
    assert [p.one_call(r) for r in p.complete] == [True, False, False]
    assert p.one_call(1, ("paged", "cascade"))  # the two baselines of rep 1 share its call
    row = _row(report.render(report.read_results(tmp_path), tmp_path), "| table9 |")
    assert "| 2.200, 2.200‡, 2.200‡ | 1.100, 1.100‡, 1.100‡ |" in row
    assert "| 0: aaaaaaaa, 1: bbbbbbbb+cccccccc, 2: — |" in row


def test_knobbed_stand_in_one_system_points_and_non_sweep_folders(tmp_path):
    t21, t24 = tmp_path / "table21", tmp_path / "table24"
    _cell(t21, "paged", 100, k=4)
    _cell(t21, "cascade", 100, k=4)
    _cell(t21, "granikv", 250, k=4, knobs="hot_fraction0.3")  # the only granikv cell: it stands in
    _cell(t24, "cascade", 200, lp=8192)
    _cell(t24, "granikv", 210, lp=8192)
    _cell(t24, "granikv", 190, lp=8192, knobs="hot_fraction0.1")  # a plain cell exists: left out
    _cell(tmp_path / "table15", "granikv", 300)  # one system: no ratio, no row
    _cell(tmp_path / "engine", "paged", 1)  # not a sweep folder
    _cell(tmp_path / "engine", "granikv", 1)
    (tmp_path / "microbench").mkdir()
    (tmp_path / "microbench" / "kernels.json").write_text(json.dumps({"records": []}))  # not a cell
    pts = {p.sweep: p for p in report.points(report.read_results(tmp_path))}
    assert set(pts) == {"table21", "table24"}
    assert pts["table21"].complete == [0] and pts["table21"].ratio(0, "paged") == pytest.approx(2.5)
    assert pts["table24"].tok_s[0] == {"cascade": 200, "granikv": 210} and not pts["table24"].complete
    text = report.render(report.read_results(tmp_path), tmp_path)
    assert "k4 (granikv hot_fraction0.3) |" in text
    assert "| 200* |" in _row(text, "| table24 |") and "*: the point has no complete repetition" in text


def test_a_file_name_that_does_not_name_its_cell_is_an_error(tmp_path):
    _cell(tmp_path / "table9", "paged", 1)
    (tmp_path / "table9" / "paged-llama-3.1-8b-tp1-sharegpt-lp4096-b256-k1-r0.json").rename(
        tmp_path / "table9" / "cascade-lp4096-r0.json")
    with pytest.raises(ValueError, match="does not read"):
        report.read_results(tmp_path)


def test_ab_gain_and_ratios_against_the_mean_of_the_baseline_reps(tmp_path):
    t9, ad = tmp_path / "table9", tmp_path / "adhoc"
    for rep, (p, c, g) in enumerate(((100, 300, 330), (110, 300, 340))):
        call = f"base{rep}"  # each baseline rep measured in one call
        _cell(t9, "paged", p, rep, lp=16384, ext=7.0 + rep, run=(10.0 + rep, 9.9, 0.2), call=call)  # 0.3, 1.3 s beyond
        _cell(t9, "cascade", c, rep, lp=16384, ext=6.5, call=call)
        _cell(t9, "granikv", g, rep, lp=16384, ext=6.6, call=call)
    _cell(t9, "granikv", 999, 0, lp=16384, m_sat=2**31, knobs="msat")  # forced cascade: not this baseline
    for system, tok in (("paged", 105), ("cascade", 330), ("granikv", 350)):
        _cell(ad, system, tok, lp=16384, ext=5.5, tag="long-keys", extra=["+server.extra.extend_split_rule=long-keys"],
              run=(9.0, 9.1, 0.25), git="1234567", call="ab0")
        _cell(ad, system, tok + 1, lp=16384, ext=5.0, knobs="eg", extra=["+server.extra.extend_graph_tokens=[32,64]"])
    _cell(ad, "granikv", 370, rep=1, lp=16384, ext=5.5, tag="long-keys", git="1234567", call="ab1")  # granikv alone
    _cell(ad, "paged", 1, rep=3, lp=16384)  # no label: a plain re-measure, left out
    rows = report.ab_rows(report.read_results(tmp_path))
    assert {r.label for r in rows} == {"long-keys", "extend_graph_tokens=[32,64]"}
    g = next(r for r in rows if r.label == "long-keys" and r.system == "granikv")
    assert g.baseline_sweep == "table9" and len(g.baseline) == 2 and len(g.ab) == 2
    assert g.baseline_tok_s == 335 and g.ab_tok_s == 360 and g.gain == pytest.approx(360 / 335 - 1)
    text = report.render(report.read_results(tmp_path), tmp_path)
    ab = text[text.index("## A/B cells"):]
    head = "| llama-3.1-8b / TP=1 | sharegpt | 16384 | 256 | 1 | long-keys |"
    # granikv over paged and cascade, baseline → A/B: the A/B side's ratios from its rep of one call (rep 0)
    assert f"{head} 3.19 → 3.33 | 1.12 → 1.06 |" in ab
    eg = "| llama-3.1-8b / TP=1 | sharegpt | 16384 | 256 | 1 | extend_graph_tokens=[32,64] |"
    assert f"{eg} 3.19 → 3.31‡ | 1.12 → 1.06‡ |" in ab  # A/B cells without call ids: mean over all, marked
    assert f"{head} paged | table9 | 105 (2) | 105 (1) | +0.0% | 7.0–8.0 → 5.5 | 0.30–1.30 → 0.15 | 1234567 |" in ab
    assert f"{head} granikv | table9 | 335 (2) | 360 (2) | +7.5% | 6.6 → 5.5 | — → 0.15 |" in ab  # no loop clock


def test_ab_baseline_comes_from_whichever_sweep_holds_the_point(tmp_path):
    _cell(tmp_path / "table20", "granikv", 100, lp=8192, k=16, workload="multiprefix")
    _cell(tmp_path / "table20", "paged", 50, lp=8192, k=16, workload="multiprefix")
    _cell(tmp_path / "adhoc", "granikv", 90, lp=8192, k=16, workload="multiprefix", tag="coldcache")
    _cell(tmp_path / "adhoc", "cascade", 90, lp=8192, k=4, workload="multiprefix", tag="nobase")
    text = report.render(report.read_results(tmp_path), tmp_path)
    assert "| 16 | coldcache | granikv | table20 | 100 (1) | 90 (1) | -10.0% |" in text
    assert "| 4 | nobase | cascade | — | — | 90 (1) | — |" in text


def test_main_writes_the_report_or_refuses(tmp_path):
    for lp in (16384, 512, 2048):
        for system in ("paged", "cascade", "granikv"):
            _cell(tmp_path / "table9", system, 100, lp=lp)
    out = tmp_path / "reps.md"
    assert report.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    lps = [line.split("-lp")[1].split("-")[0] for line in text.splitlines() if line.startswith("| table9")]
    assert lps == ["512", "2048", "16384"]  # natural order
    assert "## A/B cells" in text and "| — | — |" in text  # no A/B cells: the section says so
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="no serving cells"):
        report.main(["--results", str(empty)])
    with pytest.raises(SystemExit, match="not a folder"):
        report.main(["--results", str(tmp_path / "missing")])


def test_a_poisson_cell_is_not_a_repetition_of_the_saturating_one(tmp_path):
    """Same point and tag at another arrival rate: its own A/B row, labelled with its rate, and no
    saturating baseline."""
    _cell(tmp_path / "table9", "granikv", 100, lp=16384)
    _cell(tmp_path / "adhoc", "granikv", 99, lp=16384, tag="nohint")
    _cell(tmp_path / "adhoc", "granikv", 30, lp=16384, tag="nohint", rate=16.0)
    rows = {r.label: r for r in report.ab_rows(report.read_results(tmp_path))}
    assert set(rows) == {"nohint", "nohint (rate 16.0)"}
    assert rows["nohint"].ab_tok_s == 99 and rows["nohint"].baseline_tok_s == 100
    assert rows["nohint (rate 16.0)"].ab_tok_s == 30 and rows["nohint (rate 16.0)"].baseline_sweep is None
