# The reproduction pipeline: every paper table (3-24) and the plots, from cells measured here.
#
#   snakemake --profile profiles/cpu-smoke all      # CPU-only host, tiny model (make smoke)
#   snakemake --profile profiles/h200 all           # one H200: the headline GPU cells
#   snakemake --profile profiles/paper table9       # one table's cells, full grid, 3 reps
#   snakemake --profile profiles/h200 -n all        # the plan (dry run)
#   snakemake --profile profiles/h200 gate          # the CI throughput gate (docs/gate.md)
#
# The profile's pipeline.yaml (its `configfile`) picks hardware, grid level, reps and GPUs;
# harness/run/sweeps.py expands conf/sweep/*.yaml into cells, and harness/run/point.py groups them into
# points: the cells of one sweep that differ only in system and granikv's knobs, rep included
# (paged, cascade and granikv at one Lp, B, k, TP, workload and rep). A point is one job, a rule
# of its own named `point_<sweep>_<point-id>` whose outputs are all its cell files
# (results/<hw>/<sweep>/<cell-id>.json): `python -m harness.run.point run <sweep> <point-id>` measures
# them back to back in one call, every cell recording the call's `env.call_id`, so a ratio never
# mixes two calls. A point whose files all exist is never recomputed (profiles set rerun-triggers
# to mtime, so a changed command line does not re-measure it); a point with a file missing — a
# killed run, a failed cell (Snakemake then deletes the job's other outputs too) — is re-measured
# whole. GPU jobs declare `resources: gpu=<tp>`, so points never share a GPU when the profile
# caps `gpu`.
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir)))

from harness.run.point import points as group_points  # noqa: E402
from harness.run.sweeps import PipelineProfile, load_profile, load_sweep, plan as make_plan, sweep_cells  # noqa: E402

if not config:
    raise WorkflowError("no pipeline config: run with --profile profiles/<name> (cpu-smoke, h200, paper, a100-40gb)")

PYTHON = config.get("python") or sys.executable
# gate_* keys (e.g. --config gate_mode=both) set the `gate` target, not the pipeline profile
PROFILE = PipelineProfile.from_dict({k: v for k, v in config.items() if k != "python" and not k.startswith("gate_")})
PLAN = make_plan(PROFILE)
R = PROFILE.results
VIEW = PROFILE.view
TABLES = f"{PROFILE.tables_dir}/{PROFILE.hardware}"
PLOTS = f"{PROFILE.plots_dir}/{PROFILE.hardware}"
# The CI gate (docs/gate.md): conf/sweep/gate.yaml's cells, in their own folder R/gate/, never
# part of `all`; gated against the committed baseline by harness.report.gate. Measured as points too.
GATE_CELLS = sweep_cells(load_sweep("gate"), PROFILE)
POINTS = group_points(PLAN.all_cells()) + group_points(GATE_CELLS)
GATE_BASELINE = config.get("gate_baseline") or f"{PROFILE.results_dir}/baselines/{PROFILE.hardware}.json"
GATE_MODE = config.get("gate_mode", "ratio")
GATE_REPORT = f"{R}/gate/report"
TABLE_SWEEPS = PLAN.table_sweeps()
ALL_TABLES = sorted(TABLE_SWEEPS)
# Stand-in profiles (cpu-smoke) render tables from the paper-unit view of their results.
MAKE_VIEW = f"{PYTHON} -m harness.run.sweeps view --results {R} --out {VIEW} && " if PROFILE.stand_in else ""


def profile_arg():
    """How `harness.run.point run` gets this run's pipeline profile: its file when the file says what
    this run uses (the readable command line), else the profile as JSON (`--config` changed it)."""
    for f in reversed(list(workflow.configfiles)):
        try:
            same = load_profile(f) == PROFILE
        except (OSError, ValueError):
            continue
        if same:
            path = Path(f).resolve()
            return shlex.quote(str(path.relative_to(Path.cwd().resolve()) if path.is_relative_to(Path.cwd()) else path))
    fields = {k: v for k, v in config.items() if k != "python" and not k.startswith("gate_")}
    return shlex.quote(json.dumps(fields, sort_keys=True))


PROFILE_ARG = profile_arg()


def cell_files(cells):
    return sorted({c.path(PROFILE) for c in cells})


def microbench_files(sweeps):
    names = {PLAN.sweeps[s].microbench for s in sweeps} & set(PROFILE.microbench)
    return sorted(f"{R}/microbench/{n}.json" for n in names)


def table_inputs(n):
    sweeps = TABLE_SWEEPS.get(int(n), [])
    return cell_files(c for s in sweeps for c in PLAN.inputs_of(s)) + microbench_files(sweeps)


ALL_INPUTS = cell_files(PLAN.all_cells()) + microbench_files(PLAN.sweeps)

wildcard_constraints:
    n=r"\d+",
    name=r"[A-Za-z0-9_\-]+",


rule all:
    input:
        f"{TABLES}/README.md",
        f"{TABLES}/tree.md",
        f"{PLOTS}/.done",


