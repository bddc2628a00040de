"""harness.run.point: cells grouped into points, point ids, the run order over reps, one call id per
point (recorded by every cell), `lines --mixed/--missing`, and the Snakemake plan of one job per
point."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from fake_cell import fake_cells, write_result

from harness.run import batch, point, sweeps
from harness.run import env as cell_env
from harness.run.results import validate_cell

ROOT = Path(__file__).resolve().parents[3]
FAKE = "server.module=tests.harness.fake_engine"


def _profile(name: str) -> sweeps.PipelineProfile:
    return sweeps.load_profile(ROOT / "profiles" / name / "pipeline.yaml")


def _points(sweep: str, profile: str = "paper") -> list[point.Point]:
    return point.points(sweeps.sweep_cells(sweeps.load_sweep(sweep), _profile(profile)))


def _systems(p: point.Point) -> list[str]:
    return [str(c.values["system"]) + point._knobs(c.values) for c in p.cells]


# --------------------------------------------------------------------------- grouping and ids


def test_a_points_cells_differ_only_in_system_and_knobs_and_each_rep_is_a_point_of_its_own():
    t9 = _points("table9")
    assert len(t9) == 6 * 6 * 3 and all(_systems(p) == ["paged", "cascade", "granikv"] for p in t9)
    assert t9[0].point_id == "llama-3.1-8b-tp1-sharegpt-lp512-b8-k1-r0"
    assert [p.point_id[-2:] for p in t9[:3]] == ["r0", "r1", "r2"]  # reps split, in first-seen order
    # knobs never split a point: Table 21's HOT share, 13's forced cascade, 18's COLD pages, 24's f_p
    assert [_systems(p) for p in _points("table21") if p.rep == 0] == [
        ["paged", "cascade", "granikv[hot_fraction=0.3]"],
        ["paged", "cascade", "granikv[hot_fraction=0.4]"],
    ]
    assert _systems(_points("table13")[0]) == ["paged", "cascade", "granikv", "granikv[m_sat=2147483648]"]
    assert _systems(_points("table18")[0]) == ["granikv", "granikv[cold_page_size=4]", "granikv[cold_page_size=16]"]
    assert _systems(_points("table24")[0]) == ["cascade", "granikv"] + [
        f"granikv[hot_fraction={f}]" for f in (0.05, 0.1, 0.4, 0.6, 0.8)
    ]


@pytest.mark.parametrize("profile", ["paper", "h200", "cpu-smoke"])
def test_every_cell_is_in_one_point_whose_id_is_safe_and_unique(profile):
    plan = sweeps.plan(_profile(profile))
    cells = plan.all_cells() + sweeps.sweep_cells(sweeps.load_sweep("gate"), plan.profile)
    found = point.points(cells)
    assert sorted(c.cell_id for p in found for c in p.cells) == sorted(c.cell_id for c in cells)
    ids = [(p.sweep, p.point_id) for p in found]
    assert len(ids) == len(set(ids))
    for p in found:
        assert re.fullmatch(r"[A-Za-z0-9._\-]+", p.point_id)
        assert len({c.values.get("rep", 0) for c in p.cells}) == 1
        for c in p.cells:
            if point.is_plain(c.values):  # a plain cell's id is its system, then the point's id
                assert c.cell_id == f"{c.values['system']}-{p.point_id}"
    # first-seen order: a point comes where its first cell comes
    firsts = []
    for c in cells:
        p = next(p for p in found if c in p.cells)
        if p not in firsts:
            firsts.append(p)
    assert firsts == found


def test_two_points_with_one_id_are_refused():
    """Points that differ only in values the cell id does not name (here num_prompts) and hold
    different systems would share an id: refused, as sweeps refuses two cells with one id."""
    sw = sweeps.Sweep(
        name="t",
        tables=(),
        grids={
            "paper": (
                {"system": ["paged"], "model": "llama-3.1-8b", "lp": 512, "batch": 8, "num_prompts": 8},
                {"system": ["granikv"], "model": "llama-3.1-8b", "lp": 512, "batch": 8, "num_prompts": 64},
            ),
        },
    )
    cells = sweeps.sweep_cells(sw, sweeps.PipelineProfile(name="x", hardware="h200"))
    with pytest.raises(ValueError, match="two points have the id llama-3.1-8b-tp1-sharegpt-lp512-b8-k1-r0"):
        point.points(cells)


def test_the_run_order_rotates_with_the_rep_so_each_system_goes_first_once():
    t9 = [p for p in _points("table9") if p.point_id.startswith("llama-3.1-8b-tp1-sharegpt-lp16384-b256-")]
    orders = [[c.values["system"] for c in p.run_order()] for p in t9]
    assert orders == [["paged", "cascade", "granikv"], ["cascade", "granikv", "paged"], ["granikv", "paged", "cascade"]]
    t13 = _points("table13")
    assert [str(p.run_order()[0].values["system"]) + point._knobs(p.run_order()[0].values) for p in t13] == [
        "paged",
        "cascade",
        "granikv",
    ]
    assert point.run_order([], 2, dict) == []


def test_cell_lines_group_into_points_by_consecutive_lines():
    lines = [ln.split() for ln in batch.sweep_lines("table21", ROOT / "profiles" / "h200" / "pipeline.yaml", [], None)]
    assert point.group_lines(lines) == [[0, 1, 2], [3, 4, 5]]  # the granikv knob does not split a point
    again = lines[:1] + [[*lines[1], "overwrite=true"]] + [lines[2]]
    assert point.group_lines(again) == [[0, 1, 2]]  # neither does overwrite
    other_rep = [[o.replace("rep=0", "rep=1") for o in lines[2]]]
    assert point.group_lines(lines[:2] + other_rep) == [[0, 1], [2]]  # a rep does
    assert point.group_lines([lines[0], lines[3], lines[1]]) == [[0], [1], [2]]  # consecutive lines only
    # a list's lines in the rep's rotated order, knobs read from the overrides
    rep1 = [[o.replace("rep=0", "rep=1") for o in ln] for ln in lines[:3]]
    assert [point.line_values(ln)["system"] for ln in point.run_order(rep1, 1, point.line_values)] == [
        "cascade",
        "granikv",
        "paged",
    ]


# --------------------------------------------------------------------------- call ids


def test_a_point_runs_every_cell_in_one_fresh_call_and_re_measures_the_measured_ones(tmp_path, monkeypatch, capsys):
    prof = {**_plain(_profile("cpu-smoke")), "results_dir": str(tmp_path / "results")}
    profile = point.profile_of(json.dumps(prof))
    (p,) = point.points(sweeps.sweep_cells(sweeps.load_sweep("table21"), profile))
    paths = {f"{c.values['system']}@0": ROOT / c.path(profile) for c in p.cells}
    read = fake_cells(monkeypatch, tmp_path, paths)
    write_result(paths["cascade@0"], "0" * 40, "an-old-call")
    monkeypatch.setenv(cell_env.CALL_ID_ENV, "set-outside")  # a job's call is its own, never inherited
    assert point.main(["run", "table21", p.point_id, "--profile", json.dumps(prof)]) == 0
    ran = read()
    assert [r["system"] for r in ran] == ["paged", "cascade", "granikv"]
    assert [r["overwrite"] for r in ran] == [None, "true", None]
    calls = {json.loads(Path(paths[k]).read_text())["env"]["call_id"] for k in paths}
    assert len(calls) == 1 and calls != {"set-outside"} and {r["call"] for r in ran} == calls
    assert "3 cells in one call" in capsys.readouterr().out
    # a failing cell: reported, the others still run, exit 1; the next job is a call of its own
    read = fake_cells(monkeypatch, tmp_path, paths, fail="paged")
    assert point.main(["run", "table21", p.point_id, "--profile", json.dumps(prof)]) == 1
    assert [r["system"] for r in read()[3:]] == ["paged", "cascade", "granikv"]
    assert len({r["call"] for r in read()[3:]} | calls) == 2
    assert "1 of 3 cells failed" in capsys.readouterr().out
    assert point.main(["run", "table21", "no-such-point", "--profile", json.dumps(prof)]) == 2


def _plain(profile: sweeps.PipelineProfile) -> dict:
    """The profile as the mapping its pipeline.yaml holds (JSON-ready)."""
    from dataclasses import asdict

    return json.loads(json.dumps(asdict(profile)))


def test_harness_point_runs_real_cells_that_record_the_shared_call(tmp_path):
    """End to end through harness.run.cell (the fake engine serves): both cells of cpu-smoke's
    Table 24 point record one call id."""
    prof = _plain(_profile("cpu-smoke"))
    prof.update(
        results_dir=str(tmp_path / "results"),
        cell_overrides=[*prof["cell_overrides"], FAKE, f"workloads_dir={tmp_path / 'workloads'}"],
    )
    profile = point.profile_of(json.dumps(prof))
    (p,) = point.points(sweeps.sweep_cells(sweeps.load_sweep("table24"), profile))
    out = subprocess.run(
        [sys.executable, "-m", "harness.run.point", "run", "table24", p.point_id, "--profile", json.dumps(prof)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    docs = [json.loads((ROOT / path).read_text()) for path in p.paths(profile)]
    for doc, path in zip(docs, p.paths(profile)):
        validate_cell(doc, path)
    assert len(docs) == 2 and len({d["env"]["call_id"] for d in docs}) == 1
    assert re.fullmatch(r"[0-9a-f]{32}", docs[0]["env"]["call_id"])


# --------------------------------------------------------------------------- lists: --mixed, --missing


def test_lines_mixed_and_missing_pick_whole_points(tmp_path, capsys):
    prof = ROOT / "profiles" / "h200" / "pipeline.yaml"
    where = ["batch=256", "lp=512,2048,8192,16384"]
    res = tmp_path / "h200"
    folder = res / "table9"

    def cell(system, lp):
        return folder / f"{system}-llama-3.1-8b-tp1-sharegpt-lp{lp}-b256-k1-r0.json"

    for s in ("paged", "cascade", "granikv"):
        write_result(cell(s, 512), "a" * 40, "one")  # one call: neither
        write_result(cell(s, 2048), "a" * 40, "two" if s == "granikv" else "one")  # two calls: mixed
        write_result(cell(s, 16384), "a" * 40, None)  # no call ids: each a call of its own
    for s in ("paged", "cascade"):
        write_result(cell(s, 8192), "a" * 40, "one")  # granikv missing: missing, not mixed

    def picked(**kw):
        found = batch.point_lines("table9", prof, where, kw.get("missing"), mixed=kw.get("mixed"))
        return [
            (re.search(r"lp=(\d+)", lines[0]).group(1), [ln.endswith("overwrite=true") for ln in lines])
            for lines in found
        ]

    assert picked(mixed=res) == [("2048", [True] * 3), ("16384", [True] * 3)]
    assert picked(missing=res) == [("8192", [True, True, False])]
    assert picked(missing=res, mixed=res) == [
        ("2048", [True] * 3),
        ("8192", [True, True, False]),
        ("16384", [True] * 3),
    ]
    assert len(picked()) == 4
    # a further rep measured beside the profile's: looked at too, whole
    write_result(folder / "paged-llama-3.1-8b-tp1-sharegpt-lp512-b256-k1-r1.json", "a" * 40, "three")
    assert ("512", [True, False, False]) in picked(missing=res)
    assert (
        batch.main(
            ["lines", "table9", "--profile", str(prof), "--mixed", str(res), *sum((["--where", w] for w in where), [])]
        )
        == 0
    )
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 6 and "6 cell lines, 2 points" in out.err


def test_one_call_counts_a_file_without_a_call_id_as_a_call_of_its_own(tmp_path):
    a, b, c = (tmp_path / f"{x}.json" for x in "abc")
    write_result(a, "s", "x")
    assert point.one_call([a, b, c])  # one file (the others missing): one call
    write_result(b, "s", "x")
    assert point.one_call([a, b])
    write_result(c, "s", None)
    assert not point.one_call([a, c])
    assert point.one_call([c, tmp_path / "d.json"])  # a lone file, even without a call id: nothing to differ from
    write_result(a, "s", None)
    assert not point.one_call([a, c])


# --------------------------------------------------------------------------- the Snakemake plan


def _dry_run(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "profiles/cpu-smoke", "-n", *args, "--directory", str(ROOT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout + out.stderr


def _jobs(text: str) -> dict[str, dict]:
    jobs = {}
    for block in text.split("\n\n"):
        m = re.search(r"^rule (point_\S+):$", block, re.M)
        if m:
            missing = re.search(r"Missing output files: (.*)", block)
            jobs[m.group(1)] = {
                "output": re.search(r"^    output: (.*)$", block, re.M).group(1).split(", "),
                "missing": missing.group(1).split(", ") if missing else [],
                "shell": re.search(r"^Shell command: (.*)$", block, re.M).group(1),
            }
    return jobs


def test_snakemake_runs_one_job_per_point_that_writes_all_its_cells(tmp_path):
    results = tmp_path / "results"
    text = _dry_run("cells", "gate", "--config", f"results_dir={results}")
    jobs = _jobs(text)
    profile = sweeps.PipelineProfile.from_dict({**_plain(_profile("cpu-smoke")), "results_dir": str(results)})
    plan = sweeps.plan(profile)
    want = point.points(plan.all_cells()) + point.points(sweeps.sweep_cells(sweeps.load_sweep("gate"), profile))
    assert sorted(jobs) == sorted(f"point_{p.sweep}_{p.point_id}" for p in want)
    for p in want:
        job = jobs[f"point_{p.sweep}_{p.point_id}"]
        assert sorted(job["output"]) == sorted(p.paths(profile))
        cmd = job["shell"].split()
        assert cmd[1:6] == ["-m", "harness.run.point", "run", p.sweep, p.point_id] and cmd[6] == "--profile"
    # `--config` changed the profile: the job carries it as JSON, which harness.run.point reads back
    shell = next(iter(jobs.values()))["shell"]
    assert point.profile_of(shlex.split(shell)[7]) == profile
    # a point with one cell measured: the job still writes (re-measures) all its cells
    p = next(p for p in want if len(p.cells) > 1)
    write_result(Path(p.paths(profile)[0]), "a" * 40, "old")
    job = _jobs(_dry_run("cells", "--config", f"results_dir={results}"))[f"point_{p.sweep}_{p.point_id}"]
    assert sorted(job["output"]) == sorted(p.paths(profile)) and len(job["missing"]) == len(p.cells) - 1


def test_the_snakemake_job_names_the_profile_file_when_it_is_what_runs():
    jobs = _jobs(_dry_run("-F", "point_table9_tiny-tp1-sharegpt-lp256-b4-k1-r0"))
    assert list(jobs) == ["point_table9_tiny-tp1-sharegpt-lp256-b4-k1-r0"]
    assert jobs["point_table9_tiny-tp1-sharegpt-lp256-b4-k1-r0"]["shell"].endswith(
        "-m harness.run.point run table9 tiny-tp1-sharegpt-lp256-b4-k1-r0 --profile profiles/cpu-smoke/pipeline.yaml"
    )
