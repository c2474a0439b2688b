#!/usr/bin/env bash
# The README's test command: create .venv when there is none, install cardsegment with the test,
# cluster, speed and docs extras under the pinned constraints (CPU torch 2.13.0), build the
# documentation with warnings as errors, run the pytest suite and list what it skipped and why.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch comes pinned by constraints.txt (torch==2.13.0, a CPU build on the project's machines);
# on another machine set TORCH_INDEX to a PyTorch wheel index (docs/getting-started/install.md says which)
# to take torch's CPU build from there instead of PyPI's default CUDA build
if [ -n "${TORCH_INDEX:-}" ] && ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/python -m pip install --quiet -c constraints.txt torch --index-url "$TORCH_INDEX"
fi
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[test,cluster,speed,docs]"
# the documentation: a broken cross-reference, a missing page or a result file that no longer
# holds a number a page names fails here (-E: every page read again)
.venv/bin/python -m sphinx -E -W --keep-going -q -b html docs docs/build/html
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# the triage-page browser tests need a headless Chromium (Testing/install-browser.sh installs it;
# .ci/run does); without one they skip, and this says so before the run
browser=${CARDSEG_CHROMIUM:-}
for c in /usr/bin/chromium-headless-shell /usr/lib/chromium/chromium-headless-shell /usr/lib/chromium/headless_shell \
    /usr/bin/chromium; do
  if [ -z "$browser" ] && [ -x "$c" ]; then browser=$c; fi
done
if [ -z "$browser" ]; then
  echo "run-tests.sh: no headless Chromium: the triage-page browser tests will skip (bash Testing/install-browser.sh installs it)"
fi
# -rs: one line per skipped test (or group) with its reason at the end of the run
.venv/bin/python -m pytest -q -rs "$@"
