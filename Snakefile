# The reproduction pipeline: every paper table (3-24) and the plots, from cells measured here.
#
#   snakemake --profile profiles/cpu-smoke all      # CPU-only host, tiny model (make smoke)
#   snakemake --profile profiles/h200 all           # one H200: the headline GPU cells
#   snakemake --profile profiles/paper table9       # one table's cells, full grid, 3 reps
#   snakemake --profile profiles/h200 -n all        # the plan (dry run)
#
# The profile's pipeline.yaml (its `configfile`) picks hardware, grid level, reps and GPUs;
# harness/sweeps.py expands conf/sweep/*.yaml into cells. Each cell is one job running the
# Hydra app `python -m harness.cell <overrides>` -> results/<hw>/<sweep>/<cell-id>.json.
# Results that exist are never recomputed (they are write-protected, and profiles set
# rerun-triggers to mtime, so a changed command line does not re-measure them); a killed run
# resumes with the cells still missing. GPU jobs declare `resources: gpu=<tp>`, so cells never
# share a GPU when the profile caps `gpu`.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir)))

from harness.sweeps import PipelineProfile, plan as make_plan  # noqa: E402

if not config:
    raise WorkflowError("no pipeline config: run with --profile profiles/<name> (cpu-smoke, h200, paper, a100-40gb)")

PYTHON = config.get("python") or sys.executable
PROFILE = PipelineProfile.from_dict({k: v for k, v in config.items() if k != "python"})
PLAN = make_plan(PROFILE)
R = PROFILE.results
VIEW = PROFILE.view
TABLES = f"{PROFILE.tables_dir}/{PROFILE.hardware}"
PLOTS = f"{PROFILE.plots_dir}/{PROFILE.hardware}"
CELLS = {(c.sweep, c.cell_id): c for c in PLAN.all_cells()}
TABLE_SWEEPS = PLAN.table_sweeps()
ALL_TABLES = sorted(TABLE_SWEEPS)
# Stand-in profiles (cpu-smoke) render tables from the paper-unit view of their results.
MAKE_VIEW = f"{PYTHON} -m harness.sweeps view --results {R} --out {VIEW} && " if PROFILE.stand_in else ""


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
    sweep=r"table\d+|adhoc",
    cell=r"[A-Za-z0-9._\-]+",
    n=r"\d+",
    name=r"[A-Za-z0-9_\-]+",


rule all:
    input:
        f"{TABLES}/README.md",
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


rule cell:
    input:
        [ancient(f"{R}/microbench/{n}.json") for n in PROFILE.cells_after],
    output:
        protected(R + "/{sweep}/{cell}.json"),
    params:
        cmd=lambda wc: CELLS[(wc.sweep, wc.cell)].command(PROFILE, PYTHON),
    resources:
        gpu=lambda wc: CELLS[(wc.sweep, wc.cell)].gpus if PROFILE.gpus else 0,
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
        MAKE_VIEW + f"{PYTHON} -m harness.tables --results {VIEW} --out {TABLES} --table {{wildcards.n}}"


rule tables:
    input:
        ALL_INPUTS,
    output:
        f"{TABLES}/README.md",
    resources:
        view=1,
    shell:
        MAKE_VIEW + f"{PYTHON} -m harness.tables --results {VIEW} --out {TABLES}"


rule plots:
    input:
        ALL_INPUTS,
    output:
        touch(f"{PLOTS}/.done"),
    resources:
        view=1,
    shell:
        MAKE_VIEW + f"{PYTHON} -m harness.plots --results {VIEW} --out {PLOTS}"
