#!/bin/bash
# nvidia-h200-x2, ~7 min: what session 4 could not verify (then x2-extend-tp.sh, a call of its own).
# 1. the TP=2 NCCL test (both GPUs), now that TP teardown releases CUDA graphs before
#    destroy_process_group (session 4's hang: results/h200/engine/tp-test-hang-5186aa6.log);
# 2. the HTTP-vs-in-process check on the 1024-token burst with incremental chunks, then with
#    SGLang's default cumulative chunks (perf-notes v5), on GPU 0 with nothing else running;
source scripts/gpu-batches/device-env.sh
timeout 150 python -m pytest -q -s -p no:cacheprovider tests/engine/test_tp_gpu.py --timeout 140 \
    --timeout-method thread -rf > "$OUT/tp-test.log" 2>&1
pkill -f multiprocessing.spawn 2>/dev/null
for mode in incremental cumulative; do
  CUDA_VISIBLE_DEVICES=0 timeout 200 python -m harness.microbench.engine_steps --cells "" \
      --http workloads/http-check-lp512-n256-o1024.jsonl --http-streaming $mode \
      --out results/h200/engine/http-steady-$mode.json > "$OUT/http-$mode.log" 2>&1
  cp results/h200/engine/http-steady-$mode.json "$OUT/" 2>/dev/null
done
rm -f "$OUT/nvidia-smi.txt"
tail -3 "$OUT/tp-test.log" "$OUT"/http-*.log
