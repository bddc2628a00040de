"""harness.run.engine_changes: which result files predate a listed engine change, asked of git;
the tables' § marks and `harness.run.batch lines --stale` built on it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.run import batch, engine_changes
from harness.run.results import load_results


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, name: str) -> str:
    (repo / "f.txt").write_text(name)
    _git(repo, "add", "f.txt")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", name)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture()
def repo(tmp_path):
    """base -> change -> after on the main line, and a side branch off base that never merges
    the change."""
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    shas = {"base": _commit(r, "base")}
    _git(r, "checkout", "-q", "-b", "side")
    shas["side"] = _commit(r, "side")
    _git(r, "checkout", "-q", "-")
    shas["change"] = _commit(r, "change")
    shas["after"] = _commit(r, "after")
    return r, shas


def _cell(root: Path, sweep: str, system: str, sha: str, lp: int = 8192, batch_: int = 256, rep: int = 0) -> Path:
    doc = {"config": {"system": system, "model": "llama-3.1-8b", "tp": 1, "workload": "sharegpt", "lp": lp,
                      "batch": batch_, "k": 1, "rep": rep},
           "metrics": {"output_throughput": 1.0, "median_ttft_ms": 1.0, "median_tpot_ms": 1.0, "completed": 1,
                       "failed": 0},
           "engine": {"decode_steps": 1}, "env": {"gpu": "test", "git_sha": sha}}
    path = root / sweep / f"{system}-lp{lp}-b{batch_}-r{rep}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_scope_matches_system_workload_and_bounds():
    ch = engine_changes.EngineChange("abc", "t", scope={"systems": ["granikv"], "min_lp": 4096, "min_k": 2})
    assert ch.applies({"system": "granikv", "lp": 8192, "k": 4})
    assert not ch.applies({"system": "paged", "lp": 8192, "k": 4})
    assert not ch.applies({"system": "granikv", "lp": 2048, "k": 4})
    assert not ch.applies({"system": "granikv", "lp": 8192, "k": 1})
    assert not ch.applies({"system": "granikv", "lp": 8192})  # no k: out of a min_k scope
    assert engine_changes.EngineChange("abc", "t").applies({})  # no scope: every cell
    upto = engine_changes.EngineChange("abc", "t", scope={"min_batch": 128, "max_lp": 8192})
    assert upto.applies({"lp": 8192, "batch": 128}) and upto.applies({"lp": 512, "batch": 512})
    assert not upto.applies({"lp": 16384, "batch": 256}) and not upto.applies({"lp": 4096, "batch": 32})
    assert not upto.applies({"lp": "2048_4096", "batch": 256})  # no single Lp: out of a max_lp scope
    between = engine_changes.EngineChange("abc", "t", scope={"min_k": 2, "max_k": 16, "tp": [1]})
    assert between.applies({"k": 2, "tp": 1}) and between.applies({"k": 16.0, "tp": 1.0})
    assert not between.applies({"k": 1, "tp": 1}) and not between.applies({"k": 64, "tp": 1})
    assert not between.applies({"k": 4, "tp": 2}) and not between.applies({})
    paged_cold = engine_changes.EngineChange("abc", "t", scope={"min_cold_page_size": 2})
    assert paged_cold.applies({"cold_page_size": 4}) and not paged_cold.applies({"cold_page_size": 1})
    assert not paged_cold.applies({})  # a cell without the field (an old file): out of scope
    # a default's change: the cells measured at defaults, not the A/B cells that set it themselves
    default = engine_changes.EngineChange("abc", "t", scope={"systems": ["granikv"], "untagged": True})
    assert default.applies({"system": "granikv"}) and default.applies({"system": "granikv", "tag": None})
    assert default.applies({"system": "granikv", "tag": float("nan")})  # a cell frame's missing tag
    assert not default.applies({"system": "granikv", "tag": "hint"}) and not default.applies({"system": "paged"})


def test_the_list_is_checked(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text(yaml.safe_dump([{"commit": "abc", "title": "t", "scope": {"min_len": 3}}]))
    with pytest.raises(ValueError, match="unknown scope keys"):
        engine_changes.load_changes(bad)
    bad.write_text(yaml.safe_dump([{"title": "t"}]))
    with pytest.raises(ValueError, match="needs a commit"):
        engine_changes.load_changes(bad)
    assert engine_changes.load_changes()  # the shipped list loads


def test_ancestry_follows_the_commit_graph(repo):
    r, sha = repo
    anc = engine_changes.Ancestry(r)
    assert anc.contains(sha["after"], sha["change"][:7]) is True  # a short change id resolves
    assert anc.contains(sha["change"], sha["change"]) is True  # a commit contains itself
    assert anc.contains(sha["base"], sha["change"]) is False
    assert anc.contains(sha["side"], sha["change"]) is False  # a branch that never merged it
    assert anc.contains(sha["after"] + "-dirty", sha["change"]) is True  # measured on a dirty tree of `after`
    assert anc.contains("0123456789abcdef0123456789abcdef01234567", sha["change"]) is None
    assert anc.contains(sha["after"], "fedcba9") is None


def test_cells_before_a_change_are_stale_after_it_current(repo, tmp_path):
    r, sha = repo
    res = tmp_path / "results" / "hw"
    old = _cell(res, "table9", "paged", sha["base"])
    side = _cell(res, "table9", "cascade", sha["side"])
    new = _cell(res, "table9", "granikv", sha["after"] + "-dirty")
    at = _cell(res, "table6", "granikv", sha["change"])
    out_of_scope = _cell(res, "table9", "paged", sha["base"], lp=512)
    changes = [engine_changes.EngineChange(sha["change"][:7], "the change", scope={"min_lp": 4096})]
    stale = engine_changes.stale_cells(load_results(res).cells, changes, repo=r)
    assert {Path(p).resolve(): c for p, c in stale.items()} == {old.resolve(): (sha["change"][:7],),
                                                                side.resolve(): (sha["change"][:7],)}
    assert not {p.resolve() for p in (new, at, out_of_scope)} & {Path(p).resolve() for p in stale}
    # a cell git cannot place (a shallow clone, a commit that never reached here): no answer at all
    _cell(res, "table6", "paged", "0123456789abcdef0123456789abcdef01234567")
    assert engine_changes.stale_cells(load_results(res).cells, changes, repo=r) is None
    # ... unless no listed change is in its scope: then git need not place it
    lp512 = [engine_changes.EngineChange(sha["change"][:7], "t", scope={"max_lp": 512})]
    assert set(engine_changes.stale_cells(load_results(res).cells, lp512, repo=r)) == {str(out_of_scope)}


def test_a_shallow_clone_cannot_tell(repo, tmp_path):
    """A depth-1 clone has the cells' newest commit only: the tables leave rows unmarked rather
    than mark the subset git can place."""
    r, sha = repo
    shallow = tmp_path / "shallow"
    _git(tmp_path, "clone", "-q", "--depth", "1", f"file://{r}", str(shallow))
    res = tmp_path / "results" / "hw"
    _cell(res, "table9", "paged", sha["base"])
    _cell(res, "table9", "granikv", sha["after"])
    changes = [engine_changes.EngineChange(sha["change"][:7], "the change")]
    assert engine_changes.stale_cells(load_results(res).cells, changes, repo=shallow) is None
    assert set(engine_changes.stale_cells(load_results(res).cells, changes, repo=r)) == {
        str(res / "table9" / "paged-lp8192-b256-r0.json")}


def test_every_listed_change_is_a_commit_of_this_repository():
    """A typo in the list would make every cell look current; checked wherever the clone has
    the history (a shallow clone cannot tell)."""
    root = engine_changes.ROOT
    try:
        shallow = _git(root, "rev-parse", "--is-shallow-repository")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    if shallow != "false":
        pytest.skip("shallow clone: the list's commits may be outside it")
    for ch in engine_changes.load_changes():
        rc = subprocess.run(["git", "cat-file", "-e", f"{ch.commit}^{{commit}}"], cwd=root).returncode
        assert rc == 0, f"{ch.commit} ({ch.title}) is not a commit here"


def test_main_lists_the_stale_cells(repo, tmp_path, monkeypatch, capsys):
    r, sha = repo
    res = tmp_path / "results" / "hw"
    old = _cell(res, "table9", "paged", sha["base"])
    _cell(res, "table9", "granikv", sha["after"])
    monkeypatch.setattr(engine_changes, "ROOT", r)
    monkeypatch.setattr(engine_changes, "load_changes",
                        lambda path=None: [engine_changes.EngineChange(sha["change"][:7], "the change")])
    assert engine_changes.main(["--results", str(res)]) == 0
    out = capsys.readouterr()
    assert f"{old}: predates {sha['change'][:7]}" in out.out and f"  {sha['change'][:7]}: the change" in out.out
    assert "2 cells, 1 measured before" in out.err


def test_main_counts_tagged_ab_cells(repo, tmp_path, monkeypatch, capsys):
    """`--sweep adhoc` judges the tagged A/B cells too (the tables leave those out)."""
    r, sha = repo
    res = tmp_path / "results" / "hw"
    ab = _cell(res, "adhoc", "granikv", sha["base"])
    doc = json.loads(ab.read_text())
    doc["config"]["tag"] = "hint"
    ab.write_text(json.dumps(doc))
    monkeypatch.setattr(engine_changes, "ROOT", r)
    monkeypatch.setattr(engine_changes, "load_changes",
                        lambda path=None: [engine_changes.EngineChange(sha["change"][:7], "the change")])
    assert engine_changes.main(["--results", str(res), "--sweep", "adhoc"]) == 0
    out = capsys.readouterr()
    assert f"{ab}: predates" in out.out and "1 cells, 1 measured before" in out.err


def test_batch_lines_re_measure_the_points_of_the_stale_cells(monkeypatch, tmp_path):
    """`lines --stale` keeps the sweep's points with a stale result file, whole, and asks to
    overwrite each measured cell: the point is re-measured in one call."""
    prof = Path(batch.ROOT / "profiles" / "h200" / "pipeline.yaml")
    everything = batch.sweep_lines("table6", prof, ["lp=16384", "batch=32"], None)
    assert len(everything) == 3 and not any("overwrite" in line for line in everything)
    target = "model=llama-3.1-8b tp=1 workload=burst num_prompts=32 system=granikv lp=16384 batch=32"
    cell_id = None
    from harness.run.sweeps import load_profile, load_sweep, sweep_cells

    for c in sweep_cells(load_sweep("table6"), load_profile(prof)):
        if " ".join(c.overrides(load_profile(prof))).startswith(target):
            cell_id = c.cell_id
    assert cell_id
    res = tmp_path / "h200"
    (res / "table6").mkdir(parents=True)
    (res / "table6" / f"{cell_id}.json").write_text("{}")
    stale = {(res / "table6" / f"{cell_id}.json").resolve()}
    monkeypatch.setattr(batch, "stale_paths", lambda results: stale)
    lines = batch.sweep_lines("table6", prof, ["lp=16384", "batch=32"], None, stale=res)
    assert lines == [f"{x} overwrite=true" if "system=granikv" in x else x for x in everything]
    monkeypatch.setattr(batch, "stale_paths", lambda results: set())
    assert batch.sweep_lines("table6", prof, ["lp=16384", "batch=32"], None, stale=res) == []


def test_batch_stale_paths_asks_git_and_refuses_when_it_cannot_tell(repo, tmp_path, monkeypatch):
    r, sha = repo
    res = tmp_path / "results" / "hw"
    old = _cell(res, "table9", "paged", sha["base"])
    _cell(res, "table9", "granikv", sha["after"])
    monkeypatch.setattr(engine_changes, "ROOT", r)
    monkeypatch.setattr(engine_changes, "load_changes",
                        lambda path=None: [engine_changes.EngineChange(sha["change"][:7], "the change")])
    assert batch.stale_paths(res) == {old.resolve()}
    _cell(res, "table9", "cascade", "0123456789abcdef0123456789abcdef01234567")
    with pytest.raises(SystemExit, match="cannot place"):
        batch.stale_paths(res)


def test_batch_lines_cover_stale_repetitions_beyond_the_profile(monkeypatch, tmp_path):
    """The h200 profile runs one rep, batch lists add `rep=1`, `rep=2`: a stale point's extra
    reps are re-measured too (else the tables would average a new rep 0 with stale reps), each
    whole, right after their rep 0 and only where a file of theirs is stale."""
    from harness.run.sweeps import load_profile, load_sweep, sweep_cells

    prof_path = Path(batch.ROOT / "profiles" / "h200" / "pipeline.yaml")
    prof = load_profile(prof_path)
    where = ["lp=16384", "batch=32"]
    cells = [c for c in sweep_cells(load_sweep("table6"), prof)
             if str(c.values.get("lp")) == "16384" and str(c.values.get("batch")) == "32"]
    assert len(cells) == 3 and all(c.cell_id.endswith("-r0") for c in cells)
    res = tmp_path / "h200"
    (res / "table6").mkdir(parents=True)
    stale = set()
    for c in cells:
        for rep in (0, 1, 2, 3):
            path = res / "table6" / f"{c.cell_id[:-1]}{rep}.json"
            path.write_text("{}")
            if rep == 0 or (rep == 1 and c.values["system"] == "paged"):
                stale.add(path.resolve())  # rep 1's paged cell is stale, its other cells and reps 2-3 current
    monkeypatch.setattr(batch, "stale_paths", lambda results: stale)
    lines = batch.sweep_lines("table6", prof_path, where, None, stale=res)
    got = [(next(t for t in line.split() if t.startswith("system=")),
            next(t for t in line.split() if t.startswith("rep="))) for line in lines]
    assert got == [(f"system={s}", f"rep={r}") for r in (0, 1) for s in ("paged", "cascade", "granikv")]
    assert all(line.endswith("overwrite=true") for line in lines)
    for p in (res / "table6").glob("*-r[12].json"):  # without result files beyond rep 0: the profile's reps
        p.unlink()
    assert len(batch.sweep_lines("table6", prof_path, where, None, stale=res)) == 3


def test_tables_mark_the_rows_built_from_stale_cells(repo, tmp_path):
    """A table row whose numbers come from a cell measured before a listed change is marked, in
    the Markdown and LaTeX tables and the README headline; rows from current cells are not."""
    import re

    from harness.report.tables import compare as table_compare
    from harness.report.tables import render as table_render
    from harness.report.tables import write as tables
    from harness.run.results import load_results

    r, sha = repo
    res_dir = tmp_path / "results" / "hw"
    old = {s: _cell(res_dir, "table9", s, sha["base"], lp=8192) for s in ("paged", "cascade", "granikv")}
    new = {s: _cell(res_dir, "table9", s, sha["after"], lp=512) for s in ("paged", "cascade", "granikv")}
    changes = [engine_changes.EngineChange(sha["change"][:7], "the change")]
    res = load_results(res_dir)
    stale = tables.stale_cell_paths(res, changes, repo=r)
    assert {Path(p).resolve() for p in stale} == {p.resolve() for p in old.values()}

    t = table_compare.build_table(9, res)
    rows = {(int(row.keys[0]), int(row.keys[1])): row for row in t.rows}
    assert {Path(p).resolve() for p in rows[(8192, 256)].sources} == {p.resolve() for p in old.values()}
    assert {Path(p).resolve() for p in rows[(512, 256)].sources} == {p.resolve() for p in new.values()}
    assert not rows[(512, 8)].sources  # a row we have no cells for reads none

    marked = table_compare.mark_stale(t, stale)
    flags = {(int(row.keys[0]), int(row.keys[1])): row.stale for row in marked.rows}
    assert flags[(8192, 256)] and not flags[(512, 256)] and sum(flags.values()) == 1
    md = re.sub(" +", " ", table_render.render_markdown(marked))  # pandas pads the columns
    assert f"| 8192{table_render.STALE_MARK} | 256 |" in md and "| 512 | 256 |" in md
    assert f"1 row(s) marked {table_render.STALE_MARK}" in md and "python -m harness.run.engine_changes" in md
    assert r"8192\S{}" in table_render.render_latex(marked)
    assert table_render.STALE_MARK not in table_render.render_markdown(t)  # unmarked without the audit


def test_tables_leave_rows_unmarked_when_git_cannot_place_the_cells(tmp_path):
    from harness.report.tables import write as tables

    res_dir = tmp_path / "results" / "hw"
    _cell(res_dir, "table9", "paged", "0123456789abcdef0123456789abcdef01234567")
    assert tables.stale_cell_paths(load_results(res_dir)) is None
