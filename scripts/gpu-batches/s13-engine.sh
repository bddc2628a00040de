#!/bin/bash
# nvidia-h200 (one GPU), ~8 min, after the first s12-call.sh 4 call of a session (a serving cell
# first on a fresh machine checks that nothing compiles inside a run): issue 4's bars at HEAD —
# the decode-step benchmark (median step vs roofline floor, host-gap share; last measured at
# b5cb7be, before the engine process, the pipe fix and the extend splits) with its 128-token HTTP
# check, then the 1024-token HTTP check with incremental chunks (last at 0929764).
# Land: python -m harness.batch land /work/.device/N/engine.tar.gz --into results/h200/history/engine-steps-b5cb7be
source scripts/gpu-batches/device-env.sh
timeout 330 python -m harness.microbench.engine_steps --cells 512x256,16384x256,16384x8 \
    --http workloads/http-check-lp512-n256-o128.jsonl --out results/h200/engine/steps.json > "$OUT/steps.log" 2>&1
echo "steps rc=$?"
timeout 200 python -m harness.microbench.engine_steps --cells "" --http workloads/http-check-lp512-n256-o1024.jsonl \
    --http-streaming incremental --out results/h200/engine/http-steady-incremental.json > "$OUT/http-incremental.log" 2>&1
echo "http rc=$?"
tar -czf "$OUT/engine.tar.gz" $(ls results/h200/engine/steps.json results/h200/engine/http-steady-incremental.json 2>/dev/null)
rm -f "$OUT/nvidia-smi.txt"
grep -h "step \|http\|throughput" "$OUT/steps.log" "$OUT/http-incremental.log" | cut -c1-200 | tail -20
