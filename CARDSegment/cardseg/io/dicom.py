"""Reading a DICOM series folder as one volume, refusing a series with holes.

ITK's series reader skips a file it cannot read with only a printed warning and then reports
a wrong slice spacing. Here every file of the folder that looks like DICOM is read on its own;
the slice stack is built from the files' own ``ImagePositionPatient`` and
``ImageOrientationPatient``, and is refused when a file is unreadable, belongs to no series,
when slices are missing or unevenly spaced, or when files disagree on size or orientation. A
cine series (several phases at each slice position) is read one phase at a time (``frame``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np
import SimpleITK as sitk

from cardseg.base.errors import CardsegError
from cardseg.io.limits import MAX_VOLUME_VOXELS

#: relative tolerance on the slice gap before a series counts as unevenly spaced
GAP_TOLERANCE = 0.02
_DICOM_SUFFIXES = (".dcm", ".dicom", ".ima")


@dataclass
class _Slice:
    path: Path
    position: np.ndarray  # (3,) LPS mm of the first voxel
    row: np.ndarray  # (3,) direction of increasing column index i
    col: np.ndarray  # (3,) direction of increasing row index j
    size: tuple
    spacing: tuple  # in-plane (i, j) mm
    instance: int
    trigger: float
    thickness: float  # SliceThickness (mm), used as the slice spacing of a one-slice series


def looks_like_dicom(path: Path) -> bool:
    """A ``.dcm``/``.dicom``/``.ima`` name, or the ``DICM`` mark at byte 128."""
    if path.suffix.lower() in _DICOM_SUFFIXES:
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(132)
    except OSError:
        return False
    return len(head) == 132 and head[128:132] == b"DICM"


def _names(paths: List[Path], limit: int = 3) -> str:
    shown = ", ".join(p.name for p in paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _meta(reader: sitk.ImageFileReader, key: str) -> Optional[str]:
    return reader.GetMetaData(key).strip() if reader.HasMetaDataKey(key) else None


def _read_slice_header(path: Path) -> _Slice:
    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    reader.ReadImageInformation()
    if reader.GetDimension() == 3 and reader.GetSize()[2] > 1:
        raise CardsegError(f"{path}: multi-frame DICOM files are not supported; export single-frame slices")
    pos = _meta(reader, "0020|0032")
    ori = _meta(reader, "0020|0037")
    if pos is None or ori is None:
        raise CardsegError(f"{path}: DICOM file has no image position or orientation")
    try:
        o = np.array([float(v) for v in ori.split("\\")])
        position = np.array([float(v) for v in pos.split("\\")])
        if o.shape != (6,) or position.shape != (3,):
            raise ValueError("shape")
        return _Slice(path=path, position=position, row=o[:3], col=o[3:6],
                      size=tuple(reader.GetSize()[:2]), spacing=tuple(reader.GetSpacing()[:2]),
                      instance=int(float(_meta(reader, "0020|0013") or 0)),
                      trigger=float(_meta(reader, "0018|1060") or 0.0),
                      thickness=float(_meta(reader, "0018|0050") or 0.0))
    except ValueError:
        raise CardsegError(f"{path}: DICOM file has a malformed position, orientation, instance number, "
                           "trigger time or slice thickness") from None


def list_series_files(folder: Path) -> List[Path]:
    """The files of the folder's one DICOM series; refuses several series or stray DICOM files."""
    reader = sitk.ImageSeriesReader()
    series = reader.GetGDCMSeriesIDs(str(folder))
    if not series:
        raise CardsegError(f"{folder}: folder holds no DICOM series")
    if len(series) > 1:
        raise CardsegError(f"{folder}: folder holds {len(series)} DICOM series; point to a folder with one")
    files = [Path(f) for f in reader.GetGDCMSeriesFileNames(str(folder), series[0])]
    listed = {os.path.realpath(f) for f in files}
    stray = sorted(p for p in folder.iterdir()
                   if p.is_file() and not p.name.startswith(".") and os.path.realpath(p) not in listed
                   and looks_like_dicom(p))
    if stray:
        raise CardsegError(f"{folder}: unreadable or foreign DICOM files in the series folder: {_names(stray)}")
    return files


