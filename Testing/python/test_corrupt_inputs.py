"""Property: a truncated or corrupted file of any accepted format is refused by the real CLI
with one line and exit code 2, before any work, writing nothing and touching nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: name → (writer options, where the compressed payload starts: a function of the bytes, or None)
FORMATS = ["nii.gz", "nii", "nrrd-gz", "nrrd-raw", "mha-z", "mha-raw", "png", "dcm"]
COMPRESSED = {"nii.gz", "nrrd-gz", "mha-z"}


def _payload_start(fmt: str, data: bytes) -> int:
    """First byte of the compressed stream (flips after it must break a checksum)."""
    if fmt == "nii.gz":
        return 10  # after the gzip member header
    if fmt == "nrrd-gz":
        return data.index(b"\n\n") + 2 + 10
    if fmt == "mha-z":
        return data.index(b"ElementDataFile = LOCAL\n") + len(b"ElementDataFile = LOCAL\n") + 2
    raise AssertionError(fmt)


@pytest.fixture(scope="module")
def originals(tmp_path_factory, synthetic_volume):
    vol, _ = synthetic_volume
    root = tmp_path_factory.mktemp("originals")
    files = {}
    img = vol.to_image()
    for fmt in FORMATS:
        ext = fmt.split("-")[0]
        path = root / f"scan.{ext}"
        if fmt == "png":
            a = vol.array[0]
            sitk.WriteImage(sitk.GetImageFromArray((255 * (a - a.min()) / np.ptp(a)).astype(np.uint8)), str(path))
        elif fmt == "dcm":
            sitk.WriteImage(sitk.Cast(img[:, :, 1], sitk.sitkInt16), str(path))
        else:
            sitk.WriteImage(img, str(path), useCompression=fmt in COMPRESSED)
        files[fmt] = path.read_bytes()
    return files


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(FORMATS), kind=st.sampled_from(["truncate", "flip"]),
       where=st.floats(0.0, 1.0, exclude_max=True), xor=st.integers(1, 255))
def test_corrupt_files_are_refused_in_one_line(originals, tiny_bundle, tmp_path_factory, fmt, kind, where, xor):
    data = originals[fmt]
    if kind == "flip" and fmt not in COMPRESSED:
        kind = "truncate"  # a changed raw voxel is just another image: only checksums can tell
    if kind == "truncate":
        bad = data[:int(where * len(data))]
    else:
        start = _payload_start(fmt, data)
        i = start + int(where * (len(data) - start))
        bad = data[:i] + bytes([data[i] ^ xor]) + data[i + 1:]
    work = tmp_path_factory.mktemp("case")
    path = work / f"bad.{fmt.split('-')[0]}"
    path.write_bytes(bad)
    args = [sys.executable, "-m", "cardseg", "segment", str(path), "-o", str(work / "out"), "--bundle", str(tiny_bundle)]
    if fmt == "png":
        args += ["--spacing", "1.5,1.5"]
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (fmt, kind, len(bad), proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("cardseg: error:"), (fmt, kind, proc.stderr)
    assert sorted(p.name for p in work.iterdir()) == [path.name]  # nothing written beside it
    assert path.read_bytes() == bad  # the input untouched
