#!/bin/bash
# nvidia-h200 (one GPU), for session 18: `bash scripts/gpu-batches/s18-call.sh N` runs s18-callN.txt
# through call.sh (BUDGET_S and GPU_TESTS as there).
exec bash scripts/gpu-batches/call.sh "scripts/gpu-batches/s18-call${1:?usage: s18-call.sh N}.txt"
