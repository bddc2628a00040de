"""harness.staleness: which result files predate a listed engine change, asked of git."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from harness import batch, staleness


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path):
    """A three-commit history: base, the change, after."""
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    shas = []
    for name in ("base", "change", "after"):
        (r / "f.txt").write_text(name)
        _git(r, "add", "f.txt")
        _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", name)
        shas.append(_git(r, "rev-parse", "HEAD"))
    return r, dict(zip(("base", "change", "after"), shas))


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
    ch = staleness.CodeChange("abc", "t", scope={"systems": ["granikv"], "min_lp": 4096, "min_k": 2})
    assert ch.applies({"system": "granikv", "lp": 8192, "k": 4})
    assert not ch.applies({"system": "paged", "lp": 8192, "k": 4})
    assert not ch.applies({"system": "granikv", "lp": 2048, "k": 4})
    assert not ch.applies({"system": "granikv", "lp": 8192, "k": 1})
    assert not ch.applies({"system": "granikv", "lp": 8192})  # no k: out of a min_k scope
    assert staleness.CodeChange("abc", "t").applies({})  # no scope: every cell
    upto = staleness.CodeChange("abc", "t", scope={"min_batch": 128, "max_lp": 8192})
    assert upto.applies({"lp": 8192, "batch": 128}) and upto.applies({"lp": 512, "batch": 512})
    assert not upto.applies({"lp": 16384, "batch": 256}) and not upto.applies({"lp": 4096, "batch": 32})
    assert not upto.applies({"lp": "2048_4096", "batch": 256})  # no single Lp: out of a max_lp scope
    between = staleness.CodeChange("abc", "t", scope={"min_k": 2, "max_k": 16})
    assert between.applies({"k": 2}) and between.applies({"k": 16})
    assert not between.applies({"k": 1}) and not between.applies({"k": 64}) and not between.applies({})


def test_registry_is_checked(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text(yaml.safe_dump([{"commit": "abc", "title": "t", "scope": {"min_len": 3}}]))
    with pytest.raises(ValueError, match="unknown scope keys"):
        staleness.load_changes(bad)
    bad.write_text(yaml.safe_dump([{"title": "t"}]))
    with pytest.raises(ValueError, match="needs a commit"):
        staleness.load_changes(bad)
    assert staleness.load_changes()  # the shipped registry loads


def test_cells_before_a_change_are_stale_after_it_current(repo, tmp_path):
    r, sha = repo
    res = tmp_path / "results" / "hw"
    old = _cell(res, "table9", "paged", sha["base"])
    new = _cell(res, "table9", "cascade", sha["after"] + "-dirty")
    at = _cell(res, "table9", "granikv", sha["change"])
    out_of_scope = _cell(res, "table9", "paged", sha["base"], lp=512)
    lost = _cell(res, "table6", "paged", "0123456789abcdef0123456789abcdef01234567")
    changes = [staleness.CodeChange(sha["change"][:7], "the change", scope={"min_lp": 4096})]
    assert staleness.stale_paths(res, changes, repo=r) == {old.resolve()}

    from harness.results import load_results

    audits = {Path(a.path).resolve(): a for a in
              staleness.audit_cells(load_results(res).cells, changes, staleness.Ancestry(r))}
    assert audits[old.resolve()].missing == (sha["change"][:7],)
    assert not any(audits[p.resolve()].stale for p in (new, at, out_of_scope))
    assert audits[lost.resolve()].unknown and not audits[lost.resolve()].stale
    md = staleness.render_markdown(list(audits.values()), changes)
    assert "5 cells, 1 stale, 4 current; 1 measured at a commit git cannot place." in md
    row = next(line for line in md.splitlines() if line.startswith("| table9 | lp=8192 batch=256 |"))
    # three systems of one point at three commits: the ratio spans a code change
    assert "(*mixed*)" in row and f"paged: {sha['change'][:7]}" in row


def test_batch_lines_re_measure_only_the_stale_cells(monkeypatch, tmp_path):
    """`lines --stale` keeps the sweep's cells whose result file is stale and asks to overwrite it."""
    prof = Path(batch.ROOT / "profiles" / "h200" / "pipeline.yaml")
    everything = batch.sweep_lines("table6", prof, ["lp=16384", "batch=32"], None)
    assert len(everything) == 3 and not any("overwrite" in line for line in everything)
    target = "model=llama-3.1-8b tp=1 workload=burst num_prompts=32 system=granikv lp=16384 batch=32"
    cell_id = None
    from harness.sweeps import load_profile, load_sweep, sweep_cells

    for c in sweep_cells(load_sweep("table6"), load_profile(prof)):
        if " ".join(c.overrides(load_profile(prof))).startswith(target):
            cell_id = c.cell_id
    assert cell_id
    res = tmp_path / "h200"
    (res / "table6").mkdir(parents=True)
    (res / "table6" / f"{cell_id}.json").write_text("{}")
    monkeypatch.setattr("harness.staleness.stale_paths",
                        lambda results: {(Path(results) / "table6" / f"{cell_id}.json").resolve()})
    lines = batch.sweep_lines("table6", prof, ["lp=16384", "batch=32"], None, stale=res)
    assert lines == [f"{[x for x in everything if 'system=granikv' in x][0]} overwrite=true"]


