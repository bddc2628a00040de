#!/bin/bash
# nvidia-h200 (one GPU): `bash scripts/gpu-batches/call.sh LIST [TAG]` runs one cell list with
# harness.batch into $OUT/TAG.tar.gz and $OUT/TAG.log (TAG: callN when LIST ends in callN.txt).
# BUDGET_S (default 560) caps the call; GPU_TESTS=1 first runs the GPU test suite (`-m gpu`,
# without the two-GPU TP test) into $OUT/gpu-tests.log (~2 min).
# Land a call's tarball before the next call (which then skips what it measured):
# `python -m harness.batch land /work/.device/N/TAG.tar.gz --into results/h200/history/<why>`.
source scripts/gpu-batches/device-env.sh
LIST=${1:?usage: call.sh LIST [TAG]}
TAG=${2:-$(basename "$LIST" .txt | sed 's/^.*-\(call[0-9]*\)$/\1/')}
B=${BUDGET_S:-560}
[[ ${GPU_TESTS:-0} == 1 ]] && gpu_tests
run_list "$LIST" "$TAG" $((B - SECONDS))
rm -f "$OUT/nvidia-smi.txt"
