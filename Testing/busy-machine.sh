#!/usr/bin/env bash
# Runs a command (the README's test command, in .ci/run) on a machine its user keeps busy: a
# background loop on every core at the lowest priority, and the user's own `cardseg segment`
# runs, one after another, adding to the default model cache (~/.cache/cardseg or
# $XDG_CACHE_HOME/cardseg) while the command runs. The command's exit status is returned.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
pids=()
work=$(mktemp -d)
cleanup() {
  for p in "${pids[@]}"; do
    pkill -P "$p" 2>/dev/null || true  # a user run in flight, or its pause
    kill "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq "$(nproc)"); do
  nice -n 19 bash -c 'while :; do :; done' &
  pids+=($!)
done
(
  # the user's runs, beside the tests: they start once the command has installed .venv
  until [ -x "$root/.venv/bin/cardseg" ] && "$root/.venv/bin/python" -c "import cardseg" 2>/dev/null; do sleep 10; done
  cd "$work"
  unset CARDSEG_CACHE_DIR
  "$root/.venv/bin/cardseg" synth user.nii.gz >/dev/null
  for i in 1 2 3; do
    nice -n 5 "$root/.venv/bin/cardseg" segment user.nii.gz -o "out$i" --progress none >/dev/null 2>&1 || true
    sleep 60
  done
) &
pids+=($!)
"$@"
