#!/usr/bin/env bash
# Lint and format check: ruff (configured in pyproject.toml) on the whole tree, at the version
# constraints.txt pins. Makes .venv when there is none, as Testing/run-tests.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet -c constraints.txt ruff
.venv/bin/ruff check .
.venv/bin/ruff format --check .
