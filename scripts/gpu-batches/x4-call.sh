#!/bin/bash
# nvidia-h200-x4 (four GPUs), when one is lent (issue 8): `bash scripts/gpu-batches/x4-call.sh N`
# runs x4-cells.txt (TP=4 cells use all four GPUs, one cell at a time; Table 19's Qwen-32B/TP=2
# pair uses two) and tars what it wrote to $OUT/x4-callN.tar.gz; run it again as call N+1 for the
# cells the budget left (measured cells are skipped). Land each tarball with
# `python -m harness.batch land`.
source scripts/gpu-batches/device-env.sh
N=${1:?usage: x4-call.sh N}
B=${BUDGET_S:-560}
run_list scripts/gpu-batches/x4-cells.txt x4-call$N $((B - SECONDS))
rm -f "$OUT/nvidia-smi.txt"
