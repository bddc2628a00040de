#!/bin/bash
# nvidia-h200-x2, ~10 min: what session 4 could not verify, and the TP=2 extend step's fixed cost.
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
# 3. the TP=2 extend step's fixed cost (docs/reproduction.md: 55-100 ms at TP=2 against 21 ms at
#    TP=1 (Llama-8B) when last measured, before the key splits and the host fix): Qwen-14B extend steps at
#    TP=2, then the same at TP=1 on GPU 0, host phases and Python profile included (~3 min)
for tp in 2 1; do
  timeout 240 python -m harness.microbench.extend_steps --engine --tp $tp --model qwen2.5-14b --lp 4096,16384 \
      --cases 1x20,1x160,3x160 --reps 3 --py-profile \
      --out results/h200/microbench/extend-steps-engine-qwen14b-tp$tp.json > "$OUT/extend-tp$tp.log" 2>&1
  cp results/h200/microbench/extend-steps-engine-qwen14b-tp$tp.json "$OUT/" 2>/dev/null
done
rm -f "$OUT/nvidia-smi.txt"
tail -3 "$OUT/tp-test.log" "$OUT"/http-*.log "$OUT"/extend-tp*.log
