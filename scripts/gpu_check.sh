#!/usr/bin/env bash
# GPU check: run on a machine with CUDA from the repository root. Prints a pass/fail table.
#   bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
timeout 300 "$PY" scripts/gpu_check.py "$@"
