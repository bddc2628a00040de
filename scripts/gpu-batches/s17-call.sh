#!/bin/bash
# nvidia-h200 (one GPU), for session 17: `bash scripts/gpu-batches/s17-call.sh N` runs s17-callN.txt
# through call.sh (BUDGET_S and GPU_TESTS as there).
exec bash scripts/gpu-batches/call.sh "scripts/gpu-batches/s17-call${1:?usage: s17-call.sh N}.txt"
