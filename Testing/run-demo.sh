#!/usr/bin/env bash
# The README's main job in one command: make .venv when there is none (the runtime packages only:
# cardsegment with the [speed] extra under the pinned constraints), write the synthetic phantom
# demo.nii.gz and segment it into demo-out/. Run it again and it writes both afresh: it replaces
# only what it wrote itself: demo.nii.gz only while it holds the phantom's bytes, and demo-out/
# only while it holds nothing but an earlier cardseg run's results (cardseg's --overwrite rule).
# DEMO_DIR=FOLDER writes into another folder; TORCH_INDEX as for Testing/run-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/cardseg ]; then
  if [ ! -x .venv/bin/python ]; then
    echo "run-demo.sh: making .venv (first run: installs torch, MONAI and the engine)"
    "$PY" -m venv .venv
  fi
  if [ -n "${TORCH_INDEX:-}" ] && ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
    .venv/bin/python -m pip install --quiet -c constraints.txt torch --index-url "$TORCH_INDEX"
  fi
  .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[speed]"
fi
out=${DEMO_DIR:-.}
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# the phantom is the same bytes every time: an existing demo.nii.gz that differs from it is not
# this script's, and is left alone
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
.venv/bin/cardseg synth "$fresh/demo.nii.gz" >/dev/null
if [ -e "$out/demo.nii.gz" ] && ! cmp -s "$fresh/demo.nii.gz" "$out/demo.nii.gz"; then
  echo "run-demo.sh: error: $out/demo.nii.gz exists and is not the phantom this script writes; move it away" >&2
  exit 2
fi
.venv/bin/cardseg synth "$out/demo.nii.gz" --overwrite
.venv/bin/cardseg segment "$out/demo.nii.gz" -o "$out/demo-out" --overwrite "$@"
echo "run-demo.sh: the results are in $out/demo-out/ (report.json says what was found)"
