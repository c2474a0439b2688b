"""A short-axis cine exported as one DICOM series per slice location: the study folder is assembled
into the real stack (series sorted along the slice normal, the geometry the headers define), and a
study whose series disagree (a missing slice, another phase count, orientation or in-plane grid, two
series at one position) is refused in one line naming them, exit 2, nothing written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from conftest import files_of, refused

from cardseg.base.errors import CardsegError
from cardseg.io.dicom_study import (
    assemble_series,
    is_study_folder,
    read_study_frame,
    study_stack_info,
)
from cardseg.io.volume import read_volume

PHASES, SLICES, ROWS, COLS = 4, 6, 32, 30
SPACING = (1.25, 1.5, 8.0)  # x (column step), y (row step), slice
ORIGIN = (-31.5, 20.25, 44.0)
DIRECTION = tuple(np.asarray(sitk.VersorTransform((0.4, -0.6, 0.7), 0.9).GetMatrix()).tolist())
STUDY_UID = "1.2.826.0.1.3680043.2.1125.77.1"
FRAME_UID = "1.2.826.0.1.3680043.2.1125.77.2"
#: the order the series are written in (and named by): not their slice order
SHUFFLE = (3, 0, 5, 1, 4, 2)


def cine() -> np.ndarray:
    """(P, Z, Y, X) int16: a blob that moves with the phase, every (phase, slice) plane distinct."""
    rng = np.random.default_rng(11)
    pp, zz, yy, xx = np.mgrid[0:PHASES, 0:SLICES, 0:ROWS, 0:COLS]
    blob = 900.0 * np.exp(-((yy - 14 - pp) ** 2 + (xx - 15 + zz) ** 2) / 40.0)
    return (blob + 100 * pp + 9 * zz + rng.normal(0, 15, blob.shape)).astype(np.int16)


def stack_image(a3: np.ndarray, spacing=SPACING, direction=DIRECTION) -> sitk.Image:
    img = sitk.GetImageFromArray(a3)
    img.SetSpacing(spacing)
    img.SetOrigin(ORIGIN)
    img.SetDirection(direction)
    return img


@dataclass(frozen=True)
class Place:
    """Where a file's plane lies: position (LPS mm), direction (9 numbers), spacing (x, y, slice)."""

    position: tuple
    direction: tuple = DIRECTION
    spacing: tuple = SPACING
    frame_uid: str = FRAME_UID


def write_slice(path: Path, plane: np.ndarray, place: Place, series: str, number: int, phase: int):
    """One MR file: ``plane`` (Y, X) of series ``series`` (SeriesNumber ``number``), phase ``phase``."""
    img = sitk.GetImageFromArray(plane)
    spacing = place.spacing
    img.SetSpacing(spacing[:2])
    d = np.asarray(place.direction).reshape(3, 3)
    position = place.position
    tags = {
        "0008|0060": "MR",
        "0020|000d": STUDY_UID,
        "0020|0052": place.frame_uid,
        "0020|000e": series,
        "0020|0011": str(number),
        "0020|0013": str(phase + 1),
        "0020|0032": "\\".join(f"{v:.6f}" for v in position),
        "0020|0037": "\\".join(f"{v:.7f}" for v in [*d[:, 0], *d[:, 1]]),
        "0018|0050": f"{spacing[2]:g}",
        "0018|1060": f"{35.0 * phase + 0.5 * number:g}",
    }
    for key, value in tags.items():
        img.SetMetaData(key, value)
    writer = sitk.ImageFileWriter()
    writer.KeepOriginalImageUIDOn()
    writer.SetFileName(str(path))
    writer.Execute(img)


def write_study(root: Path, data: np.ndarray, flat=False, skip_slice=None, phases=None, direction=None, grid=None):
    """``data`` (P, Z, Y, X) as one series per slice location, written in :data:`SHUFFLE` order, each in
    its own sub-folder ``loc_<n>`` (or, ``flat``, side by side in ``root``). Faults of one series (by its
    slice index): ``phases`` {slice: phase count}, ``direction`` {slice: direction}, ``grid`` {slice:
    (spacing)}; ``skip_slice`` leaves a slice location out. Returns {slice index: series label}."""
    root.mkdir(parents=True, exist_ok=True)
    geometry = stack_image(data[0])
    labels = {}
    for n, k in enumerate(SHUFFLE):
        if k == skip_slice:
            continue
        folder = root if flat else root / f"loc_{n + 1:02d}"
        folder.mkdir(exist_ok=True)
        uid = f"1.2.826.0.1.3680043.2.1125.77.3.{n + 1}"
        labels[k] = f"series {n + 1}" if flat else folder.name
        position = geometry.TransformIndexToPhysicalPoint((0, 0, k))
        d = (direction or {}).get(k, DIRECTION)
        spacing = (grid or {}).get(k, SPACING)
        for ph in range((phases or {}).get(k, PHASES)):
            name = f"s{n + 1}_{ph + 1:02d}.dcm" if flat else f"IM{PHASES - ph:04d}.dcm"  # names not in phase order
            write_slice(folder / name, data[ph, k], Place(position, d, spacing), uid, n + 1, ph)
    return labels


