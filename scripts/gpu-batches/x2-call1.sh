#!/bin/bash
# nvidia-h200-x2, call 1 (TP=1 on each GPU, two lanes at once; the systems of one cell point run
# back to back on the same GPU, so every ratio comes from one GPU in one run).
# GPU 0: the GPU test suite (bar TP), the engine decode-step benchmark with the warm HTTP check,
# then Table 13's cascade cell. GPU 1: Table 3 rows, the Lp=512 B=512 no-regression cells, more Table 9.
source scripts/gpu-batches/device-env.sh
( export CUDA_VISIBLE_DEVICES=0
  timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests --ignore tests/engine/test_tp_gpu.py \
      -n 4 --timeout 150 -rf > "$OUT/gpu-tests.log" 2>&1
  timeout 330 python -m harness.microbench.engine_steps --cells 512x256,16384x256,16384x8 --steps 30 \
      --prof-steps 8 --http workloads/http-check-lp512-n256-o128.jsonl \
      --out results/h200/engine/steps.json > "$OUT/steps.log" 2>&1
  python -m harness.batch run scripts/gpu-batches/x2-call1-gpu0.txt --logs batch-logs/gpu0 \
      --budget-s $((550 - SECONDS)) --reserve-s 60 --tar "$OUT/gpu0.tar.gz" > "$OUT/gpu0.log" 2>&1
) &
CUDA_VISIBLE_DEVICES=1 python -m harness.batch run scripts/gpu-batches/x2-call1-gpu1.txt --logs batch-logs/gpu1 \
    --budget-s 550 --reserve-s 40 --tar "$OUT/gpu1.tar.gz" > "$OUT/gpu1.log" 2>&1 &
wait
cp results/h200/engine/steps.json "$OUT/" 2>/dev/null
tail -3 "$OUT/gpu-tests.log" "$OUT/steps.log" "$OUT/gpu0.log" "$OUT/gpu1.log"
