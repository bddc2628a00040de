#!/bin/bash
# nvidia-h200 (one GPU), for session 9: `bash scripts/gpu-batches/s9-call.sh N` runs s9-callN.txt
# (call 1: s9-call1a.txt first, on a cold Triton cache, then the GPU tests and the extend-step
# microbenchmark, then s9-call1b.txt). The lists use overwrite=true: before extracting a call's
# tarball, `python -m harness.batch supersede <list> --into results/h200/history/<folder>`.
source scripts/gpu-batches/device-env.sh
N=${1:?usage: s9-call.sh N}
B=${BUDGET_S:-560}
run_list() {  # list, tag, budget
  python -m harness.batch run "$1" --logs "batch-logs/$2" --budget-s "$3" --reserve-s 45 \
      --tar "$OUT/$2.tar.gz" > "$OUT/$2.log" 2>&1
  grep -h "rc=\|cell " "$OUT/$2.log" | cut -c1-220
}
if [[ $N == 1 ]]; then
  run_list scripts/gpu-batches/s9-call1a.txt call1a 200
  # the longest extend step of each cell: the cold-cache check (no compile inside a run)
  python - <<'PY'
import glob, json
for f in sorted(glob.glob("results/h200/table9/*lp2048-b512-k1-r2.json")):
    e = json.load(open(f))["engine"]
    rec = e["step_log"]["extend"]["recent"]
    print("cold-cache check", f.split("/")[-1], "longest extend step ms", max(r[2] for r in rec),
          "variants at start", e.get("graphs", {}).get("extend_variants_at_start"))
PY
  timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests --ignore tests/engine/test_tp_gpu.py -n 4 \
      --timeout 150 -rf > "$OUT/gpu-tests.log" 2>&1
  tail -2 "$OUT/gpu-tests.log"
  M=results/h200/microbench
  timeout 280 python -m harness.microbench.extend_steps --engine --lp 512,16384 --extend-graphs 32,64,128,256,512 \
      --out $M/extend-steps-engine.json > $M/extend-steps-engine.log 2>&1
  tar -czf "$OUT/micro.tar.gz" $M/extend-steps-engine.* 2>/dev/null
  tail -16 $M/extend-steps-engine.log
  run_list scripts/gpu-batches/s9-call1b.txt call1b $((B - SECONDS))
else
  run_list scripts/gpu-batches/s9-call$N.txt call$N $((B - SECONDS))
fi
rm -f "$OUT/nvidia-smi.txt"
