#!/bin/bash
# nvidia-h200 (one GPU), session 7: `bash scripts/gpu-batches/s7-call.sh N` runs s7-callN.txt (cells in
# priority order; the batch stops starting cells when BUDGET_S runs low). GPU_TESTS=1 first runs the
# GPU test suite (`-m gpu`, without the two-GPU TP test) into $OUT/gpu-tests.log.
source scripts/gpu-batches/device-env.sh
N=${1:?usage: s7-call.sh N}
B=${BUDGET_S:-560}
if [[ ${GPU_TESTS:-0} == 1 ]]; then
  timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests --ignore tests/engine/test_tp_gpu.py -n 4 \
      --timeout 150 -rf > "$OUT/gpu-tests.log" 2>&1
  tail -2 "$OUT/gpu-tests.log"
fi
python -m harness.batch run scripts/gpu-batches/s7-call$N.txt --logs batch-logs/call$N \
    --budget-s $((B - SECONDS)) --reserve-s 45 --tar "$OUT/call$N.tar.gz" > "$OUT/call$N.log" 2>&1
rm -f "$OUT/nvidia-smi.txt"
grep -h "rc=\|cell " "$OUT/call$N.log" | cut -c1-220
