#!/bin/bash
# nvidia-h200-x2, session 4 call 2: the TP=2 NCCL test (stack dumps if it hangs), then the TP=2
# cells of s4-tp2.txt (Qwen-2.5-14B / 32B over both GPUs).
source scripts/gpu-batches/device-env.sh
B=${BUDGET_S:-565}
timeout 110 python -m pytest -q -s -p no:cacheprovider tests/engine/test_tp_gpu.py --timeout 100 \
    --timeout-method thread -rf > "$OUT/tp-test.log" 2>&1
pkill -f multiprocessing.spawn 2>/dev/null
python -m harness.batch run scripts/gpu-batches/s4-tp2.txt --logs batch-logs/tp2 \
    --budget-s $((B - SECONDS)) --reserve-s 45 --tar "$OUT/tp2.tar.gz" > "$OUT/tp2.log" 2>&1
rm -f "$OUT/nvidia-smi.txt"
tail -5 "$OUT/tp-test.log"; grep -h "rc=" "$OUT/tp2.log" | cut -c1-200
