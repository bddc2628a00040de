#!/bin/bash
# nvidia-h200 (one GPU), session 19 call 1 (~7 min on a fresh machine): the compile-inside-a-run fix (e6f8160).
# 1. the GPU test suite at HEAD, with tests/engine/test_no_compile_gpu.py;
# 2. that test on the pre-fix tree (.carry/before = git archive faefc38 + the test file): expected to fail,
#    naming the kernels that compiled after the warm-up;
# 3. harness.microbench.specialize on an empty Triton cache (per-launch A/B, first-call compile times);
# 4. Table 20 k=16 granikv on an empty Triton cache, pre-fix tree then HEAD (sweep adhoc, tag coldcache-*);
# 5. the re-measure list with what is left of BUDGET_S (default 560).
source scripts/gpu-batches/device-env.sh
ROOT=$PWD
gpu_tests
(cd .carry/before && GIT_SHA=$(cat sha) timeout 120 python -m pytest -q -p no:cacheprovider -m gpu \
    tests/engine/test_no_compile_gpu.py -x -rf > "$OUT/before-no-compile.log" 2>&1; echo "before-tree no-compile test rc=$?")
grep -h "compiled inside\|passed\|failed" "$OUT/before-no-compile.log" | cut -c1-400 | tail -4
TRITON_CACHE_DIR=$(mktemp -d) timeout 150 python -m harness.microbench.specialize > "$OUT/specialize.log" 2>&1
echo "specialize rc=$?"; tail -9 "$OUT/specialize.log"
CELL="model=llama-3.1-8b tp=1 workload=multiprefix lp=8192 batch=256 system=granikv k=16 rep=0 sweep=adhoc hardware=h200"
(cd .carry/before && TRITON_CACHE_DIR=$(mktemp -d) GIT_SHA=$(cat sha) timeout 150 python -m harness.cell $CELL \
    tag=coldcache-before workloads_dir=$ROOT/workloads results_dir=$ROOT/results > "$OUT/cold.log" 2>&1; echo "cold before rc=$?")
TRITON_CACHE_DIR=$(mktemp -d) timeout 150 python -m harness.cell $CELL tag=coldcache-after results_dir=results \
    >> "$OUT/cold.log" 2>&1; echo "cold after rc=$?"
grep -h "^cell \|cell failed" "$OUT/cold.log" | cut -c1-200
tar -czf "$OUT/call1.tar.gz" results/h200/microbench/specialize.json results/h200/adhoc/*coldcache* 2>/dev/null
run_list scripts/gpu-batches/s19-remeasure.txt remeasure1 $((${BUDGET_S:-560} - SECONDS))
rm -f "$OUT/nvidia-smi.txt"
