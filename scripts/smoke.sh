#!/usr/bin/env bash
# The main job on a CPU-only host (the README's `make smoke`): the whole reproduction pipeline
# with the cpu-smoke profile -- the tiny model through the real engine on CPU for a small grid
# of every serving table, then every table (paper beside ours) and plot.
#   scripts/smoke.sh            # = snakemake --profile profiles/cpu-smoke all
#   scripts/smoke.sh -n         # the plan only; any other snakemake flags pass through
# Works on a fresh clone: workloads are generated on the fly; results already there are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
if [ ! -x "$PY" ]; then
    echo "error: $PY not found; run 'make env' (scripts/setup-env.sh) first" >&2
    exit 1
fi
"$PY" -m snakemake --profile profiles/cpu-smoke all "$@"
case " $* " in *" -n "*|*" --dry-run "*) exit 0 ;; esac
echo
echo "cpu-smoke done (tiny-model stand-ins on CPU: they show the pipeline works, not paper-scale speed):"
echo "  tables : tables/cpu/README.md  (table<N>.md/.tex/.csv, the paper's numbers beside ours)"
echo "  plots  : plots/cpu/"
echo "  results: results/cpu/<sweep>/<cell>.json  (paper-unit view for the tables: results/cpu-standin/)"
