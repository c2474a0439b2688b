"""How many frames an input holds and its temporal resolution, from its headers alone (no pixel data).

* NIfTI: ``dim[0] == 4`` gives ``dim[4]`` frames; the frame interval is ``pixdim[4]`` in the time
  unit of ``xyzt_units`` (seconds, milliseconds or microseconds); with no time unit named there,
  the interval is unknown.
* NRRD: a ``time`` or ``list`` axis holds the frames; their times are the axis' ``axis N index
  values`` (Slicer's sequence files) or its ``spacings`` entry, in the axis' ``units`` entry
  (``ms`` or ``s``); without a unit the times are unknown.
* DICOM, a folder: the files of the folder and of its sub-folders (a study exported as one
  series per slice location) grouped by slice position; the frames are the images per position,
  ordered by ``TriggerTime`` (0018,1060) and ``InstanceNumber``; the times are the trigger times
  of the first position where every image has one, and ``NominalInterval`` (0018,1062) the
  R-R interval.
* Anything else (MetaImage, one file): ITK's header; a 4D image gives its frames, times unknown.

A header this module cannot read gives one frame: the case's reader then says what is wrong.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

import numpy as np

#: NIfTI ``xyzt_units`` time codes (bits 3-5) -> milliseconds per unit
_NIFTI_TIME_MS = {8: 1000.0, 16: 1.0, 24: 0.001}
_NRRD_TIME_MS = {"ms": 1.0, "msec": 1.0, "s": 1000.0, "sec": 1000.0, "second": 1000.0, "seconds": 1000.0}
_DICOM_SUFFIXES = (".dcm", ".dicom", ".ima")
#: the most files a DICOM folder's header walk reads
MAX_DICOM_FILES = 20000


class CineInfo(NamedTuple):
    """frames: how many the input holds (1: not a cine); frame_ms: the interval between frames (ms) or
    ``None``; trigger_ms: each frame's trigger time (ms, ``(T,)``) or ``None``; rr_ms: the R-R interval
    (ms) or ``None``; source: which header field the times came from (``""``: none)."""

    frames: int
    frame_ms: Optional[float] = None
    trigger_ms: Optional[Tuple[float, ...]] = None
    rr_ms: Optional[float] = None
    source: str = ""


def positive(v) -> Optional[float]:
    """``v`` as a finite positive float, else ``None`` (a missing or unusable header value)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f > 0 else None


def read_cine_info(path) -> CineInfo:
    """The :class:`CineInfo` of an input file or folder (see the module docstring); never raises for a bad header."""
    p = Path(path)
    try:
        if p.is_dir():
            return _dicom_info(p)
        name = p.name.lower()
        if name.endswith((".nii", ".nii.gz", ".hdr")):
            return _nifti_info(p)
        if name.endswith((".nrrd", ".nhdr")):
            return _nrrd_info(p)
        return _itk_info(p)
    except Exception:  # noqa: BLE001 - the reader of the case names the problem
        return CineInfo(1)


def _nifti_info(p: Path) -> CineInfo:
    import struct

    from cardseg.io.headers import read_nifti_head

    head = read_nifti_head(p)
    if head.order is None or len(head.raw) < 348:
        return CineInfo(1)
    dim = struct.unpack(head.order + "8h", head.raw[40:56])
    if dim[0] != 4 or dim[4] < 2:
        return CineInfo(1)
    pixdim = struct.unpack(head.order + "8f", head.raw[76:108])
    per_unit = _NIFTI_TIME_MS.get(head.raw[123] & 0x38)
    interval = positive(pixdim[4])
    if per_unit is None or interval is None:
        return CineInfo(int(dim[4]))
    return CineInfo(int(dim[4]), round(interval * per_unit, 4), source="NIfTI pixdim[4]")  # float32 in the header


def _quoted(value: str) -> List[str]:
    return re.findall(r'"([^"]*)"', value)


