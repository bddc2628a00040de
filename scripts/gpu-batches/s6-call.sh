#!/bin/bash
# nvidia-h200 (one GPU), session 6: `bash scripts/gpu-batches/s6-call.sh N` runs s6-callN.txt (cells in
# priority order; the batch stops starting cells when BUDGET_S runs low). HTTP=1 first runs the
# HTTP-vs-in-process check on the 1024-token burst with incremental chunks (issue 4's bar).
# What ran: HTTP=1 ... 1 (re-measures after fixes, Lp=512 B=128); 2 (Table 9 small B);
# 3 (refused: the machine was being given back); HTTP=1 BUDGET_S=540 ... 4 (after the listen-backlog fix
# and the dispatcher's saved-bytes rule). Calls 2 and 3 ran with --reserve-s 40.
source scripts/gpu-batches/device-env.sh
N=${1:?usage: s6-call.sh N}
B=${BUDGET_S:-560}
if [[ ${HTTP:-0} == 1 ]]; then
  timeout 220 python -m harness.microbench.engine_steps --cells "" --http workloads/http-check-lp512-n256-o1024.jsonl \
      --http-streaming incremental --out results/h200/engine/http-steady-incremental.json > "$OUT/http-incremental.log" 2>&1
  cp results/h200/engine/http-steady-incremental.json "$OUT/" 2>/dev/null
  tail -3 "$OUT/http-incremental.log"
fi
python -m harness.batch run scripts/gpu-batches/s6-call$N.txt --logs batch-logs/call$N \
    --budget-s $((B - SECONDS)) --reserve-s 50 --tar "$OUT/call$N.tar.gz" > "$OUT/call$N.log" 2>&1
rm -f "$OUT/nvidia-smi.txt"
grep -h "rc=\|cell " "$OUT/call$N.log" | cut -c1-220
