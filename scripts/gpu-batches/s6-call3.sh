#!/bin/bash
# nvidia-h200 (one GPU), session 6 call 3: s6-call3.txt (cells in priority order; the batch stops starting
# cells when the budget runs low).
source scripts/gpu-batches/device-env.sh
B=${BUDGET_S:-560}
python -m harness.batch run scripts/gpu-batches/s6-call3.txt --logs batch-logs/call3 \
    --budget-s $((B - SECONDS)) --reserve-s 40 --tar "$OUT/call3.tar.gz" > "$OUT/call3.log" 2>&1
rm -f "$OUT/nvidia-smi.txt"
grep -h "rc=\|cell " "$OUT/call3.log" | cut -c1-220