rule cells:
    """Every cell of the profile, no tables."""
    input:
        ALL_INPUTS,


for _n in ALL_TABLES:
    rule:
        name: f"table{_n}"
        input:
            f"{TABLES}/table{_n}.md",


def gate_command():
    """harness.report.gate over the gate's cells (exit 1 on a regression, 2 when it cannot judge). A
    stand-in profile (cpu-smoke) without a baseline skips the verdict: its numbers show the
    plumbing works, not how fast anything is, so no CPU baseline is committed."""
    if PROFILE.stand_in and not Path(GATE_BASELINE).exists():
        return (f"echo 'gate: skipped: no baseline {GATE_BASELINE} for the stand-in profile {PROFILE.name}; "
                f"write one with: {PYTHON} -m harness.report.gate --results {R} --sweep gate --cells gate "
                f"--profile {PROFILE.name} --baseline {GATE_BASELINE} --write-baseline'")
    return (f"{PYTHON} -m harness.report.gate --results {R} --sweep gate --baseline {GATE_BASELINE} --mode {GATE_MODE} "
            f"--json {GATE_REPORT}/report.json --markdown {GATE_REPORT}/report.md")


rule gate:
    """Measure the gate's cells and gate them. No output files: the rule runs on every call, and
    the report it writes survives a failing verdict (Snakemake deletes a failed job's outputs).
    The judged cells are copied beside the report (report/cells/), so a committed report carries
    the result files its numbers come from, while R/gate/ itself stays unversioned and is
    measured afresh by the next run."""
    input:
        cell_files(GATE_CELLS),
    shell:
        f"mkdir -p {GATE_REPORT}/cells && rm -f {GATE_REPORT}/cells/*.json && cp {{input}} {GATE_REPORT}/cells/ && "
        + gate_command()


# One rule per point (its outputs are fixed file names, so no wildcards): the job measures the
# whole point, and Snakemake runs it when any of its cell files is missing. Not protected():
# Snakemake refuses to run a job while one of its outputs is write-protected (it would have to
# delete it first), and a point with some cells measured must run again whole, re-measuring them.
# Cluster profiles size the point jobs under the name `point` (set-resources / set-threads: point):
# the rules' own names are per point, so the profile's values are copied onto each of them here.
def _profile_point_resources() -> dict:
    rs = workflow.resource_settings
    res = rs.overwrite_resources.get("point") or {}
    if hasattr(res, "items"):
        res = dict(res.items())
    out = {}
    for key, value in res.items():
        raw = getattr(value, "raw", value)  # a parsed Resource keeps what the profile gave
        if key not in ("gpu", "_cores", "_nodes") and raw is not None:
            out[key] = raw
    return out


def _profile_point_threads() -> int:
    t = workflow.resource_settings.overwrite_threads.get("point")
    t = getattr(t, "raw", t)
    return int(t) if t else 1


POINT_RESOURCES = _profile_point_resources()
POINT_THREADS = _profile_point_threads()

for _p in POINTS:
    rule:
        name:
            f"point_{_p.sweep}_{_p.point_id}"
        input:
            [ancient(f"{R}/microbench/{n}.json") for n in PROFILE.cells_after],
        output:
            _p.paths(PROFILE),
        params:
            cmd=f"{shlex.quote(PYTHON)} -m harness.run.point run {_p.sweep} {_p.point_id} --profile {PROFILE_ARG}",
        threads: POINT_THREADS
        resources:
            gpu=_p.gpus if PROFILE.gpus else 0,
            **POINT_RESOURCES,
        shell:
            "{params.cmd}"


rule microbench:
    output:
        protected(R + "/microbench/{name}.json"),
    params:
        cmd=lambda wc, output: PROFILE.microbench[wc.name].format(python=PYTHON, output=output[0]),
    resources:
        gpu=lambda wc: 1 if PROFILE.gpus else 0,
    shell:
        "{params.cmd}"


rule table:
    input:
        lambda wc: table_inputs(wc.n),
    output:
        f"{TABLES}/table{{n}}.md",
    resources:
        view=1,
    shell:
        MAKE_VIEW + f"{PYTHON} -m harness.report.tables --results {VIEW} --out {TABLES} --table {{wildcards.n}}"


rule tables:
    input:
        ALL_INPUTS,
    output:
        f"{TABLES}/README.md",
    resources:
        view=1,
    shell:
        MAKE_VIEW + f"{PYTHON} -m harness.report.tables --results {VIEW} --out {TABLES}"


rule tree_page:
    """Sharing at any depth (the tree sweep's points) against the any-depth sharing bars."""
    input:
        ALL_INPUTS,
    output:
        f"{TABLES}/tree.md",
    resources:
        view=1,
    shell:
        MAKE_VIEW + f"{PYTHON} -m harness.report.tree_table --results {VIEW} --out {TABLES}/tree.md"


rule plots:
    input:
        ALL_INPUTS,
    output:
        touch(f"{PLOTS}/.done"),
    resources:
        view=1,
    shell:
        MAKE_VIEW + f"{PYTHON} -m harness.report.plots --results {VIEW} --out {PLOTS}"
