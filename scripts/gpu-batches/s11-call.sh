#!/bin/bash
# nvidia-h200 (one GPU), for session 11: `bash scripts/gpu-batches/s11-call.sh N` runs s11-callN.txt (session 10's lists ran with s10-call.sh)
# The lists use overwrite=true: before extracting a call's tarball,
# `python -m harness.batch supersede <list> --into results/h200/history/<folder>`.
source scripts/gpu-batches/device-env.sh
N=${1:?usage: s10-call.sh N}
B=${BUDGET_S:-560}
run_list scripts/gpu-batches/s11-call$N.txt call$N $((B - SECONDS))
rm -f "$OUT/nvidia-smi.txt"
