"""Refusals name the real problem: float64 values beyond float32 are not called "NaN or infinite",
a device or FIFO given as an input or a data file is not called "missing", and no Python warning
line reaches stderr on the way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg.cli import main
from cardseg.io.volume import read_volume

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, array: np.ndarray) -> Path:
    img = sitk.GetImageFromArray(array)
    img.SetSpacing((1.5, 1.5, 8.0))
    sitk.WriteImage(img, str(path))
    return path


def _float64_volume(value: float) -> np.ndarray:
    a = np.random.default_rng(0).random((3, 24, 24)) * 100.0
    a[1, 5, 7] = value
    return a


@pytest.mark.filterwarnings("error")  # a RuntimeWarning (overflow in a cast) fails the test
@pytest.mark.parametrize("suffix", [".nii.gz", ".nrrd", ".mha"])
@pytest.mark.parametrize("value", [1e39, -1e39, 3.5e38, 1e300, -np.finfo(np.float64).max])
def test_float64_beyond_float32_is_named_as_such(tmp_path, capsys, suffix, value):
    src = _write(tmp_path / f"big{suffix}", _float64_volume(value))
    assert main(["segment", str(src), "-o", str(tmp_path / "out"), "--progress", "none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "beyond the float32 range" in err and "NaN" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("value", [3.4e38, -3.4e38, 1e38, float(np.finfo(np.float32).max)])
def test_float64_within_float32_is_read(tmp_path, value):
    vol = read_volume(_write(tmp_path / "ok.nii.gz", _float64_volume(value)))
    assert vol.array.dtype == np.float32 and np.isfinite(vol.array).all()
    assert vol.array[1, 5, 7] == pytest.approx(value, rel=1e-6)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nan_and_infinite_are_still_called_so(tmp_path, capsys, value):
    src = _write(tmp_path / "bad.nii.gz", _float64_volume(value))
    assert main(["segment", str(src), "-o", str(tmp_path / "out"), "--progress", "none"]) == 2
    assert "NaN or infinite" in capsys.readouterr().err


def _headers(tmp_path: Path, target: str) -> dict:
    """Image headers whose data file is ``target`` (a name in ``tmp_path`` or an absolute path)."""
    nhdr = tmp_path / "a.nhdr"
    nhdr.write_text(
        "NRRD0004\ntype: float\ndimension: 3\nsizes: 24 24 3\nspacings: 1.5 1.5 8\nencoding: raw\n"
        f"endian: little\ndata file: {target}\n"
    )
    mhd = tmp_path / "b.mhd"
    mhd.write_text(
        "ObjectType = Image\nNDims = 3\nDimSize = 24 24 3\nElementSpacing = 1.5 1.5 8\n"
        f"ElementType = MET_FLOAT\nElementDataFile = {target}\n"
    )
    return {"nrrd": nhdr, "mhd": mhd}


def _special(tmp_path: Path, kind: str) -> str:
    if kind == "FIFO":
        os.mkfifo(tmp_path / "data.raw")
        return "data.raw"
    if kind == "folder":
        (tmp_path / "data.raw").mkdir()
        return "data.raw"
    if kind == "character device":
        return "/dev/zero"
    return "data.raw"  # missing


def _run(args, cwd) -> subprocess.CompletedProcess:
    """The CLI in a child process, bounded in time (an input that blocks must not hang the suite)."""
    env = dict(os.environ, PYTHONWARNINGS="error::RuntimeWarning")
    return subprocess.run(
        [sys.executable, "-m", "cardseg"] + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


CASES = [
    (fmt, kind)
    for fmt in ("nrrd", "mhd", "analyze")
    for kind in ("FIFO", "character device", "folder", "missing")
    if (fmt, kind) != ("analyze", "character device")
]  # a pair's .img lies beside its .hdr


@pytest.mark.parametrize("fmt,kind", CASES)
def test_data_file_that_is_not_a_regular_file_is_named_by_its_kind(tmp_path, kind, fmt):
    target = _special(tmp_path, kind)
    if fmt == "analyze":
        _write(tmp_path / "p.hdr", np.zeros((3, 24, 24), np.float32) + np.arange(24, dtype=np.float32))
        os.unlink(tmp_path / "p.img")
        _special_at = tmp_path / "p.img"
        if kind == "FIFO":
            os.mkfifo(_special_at)
        elif kind == "folder":
            _special_at.mkdir()
        src = tmp_path / "p.hdr"
    else:
        src = _headers(tmp_path, target)[fmt]
    r = _run(["segment", str(src), "-o", str(tmp_path / "out"), "--progress", "none"], tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cardseg: error: "), r.stderr
    if kind == "missing":
        assert lines[0].endswith("is missing"), lines[0]
    else:
        assert f"is a {kind}, not a regular file" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["FIFO", "character device"])
def test_input_that_is_a_fifo_or_device_is_refused_at_once(tmp_path, kind):
    if kind == "FIFO":
        src = tmp_path / "in.nii.gz"
        os.mkfifo(src)
    else:
        src = Path("/dev/zero")
    r = _run(["segment", str(src), "-o", str(tmp_path / "out"), "--progress", "none"], tmp_path)
    assert r.returncode == 2 and f"is a {kind}" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_result_cut_short_while_replaced_is_named_so(tmp_path, capsys, tiny_bundle, synthetic_volume):
    """A folder whose stamp is still the interim one of an interrupted replacement (the new
    files listed under ``replacing``) is not called an ordinary earlier result."""
    import json

    from cardseg.io.outdir import STAMP

    vol, _ = synthetic_volume
    src = tmp_path / "in.nii.gz"
    sitk.WriteImage(vol.to_image(), str(src))
    out = tmp_path / "out"
    argv = [
        "segment",
        str(src),
        "-o",
        str(out),
        "--bundle",
        str(tiny_bundle),
        "--backend",
        "torch",
        "--progress",
        "none",
        "--quiet",
    ]
    assert main(argv) == 0
    stamp = json.loads((out / STAMP).read_text(encoding="utf-8"))
    names = sorted(stamp["files"])
    interim = {
        "tool": "cardseg",
        "version": stamp.get("version", ""),
        "files": {},
        "replacing": {n: [stamp["files"][n]] for n in names},
    }
    (out / STAMP).write_text(json.dumps(interim), encoding="utf-8")
    before = {n: (out / n).read_bytes() for n in names}
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and "--overwrite" in err, err
    assert {n: (out / n).read_bytes() for n in names} == before
    assert main(argv + ["--overwrite"]) == 0
    assert "replacing" not in json.loads((out / STAMP).read_text(encoding="utf-8"))


def test_a_folder_of_image_files_is_pointed_to_batch(tmp_path, capsys, phantom_file):
    """``cardseg segment FOLDER`` reads a DICOM series; a folder of NIfTI files gets one line naming
    one of them and the two commands that take them, and nothing is written."""
    import shutil

    folder = tmp_path / "cohort"
    folder.mkdir()
    for name in ("a.nii.gz", "b.nii.gz"):
        shutil.copy(phantom_file, folder / name)
    assert main(["segment", str(folder), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no DICOM series but 2 image files (e.g. a.nii.gz)" in err[0]
    assert f"cardseg batch {folder} -o OUTDIR" in err[0] and not (tmp_path / "out").exists()
    (folder / "a.nii.gz").unlink()
    (folder / "b.nii.gz").unlink()
    (folder / "notes.txt").write_text("x")
    assert main(["segment", str(folder), "-o", str(tmp_path / "out")]) == 2
    assert "batch" not in capsys.readouterr().err
