#!/bin/bash
# nvidia-h200-x2, call 3 (TP=1, two lanes): x2-call3-gpu0.txt and x2-call3-gpu1.txt within BUDGET_S.
source scripts/gpu-batches/device-env.sh
B=${BUDGET_S:-550}
CUDA_VISIBLE_DEVICES=0 python -m harness.batch run scripts/gpu-batches/x2-call3-gpu0.txt --logs batch-logs/gpu0 \
    --budget-s $((B - SECONDS)) --reserve-s 40 --tar "$OUT/gpu0.tar.gz" > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 python -m harness.batch run scripts/gpu-batches/x2-call3-gpu1.txt --logs batch-logs/gpu1 \
    --budget-s $((B - SECONDS)) --reserve-s 40 --tar "$OUT/gpu1.tar.gz" > "$OUT/gpu1.log" 2>&1 &
wait
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
