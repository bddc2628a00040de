#!/bin/bash
# nvidia-h200-x2, ~4 min, a call of its own after next-engine-checks.sh:
source scripts/gpu-batches/device-env.sh
# the TP=2 extend step's fixed cost (docs/reproduction.md: 55-100 ms at TP=2 against 21 ms at
#   TP=1 (Llama-8B) when last measured, before the key splits and the host fix): Qwen-14B extend steps at
#   TP=2, then the same at TP=1 on GPU 0, host phases and Python profile included (~3 min)
for tp in 2 1; do
  timeout 240 python -m harness.microbench.extend_steps --engine --tp $tp --model qwen2.5-14b --lp 4096,16384 \
      --cases 1x20,1x160,3x160 --reps 3 --py-profile \
      --out results/h200/microbench/extend-steps-engine-qwen14b-tp$tp.json > "$OUT/extend-tp$tp.log" 2>&1
  cp results/h200/microbench/extend-steps-engine-qwen14b-tp$tp.json "$OUT/" 2>/dev/null
done
rm -f "$OUT/nvidia-smi.txt"
tail -25 "$OUT"/extend-tp*.log
