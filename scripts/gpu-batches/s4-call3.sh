#!/bin/bash
# nvidia-h200-x2, session 4 call 3: the two TP=1 lanes again (cells measured in call 1 are
# committed, so skipped).
source scripts/gpu-batches/device-env.sh
B=${BUDGET_S:-540}
for g in 0 1; do
  CUDA_VISIBLE_DEVICES=$g python -m harness.batch run scripts/gpu-batches/s4-lane$g.txt --logs batch-logs/lane$g \
      --budget-s $((B - SECONDS)) --reserve-s 40 --tar "$OUT/lane$g.tar.gz" > "$OUT/lane$g.log" 2>&1 &
done
wait
rm -f "$OUT/nvidia-smi.txt"
grep -h "rc=" "$OUT/lane0.log" "$OUT/lane1.log" | cut -c1-200
