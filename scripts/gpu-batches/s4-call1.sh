#!/bin/bash
# nvidia-h200-x2, session 4 call 1. GPU 0: the GPU tests (incl. the extend-kernel variant count),
# the HTTP-vs-in-process check on a steady burst (1024 output tokens), then s4-lane0.txt;
# GPU 1: s4-lane1.txt. Seven files come back (the device returns at most eight).
source scripts/gpu-batches/device-env.sh
B=${BUDGET_S:-565}
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests --ignore tests/engine/test_tp_gpu.py -n 4 \
      --timeout 150 -rf > "$OUT/gpu-tests.log" 2>&1
  timeout 220 python -m harness.microbench.engine_steps --cells "" --http workloads/http-check-lp512-n256-o1024.jsonl \
      --out results/h200/engine/http-steady.json > "$OUT/http.log" 2>&1
  cp results/h200/engine/http-steady.json "$OUT/" 2>/dev/null
  python -m harness.batch run scripts/gpu-batches/s4-lane0.txt --logs batch-logs/lane0 \
      --budget-s $((B - SECONDS)) --reserve-s 40 --tar "$OUT/lane0.tar.gz" > "$OUT/lane0.log" 2>&1
) &
CUDA_VISIBLE_DEVICES=1 python -m harness.batch run scripts/gpu-batches/s4-lane1.txt --logs batch-logs/lane1 \
    --budget-s $((B - SECONDS)) --reserve-s 40 --tar "$OUT/lane1.tar.gz" > "$OUT/lane1.log" 2>&1 &
wait
rm -f "$OUT/nvidia-smi.txt"
tail -2 "$OUT/gpu-tests.log"; tail -4 "$OUT/http.log"; grep -h "rc=" "$OUT/lane0.log" "$OUT/lane1.log" | cut -c1-200
