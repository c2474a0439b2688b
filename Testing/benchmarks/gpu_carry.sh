#!/usr/bin/env bash
# Build the folder that gpu_engine.sh carries to the GPU machine (not a test):
#
#   bash Testing/benchmarks/gpu_carry.sh [.gpucarry]
#
# The GPU machine has torch but not MONAI, SimpleITK, slicerio or pynrrd, and cannot download
# them. Their wheels (Python 3.12, manylinux x86-64) are fetched here; SimpleITK's wheel (52 MB)
# does not fit the 64 MiB transfer beside the repository, so it travels unpacked as an xz archive
# (28 MB). The folder is git-ignored (.git/info/exclude); pass it to the device tool's `carry`.
set -euo pipefail
DEST=${1:-.gpucarry}
PY=${PY:-python3}
mkdir -p "$DEST"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$work" "SimpleITK==2.5.3" "slicerio==1.4.0" "pynrrd==1.1.3" "monai==1.6.1"
mv "$work"/slicerio-*.whl "$work"/pynrrd-*.whl "$work"/monai-*.whl "$DEST"/
mkdir "$work/sitk"
$PY -m zipfile -e "$work"/simpleitk-*.whl "$work/sitk"
tar -C "$work/sitk" -cf - . | xz -9 -T2 > "$work/sitk.tar.xz"
mv "$work/sitk.tar.xz" "$DEST/sitk.tar.xz"
du -sh "$DEST"
