"""A NIfTI that cardseg compressed itself is proven whole by reading its bytes back against what was
written (cardseg.io.written.GzipWritten), without decompressing it again."""

from __future__ import annotations

import gzip
import zlib

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg.io import written


def _image() -> sitk.Image:
    rng = np.random.default_rng(2)
    return sitk.GetImageFromArray(rng.random((6, 90, 70, 4)).astype(np.float32), isVector=True)


def test_what_the_compressor_reports_is_the_file_it_wrote(tmp_path):
    img = _image()
    sitk.WriteImage(img, str(tmp_path / "x.nii"), useCompression=False)
    raw = (tmp_path / "x.nii").read_bytes()
    w = written._gzip_file(tmp_path / "x.nii", tmp_path / "x.nii.gz")
    data = (tmp_path / "x.nii.gz").read_bytes()
    assert (w.size, w.crc) == (len(data), zlib.crc32(data))
    assert w.raw_size == len(raw) and w.head == raw[: written.HEADER_BYTES]
    assert gzip.decompress(data) == raw


def test_the_read_back_refuses_any_change_to_the_bytes_written(tmp_path):
    img, path = _image(), tmp_path / "x.nii.gz"
    raw = tmp_path / "x.raw.nii"
    sitk.WriteImage(img, str(raw), useCompression=False)
    w = written._gzip_file(raw, path)
    written.verify_image(img, path, w)
    data = path.read_bytes()
    changed = [data[:-1], data[: len(data) // 2], data + b"\0", data[:100] + bytes([data[100] ^ 1]) + data[101:]]
    for bad in changed:
        path.write_bytes(bad)
        with pytest.raises(written.IncompleteWrite):
            written.verify_image(img, path, w)
    path.write_bytes(data)
    with pytest.raises(written.IncompleteWrite):  # the right bytes, but not the image asked for
        written.verify_image(img[:, :, :2], path, w)


def test_write_image_writes_the_same_bytes_and_they_read_back_as_the_image(tmp_path):
    img = _image()
    written.write_image(img, tmp_path / "a.nii.gz")
    sitk.WriteImage(img, str(tmp_path / "b.nii"), useCompression=False)
    written._gzip_file(tmp_path / "b.nii", tmp_path / "b.nii.gz")
    assert (tmp_path / "a.nii.gz").read_bytes() == (tmp_path / "b.nii.gz").read_bytes()
    back = sitk.GetArrayFromImage(sitk.ReadImage(str(tmp_path / "a.nii.gz")))
    assert np.array_equal(back, sitk.GetArrayFromImage(img))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.nii.gz", "b.nii", "b.nii.gz"]