def read_dicom_series(folder: os.PathLike, frame: Optional[int] = None) -> sitk.Image:
    """One 3D image from the folder's series (one phase of a cine series: ``frame``, 0-based)."""
    folder = Path(folder)
    headers = []
    for f in list_series_files(folder):
        try:
            headers.append(_read_slice_header(f))
        except RuntimeError:
            raise CardsegError(f"{folder}: unreadable DICOM file {f.name}") from None
    first = headers[0]
    normal = np.cross(first.row, first.col)
    odd = [h.path for h in headers if h.size != first.size or not np.allclose(h.row, first.row, atol=1e-4)
           or not np.allclose(h.col, first.col, atol=1e-4) or not np.allclose(h.spacing, first.spacing, rtol=1e-4)]
    if odd:
        raise CardsegError(f"{folder}: files differ in size, orientation or pixel spacing from {first.path.name}: "
                           f"{_names(odd)}")
    stack = _select_phase(folder, headers, normal, frame)
    n = len(stack) * first.size[0] * first.size[1]
    if n > MAX_VOLUME_VOXELS:
        raise CardsegError(f"{folder}: the volume to segment has {n:,d} voxels; the limit is {MAX_VOLUME_VOXELS:,d} "
                           "(about 1 GB of working memory)")
    gaps = np.diff([float(h.position @ normal) for h in stack])
    spacing_z = float(np.median(gaps)) if len(gaps) else first.thickness
    if len(gaps) and (spacing_z <= 0 or np.abs(gaps - spacing_z).max() > GAP_TOLERANCE * spacing_z + 1e-3):
        k = int(np.argmax(np.abs(gaps - spacing_z)))
        raise CardsegError(f"{folder}: uneven slice spacing: {gaps[k]:.3g} mm between {stack[k].path.name} and "
                           f"{stack[k + 1].path.name} where the series has {spacing_z:.3g} mm (a missing or extra slice?)")
    planes = []
    for h in stack:
        try:
            img = sitk.ReadImage(str(h.path))
        except RuntimeError:
            raise CardsegError(f"{folder}: unreadable DICOM file {h.path.name}") from None
        a = sitk.GetArrayFromImage(img).astype(np.float32)
        planes.append(a[0] if a.ndim == 3 else a)
    # stacked as arrays: each file's own 2D origin (a tilted series) must not stop the join
    vol = sitk.GetImageFromArray(np.stack(planes))
    vol.SetOrigin(tuple(float(v) for v in stack[0].position))
    vol.SetSpacing((*first.spacing, spacing_z))
    vol.SetDirection(tuple(float(v) for v in np.column_stack([first.row, first.col, normal]).ravel()))
    return vol


def _select_phase(folder: Path, headers: List[_Slice], normal: np.ndarray, frame: Optional[int]) -> List[_Slice]:
    """Group the files by slice position; return one file per position, sorted along the normal."""
    where = np.array([float(h.position @ normal) for h in headers])
    order = np.argsort(where, kind="stable")
    groups: List[List[_Slice]] = []
    last = None
    for i in order:
        if last is None or abs(where[i] - last) > 1e-3:
            groups.append([])
        groups[-1].append(headers[i])
        last = where[i]
    counts = sorted({len(g) for g in groups})
    if len(counts) > 1:
        short = [g[0].path for g in groups if len(g) < counts[-1]]
        raise CardsegError(f"{folder}: cine series with {counts[-1]} phases per slice position, but fewer at "
                           f"{len(short)} position(s) (e.g. beside {_names(short, 2)}): files are missing")
    phases = counts[0]
    if phases == 1:
        if frame is not None:
            raise CardsegError(f"{folder}: --frame given but the DICOM series has one image per slice position")
        return [g[0] for g in groups]
    if frame is None:
        raise CardsegError(f"{folder}: cine DICOM series with {phases} phases per slice position; "
                           f"choose one with --frame N (0..{phases - 1})")
    if not 0 <= frame < phases:
        raise CardsegError(f"{folder}: --frame {frame} is out of range (0..{phases - 1})")
    return [sorted(g, key=lambda h: (h.trigger, h.instance, h.path.name))[frame] for g in groups]
