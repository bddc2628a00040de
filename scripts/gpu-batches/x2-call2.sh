#!/bin/bash
# nvidia-h200-x2, call 2 (TP=2 over NCCL, both GPUs): the NCCL equality test, the all-reduce floor,
# then the Qwen-2.5-14B cells of x2-call2.txt.
source scripts/gpu-batches/device-env.sh
timeout 150 python -m pytest -q -p no:cacheprovider tests/engine/test_tp_gpu.py --timeout 120 -rf \
    > "$OUT/tp-tests.log" 2>&1
timeout 90 python -m harness.microbench.allreduce --world 2 --out results/h200/microbench/allreduce-tp2.json \
    > "$OUT/allreduce.log" 2>&1
cp results/h200/microbench/allreduce-tp2.json "$OUT/" 2>/dev/null
python -m harness.batch run scripts/gpu-batches/x2-call2.txt --logs batch-logs/tp2 \
    --budget-s $((${BUDGET_S:-560} - SECONDS)) --reserve-s 70 --tar "$OUT/tp2.tar.gz" > "$OUT/tp2.log" 2>&1
tail -3 "$OUT/tp-tests.log" "$OUT/allreduce.log"; cat "$OUT/tp2.log"