def _nrrd_info(p: Path) -> CineInfo:
    from cardseg.io.headers import read_nrrd_header

    lines, fields, _ = read_nrrd_header(p)
    kinds = fields.get("kinds", "").split()
    sizes = fields.get("sizes", "").split()
    axes = [i for i, k in enumerate(kinds) if k in ("time", "list")]
    if len(axes) != 1 or len(sizes) != len(kinds) or len(kinds) not in (3, 4):
        return CineInfo(1)
    axis, frames = axes[0], int(sizes[axes[0]])
    if frames < 2:
        return CineInfo(1)
    units = _quoted(fields.get("units", ""))
    per_unit = _NRRD_TIME_MS.get(units[axis].strip().lower()) if axis < len(units) else None
    if per_unit is None:
        return CineInfo(frames)
    pairs = dict(ln.split(":=", 1) for ln in lines if ":=" in ln)
    values = pairs.get(f"axis {axis} index values", "").split()
    if len(values) == frames:
        times = [float(v) * per_unit for v in values]
        if all(math.isfinite(t) for t in times):
            step = np.median(np.diff(times)) if frames > 1 else None
            return CineInfo(frames, positive(step), tuple(times), source="NRRD axis index values")
    spacings = fields.get("spacings", "").split()
    if axis < len(spacings) and positive(spacings[axis]) is not None:
        return CineInfo(frames, float(spacings[axis]) * per_unit, source="NRRD spacings")
    return CineInfo(frames)


def _itk_info(p: Path) -> CineInfo:
    import SimpleITK as sitk

    reader = sitk.ImageFileReader()
    reader.SetFileName(str(p))
    reader.ReadImageInformation()
    size = reader.GetSize()
    return CineInfo(int(size[3])) if len(size) == 4 and size[3] > 1 else CineInfo(1)


def _dicom_files(folder: Path) -> List[Path]:
    """The folder's files that may be DICOM, and those of its sub-folders (one level)."""
    out: List[Path] = []
    for place in [folder] + sorted(e for e in folder.iterdir() if e.is_dir() and not e.name.startswith(".")):
        for f in sorted(place.iterdir()):
            if f.is_file() and not f.name.startswith("."):
                out.append(f)
                if len(out) > MAX_DICOM_FILES:
                    return []
    return out


def _dicom_header(f: Path) -> Optional[dict]:
    import SimpleITK as sitk

    reader = sitk.ImageFileReader()
    reader.SetFileName(str(f))
    try:
        reader.ReadImageInformation()
    except RuntimeError:
        return None

    def meta(key: str) -> Optional[str]:
        return reader.GetMetaData(key).strip() if reader.HasMetaDataKey(key) else None

    pos, ori = meta("0020|0032"), meta("0020|0037")
    if pos is None or ori is None:
        return None
    o = np.array([float(v) for v in ori.split("\\")])
    where = float(np.array([float(v) for v in pos.split("\\")]) @ np.cross(o[:3], o[3:6]))
    return {
        "where": where,
        "trigger": _float_or_none(meta("0018|1060")),
        "instance": _float_or_none(meta("0020|0013")) or 0.0,
        "rr": positive(meta("0018|1062")),
    }


def _float_or_none(text: Optional[str]) -> Optional[float]:
    try:
        f = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    return f if f is not None and math.isfinite(f) else None


def _dicom_info(folder: Path) -> CineInfo:
    heads = [h for h in (_dicom_header(f) for f in _dicom_files(folder)) if h is not None]
    if not heads:
        return CineInfo(1)
    heads.sort(key=lambda h: h["where"])
    groups: List[List[dict]] = []
    for h in heads:
        if not groups or abs(h["where"] - groups[-1][-1]["where"]) > 1e-3:
            groups.append([])
        groups[-1].append(h)
    frames = min(len(g) for g in groups)
    if frames < 2:
        return CineInfo(1)
    rr = next((h["rr"] for h in heads if h["rr"] is not None), None)
    for g in groups:
        if all(h["trigger"] is not None for h in g):
            times = tuple(sorted(h["trigger"] for h in g))[:frames]
            step = positive(np.median(np.diff(times)))
            return CineInfo(frames, step, times, rr, "DICOM TriggerTime")
    return CineInfo(frames, None, None, rr, "DICOM NominalInterval" if rr else "")
