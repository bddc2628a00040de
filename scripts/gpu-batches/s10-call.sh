#!/bin/bash
# nvidia-h200 (one GPU), for session 10: `bash scripts/gpu-batches/s10-call.sh N` runs s10-callN.txt
# (call 1: first the extend-step microbenchmark with --py-profile and extend graphs — the check of
# 1d3b5fd's host fix —, then s10-call1.txt). The lists use overwrite=true: before extracting a
# call's tarball, `python -m harness.batch supersede <list> --into results/h200/history/<folder>`.
source scripts/gpu-batches/device-env.sh
N=${1:?usage: s10-call.sh N}
B=${BUDGET_S:-560}
run_list() {  # list, tag, budget
  python -m harness.batch run "$1" --logs "batch-logs/$2" --budget-s "$3" --reserve-s 45 \
      --tar "$OUT/$2.tar.gz" > "$OUT/$2.log" 2>&1
  grep -h "rc=\|cell " "$OUT/$2.log" | cut -c1-220
}
if [[ $N == 1 ]]; then
  M=results/h200/microbench
  # prediction (perf-notes, "Session 9"): numpy.asarray gone from the 8x160 step's top functions,
  # the Lp=16K 1x20 graph step from 11.7 toward ~8 ms
  timeout 120 python -m harness.microbench.extend_steps --engine --lp 512,16384 --cases 1x20,3x160,8x160 \
      --reps 3 --py-profile --extend-graphs 32,64,128,256,512 \
      --out $M/extend-steps-pyprof.json > $M/extend-steps-pyprof.log 2>&1
  tar -czf "$OUT/micro.tar.gz" $M/extend-steps-pyprof.* 2>/dev/null
  grep -v "^USDT" $M/extend-steps-pyprof.log | grep "engine \|^|" | cut -c1-200
fi
run_list scripts/gpu-batches/s10-call$N.txt call$N $((B - SECONDS))
rm -f "$OUT/nvidia-smi.txt"
