#!/usr/bin/env bash
# The Slicer module's MRML tests (Testing/python/test_slicer_*.py) under every slicer-core release
# line on PyPI for this Python, so that the oldest supported one keeps working, not only the newest.
#
# One virtual environment per release line, .venv-slicer-<line>/ (kept and reused: a second run
# only re-checks the installation), with the project installed under constraints.txt except for
# slicer-core and vtk: each line gets its newest slicer-core build and the vtk that build pins.
#
#   Testing/run-slicer-compat.sh [pytest arguments]
#   SLICER_CORE_LINES="5.11 5.13" Testing/run-slicer-compat.sh     # choose the lines
#   SLICER_CORE_LINES="5.11.0.2" Testing/run-slicer-compat.sh      # or exact releases
#   Testing/run-slicer-compat.sh -m "not slow"                     # without the module's self-test
#
# Default lines: those `pip index versions slicer-core` lists (5.11 and later; slicer-core needs
# Python >= 3.10), else 5.11 5.12 5.13. Exit status: 0 when every line passed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "run-slicer-compat: slicer-core needs Python 3.10 or later ($PY is older); nothing to do" >&2
  exit 0
fi

discover_lines() {
  "$PY" -m pip index versions slicer-core 2>/dev/null \
    | sed -n 's/^Available versions: //p' | tr ',' '\n' | tr -d ' ' \
    | awk -F. 'NF >= 2 && ($1 > 5 || ($1 == 5 && $2 >= 11)) {print $1 "." $2}' | sort -t. -k1,1n -k2,2n -u
}
LINES=${SLICER_CORE_LINES:-$(discover_lines | tr '\n' ' ')}
LINES=${LINES:-"5.11 5.12 5.13"}

# constraints.txt without the slicer-core and vtk pins (each release line brings its own)
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
grep -v -i -E '^(slicer-core|vtk)[[:space:]]*[=<>!~]' constraints.txt > "$CONSTRAINTS"

declare -a SUMMARY
STATUS=0
for LINE in $LINES; do
  VENV=".venv-slicer-$LINE"
  START=$(date +%s)
  echo "=== slicer-core $LINE ($VENV)"
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  SPEC="slicer-core==$LINE.*"
  case "$LINE" in *.*.*) SPEC="slicer-core==$LINE" ;; esac
  if ! "$VENV/bin/python" -m pip install --quiet -c "$CONSTRAINTS" -e . pytest "$SPEC"; then
    SUMMARY+=("slicer-core $LINE: could not be installed")
    STATUS=1
    continue
  fi
  VERSION=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("slicer-core"), "vtk", version("vtk"))')
  if "$VENV/bin/python" -m pytest -q -p no:cacheprovider Testing/python/test_slicer_*.py "$@"; then
    RESULT=passed
  else
    RESULT=FAILED
    STATUS=1
  fi
  SUMMARY+=("slicer-core $VERSION: $RESULT ($(( $(date +%s) - START )) s)")
done

echo "=== summary"
printf '%s\n' "${SUMMARY[@]}"
exit $STATUS
