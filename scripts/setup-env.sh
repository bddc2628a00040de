#!/usr/bin/env bash
# Creates .venv with everything the tests and the cpu-smoke pipeline need, on a fresh
# CPU-only machine. Idempotent: a finished venv is left alone (stamp file).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAMP=.venv/.granikv-setup-$(sha1sum pyproject.toml | cut -c1-12)
if [[ -f "$STAMP" ]]; then exit 0; fi
[[ -d .venv ]] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build first: an unpinned torch would pull a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[harness,test]"
rm -f .venv/.granikv-setup-*
touch "$STAMP"
echo "environment ready: .venv"
