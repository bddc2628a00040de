#!/bin/bash
# nvidia-h200 (one GPU), session 19 calls 2, 3, ...: `bash scripts/gpu-batches/s19-call.sh N` continues
# s19-remeasure.txt (cells measured at GIT_SHA are skipped once the earlier calls' tarballs are landed).
exec bash scripts/gpu-batches/call.sh scripts/gpu-batches/s19-remeasure.txt "remeasure${1:?usage: s19-call.sh N}"
