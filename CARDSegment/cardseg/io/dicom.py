"""Reading a DICOM series folder as one volume, refusing a series with holes.

ITK's series reader skips a file it cannot read with only a printed warning and then reports
a wrong slice spacing. Here every file of the folder that looks like DICOM is read on its own;
the slice stack is built from the files' own ``ImagePositionPatient`` and
``ImageOrientationPatient``, and is refused when a file is unreadable, belongs to no series,
when slices are missing or unevenly spaced, when their positions drift along the rows or columns
(a sheared series, beyond :data:`SHEAR_TOLERANCE` pixels: the outputs lie on an orthogonal grid),
or when files disagree on size or orientation. A
cine series (several phases at each slice position) is read one phase at a time (``frame``); a cine
exported as one series per slice location is assembled by :mod:`cardseg.io.dicom_study`.

Nothing is assumed: a file without ``PixelSpacing`` is refused (ITK would read 1 mm) unless the
user gives the spacing; an ``ImageOrientationPatient`` whose vectors are not unit length and
orthogonal within :data:`~cardseg.io.limits.DIRECTION_TOLERANCE` is refused (within it, it is made
exactly orthonormal, so its length never scales the slice spacing). The slice spacing comes from
the slice positions; with one slice position it is the user's, else ``SpacingBetweenSlices``,
else ``SliceThickness`` (the source is recorded in the image's metadata key
:data:`SLICE_SPACING_KEY`), else the input is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import SimpleITK as sitk

from cardseg.base.errors import CardsegError
from cardseg.io.limits import (
    DIRECTION_TOLERANCE,
    LIMIT_MEMORY_NOTE,
    MAX_VOLUME_VOXELS,
    nearest_orthonormal,
    skew_degrees,
)

#: relative tolerance on the slice gap before a series counts as unevenly spaced
GAP_TOLERANCE = 0.02
#: largest in-plane distance (in pixels) of a slice's position from the straight stack through the first slice
#: along the slice normal; beyond it the series is sheared (its slices drift along the rows or columns) and is
#: refused, since the outputs are written on an orthogonal grid
SHEAR_TOLERANCE = 0.1
_DICOM_SUFFIXES = (".dcm", ".dicom", ".ima")
#: metadata key of the image read from a one-slice series: where its slice spacing came from
SLICE_SPACING_KEY = "cardseg_slice_spacing_from"


@dataclass
class SliceHeader:
    """What cardseg reads of one single-frame DICOM file before its pixels (LPS, mm)."""

    path: Path
    position: np.ndarray  # (3,) LPS mm of the first voxel
    row: np.ndarray  # (3,) direction of increasing column index i
    col: np.ndarray  # (3,) direction of increasing row index j
    size: tuple
    spacing: Optional[tuple]  # in-plane (i, j) mm from PixelSpacing; None where the file has none
    instance: int
    trigger: float
    between: float  # SpacingBetweenSlices (mm), 0 where absent: the slice spacing of a one-slice series
    thickness: float  # SliceThickness (mm), 0 where absent: the next choice for a one-slice series
    trigger_known: bool = False  # whether the file has a TriggerTime (0018,1060)
    series_uid: str = ""  # SeriesInstanceUID (0020,000E)
    series_number: str = ""  # SeriesNumber (0020,0011)
    frame_of_reference: str = ""  # FrameOfReferenceUID (0020,0052), else StudyInstanceUID (0020,000D)


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


def _read_slice_header(path: Path) -> SliceHeader:
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
        if o.shape != (6,) or position.shape != (3,) or not np.isfinite([*o, *position]).all():
            raise ValueError("shape")
        header = SliceHeader(
            path=path,
            position=position,
            row=o[:3],
            col=o[3:6],
            size=tuple(reader.GetSize()[:2]),
            spacing=_pixel_spacing(path, _meta(reader, "0028|0030")),
            instance=int(float(_meta(reader, "0020|0013") or 0)),
            trigger=float(_meta(reader, "0018|1060") or 0.0),
            between=abs(float(_meta(reader, "0018|0088") or 0.0)),
            thickness=float(_meta(reader, "0018|0050") or 0.0),
            trigger_known=bool(_meta(reader, "0018|1060")),
            series_uid=(_meta(reader, "0020|000e") or "").strip("\0 "),
            series_number=(_meta(reader, "0020|0011") or "").strip("\0 "),
            frame_of_reference=(_meta(reader, "0020|0052") or _meta(reader, "0020|000d") or "").strip("\0 "),
        )
    except ValueError:
        raise CardsegError(
            f"{path}: DICOM file has a malformed position, orientation, instance number, "
            "trigger time, slice spacing or slice thickness"
        ) from None
    axes = nearest_orthonormal(np.column_stack([header.row, header.col]))
    if axes is None:
        raise CardsegError(
            f"{path}: DICOM ImageOrientationPatient (0020,0037) is not two orthogonal unit vectors "
            f"(lengths {np.linalg.norm(header.row):.6g} and {np.linalg.norm(header.col):.6g}, "
            f"{skew_degrees(np.column_stack([header.row, header.col])):.3g} degrees from orthogonal; "
            f"tolerance {DIRECTION_TOLERANCE:g})"
        )
    header.row, header.col = axes[:, 0], axes[:, 1]
    return header


def _pixel_spacing(path: Path, text: Optional[str]) -> Optional[tuple]:
    """``PixelSpacing`` (0028,0030), row spacing then column spacing, as (i, j) = (column, row) mm."""
    if text is None or not text.strip("\\ \0"):
        return None
    try:
        values = [float(v) for v in text.split("\\")]
    except ValueError:
        values = []
    if len(values) != 2 or not all(np.isfinite(v) and v > 0 for v in values):
        raise CardsegError(f"{path}: DICOM PixelSpacing (0028,0030) is malformed: {text[:40]!r}")
    return (values[1], values[0])


def list_series_files(folder: Path) -> List[Path]:
    """The files of the folder's one DICOM series; refuses several series, stray DICOM files, or
    anything in the folder that is not a file or a folder (a FIFO would block a reader), by name."""
    series = series_file_lists(folder)
    if len(series) > 1:
        raise CardsegError(f"{folder}: folder holds {len(series)} DICOM series; point to a folder with one")
    return next(iter(series.values()))


def _no_series(folder: Path) -> str:
    """The refusal of a folder without a DICOM series; one of image files points to ``cardseg batch``."""
    from cardseg.base.filekind import VOLUME_SUFFIXES

    images = sorted(p.name for p in folder.iterdir() if p.name.lower().endswith(VOLUME_SUFFIXES) and p.is_file())
    if not images:
        return f"{folder}: folder holds no DICOM series"
    return (
        f"{folder}: folder holds no DICOM series but {len(images)} image file{'s' if len(images) > 1 else ''} "
        f"(e.g. {images[0]}): segment one with 'cardseg segment FILE', or the folder as a cohort with "
        f"'cardseg batch {folder} -o OUTDIR'"
    )


def series_file_lists(folder: Path) -> Dict[str, List[Path]]:
    """The DICOM series among the folder's own files: SeriesInstanceUID -> its files, in GDCM's order.
    Refuses (one line, by name) a folder holding no series, DICOM files that belong to none (unreadable or
    foreign), and anything that is not a file or a folder (a FIFO would block a reader)."""
    from cardseg.base.filekind import kind_of

    special = sorted(
        (p.name, kind) for p in folder.iterdir() if (kind := kind_of(p)) not in ("file", "folder", "missing")
    )
    if special:
        name, kind = special[0]
        more = f" (and {len(special) - 1} more)" if len(special) > 1 else ""
        raise CardsegError(f"{folder}: {name} is a {kind}, not a file; a DICOM series folder holds files only{more}")
    reader = sitk.ImageSeriesReader()
    ids = reader.GetGDCMSeriesIDs(str(folder))
    if not ids:
        raise CardsegError(_no_series(folder))
    series = {uid: [Path(f) for f in reader.GetGDCMSeriesFileNames(str(folder), uid)] for uid in ids}
    listed = {os.path.realpath(f) for files in series.values() for f in files}
    stray = sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and os.path.realpath(p) not in listed and looks_like_dicom(p)
    )
    if stray:
        raise CardsegError(f"{folder}: unreadable or foreign DICOM files in the series folder: {_names(stray)}")
    return series


def read_dicom_series(
    folder: os.PathLike, frame: Optional[int] = None, spacing: Optional[Sequence[float]] = None
) -> sitk.Image:
    """One 3D image from the folder's series (one phase of a cine series: ``frame``, 0-based),
    on the grid the files' own positions, orientation and pixel spacing define; ``spacing``
    (the user's, mm, x y [z]) stands in for what the files do not say (see the module docstring)."""
    folder = Path(folder)
    return stack_volume(folder, [read_header(folder, f) for f in list_series_files(folder)], frame, spacing)


def read_dicom_file(
    path: os.PathLike, frame: Optional[int] = None, spacing: Optional[Sequence[float]] = None
) -> sitk.Image:
    """One single-frame DICOM file as a one-slice 3D image, with the same checks as a series."""
    path = Path(path)
    return stack_volume(path, [read_header(path.parent, path)], frame, spacing)


def read_header(folder: Path, f: Path) -> SliceHeader:
    """The header of DICOM file ``f``; an unreadable one is refused naming it (and ``folder``)."""
    try:
        return _read_slice_header(f)
    except RuntimeError:
        raise CardsegError(f"{folder}: unreadable DICOM file {f.name}") from None


def stack_volume(
    where: Path, headers: List[SliceHeader], frame: Optional[int], spacing: Optional[Sequence[float]]
) -> sitk.Image:
    """One 3D image from single-frame DICOM slices (one phase per slice position: ``frame``), after the
    checks of the module docstring; ``where`` is the input named in a refusal."""
    first = headers[0]
    normal = np.cross(first.row, first.col)
    odd = [h.path for h in headers if not same_frame_grid(h, first)]
    if odd:
        raise CardsegError(
            f"{where}: files differ in size, orientation or pixel spacing from {first.path.name}: {_names(odd)}"
        )
    user = [float(v) for v in spacing] if spacing is not None else []
    inplane = first.spacing if len(user) < 2 else tuple(user[:2])
    if inplane is None:
        raise CardsegError(
            f"{where}: DICOM file {first.path.name} has no PixelSpacing (0028,0030), so its pixel size "
            "is unknown (cardseg does not assume 1 mm); give it with --spacing SX,SY[,SZ] (mm)"
        )
    stack = _select_phase(where, headers, normal, frame)
    n = len(stack) * first.size[0] * first.size[1]
    if n > MAX_VOLUME_VOXELS:
        raise CardsegError(
            f"{where}: the volume to segment has {n:,d} voxels; the limit is {MAX_VOLUME_VOXELS:,d} "
            f"({LIMIT_MEMORY_NOTE})"
        )
    gaps = np.diff([float(h.position @ normal) for h in stack])
    source = None
    if len(gaps):
        spacing_z = float(np.median(gaps))
    else:
        spacing_z, source = _one_slice_spacing(where, first, user)
    if len(gaps) and (spacing_z <= 0 or np.abs(gaps - spacing_z).max() > GAP_TOLERANCE * spacing_z + 1e-3):
        k = int(np.argmax(np.abs(gaps - spacing_z)))
        raise CardsegError(
            f"{where}: uneven slice spacing: {gaps[k]:.3g} mm between {stack[k].path.name} and "
            f"{stack[k + 1].path.name} where the series has {spacing_z:.3g} mm (a missing or extra slice?)"
        )
    check_straight(where, stack, first, inplane)
    planes = []
    for h in stack:
        try:
            img = sitk.ReadImage(str(h.path))
        except RuntimeError:
            raise CardsegError(f"{where}: unreadable DICOM file {h.path.name}") from None
        a = sitk.GetArrayFromImage(img).astype(np.float32)
        planes.append(a[0] if a.ndim == 3 else a)
    # stacked as arrays: each file's own 2D origin (a tilted series) must not stop the join
    vol = sitk.GetImageFromArray(np.stack(planes))
    vol.SetOrigin(tuple(float(v) for v in stack[0].position))
    vol.SetSpacing((*inplane, spacing_z))
    vol.SetDirection(tuple(float(v) for v in np.column_stack([first.row, first.col, normal]).ravel()))
    if source:
        vol.SetMetaData(SLICE_SPACING_KEY, source)
    return vol


def same_frame_grid(h: SliceHeader, first: SliceHeader) -> bool:
    """Whether ``h`` has the size, orientation and pixel spacing of ``first`` (so both stack on one grid)."""
    return (
        h.size == first.size
        and np.allclose(h.row, first.row, atol=1e-4)
        and np.allclose(h.col, first.col, atol=1e-4)
        and (h.spacing is None) == (first.spacing is None)
        and (h.spacing is None or np.allclose(h.spacing, first.spacing, rtol=1e-4))
    )


def check_straight(
    where: Path,
    stack: List[SliceHeader],
    first: SliceHeader,
    inplane: Sequence[float],
    name: Callable[[SliceHeader], str] = lambda h: h.path.name,
) -> None:
    """Refuse slices whose positions drift in-plane (along the row or column direction) from the first one
    by more than :data:`SHEAR_TOLERANCE` pixels: placed on a straight grid, they would come back displaced.
    ``name``: how the message names a slice (its file name by default)."""
    if len(stack) < 2:
        return
    offsets = np.array([h.position - stack[0].position for h in stack])
    drift = np.column_stack([offsets @ first.row, offsets @ first.col]) / np.asarray(inplane, dtype=float)
    k = int(np.argmax(np.abs(drift).max(axis=1)))
    if np.abs(drift[k]).max() > SHEAR_TOLERANCE:
        mm = np.round(drift[k] * np.asarray(inplane, dtype=float), 3) + 0.0  # + 0.0: no "-0"
        raise CardsegError(
            f"{where}: sheared DICOM series: the position of {name(stack[k])} is {mm[0]:.3g} mm along "
            f"the rows and {mm[1]:.3g} mm along the columns off the straight stack through "
            f"{name(stack[0])} ({np.abs(drift[k]).max():.3g} pixels; tolerance {SHEAR_TOLERANCE:g}); "
            "cardseg writes its outputs on an orthogonal grid, so it cannot return them where this "
            "series lies (resample it onto an orthogonal grid first)"
        )


def _one_slice_spacing(where: Path, first: SliceHeader, user: List[float]):
    """The slice spacing of a one-slice series and where it came from (see the module docstring)."""
    if len(user) >= 3:
        return user[2], "--spacing"
    if first.between > 0:
        return first.between, "SpacingBetweenSlices (0018,0088)"
    if first.thickness > 0:
        return first.thickness, "SliceThickness (0018,0050)"
    raise CardsegError(
        f"{where}: one DICOM slice with neither SpacingBetweenSlices (0018,0088) nor SliceThickness "
        "(0018,0050), so the slice spacing is unknown; give it with --spacing SX,SY,SZ (mm)"
    )


def _select_phase(
    folder: Path, headers: List[SliceHeader], normal: np.ndarray, frame: Optional[int]
) -> List[SliceHeader]:
    """Group the files by slice position; return one file per position, sorted along the normal."""
    where = np.array([float(h.position @ normal) for h in headers])
    order = np.argsort(where, kind="stable")
    groups: List[List[SliceHeader]] = []
    last = None
    for i in order:
        if last is None or abs(where[i] - last) > 1e-3:
            groups.append([])
        groups[-1].append(headers[i])
        last = where[i]
    counts = sorted({len(g) for g in groups})
    if len(counts) > 1:
        short = [g[0].path for g in groups if len(g) < counts[-1]]
        raise CardsegError(
            f"{folder}: cine series with {counts[-1]} phases per slice position, but fewer at "
            f"{len(short)} position(s) (e.g. beside {_names(short, 2)}): files are missing"
        )
    phases = counts[0]
    if phases == 1:
        if frame is not None:
            raise CardsegError(f"{folder}: --frame given but the DICOM series has one image per slice position")
        return [g[0] for g in groups]
    if frame is None:
        raise CardsegError(
            f"{folder}: cine DICOM series with {phases} phases per slice position; "
            f"choose one with --frame N or a batch manifest's frame column (0..{phases - 1})"
        )
    if not 0 <= frame < phases:
        raise CardsegError(f"{folder}: --frame {frame} is out of range (0..{phases - 1})")
    return [sorted(g, key=lambda h: (h.trigger, h.instance, h.path.name))[frame] for g in groups]
