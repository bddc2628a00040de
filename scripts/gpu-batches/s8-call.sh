#!/bin/bash
# nvidia-h200 (one GPU), for session 8: `bash scripts/gpu-batches/s8-call.sh N` runs s8-callN.txt.
# MICRO=1 first runs the extend microbenchmarks (kernel cases with split counts to tune
# ExtendSplitPolicy, then whole engine extend steps with splits on and off) and the Table 17
# dispatch-overhead window (~3-4 min in all) into $OUT/extend-steps*.json and dispatch.json; GPU_TESTS=1 runs the GPU test suite. The cells re-measure points whose
# prefill phase the key splits change (every system's): move the superseded files to
# results/h200/history/ before committing the new ones (the lists use overwrite=true).
source scripts/gpu-batches/device-env.sh
N=${1:?usage: s8-call.sh N}
B=${BUDGET_S:-560}
if [[ ${MICRO:-0} == 1 ]]; then  # one tarball back: the device returns at most 8 files
  M=results/h200/microbench
  # the key-split extend kernel has not run on a GPU before this call: its bf16 tests first,
  # and no cells on a kernel that disagrees with the float32 reference
  timeout 180 python -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_extend_merge_store.py \
      -x --timeout 150 > "$OUT/extend-gpu-tests.log" 2>&1 || { tail -30 "$OUT/extend-gpu-tests.log"; exit 1; }
  tail -1 "$OUT/extend-gpu-tests.log"
  timeout 150 python -m harness.microbench.extend_steps --splits 1,auto,4,8,16,32 \
      --out $M/extend-steps.json > $M/extend-steps.log 2>&1
  timeout 200 python -m harness.microbench.extend_steps --engine --lp 512,16384 \
      --out $M/extend-steps-engine.json > $M/extend-steps-engine.log 2>&1
  timeout 150 python -m harness.microbench.dispatch --out $M/dispatch.json > $M/dispatch.log 2>&1
  tar -czf "$OUT/micro.tar.gz" $M/extend-steps* $M/dispatch.* 2>/dev/null
  tail -12 $M/extend-steps.log; tail -8 $M/extend-steps-engine.log; tail -2 $M/dispatch.log
fi
if [[ ${KERNEL_MICRO:-0} == 1 ]]; then  # the kernel cases alone (call 4: call 1's crashed)
  M=results/h200/microbench
  timeout 150 python -m harness.microbench.extend_steps --splits 1,auto,4,8,16,32 \
      --out $M/extend-steps.json > $M/extend-steps.log 2>&1
  tar -czf "$OUT/micro-kernel.tar.gz" $M/extend-steps.json $M/extend-steps.log 2>/dev/null
  tail -40 $M/extend-steps.log
fi
if [[ ${GPU_TESTS:-0} == 1 ]]; then
  timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests --ignore tests/engine/test_tp_gpu.py -n 4 \
      --timeout 150 -rf > "$OUT/gpu-tests.log" 2>&1
  tail -2 "$OUT/gpu-tests.log"
fi
python -m harness.batch run scripts/gpu-batches/s8-call$N.txt --logs batch-logs/call$N \
    --budget-s $((B - SECONDS)) --reserve-s 45 --tar "$OUT/call$N.tar.gz" > "$OUT/call$N.log" 2>&1
rm -f "$OUT/nvidia-smi.txt"
grep -h "rc=\|cell " "$OUT/call$N.log" | cut -c1-220
