"""A short-axis cine exported as one DICOM series per slice location, assembled into one stack.

A study folder holds several single-location series, either one per sub-folder (``study/slice01/``,
``study/slice02/`` ...) or side by side among the folder's own files (told apart by
``SeriesInstanceUID``). Each series holds every cardiac phase of one slice position. The stack is
built from the files' own headers: the series sorted along the common slice normal (the cross
product of the ``ImageOrientationPatient`` row and column directions), each phase sorted by
``TriggerTime`` then ``InstanceNumber`` as in a cine series (:mod:`cardseg.io.dicom`).

Refused in one line that names the series which disagree (each is checked against the value most
series share): a series holding more than one slice position, another ``FrameOfReferenceUID``, an
orientation more than :data:`ORIENTATION_TOLERANCE_DEG` degrees off, another in-plane grid (Rows,
Columns, PixelSpacing), another phase count, two series at one slice position, a gap of about two
or more slice spacings (a missing slice location: never interpolated), any other uneven spacing,
and a sheared stack. Within the tolerance the stack takes the orientation of the series most
agree with.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import SimpleITK as sitk

from cardseg.base.errors import CardsegError
from cardseg.base.filekind import kind_of
from cardseg.io.dicom import (
    GAP_TOLERANCE,
    SliceHeader,
    check_straight,
    looks_like_dicom,
    read_dicom_series,
    read_header,
    same_frame_grid,
    series_file_lists,
    stack_volume,
)

#: largest angle (degrees) between a series' row or column direction and the stack's: over a 400 mm
#: field of view it moves the image's edge by 0.7 mm, below half of a cine's usual pixel
ORIENTATION_TOLERANCE_DEG = 0.1
#: positions closer than this (mm) are one slice position (all files of a series; two series that clash)
SAME_POSITION_MM = 0.01
#: metadata key of an image assembled from a study: the series, as JSON, in slice order
STUDY_SERIES_KEY = "cardseg_study_series"


@dataclass(frozen=True)
class StudySeries:
    """One slice location of a study: ``label`` (its sub-folder's name, else ``series N`` from its
    SeriesNumber or SeriesInstanceUID), ``position_mm`` along the stack's slice normal, ``files``
    one per phase in phase order (``headers`` the same files' headers)."""

    label: str
    position_mm: float
    files: Tuple[Path, ...]
    headers: Tuple[SliceHeader, ...] = field(repr=False, compare=False)


@dataclass(frozen=True)
class StudyStack:
    """A checked study: ``series`` sorted along the slice normal, ``phases`` per series, the slice
    spacing (mm; None for a single series), each phase's trigger time (ms, the mean over the series;
    None where a file has no TriggerTime) and ``notes`` on what was chosen."""

    where: Path
    series: Tuple[StudySeries, ...]
    phases: int
    slice_spacing_mm: Optional[float]
    trigger_times_ms: Optional[Tuple[float, ...]]
    notes: Tuple[str, ...] = ()


# ----------------------------------------------------------------------------- finding the series


def _own_dicom_files(folder: Path) -> List[Path]:
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    return [e for e in entries if not e.name.startswith(".") and e.is_file() and looks_like_dicom(e)]


def _dicom_subfolders(folder: Path) -> List[Path]:
    subs = sorted(e for e in folder.iterdir() if not e.name.startswith(".") and e.is_dir())
    return [s for s in subs if _own_dicom_files(s)]


def _sampled_reference(files: Sequence[Path]) -> Optional[str]:
    """The frame of reference of a series whose first and last file (by name) lie at one position,
    else None (two positions, or a file that cannot be read)."""
    ends = sorted(files)
    try:
        a, b = (read_header(Path(f).parent, Path(f)) for f in (ends[0], ends[-1]))
    except CardsegError:
        return None
    return a.frame_of_reference if np.linalg.norm(a.position - b.position) < SAME_POSITION_MM else None


def is_study_folder(folder: os.PathLike) -> bool:
    """Whether ``folder`` looks like a study of single-location series: at least two series (sub-folders,
    or SeriesInstanceUIDs among its own files) of one frame of reference whose first and last files lie
    at one position. Cheap (two headers per series); :func:`study_stack_info` does the full checks."""
    p = Path(folder)
    try:
        if not p.is_dir():
            return False
        if _own_dicom_files(p):
            if any(kind_of(e) not in ("file", "folder", "missing") for e in p.iterdir()):
                return False  # a FIFO would block the series scan: the series reader refuses it by name
            reader = sitk.ImageSeriesReader()
            ids = reader.GetGDCMSeriesIDs(str(p))
            lists = [reader.GetGDCMSeriesFileNames(str(p), uid) for uid in ids] if len(ids) > 1 else []
        else:
            lists = [_own_dicom_files(s) for s in _dicom_subfolders(p)]
    except OSError:
        return False
    refs = [r for r in (_sampled_reference(files) for files in lists if files) if r is not None]
    return bool(refs) and Counter(refs).most_common(1)[0][1] >= 2


def _study_lists(folder: Path) -> List[Tuple[Optional[str], List[Path]]]:
    """``(label or None, files)`` per series of a study folder (None: labelled from the headers)."""
    if _own_dicom_files(folder):
        return [(None, files) for files in series_file_lists(folder).values()]
    subs = _dicom_subfolders(folder)
    if not subs:
        raise CardsegError(f"{folder}: folder holds no DICOM files and no sub-folder with a DICOM series")
    return [(s.name, _one_series(s)) for s in subs]


def _one_series(sub: Path) -> List[Path]:
    lists = series_file_lists(sub)
    if len(lists) > 1:
        raise CardsegError(
            f"{sub}: the study's sub-folder holds {len(lists)} DICOM series; each sub-folder must hold one"
        )
    return next(iter(lists.values()))


def read_dicom_folder(
    folder: os.PathLike, frame: Optional[int] = None, spacing: Optional[Sequence[float]] = None
) -> sitk.Image:
    """One 3D image from a DICOM folder: a study of single-location series (:func:`read_study_frame`)
    or one series (:func:`cardseg.io.dicom.read_dicom_series`)."""
    p = Path(folder)
    if is_study_folder(p):
        return read_study_frame(p, frame, spacing)
    return read_dicom_series(p, frame, spacing)


# ----------------------------------------------------------------------------- the public readers


def study_stack_info(folder: os.PathLike) -> StudyStack:
    """The checked, sorted series of a study folder (see the module docstring); nothing is read but headers."""
    p = Path(folder)
    if not p.is_dir():
        raise CardsegError(f"{p}: not a folder")
    return _checked_stack(p, _study_lists(p))


def read_study_frame(
    folder: os.PathLike, frame: Optional[int], spacing: Optional[Sequence[float]] = None
) -> sitk.Image:
    """Phase ``frame`` (0-based) of a study folder as one 3D image on the grid its headers define;
    ``spacing`` (mm, x y [z]) stands in for what the files do not say, as for a series."""
    return frame_image(study_stack_info(folder), frame, spacing)


def assemble_series(
    file_lists: Sequence[Sequence[os.PathLike]], frame: Optional[int], spacing: Optional[Sequence[float]] = None
) -> sitk.Image:
    """The same as :func:`read_study_frame` from explicit file lists, one list of DICOM files per series
    (e.g. from a DICOM database); the series are labelled from their headers."""
    lists = [[Path(f) for f in files] for files in file_lists]
    if not lists or not all(lists):
        raise CardsegError("assembling a study needs at least one series, and each series at least one file")
    where = Path(os.path.commonpath([str(f.parent) for files in lists for f in files]))
    return frame_image(_checked_stack(where, [(None, files) for files in lists]), frame, spacing)


def frame_image(stack: StudyStack, frame: Optional[int], spacing: Optional[Sequence[float]] = None) -> sitk.Image:
    """Phase ``frame`` of a checked stack as a 3D image (k along the slice normal, as ``stack.series``)."""
    n = stack.phases
    if frame is None and n > 1:
        raise CardsegError(
            f"{stack.where}: cine study of {len(stack.series)} series with {n} phases each; "
            f"choose one with --frame N or a batch manifest's frame column (0..{n - 1})"
        )
    if frame is not None and n == 1:
        raise CardsegError(f"{stack.where}: --frame given but each series of the study holds one image")
    if frame is not None and not 0 <= frame < n:
        raise CardsegError(f"{stack.where}: --frame {frame} is out of range (0..{n - 1})")
    chosen = [s.headers[frame or 0] for s in stack.series]
    img = stack_volume(stack.where, chosen, None, spacing)
    img.SetMetaData(STUDY_SERIES_KEY, json.dumps([s.label for s in stack.series]))
    return img


# ----------------------------------------------------------------------------- the checks


def _names(labels: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(labels[:limit])
    return shown + (f" and {len(labels) - limit} more" if len(labels) > limit else "")


def _labels(lists: List[Tuple[Optional[str], List[Path]]], headers: List[List[SliceHeader]]) -> List[str]:
    """Sub-folder names where given, else ``series N`` (SeriesNumber) or ``series UID``, whichever tells them apart."""
    if all(label is not None for label, _ in lists):
        return [label for label, _ in lists]
    for key in ("series_number", "series_uid"):
        values = [getattr(h[0], key) for h in headers]
        if all(values) and len(set(values)) == len(values):
            return [f"series {v}" for v in values]
    return [f"series {h[0].series_uid or '?'} (file list {k + 1})" for k, h in enumerate(headers)]


def _series_headers(where: Path, label: str, files: List[Path]) -> List[SliceHeader]:
    """The headers of one series in phase order; refuses files at several positions or on several grids."""
    headers = [read_header(f.parent, f) for f in files]
    first = headers[0]
    spread = max(float(np.linalg.norm(h.position - first.position)) for h in headers)
    if spread >= SAME_POSITION_MM:
        count = len({tuple(np.round(h.position / SAME_POSITION_MM)) for h in headers})
        raise CardsegError(
            f"{where}: {label} holds images at {count} slice positions ({spread:.3g} mm apart); each series "
            "of a study folder holds one slice position (give a folder holding a whole stack on its own)"
        )
    odd = [h.path.name for h in headers if not same_frame_grid(h, first)]
    if odd:
        raise CardsegError(
            f"{where}: in {label}, files differ in size, orientation or pixel spacing from "
            f"{first.path.name}: {_names(odd)}"
        )
    return sorted(headers, key=lambda h: (h.trigger, h.instance, h.path.name))


def _majority(n: int, same: Callable[[int, int], bool]) -> Tuple[int, List[int]]:
    """``(reference, disagreeing)``: the item agreeing with the most others (first on a tie) and those it
    disagrees with."""
    agree = [sum(same(i, j) for j in range(n)) for i in range(n)]
    ref = int(np.argmax(agree))
    return ref, [j for j in range(n) if not same(ref, j)]


def _refuse_odd(where: Path, labels: List[str], ref: int, odd: List[int], what: str, describe) -> None:
    """One line naming the series ``odd`` that disagree with ``ref`` (and how many agree with it)."""
    if odd:
        others = len(labels) - len(odd) - 1
        agree = f" and the {others} other series that agree with it" if others else ""
        raise CardsegError(
            f"{where}: {_names([labels[j] for j in odd])} {'differs' if len(odd) == 1 else 'differ'} in its {what} "
            f"from {labels[ref]}{agree} ({describe(odd[0])} against {describe(ref)})"
        )


def _angle_deg(a: SliceHeader, b: SliceHeader) -> float:
    dots = np.clip([a.row @ b.row, a.col @ b.col], -1.0, 1.0)
    return float(np.degrees(np.arccos(dots)).max())


def _check_agreement(where: Path, labels: List[str], heads: List[List[SliceHeader]]) -> int:
    """Refuse series that disagree with the most in frame of reference, orientation, grid or phase count;
    the index of the reference series."""
    n, first = len(heads), [h[0] for h in heads]
    refs = [h.frame_of_reference for h in first]
    ref, odd = _majority(n, lambda i, j: refs[i] == refs[j] or not refs[i] or not refs[j])
    _refuse_odd(where, labels, ref, odd, "FrameOfReferenceUID", lambda k: refs[k])
    ref, odd = _majority(n, lambda i, j: _angle_deg(first[i], first[j]) <= ORIENTATION_TOLERANCE_DEG)
    off = _angle_deg(first[odd[0]], first[ref]) if odd else 0.0
    _refuse_odd(
        where,
        labels,
        ref,
        odd,
        f"orientation, by {off:.3g} degrees (tolerance {ORIENTATION_TOLERANCE_DEG:g})",
        lambda k: "ImageOrientationPatient " + "\\".join(f"{v:.4g}" for v in (*first[k].row, *first[k].col)),
    )

    def grid(k: int) -> str:
        sp = first[k].spacing
        return f"{first[k].size[0]}x{first[k].size[1]} pixels of " + (f"{sp[0]:.4g}x{sp[1]:.4g} mm" if sp else "?")

    def same_grid(i: int, j: int) -> bool:
        a, b = first[i], first[j]
        spacing_same = (a.spacing is None) == (b.spacing is None) and (
            a.spacing is None or np.allclose(a.spacing, b.spacing, rtol=1e-4)
        )
        return a.size == b.size and spacing_same

    ref, odd = _majority(n, same_grid)
    _refuse_odd(where, labels, ref, odd, "in-plane grid (Rows, Columns, PixelSpacing)", grid)
    ref, odd = _majority(n, lambda i, j: len(heads[i]) == len(heads[j]))
    _refuse_odd(where, labels, ref, odd, "phase count (files missing?)", lambda k: f"{len(heads[k])} phases")
    return _majority(n, lambda i, j: _angle_deg(first[i], first[j]) <= ORIENTATION_TOLERANCE_DEG)[0]


def _check_positions(where: Path, labels: List[str], z: np.ndarray) -> Optional[float]:
    """Refuse two series at one position, a missing slice location and uneven spacing; the slice spacing.
    ``z``: (S,) positions along the normal, sorted; ``labels`` in the same order."""
    if len(z) < 2:
        return None
    gaps = np.diff(z)
    k = int(np.argmin(gaps))
    if gaps[k] < SAME_POSITION_MM:
        raise CardsegError(
            f"{where}: {labels[k]} and {labels[k + 1]} lie at one slice position ({gaps[k]:.3g} mm apart "
            "along the slice normal); keep one of them"
        )
    spacing = float(np.median(gaps))
    k = int(np.argmax(np.abs(gaps - spacing)))
    if abs(gaps[k] - spacing) <= GAP_TOLERANCE * spacing + 1e-3:
        return spacing
    ratio = gaps[k] / spacing
    between = f"between {labels[k]} and {labels[k + 1]}"
    if ratio > 1.5:
        missing = max(int(round(ratio)) - 1, 1)
        what = "a slice location is" if missing == 1 else f"about {missing} slice locations are"
        raise CardsegError(
            f"{where}: {what} missing {between}: they lie {gaps[k]:.3g} mm apart "
            f"where the stack's slice spacing is {spacing:.3g} mm (cardseg does not fill a gap)"
        )
    raise CardsegError(
        f"{where}: uneven slice spacing: {gaps[k]:.3g} mm {between} where the stack's slice spacing is {spacing:.3g} mm"
    )


def _checked_stack(where: Path, lists: List[Tuple[Optional[str], List[Path]]]) -> StudyStack:
    """Read every header, check the series against each other, and sort them along the slice normal."""
    heads = [_series_headers(where, label or f"series of {files[0].name}", files) for label, files in lists]
    labels = _labels(lists, heads)
    ref = heads[_check_agreement(where, labels, heads)][0]
    normal = np.cross(ref.row, ref.col)
    heads = [[dataclasses.replace(h, row=ref.row, col=ref.col) for h in hs] for hs in heads]  # within tolerance
    z = np.array([float(hs[0].position @ normal) for hs in heads])
    order = np.argsort(z, kind="stable")
    heads, labels, z = [heads[i] for i in order], [labels[i] for i in order], z[order]
    spacing = _check_positions(where, labels, z)
    firsts = [hs[0] for hs in heads]
    if ref.spacing is not None:  # else the user's spacing is needed: stack_volume checks it, naming files
        named = {id(h): label for h, label in zip(firsts, labels)}
        check_straight(where, firsts, firsts[0], ref.spacing, name=lambda h: named[id(h)])
    series = tuple(
        StudySeries(label, float(pos), tuple(h.path for h in hs), tuple(hs)) for label, pos, hs in zip(labels, z, heads)
    )
    times, notes = _trigger_times(heads)
    return StudyStack(where, series, len(heads[0]), spacing, times, tuple(notes))


def _trigger_times(heads: List[List[SliceHeader]]) -> Tuple[Optional[Tuple[float, ...]], List[str]]:
    """Each phase's mean TriggerTime over the series (ms) and a note on their spread; None without one."""
    if not all(h.trigger_known for hs in heads for h in hs):
        return None, ["some files have no TriggerTime (0018,1060): phases are ordered by InstanceNumber"]
    t = np.array([[h.trigger for h in hs] for hs in heads], dtype=float)  # (S, P)
    spread = float((t.max(axis=0) - t.min(axis=0)).max())
    notes = [f"the trigger times of one phase differ by up to {spread:.3g} ms between the series"] if spread > 0 else []
    return tuple(float(v) for v in t.mean(axis=0)), notes
