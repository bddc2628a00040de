#!/bin/bash
# nvidia-h200-x2, call 4: the cells whose result files did not come back from calls 1-2 (the tool
# returns at most 8 files of 16 MiB: tar only the result JSONs). Phase A: two TP=1 lanes plus a
# stack-dumping run of the TP=2 NCCL test (it hung in call 2); phase B: the TP=2 cells.
source scripts/gpu-batches/device-env.sh
touch /tmp/call-start
( timeout 110 python -X faulthandler -m pytest -x -s -p no:cacheprovider tests/engine/test_tp_gpu.py -k paged \
    --timeout 90 -rf > "$OUT/tp-test.log" 2>&1 ) &
CUDA_VISIBLE_DEVICES=0 python -m harness.batch run scripts/gpu-batches/x2-call4-gpu0.txt --logs /tmp/bl0 \
    --budget-s 190 --reserve-s 20 > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 python -m harness.batch run scripts/gpu-batches/x2-call4-gpu1.txt --logs /tmp/bl1 \
    --budget-s 190 --reserve-s 20 > "$OUT/gpu1.log" 2>&1 &
wait
python -m harness.batch run scripts/gpu-batches/x2-call4-tp2.txt --logs /tmp/bl2 \
    --budget-s $((${BUDGET_S:-530} - SECONDS)) --reserve-s 55 > "$OUT/tp2.log" 2>&1
find results -newer /tmp/call-start -name '*.json' -not -path '*.run/*' | tar czf "$OUT/results.tar.gz" -T -
tar tzf "$OUT/results.tar.gz"; cat "$OUT/gpu0.log" "$OUT/gpu1.log" "$OUT/tp2.log" | grep -v "^    "
