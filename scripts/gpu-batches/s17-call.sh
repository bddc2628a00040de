#!/bin/bash
# nvidia-h200 (one GPU), for session 17: `bash scripts/gpu-batches/s17-call.sh N` runs s17-callN.txt
# GPU_TESTS=1 first runs the GPU test suite (`-m gpu`, without the two-GPU TP test) into
# $OUT/gpu-tests.log (~2 min).
# Land a call's tarball before the next call (which then skips what it measured):
# `python -m harness.batch land /work/.device/N/callM.tar.gz --into results/h200/history/<why>`.
source scripts/gpu-batches/device-env.sh
N=${1:?usage: s17-call.sh N}
B=${BUDGET_S:-560}
[[ ${GPU_TESTS:-0} == 1 ]] && gpu_tests
run_list scripts/gpu-batches/s17-call$N.txt call$N $((B - SECONDS))
rm -f "$OUT/nvidia-smi.txt"
