#!/bin/bash
# nvidia-h200 (one GPU), session 6 call 2: s6-call2.txt (cells in priority order; the batch stops starting
# cells when the budget runs low).
source scripts/gpu-batches/device-env.sh
B=${BUDGET_S:-560}
python -m harness.batch run scripts/gpu-batches/s6-call2.txt --logs batch-logs/call2 \
    --budget-s $((B - SECONDS)) --reserve-s 40 --tar "$OUT/call2.tar.gz" > "$OUT/call2.log" 2>&1
rm -f "$OUT/nvidia-smi.txt"
grep -h "rc=\|cell " "$OUT/call2.log" | cut -c1-220
