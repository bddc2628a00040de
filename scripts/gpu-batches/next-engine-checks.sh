#!/bin/bash
# One H200 (nvidia-h200, or GPU 0 of a pair), ~8 min: what session 3 could not verify.
# 1. the extend kernel compiles one variant for any TILES (4c6f322) and the kernel/engine GPU tests;
# 2. the TP=2 NCCL test, with stack dumps if it hangs again (needs two GPUs; skipped on one);
# 3. the HTTP-vs-in-process check on a steady burst (1024 output tokens; the 128-token burst is
#    dominated by the ~0.2 s admission ramp, perf-notes v4).
source scripts/gpu-batches/device-env.sh
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests --ignore tests/engine/test_tp_gpu.py -n 4 \
    --timeout 150 -rf > "$OUT/gpu-tests.log" 2>&1
timeout 130 python -m pytest -q -s -p no:cacheprovider tests/engine/test_tp_gpu.py -k paged --timeout 120 \
    --timeout-method thread -rf > "$OUT/tp-test.log" 2>&1
timeout 240 python -m harness.microbench.engine_steps --cells "" --http workloads/http-check-lp512-n256-o1024.jsonl \
    --out results/h200/engine/http-steady.json > "$OUT/http.log" 2>&1
cp results/h200/engine/http-steady.json "$OUT/" 2>/dev/null
tail -3 "$OUT/gpu-tests.log" "$OUT/tp-test.log" "$OUT/http.log"
