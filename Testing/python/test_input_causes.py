"""One-line refusals that name the real cause of a bad input (not only that it is bad)."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import SimpleITK as sitk


def cardseg(*args):
    p = subprocess.run(
        [sys.executable, "-m", "cardseg", *[str(a) for a in args]], capture_output=True, text=True, timeout=300
    )
    return p.returncode, p.stderr.strip()


def small_nifti(path, shape=(4, 64, 64)):
    img = sitk.GetImageFromArray(np.random.default_rng(0).random(shape).astype(np.float32))
    img.SetSpacing((1.5, 1.5, 8.0))
    sitk.WriteImage(img, str(path))
    return path


def sheared_nifti(path):
    """A NIfTI whose sform (the only transform it declares) has a shear: x leans into y."""
    raw = bytearray(gzip.open(small_nifti(path)).read())
    raw[252:256] = struct.pack("<hh", 0, 2)  # no qform; sform: aligned to another file
    raw[280:328] = struct.pack("<12f", 1.5, 0.5, 0, 0, 0, 1.5, 0, 0, 0, 0, 8.0, 0)
    path.write_bytes(gzip.compress(bytes(raw)))
    return path


def test_a_sheared_nifti_says_why_it_cannot_be_read(tmp_path):
    code, err = cardseg("segment", sheared_nifti(tmp_path / "shear.nii.gz"), "-o", tmp_path / "out")
    assert code == 2 and "\n" not in err
    # ITK refuses it ("only supports orthonormal direction cosines"); cardseg names the header's fault instead
    assert err.startswith(
        f"cardseg: error: {tmp_path / 'shear.nii.gz'}: NIfTI sform (srow_x/y/z) is skewed: its axes "
        "are 18.4 degrees from orthogonal"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file without read permission")
def test_a_file_without_read_permission_says_so(tmp_path):
    locked = small_nifti(tmp_path / "locked.nii.gz")
    locked.chmod(0)
    code, err = cardseg("segment", locked, "-o", tmp_path / "out")
    assert (code, err) == (2, f"cardseg: error: {locked}: cannot be read (permission denied)")


def test_a_wrong_spacing_given_on_the_command_line_is_named_as_given(tmp_path):
    scan = small_nifti(tmp_path / "scan.nii.gz")
    code, err = cardseg("segment", scan, "-o", tmp_path / "out", "--spacing", "0,0")
    assert (code, err) == (
        2,
        "cardseg: error: --spacing '0,0': axis i (x) 0 mm is outside the plausible range 0.05-10 mm for MRI",
    )
    code, err = cardseg("segment", scan, "-o", tmp_path / "out", "--spacing", "1.5,1.5,0")  # the header's z is fine
    assert code == 2 and "axis k (slice) 0 mm is outside" in err and "give the right one" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("spacing", ["0,1", "-1,1", "1,1,0", "nan,1", "1,inf", "11,1"])
def test_a_wrong_spacing_for_a_raster_image_is_one_line_before_itk_sees_it(tmp_path, spacing):
    """ITK throws on a zero or negative spacing: a PNG (which needs --spacing) got a traceback, exit 1;
    ``cardseg batch`` failed every case and wrote its tables (now refused before any work)."""
    from cardseg.base.errors import CardsegError
    from cardseg.io.inputs import read_image

    png = tmp_path / "slice.png"
    sitk.WriteImage(sitk.GetImageFromArray(np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)), str(png))
    for command in ("segment", "batch"):
        code, err = cardseg(command, png, "-o", tmp_path / command, f"--spacing={spacing}")
        assert code == 2 and err.startswith(f"cardseg: error: --spacing '{spacing}': axis ") and "\n" not in err, err
        assert not (tmp_path / command).exists()
    values = [float(v) for v in spacing.split(",")]
    with pytest.raises(CardsegError, match="outside the plausible range"):  # the Python API checks it too
        read_image(png, spacing=values)


def test_a_4d_image_without_a_frame_names_both_ways_to_choose_one(tmp_path):
    img = sitk.JoinSeries([sitk.ReadImage(str(small_nifti(tmp_path / f"f{i}.nii.gz"))) for i in range(3)])
    sitk.WriteImage(img, str(tmp_path / "cine.nii.gz"))
    code, err = cardseg("segment", tmp_path / "cine.nii.gz", "-o", tmp_path / "out")
    assert code == 2 and err.endswith(
        "4D image with 3 frames; choose one with --frame N or a batch manifest's frame column (0..2)"
    )


def test_a_symbolic_link_loop_is_named_as_such(tmp_path):
    (tmp_path / "a.nii.gz").symlink_to(tmp_path / "b.nii.gz")
    (tmp_path / "b.nii.gz").symlink_to(tmp_path / "a.nii.gz")
    for command in ("batch", "segment"):  # one wording for both
        code, err = cardseg(command, tmp_path / "a.nii.gz", "-o", tmp_path / "out")
        assert (code, err) == (
            2,
            f"cardseg: error: {tmp_path / 'a.nii.gz'}: cannot be read (Too many levels of symbolic links)",
        )
