#!/bin/bash
# nvidia-h200 (one GPU), for session 15: `bash scripts/gpu-batches/s15-call.sh N` runs s15-callN.txt
# Land a call's tarball before the next call (which then skips what it measured):
# `python -m harness.batch land /work/.device/N/callM.tar.gz --into results/h200/history/<why>`.
source scripts/gpu-batches/device-env.sh
N=${1:?usage: s15-call.sh N}
B=${BUDGET_S:-560}
run_list scripts/gpu-batches/s15-call$N.txt call$N $((B - SECONDS))
rm -f "$OUT/nvidia-smi.txt"
