#!/usr/bin/env bash
# Creates .venv with everything the tests and the pipelines need. Idempotent: a finished venv
# is left alone (stamp file).
#
# Which torch (GRANIKV_TORCH, default auto; docs/gate.md, "Environment on a GPU host"):
#   cpu   the CPU build torch==2.13.0, installed first (an unpinned torch would pull a multi-GB
#         CUDA build). auto picks it on a host with no GPU: CI's `make test` machine.
#   host  keep the CUDA torch that $PYTHON already imports (a GPU image's): the venv sees the
#         site-packages directory holding it through a .pth file, and torch is not installed
#         again (pyproject's torch>=2.11,<2.14 accepts it). auto picks it when $PYTHON's torch
#         has CUDA. A .pth file, not `venv --system-site-packages`: when $PYTHON is itself a
#         venv's (e.g. /opt/torch/.venv/bin/python), --system-site-packages would expose the
#         base interpreter's packages, not the ones holding torch.
#   cuda  torch==2.13.0 from PyPI (whose Linux wheel is the CUDA build) or $TORCH_INDEX_URL
#         (e.g. https://download.pytorch.org/whl/cu128). auto picks it when `nvidia-smi -L`
#         lists a GPU but $PYTHON has no CUDA torch.
# The GPU modes end by checking torch.cuda.is_available().
# GRANIKV_SETUP_DRY_RUN=1 prints the resolved mode and the torch step, and changes nothing
# (tests/test_setup_env.py checks the resolution with stand-in interpreters and nvidia-smi).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MODE=${GRANIKV_TORCH:-auto}
if [[ "$MODE" == auto ]]; then
    if "$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1; then
        MODE=host
    elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        MODE=cuda
    else
        MODE=cpu
    fi
fi
case "$MODE" in cpu|host|cuda) ;; *) echo "GRANIKV_TORCH must be auto, cpu, host or cuda, got '$MODE'" >&2; exit 2 ;; esac
if [[ -n "${GRANIKV_SETUP_DRY_RUN:-}" ]]; then
    case "$MODE" in
        cpu) STEP='pip install torch==2.13.0 (the CPU build)' ;;
        cuda) STEP="pip install torch==2.13.0${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}" ;;
        host) STEP="keep $("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))') (.pth)" ;;
    esac
    echo "mode=$MODE torch: $STEP"
    exit 0
fi
SUFFIX=""
[[ "$MODE" == cpu ]] || SUFFIX="-$MODE"  # the CPU stamp keeps its name: CPU venvs stay finished
STAMP=.venv/.granikv-setup-$(sha1sum pyproject.toml | cut -c1-12)$SUFFIX
if [[ -f "$STAMP" ]]; then exit 0; fi
[[ -d .venv ]] || "$PY" -m venv .venv
if [[ "$MODE" == host ]]; then
    TORCH_SITE=$("$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
    SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$TORCH_SITE" > "$SITE/granikv-host-torch.pth"
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
case "$MODE" in
    cpu) python -m pip install -q "torch==2.13.0" ;;
    cuda) python -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==2.13.0" ;;
    host) ;;
esac
python -m pip install -q -e ".[harness,test]"
if [[ "$MODE" != cpu ]]; then
    if ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
        echo "error: GRANIKV_TORCH=$MODE but torch $(python -c 'import torch; print(torch.__version__)') in .venv" \
             "sees no CUDA device" >&2
        exit 1
    fi
fi
rm -f .venv/.granikv-setup-*
touch "$STAMP"
echo "environment ready: .venv (torch: $MODE, $(python -c 'import torch; print(torch.__version__)'))"
