#!/bin/bash
# nvidia-h200-x2 (two GPUs), for session 12 or later: `bash scripts/gpu-batches/x2-s12-call.sh N`
# runs x2-s12-cells.txt (TP=2 cells use both GPUs, one cell at a time) and tars what it wrote to
# $OUT/x2-callN.tar.gz; run it again as call N+1 for the cells the budget left (cells already
# re-measured at this commit are skipped). Run next-engine-checks.sh and x2-extend-tp.sh first,
# each as its own call. Land each tarball with `python -m harness.batch land`.
source scripts/gpu-batches/device-env.sh
N=${1:?usage: x2-s12-call.sh N}
B=${BUDGET_S:-560}
run_list scripts/gpu-batches/x2-s12-cells.txt x2-call$N $((B - SECONDS))
rm -f "$OUT/nvidia-smi.txt"
