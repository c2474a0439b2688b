#!/usr/bin/env bash
# Proves that the engine alone (`pip install .`, no extras) runs the README's main job: a fresh
# virtual environment .venv-engine, a non-editable install under the pinned constraints, then
# `cardseg synth` + `cardseg segment` with the shipped default bundle in a scratch folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
root=$(pwd)
if [ ! -x .venv-engine/bin/python ]; then
  "$PY" -m venv .venv-engine
fi
.venv-engine/bin/python -m pip install --quiet -c constraints.txt "$root"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
"$root/.venv-engine/bin/cardseg" synth demo.nii.gz
"$root/.venv-engine/bin/cardseg" segment demo.nii.gz -o demo-out --progress none
for f in segmentation.nii.gz segmentation.seg.nrrd probabilities.nii.gz disagreement.nii.gz temperature.nii.gz report.json; do
  test -s "demo-out/$f" || { echo "engine-only main job: $f missing" >&2; exit 1; }
done
"$root/.venv-engine/bin/python" - <<'PY'
import json
r = json.load(open("demo-out/report.json", encoding="utf-8"))
vols = r["class_volumes_ml"]
print("engine-only main job:", {k: round(v, 1) for k, v in vols.items()}, "agreement", round(r["agreement"], 3))
assert all(v > 0 for v in vols.values()), "the default model should find RV, MYO and LV in the phantom"
PY
