#!/usr/bin/env bash
# Issue 25's GPU figures in one device call (not a test). On the GPU machine, from the repository root:
#
#   bash Testing/benchmarks/gpu_engine.sh OUT [CARRY]
#
# CARRY (default .gpucarry, git-ignored; built by gpu_carry.sh) holds what that machine lacks: the wheels of MONAI (only
# the first run imports it, to prepare the TorchScript programs), slicerio and pynrrd, and
# SimpleITK's unpacked wheel as sitk.tar.xz (the wheel itself is too large for the transfer).
# Every step is guarded by its own time limit, so one failure never costs the others; each
# writes its JSON into OUT (at most 8 files come back):
#   gpu_exec_tests.txt      the CUDA-graph tests of test_gpu_exec.py on the real GPU
#   overhead_gpu.json       card/uc trajectory against its floor, CUDA graphs (the engine's default
#                           on a GPU) and the graphed outputs against eager ones
#   overhead_gpu_eager.json the same with CARDSEG_CUDA_GRAPHS=0
#   batch_gpu.json          cardseg batch's per-case stages and marginal per-case wall, graphs
#   batch_gpu_eager.json    the same, eager
#   whole_run_gpu.json      fresh `cardseg segment --device cuda` processes: where the time goes,
#                           and whether MONAI is imported after the preparation run (a one-shot run
#                           is eager by default since its grid serves one volume)
#   whole_run_gpu_eager.json the same with CARDSEG_CUDA_GRAPHS=0 (only when PARTS names whole_eager;
#                           now the same path as whole_run_gpu.json)
#   whole_run_gpu_always.json the same with CARDSEG_CUDA_GRAPHS=always: a one-shot run captures its
#                           graph at once (by default it runs eagerly: its grid serves one volume)
# PARTS (a list of the step names below) picks steps: e.g. PARTS="batch batch_eager" for a rerun.
#   log.txt                 everything printed
# Rehearsal on a CPU machine (same steps, small counts, nothing installed):
#   DEVICE=cpu PY=.venv/bin/python SITE= CASES=3 ROUNDS=2 REPEATS=1 bash Testing/benchmarks/gpu_engine.sh /tmp/rehearsal
set -uo pipefail
OUT=${1:?usage: gpu_engine.sh OUT [CARRY]}
CARRY=${2:-.gpucarry}
PARTS=${PARTS:-tests overhead batch batch_eager whole whole_always}
DEVICE=${DEVICE:-cuda} PY=${PY:-python3} SITE=${SITE-/tmp/site} CASES=${CASES:-20} ROUNDS=${ROUNDS:-9} REPEATS=${REPEATS:-3}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
if [ -n "$SITE" ]; then
    mkdir -p "$SITE"
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$CARRY"/*.whl || exit 1
    $PY -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$CARRY/sitk.tar.xz" "$SITE" || exit 1
    export PYTHONPATH=$SITE:$PWD/CARDSegment
fi
export PYTHONUNBUFFERED=1 CARDSEG_CACHE_DIR=${CARDSEG_CACHE_DIR:-/tmp/cardseg-cache-$DEVICE}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
$PY -c "import os, torch, SimpleITK, cardseg; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(0), 'cardseg', cardseg.__version__, 'cpus', os.cpu_count())" || exit 1
B=Testing/benchmarks
step() { local limit=$1; shift; echo "=== $(date -u +%T) $*"; timeout "$limit" "$@" || echo "=== step failed or timed out ($?): $*"; }
want() { [[ " $PARTS " == *" $1 "* ]]; }
if want tests; then
    step 120 $PY -m pytest -q -p no:cacheprovider Testing/python/test_gpu_exec.py 2>&1 | tee "$OUT/gpu_exec_tests.txt"
fi
want overhead && step 150 $PY $B/overhead.py --device $DEVICE --rounds $ROUNDS --json "$OUT/overhead_gpu.json"
want overhead_eager && step 120 env CARDSEG_CUDA_GRAPHS=0 $PY $B/overhead.py --device $DEVICE --rounds $ROUNDS \
    --json "$OUT/overhead_gpu_eager.json"
want batch && step 150 $PY $B/batch_overlap.py --device $DEVICE --backend torch --cases $CASES --repeats 2 \
    --out "$OUT/batch_gpu.json"
want batch_eager && step 150 env CARDSEG_CUDA_GRAPHS=0 $PY $B/batch_overlap.py --device $DEVICE --backend torch \
    --cases $CASES --repeats 2 --out "$OUT/batch_gpu_eager.json"
want whole && step 200 $PY $B/whole_run.py --device $DEVICE --backend torch --repeats $REPEATS --cases 0 \
    --json "$OUT/whole_run_gpu.json"
want whole_eager && step 200 env CARDSEG_CUDA_GRAPHS=0 $PY $B/whole_run.py --device $DEVICE --backend torch \
    --repeats $REPEATS --cases 0 --json "$OUT/whole_run_gpu_eager.json"
want whole_always && step 200 env CARDSEG_CUDA_GRAPHS=always $PY $B/whole_run.py --device $DEVICE --backend torch \
    --repeats $REPEATS --cases 0 --json "$OUT/whole_run_gpu_always.json"
echo "=== $(date -u +%T) done"
