"""Property: a truncated or corrupted file of any accepted format is refused by the real CLI
with one line and exit code 2, before any work, writing nothing and touching nothing."""

from __future__ import annotations

import os
import subprocess
import sys

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
@given(
    fmt=st.sampled_from(FORMATS),
    kind=st.sampled_from(["truncate", "flip"]),
    where=st.floats(0.0, 1.0, exclude_max=True),
    xor=st.integers(1, 255),
)
def test_corrupt_files_are_refused_in_one_line(originals, tiny_bundle, tmp_path_factory, fmt, kind, where, xor):
    data = originals[fmt]
    if kind == "flip" and fmt not in COMPRESSED:
        kind = "truncate"  # a changed raw voxel is just another image: only checksums can tell
    if kind == "truncate":
        bad = data[: int(where * len(data))]
    else:
        start = _payload_start(fmt, data)
        i = start + int(where * (len(data) - start))
        bad = data[:i] + bytes([data[i] ^ xor]) + data[i + 1 :]
    work = tmp_path_factory.mktemp("case")
    path = work / f"bad.{fmt.split('-')[0]}"
    path.write_bytes(bad)
    args = [
        sys.executable,
        "-m",
        "cardseg",
        "segment",
        str(path),
        "-o",
        str(work / "out"),
        "--bundle",
        str(tiny_bundle),
    ]
    if fmt == "png":
        args += ["--spacing", "1.5,1.5"]
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (fmt, kind, len(bad), proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("cardseg: error:"), (fmt, kind, proc.stderr)
    assert sorted(p.name for p in work.iterdir()) == [path.name]  # nothing written beside it
    assert path.read_bytes() == bad  # the input untouched


def test_detached_and_unusual_headers_are_read_or_refused_in_one_line(tmp_path, synthetic_volume):
    from cardseg.base.errors import CardsegError
    from cardseg.io.volume import read_volume

    vol, _ = synthetic_volume
    img = vol.to_image()
    # a NIfTI pair, named by either half
    sitk.WriteImage(img, str(tmp_path / "pair.hdr"))
    for name in ("pair.hdr", "pair.img"):
        assert read_volume(tmp_path / name).shape == vol.shape
    # a detached NRRD whose data file name holds a space
    (tmp_path / "my scan.raw").write_bytes(np.ascontiguousarray(vol.array, dtype="<f4").tobytes())
    z, y, x = vol.shape
    (tmp_path / "d.nhdr").write_text(
        f"NRRD0004\ntype: float\ndimension: 3\nsizes: {x} {y} {z}\nspacings: 1.5 1.5 8\nendian: little\n"
        "encoding: raw\ndata file: my scan.raw\n",
        encoding="ascii",
    )
    assert np.array_equal(read_volume(tmp_path / "d.nhdr").array, vol.array)
    # MetaImage with HeaderSize = -1: the data are the file's last bytes
    (tmp_path / "m.raw").write_bytes(b"junk header bytes" + np.ascontiguousarray(vol.array, "<f4").tobytes())
    (tmp_path / "m.mhd").write_text(
        f"ObjectType = Image\nNDims = 3\nDimSize = {x} {y} {z}\nElementSpacing = 1.5 1.5 8\n"
        "ElementType = MET_FLOAT\nHeaderSize = -1\nElementDataFile = m.raw\n",
        encoding="ascii",
    )
    assert np.array_equal(read_volume(tmp_path / "m.mhd").array, vol.array)
    # junk in a header field: one line, not a traceback
    (tmp_path / "bad.mhd").write_text(
        f"ObjectType = Image\nNDims = 3\nDimSize = {x} {y} {z}\nElementSpacing = 1.5 1.5 8 ;\n"
        "ElementType = MET_FLOAT\nElementDataFile = m.raw\n",
        encoding="ascii",
    )
    with pytest.raises(CardsegError, match="bad.mhd"):
        read_volume(tmp_path / "bad.mhd")