@pytest.fixture(scope="module")
def data():
    return cine()


@pytest.mark.parametrize("flat", [False, True], ids=["sub-folders", "one-folder"])
def test_a_study_is_stacked_along_the_slice_normal_with_its_geometry(tmp_path, data, flat):
    labels = write_study(tmp_path / "study", data, flat=flat)
    assert is_study_folder(tmp_path / "study")
    info = study_stack_info(tmp_path / "study")
    assert [s.label for s in info.series] == [labels[k] for k in range(SLICES)]
    assert info.phases == PHASES and info.slice_spacing_mm == pytest.approx(SPACING[2], abs=1e-4)
    assert np.allclose(info.trigger_times_ms, [35.0 * p + 0.5 * np.mean(range(1, 7)) for p in range(PHASES)])
    assert any("2.5 ms" in note for note in info.notes), info.notes  # series numbers 1..6 shift them by 0.5 ms
    expected = stack_image(data[2])
    img = read_study_frame(tmp_path / "study", 2)
    assert np.array_equal(sitk.GetArrayFromImage(img), data[2])
    assert np.allclose(img.GetOrigin(), ORIGIN, atol=1e-4)
    assert np.allclose(img.GetSpacing(), SPACING, atol=1e-5)
    assert np.allclose(img.GetDirection(), DIRECTION, atol=1e-6)
    corner = (COLS - 1, ROWS - 1, SLICES - 1)
    assert np.allclose(
        img.TransformIndexToPhysicalPoint(corner), expected.TransformIndexToPhysicalPoint(corner), atol=1e-3
    )


def test_explicit_file_lists_in_any_order_give_the_same_frame(tmp_path, data):
    write_study(tmp_path / "study", data)
    lists = [sorted((tmp_path / "study" / f"loc_{n:02d}").iterdir(), reverse=True) for n in (5, 2, 6, 1, 3, 4)]
    img = assemble_series(lists, 1)
    assert np.array_equal(sitk.GetArrayFromImage(img), data[1])
    assert np.allclose(img.GetOrigin(), ORIGIN, atol=1e-4)
    # the series are named from their headers (SeriesNumber), as the files come from a database
    with pytest.raises(CardsegError, match=r": series 6 differs in its phase count"):
        assemble_series([*lists[:2], lists[2][:3], *lists[3:]], 1)


def _fault_cases():
    other = tuple(np.asarray(sitk.VersorTransform((0.4, -0.6, 0.7), 0.95).GetMatrix()).tolist())
    d, o = np.reshape(DIRECTION, (3, 3)), np.reshape(other, (3, 3))
    off = max(np.degrees(np.arccos(np.clip(d[:, i] @ o[:, i], -1, 1))) for i in (0, 1))  # row and column directions
    return {
        "missing slice": (dict(skip_slice=3), ["a slice location is missing between {2} and {4}", "16 mm", "8 mm"]),
        "phase count": (dict(phases={4: 3}), ["{4}", "phase count", "3 phases", "4 phases"]),
        "orientation": (dict(direction={1: other}), ["{1}", f"orientation, by {off:.3g} degrees (tolerance 0.1)"]),
        "in-plane grid": (dict(grid={5: (1.0, 1.5, 8.0)}), ["{5}", "in-plane grid", "30x32 pixels of 1x1.5 mm"]),
    }


@pytest.mark.parametrize("fault", list(_fault_cases()))
def test_a_study_whose_series_disagree_is_refused_naming_them(tmp_path, data, fault, capsys, tiny_bundle):
    kwargs, words = _fault_cases()[fault]
    labels = write_study(tmp_path / "study", data, **kwargs)
    before = files_of(tmp_path)
    out = tmp_path / "out"
    argv = ["segment", str(tmp_path / "study"), "--frame", "1", "-o", str(out), "--bundle", str(tiny_bundle)]
    line = refused(capsys, argv, *[w.format(*[labels.get(k, "?") for k in range(SLICES)]) for w in words])
    assert str(tmp_path / "study") in line
    assert not out.exists() and files_of(tmp_path) == before


def test_two_series_at_one_slice_position_are_refused(tmp_path, data):
    write_study(tmp_path / "study", data)
    copy = tmp_path / "study" / "loc_07"  # slice 0 once more, as a repeated acquisition would be
    copy.mkdir()
    position = stack_image(data[0]).TransformIndexToPhysicalPoint((0, 0, 0))
    for ph in range(PHASES):
        write_slice(copy / f"IM{ph + 1:04d}.dcm", data[ph, 0], Place(position), "1.2.3.4.7", 7, ph)
    with pytest.raises(CardsegError, match=r"loc_02 and loc_07 lie at one slice position"):
        study_stack_info(tmp_path / "study")


