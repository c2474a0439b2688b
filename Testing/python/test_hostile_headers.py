"""Headers written to mislead: a spatial axis without a finite spacing, and sizes whose product
overflows 64-bit integers. Each is refused in one line with exit 2 and nothing written, never
read as a plausible volume."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_cli_quiet


def write_nrrd(path, spacings: str, shape=(8, 32, 32)) -> None:
    """A raw NRRD of a smooth ``shape`` (z, y, x) volume with the given ``spacings`` line."""
    z, y, x = shape
    data = (np.indices(shape).sum(axis=0) % 50).astype(np.int16)
    header = f"NRRD0004\ntype: short\ndimension: 3\nsizes: {x} {y} {z}\nspacings: {spacings}\nencoding: raw\nendian: little\n\n"
    path.write_bytes(header.encode() + data.tobytes())


def refused(args, out) -> str:
    """Run ``cardseg ARGS``; assert exit 2, one line, no output folder; return the line."""
    rc, err = run_cli_quiet(args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1, err
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize("spacings", ["4 4 nan", "nan 4 8", "4 inf 8"])
def test_a_spatial_axis_without_a_finite_spacing_is_refused(tmp_path, tiny_bundle, spacings):
    image, out = tmp_path / "bad.nrrd", tmp_path / "out"
    write_nrrd(image, spacings)
    line = refused(["segment", str(image), "-o", str(out), "--bundle", str(tiny_bundle)], out)
    assert "spacing" in line and "bad.nrrd" in line


@pytest.mark.parametrize("dims", ["2097152 2097152 4194304", "4294967296 4294967296 4294967296"])
def test_sizes_that_overflow_64_bits_are_refused(tmp_path, tiny_bundle, dims):
    image, out = tmp_path / "huge.mhd", tmp_path / "out"
    (tmp_path / "huge.raw").write_bytes(b"\0" * 64)
    image.write_text(
        "ObjectType = Image\nNDims = 3\nDimSize = "
        + dims
        + "\nElementSpacing = 1 1 1\nElementType = MET_SHORT\nElementDataFile = huge.raw\n"
    )
    line = refused(["segment", str(image), "-o", str(out), "--bundle", str(tiny_bundle)], out)
    assert "huge.mhd" in line


def write_sliced_mhd(folder, datafile: str, names, shape=(8, 32, 32)):
    """A ``.mhd`` whose slices lie in one raw file each (``names``), named by ``datafile``."""
    z, y, x = shape
    data = (np.indices(shape).sum(axis=0) % 50).astype(np.int16)
    for k, name in enumerate(names):
        (folder / name).write_bytes(data[k].tobytes())
    header = (
        f"ObjectType = Image\nNDims = 3\nDimSize = {x} {y} {z}\nElementSpacing = 1.5 1.5 8\n"
        f"ElementType = MET_SHORT\nElementDataFile = {datafile}\n"
    )
    if datafile.startswith("LIST"):
        header += "\n".join(names) + "\n"
    (folder / "sliced.mhd").write_text(header)
    return folder / "sliced.mhd"


NAMES = [f"s{k:02d}.raw" for k in range(8)]


@pytest.mark.parametrize("datafile", ["LIST 2D", "s%02d.raw 0 7 1"])
def test_a_listed_data_file_shorter_than_its_share_is_refused(tmp_path, tiny_bundle, datafile):
    image, out = write_sliced_mhd(tmp_path, datafile, NAMES), tmp_path / "out"
    short = tmp_path / NAMES[5]
    short.write_bytes(short.read_bytes()[:100])
    line = refused(["segment", str(image), "-o", str(out), "--bundle", str(tiny_bundle)], out)
    assert "s05.raw" in line and "truncated" in line


@pytest.mark.parametrize("datafile", ["LIST 2D", "s%02d.raw 0 7 1"])
def test_every_listed_data_file_is_part_of_the_resume_key(tmp_path, datafile):
    from cardseg.cohort.hashing import content_hash
    from cardseg.io.headers import metaimage_data_files

    image = write_sliced_mhd(tmp_path, datafile, NAMES)
    assert metaimage_data_files(image) == [tmp_path / n for n in NAMES]
    before = content_hash(image)
    raw = bytearray((tmp_path / NAMES[3]).read_bytes())
    raw[0] ^= 1
    (tmp_path / NAMES[3]).write_bytes(bytes(raw))
    assert content_hash(image) != before


def test_a_complete_listed_image_is_read(tmp_path, tiny_bundle):
    image, out = write_sliced_mhd(tmp_path, "LIST 2D", NAMES), tmp_path / "out"
    rc, err = run_cli_quiet(["segment", str(image), "-o", str(out), "--bundle", str(tiny_bundle), "--method", "uc"])
    assert rc == 0, err
    assert (out / "report.json").is_file()


def test_a_fifo_in_a_dicom_folder_is_named_in_the_refusal(tmp_path, synthetic_volume, tiny_bundle):
    import os

    from test_safety_cli import write_dicom_series

    vol, _ = synthetic_volume
    series, out = tmp_path / "series", tmp_path / "out"
    write_dicom_series(series, vol)
    os.mkfifo(series / "zz-pipe")
    line = refused(["segment", str(series), "-o", str(out), "--bundle", str(tiny_bundle)], out)
    assert "zz-pipe is a FIFO" in line and "IM0001" not in line


def test_a_sparse_data_file_far_larger_than_its_header_is_refused_unread(tmp_path, tiny_bundle):
    image, out = tmp_path / "small.mhd", tmp_path / "out"
    with open(tmp_path / "small.raw", "wb") as f:
        f.truncate(8 << 30)  # 8 GiB, sparse: no block written
    image.write_text(
        "ObjectType = Image\nNDims = 3\nDimSize = 32 32 8\nElementSpacing = 1.5 1.5 8\n"
        "ElementType = MET_SHORT\nElementDataFile = small.raw\n"
    )
    line = refused(["segment", str(image), "-o", str(out), "--bundle", str(tiny_bundle)], out)
    assert "small.raw" in line or "small.mhd" in line
    assert "far more" in line


def test_a_volume_with_almost_no_signal_is_refused(tmp_path, tiny_bundle):
    import SimpleITK as sitk

    a = np.zeros((8, 64, 64), np.float32)
    a[4, 30, 30] = 1000.0  # one bright voxel on a blank field
    img = sitk.GetImageFromArray(a)
    img.SetSpacing((1.5, 1.5, 8.0))
    image, out = tmp_path / "blank.nii.gz", tmp_path / "out"
    sitk.WriteImage(img, str(image))
    line = refused(["segment", str(image), "-o", str(out), "--bundle", str(tiny_bundle)], out)
    assert "almost no signal" in line and "1 of 32,768" in line


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_blank_slice_is_named_and_left_empty_and_the_others_unchanged(tiny_bundle, synthetic_volume, backend):
    from dataclasses import replace

    from cardseg.bundle.loading import load_bundle
    from cardseg.segment import SegmentOptions, segment_volume

    if backend == "onnx":
        pytest.importorskip("onnxruntime")
    vol, _ = synthetic_volume
    bundle = load_bundle(tiny_bundle, backend=backend)
    blanked = vol.array.copy()
    blanked[1] = float(blanked.min())  # a slice of one value, as a scanner pads a stack
    before = segment_volume(vol, bundle, SegmentOptions("card"))
    after = segment_volume(replace(vol, array=blanked), bundle, SegmentOptions("card"))
    assert before.report["blank_slices"] == [] and after.report["blank_slices"] == [1]
    assert not after.labels[1].any() and float(after.disagreement[1].max()) == 0.0
    assert np.allclose(after.probabilities[1, ..., 0], 1.0, atol=1e-6)
    others = [k for k in range(vol.shape[0]) if k != 1]
    assert np.array_equal(after.labels[others], before.labels[others])
