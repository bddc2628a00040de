# Sourced by the call scripts (s*-call.sh, x2-call*.sh) on a lent GPU host (repo root as the working directory).
# GIT_SHA: the commit the cells record (the host's copy of .git may be stale); .carry/site holds
# hydra-core, omegaconf and antlr4 (copied from this machine's venv; the host has no index).
export GIT_SHA=$(cat .carry/src.sha) PYTHONPATH=$PWD/.carry/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/nvidia-smi.txt" 2>&1
python -m harness.batch unpack

# run_list LIST TAG BUDGET_S: run a cell list with harness.batch, tar its result JSONs to
# $OUT/TAG.tar.gz, log to $OUT/TAG.log, and print each cell's summary line
run_list() {
  python -m harness.batch run "$1" --logs "batch-logs/$2" --budget-s "$3" --reserve-s 45 \
      --tar "$OUT/$2.tar.gz" > "$OUT/$2.log" 2>&1
  grep -h "rc=\|cell " "$OUT/$2.log" | cut -c1-220
}

# gpu_tests: the one-GPU test suite (`-m gpu`, without the two-GPU TP file) into
# $OUT/gpu-tests.log (~1-2 min on an H200), printing its summary line
gpu_tests() {
  timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests --ignore tests/engine/test_tp_gpu.py -n 4 \
      --timeout 150 -rf > "$OUT/gpu-tests.log" 2>&1
  tail -2 "$OUT/gpu-tests.log"
}
