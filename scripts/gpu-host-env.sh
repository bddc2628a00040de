# Source on a lent GPU host, from the repository root, before `python -m harness.run.batch run`
# (harness/run/batch.py's docstring and README.md, "GPU host", give the whole workflow).
# - GIT_SHA: the commit the cells record (`harness.run.batch prepare` wrote it to .carry/src.sha; the
#   host's copy of the tree may have a stale or no .git, harness.run.provenance).
# - PYTHONPATH: packages carried in .carry/site (e.g. hydra-core, omegaconf, antlr4 copied from
#   this machine's venv) for a host without a package index.
# - NCCL/NVSHMEM: no NVLink multicast (NVLS), which lent multi-GPU hosts may not offer.
# - the carried workloads unpacked into workloads/.
if [ -f .carry/src.sha ]; then export GIT_SHA=$(cat .carry/src.sha); fi
export PYTHONPATH=$PWD/.carry/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python -m harness.run.batch unpack
