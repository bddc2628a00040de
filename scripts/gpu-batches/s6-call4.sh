#!/bin/bash
# nvidia-h200 (one GPU), session 6 call 4: the HTTP-vs-in-process check on the 1024-token burst with
# incremental chunks (issue 4's last bar), then s6-call4.txt (the cells granikv lost, then Lp=16K B=8/32, Table 24).
source scripts/gpu-batches/device-env.sh
B=${BUDGET_S:-560}
timeout 220 python -m harness.microbench.engine_steps --cells "" --http workloads/http-check-lp512-n256-o1024.jsonl \
    --http-streaming incremental --out results/h200/engine/http-steady-incremental.json > "$OUT/http-incremental.log" 2>&1
cp results/h200/engine/http-steady-incremental.json "$OUT/" 2>/dev/null
python -m harness.batch run scripts/gpu-batches/s6-call4.txt --logs batch-logs/call4 \
    --budget-s $((B - SECONDS)) --reserve-s 50 --tar "$OUT/call4.tar.gz" > "$OUT/call4.log" 2>&1
rm -f "$OUT/nvidia-smi.txt"
tail -3 "$OUT/http-incremental.log"; grep -h "rc=\|cell " "$OUT/call4.log" | cut -c1-220
