# Sourced by the x2-call*.sh scripts on a lent GPU host (repo root as the working directory).
# GIT_SHA: the commit the cells record (the host's copy of .git may be stale); .carry/site holds
# hydra-core, omegaconf and antlr4 (copied from this machine's venv; the host has no index).
export GIT_SHA=$(cat .carry/src.sha) PYTHONPATH=$PWD/.carry/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/nvidia-smi.txt" 2>&1
python -m harness.batch unpack