def test_every_listed_change_is_a_commit_of_this_repository():
    """A typo in the registry would make every cell look current; checked wherever the clone has
    the history (a shallow clone cannot tell)."""
    root = staleness.ROOT
    try:
        shallow = _git(root, "rev-parse", "--is-shallow-repository")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    if shallow != "false":
        pytest.skip("shallow clone: the registry's commits may be outside it")
    for ch in staleness.load_changes():
        rc = subprocess.run(["git", "cat-file", "-e", f"{ch.commit}^{{commit}}"], cwd=root).returncode
        assert rc == 0, f"{ch.commit} ({ch.title}) is not a commit here"


def test_batch_lines_cover_stale_repetitions_beyond_the_profile(monkeypatch, tmp_path):
    """The h200 profile runs one rep, batch lists add `rep=1`, `rep=2` by hand: a stale point's
    extra reps are re-measured too (else the tables would average a new rep 0 with stale reps),
    right after their rep 0 and only where their file is stale."""
    from harness.sweeps import load_profile, load_sweep, sweep_cells

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
        for rep in (0, 1, 2):
            path = res / "table6" / f"{c.cell_id[:-1]}{rep}.json"
            path.write_text("{}")
            if rep != 1 or c.values["system"] != "granikv":
                stale.add(path.resolve())  # granikv's rep 1 is current
    monkeypatch.setattr("harness.staleness.stale_paths", lambda results: stale)
    lines = batch.sweep_lines("table6", prof_path, where, None, stale=res)
    got = [(next(t for t in line.split() if t.startswith("system=")),
            next(t for t in line.split() if t.startswith("rep="))) for line in lines]
    assert got == [(f"system={s}", f"rep={r}") for r in (0, 1, 2) for s in ("paged", "cascade", "granikv")
                   if not (r == 1 and s == "granikv")]
    assert all(line.endswith("overwrite=true") for line in lines)
    # without result files beyond rep 0, only the profile's reps
    for p in (res / "table6").glob("*-r[12].json"):
        p.unlink()
    assert len(batch.sweep_lines("table6", prof_path, where, None, stale=res)) == 3


def test_tables_mark_the_rows_built_from_stale_cells(repo, tmp_path):
    """A table row whose numbers come from a cell measured before a listed change is marked, in
    the Markdown and LaTeX tables and the README headline; rows from current cells are not."""
    import re

    from harness import table_compare, table_render, tables
    from harness.results import load_results

    r, sha = repo
    res_dir = tmp_path / "results" / "hw"
    old = {s: _cell(res_dir, "table9", s, sha["base"], lp=8192) for s in ("paged", "cascade", "granikv")}
    new = {s: _cell(res_dir, "table9", s, sha["after"], lp=512) for s in ("paged", "cascade", "granikv")}
    changes = [staleness.CodeChange(sha["change"][:7], "the change")]
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
    assert f"1 row(s) marked {table_render.STALE_MARK}" in md
    assert r"8192\S{}" in table_render.render_latex(marked)
    assert table_render.STALE_MARK not in table_render.render_markdown(t)  # unmarked without the audit


def test_tables_leave_rows_unmarked_when_git_cannot_place_the_cells(tmp_path):
    from harness import tables
    from harness.results import load_results

    res_dir = tmp_path / "results" / "hw"
    _cell(res_dir, "table9", "paged", "0123456789abcdef0123456789abcdef01234567")
    assert tables.stale_cell_paths(load_results(res_dir)) is None