def test_a_cine_study_without_a_frame_is_refused_as_a_cine_series_is(tmp_path, data, capsys, tiny_bundle):
    write_study(tmp_path / "study", data)
    argv = ["segment", str(tmp_path / "study"), "-o", str(tmp_path / "out"), "--bundle", str(tiny_bundle)]
    refused(capsys, argv, "cine study of 6 series", "4 phases", "--frame", "0..3")
    refused(capsys, [*argv, "--frame", "4"], "--frame 4 is out of range (0..3)")
    assert not (tmp_path / "out").exists()


def test_segmenting_a_study_frame_equals_segmenting_the_same_4d_file(tmp_path, data, tiny_bundle):
    from cardseg.cli import main

    write_study(tmp_path / "study", data)
    img4 = sitk.JoinSeries([stack_image(data[p]) for p in range(PHASES)])  # x, y, z, phase
    assert img4.GetDimension() == 4 and np.allclose(img4.GetOrigin()[:3], ORIGIN)
    sitk.WriteImage(img4, str(tmp_path / "cine.nii.gz"))
    assert np.array_equal(
        read_volume(tmp_path / "cine.nii.gz", frame=3).array, read_volume(tmp_path / "study", 3).array
    )
    for name, src in (("a", tmp_path / "study"), ("b", tmp_path / "cine.nii.gz")):
        argv = ["segment", str(src), "--frame", "3", "-o", str(tmp_path / name), "--bundle", str(tiny_bundle)]
        assert main([*argv, "--quiet"]) == 0
    a, b = (sitk.ReadImage(str(tmp_path / n / "segmentation.nii.gz")) for n in "ab")
    assert np.array_equal(sitk.GetArrayFromImage(a), sitk.GetArrayFromImage(b))
    assert np.allclose(a.GetOrigin(), b.GetOrigin(), atol=1e-3) and np.allclose(a.GetSpacing(), b.GetSpacing())
    assert np.allclose(a.GetDirection(), b.GetDirection(), atol=1e-5)
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["study_series"] == [f"loc_{SHUFFLE.index(k) + 1:02d}" for k in range(SLICES)]


def test_what_is_not_a_study_keeps_its_own_reading(tmp_path, data):
    # one cine stack series in a folder, and a cohort folder of such series: not studies
    for name in ("p1", "p2"):
        folder = tmp_path / "cohort" / name
        folder.mkdir(parents=True)
        for k in range(SLICES):
            position = stack_image(data[0]).TransformIndexToPhysicalPoint((0, 0, k))
            write_slice(folder / f"IM{k + 1:04d}.dcm", data[0, k], Place(position), f"1.2.9.{name[1]}", 1, 0)
    assert not is_study_folder(tmp_path / "cohort") and not is_study_folder(tmp_path / "cohort" / "p1")
    assert not is_study_folder(tmp_path / "cohort" / "p1" / "IM0001.dcm")
    vol = read_volume(tmp_path / "cohort" / "p1")
    assert np.array_equal(vol.array, data[0]) and "study_series" not in vol.notes
    # single-location series of different subjects (frames of reference) make no study either
    for n, uid in enumerate(("1.2.8.1", "1.2.8.2")):
        folder = tmp_path / "singles" / f"s{n}"
        folder.mkdir(parents=True)
        write_slice(folder / "a.dcm", data[0, n], Place(ORIGIN, frame_uid=uid + ".9"), uid, 1, 0)
    assert not is_study_folder(tmp_path / "singles")


def test_a_series_holding_a_whole_stack_or_a_fifo_in_a_study_is_refused_by_name(tmp_path, data):
    import os

    write_study(tmp_path / "study", data)
    stack = tmp_path / "study" / "loc_07"
    stack.mkdir()
    for k in (0, 1):  # one series at two slice positions
        position = stack_image(data[0]).TransformIndexToPhysicalPoint((0, 0, k))
        write_slice(stack / f"IM{k + 1:04d}.dcm", data[0, k], Place(position), "1.2.3.4.8", 8, 0)
    with pytest.raises(CardsegError, match=r"loc_07 holds images at 2 slice positions"):
        study_stack_info(tmp_path / "study")
    for f in stack.iterdir():
        f.unlink()
    stack.rmdir()
    os.mkfifo(tmp_path / "study" / "loc_03" / "pipe")  # never opened: refused from its kind alone
    with pytest.raises(CardsegError, match=r"loc_03: pipe is a FIFO"):
        read_study_frame(tmp_path / "study", 0)


def test_a_single_phase_study_needs_no_frame_and_takes_none(tmp_path, data):
    write_study(tmp_path / "study", data, phases={k: 1 for k in range(SLICES)})
    assert np.array_equal(read_volume(tmp_path / "study").array, data[0])
    with pytest.raises(CardsegError, match="--frame given but each series of the study holds one image"):
        read_volume(tmp_path / "study", frame=0)
