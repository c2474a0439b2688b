#!/usr/bin/env bash
# The README's test command: create .venv, install cardsegment with the test extra under the
# pinned constraints (CPU torch 2.13.0), run the pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[test,cluster,speed]"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
.venv/bin/python -m pytest -q "$@"
