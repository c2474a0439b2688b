"""The one place that decides whether a file or folder is an image cardseg may segment.

Accepted: NIfTI (``.nii``, ``.nii.gz``, ``.hdr``/``.img``), NRRD (``.nrrd``, ``.nhdr``),
MetaImage (``.mha``, ``.mhd``), a DICOM series folder (or one DICOM file), a DICOM study folder of
one series per slice location (:mod:`cardseg.io.dicom_study`), and 2D PNG, JPEG,
BMP or TIFF images when the pixel spacing is given (they carry none). Checked before any data
is used, each refusal one line:

* the header's declared size against :data:`~cardseg.io.limits.MAX_FILE_VOXELS` (everything the file holds) before
  any data are read, and the volume to segment against :data:`MAX_VOLUME_VOXELS` (before reading
  for DICOM series, after reading one frame otherwise);
* the data really present against what the header declares (:mod:`cardseg.io.headers`), and no
  NaN or infinite value; for DICOM, a complete, evenly spaced series (:mod:`cardseg.io.dicom`);
* a physical spacing that exists and is plausible for MRI (:data:`INPLANE_SPACING_MM`,
  :data:`SLICE_SPACING_MM`), naming the axis and value; ``spacing`` given by the user
  replaces the file's;
* an orthonormal grid: a direction matrix (NRRD ``space directions``, MetaImage
  ``TransformMatrix``, NIfTI sform/qform, DICOM ``ImageOrientationPatient``) skewed or scaled
  by more than :data:`~cardseg.io.limits.DIRECTION_TOLERANCE` is refused, since the outputs are
  written on an orthonormal grid; within it, the direction is made exactly orthonormal, so every
  output lies on the input's grid;
* a scalar grey-level pixel type, an in-plane size of at least :data:`MIN_INPLANE` pixels, a
  non-constant image, and a 4D image only with a valid ``frame``. A NRRD cine whose frames lie
  along a ``list`` axis (Slicer's sequence files; ITK reads it as vector components) or a ``time``
  axis (which ITK cannot read: it is read as a ``list`` one) is a 4D image like any other; vector
  and colour data (``vector``, ``RGB-color`` ... kinds, an RGB PNG) are refused as not grey-level.

ITK's own warnings are silenced while reading: what matters is checked here and reported in
the one error line.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import struct
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import SimpleITK as sitk

from cardseg.base.errors import CardsegError
from cardseg.base.fd2 import FD2_LOCK
from cardseg.io.headers import INSPECTORS, nrrd_field, read_nifti_head, read_nrrd_header
from cardseg.io.limits import (
    DIRECTION_TOLERANCE,
    INPLANE_SPACING_MM,
    LIMIT_MEMORY_NOTE,
    MAX_FILE_VOXELS,
    MAX_VOLUME_VOXELS,
    MIN_INPLANE,
    SLICE_SPACING_MM,
    nearest_orthonormal,
    skew_degrees,
)

#: ITK readers of 2D raster formats that store no physical pixel spacing
RASTER_IO = {"PNGImageIO": "PNG", "JPEGImageIO": "JPEG", "BMPImageIO": "BMP", "TIFFImageIO": "TIFF"}
_SUPPORTED_PIXELS = {
    sitk.sitkUInt8,
    sitk.sitkInt8,
    sitk.sitkUInt16,
    sitk.sitkInt16,
    sitk.sitkUInt32,
    sitk.sitkInt32,
    sitk.sitkUInt64,
    sitk.sitkInt64,
    sitk.sitkFloat32,
    sitk.sitkFloat64,
}
#: an ITK vector pixel type → the type of its components
_COMPONENT_OF = {
    getattr(sitk, "sitkVector" + n): getattr(sitk, "sitk" + n)
    for n in ("UInt8", "Int8", "UInt16", "Int16", "UInt32", "Int32", "UInt64", "Int64", "Float32", "Float64")
}
#: NRRD axis kinds whose entries are whole images (the frames of a cine, as in Slicer's sequence files): ITK reads
#: such an axis as the components of a vector pixel; every other kind (vector, RGB-color, ...) is pixel data
_FRAME_KINDS = ("list",)
_AXES = ("i (x)", "j (y)", "k (slice)")
#: the header field that holds the axis directions, per ITK reader
_DIRECTION_FIELD = {
    "NrrdImageIO": "NRRD space directions",
    "MetaImageIO": "MetaImage TransformMatrix",
    "NiftiImageIO": "NIfTI sform/qform",
}

sitk.ProcessObject.SetGlobalWarningDisplay(False)


def parse_spacing(text: str) -> tuple:
    """``"1.5,1.5"`` or ``"1.5,1.5,8"`` (mm) → a tuple of floats; one-line error otherwise."""
    try:
        values = tuple(float(v) for v in str(text).replace("x", ",").split(",") if v.strip())
    except ValueError:
        values = ()
    if len(values) not in (2, 3):
        raise CardsegError(f"--spacing {text!r}: give SX,SY or SX,SY,SZ in mm, e.g. 1.5,1.5,8")
    bad = implausible_spacing(values)  # checked here, before any input is read or any case runs
    if bad:
        axis, value, lo, hi = bad
        raise CardsegError(
            f"--spacing {text!r}: axis {_AXES[axis]} {value:g} mm is outside the plausible range "
            f"{lo:g}-{hi:g} mm for MRI"
        )
    return values


def implausible_spacing(spacing: Sequence[float]) -> Optional[tuple]:
    """``(axis, value, low, high)`` of the first spatial axis whose spacing (mm) lies outside the
    plausible MRI range (:data:`~cardseg.io.limits.INPLANE_SPACING_MM`, ``SLICE_SPACING_MM``), or None."""
    for axis, value in enumerate(list(spacing)[:3]):
        lo, hi = INPLANE_SPACING_MM if axis < 2 else SLICE_SPACING_MM
        if not (np.isfinite(value) and lo <= value <= hi):
            return axis, float(value), lo, hi
    return None


def read_image(path: os.PathLike, frame: Optional[int] = None, spacing: Optional[Sequence[float]] = None) -> sitk.Image:
    """Read and check an input (see the module docstring); a 3D :class:`SimpleITK.Image`."""
    p = Path(path)
    if not p.exists():
        raise CardsegError(f"{p}: no such file or folder")
    if p.is_dir():  # a DICOM series, or a study of one series per slice location (cardseg.io.dicom_study)
        from cardseg.io.dicom_study import read_dicom_folder

        img = read_dicom_folder(p, frame, spacing)
        has_spacing = True
    else:
        img, has_spacing, took_frame = _read_file(p, frame, spacing)
        frame = None if took_frame else frame
    img = _as_3d(img, p, frame)
    if spacing is not None:
        sp = list(img.GetSpacing())
        sp[: len(spacing)] = [float(s) for s in spacing]
        check_spacing(sp, p, given=len(spacing))  # before ITK sees it: ITK throws on a zero or negative spacing
        img.SetSpacing(sp)
    elif not has_spacing:
        raise CardsegError(
            f"{p}: a {_raster_name(p)} image carries no physical pixel spacing; give it with --spacing SX,SY (mm)"
        )
    check_spacing(img.GetSpacing(), p, given=len(spacing) if spacing is not None else 0)
    _check_size(img.GetSize(), p)
    return img


def _raster_name(p: Path) -> str:
    return p.suffix.lstrip(".").upper() or "raster"


@contextlib.contextmanager
def _native_stderr_muted():
    """Silence what C libraries (libpng, libjpeg, libtiff) print to file descriptor 2 while a
    reader runs: a damaged file must end in our one-line error, not in their messages too."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (embedded, captured): nothing to mute
        yield
        return
    with FD2_LOCK:  # fd 2 is the process's: one redirection at a time (cardseg.base.fd2)
        sys.stderr.flush()
        saved = os.dup(fd)
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), fd)
                yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)


#: header formats that cardseg reads itself, by file name ending (for a reason ITK does not give)
_HEADER_SUFFIXES = {
    ".nhdr": "NrrdImageIO",
    ".nrrd": "NrrdImageIO",
    ".mhd": "MetaImageIO",
    ".mha": "MetaImageIO",
    ".hdr": "NiftiImageIO",
    ".img": "NiftiImageIO",
}


def _inspect_before_itk(p: Path, io: Optional[str] = None, *start) -> None:
    """For the formats whose header may name a separate data file, cardseg's own header reader
    runs before ITK's: ITK blocks on a data file that is a FIFO and calls a missing one merely
    unreadable; this names the data file and what it is. Anything else is left to ITK.
    ``start``: what the caller read of the file's start already (a NIfTI's, :func:`read_nifti_head`)."""
    io = io or _HEADER_SUFFIXES.get(p.suffix.lower())
    if io is None:
        return
    try:
        INSPECTORS[io](p, *start)
    except CardsegError:
        raise
    except Exception:  # noqa: BLE001 - no better reason than the generic one
        return


def _read_file(p: Path, frame: Optional[int], user_spacing: Optional[Sequence[float]] = None):
    with _nrrd_time_axis_as_list(p) as source:
        return _read_via(p, source, frame, user_spacing)


@contextlib.contextmanager
def _nrrd_time_axis_as_list(p: Path):
    """ITK cannot read a NRRD with a ``time`` axis beside two or three space axes as frames (it takes it for
    a space axis, or counts four domain axes in a 3D space): for such a file, yield a detached header in a
    temporary folder that calls that axis a ``list`` (frames, as in Slicer's sequence files) and points to the
    file's own data; otherwise yield ``p`` itself."""
    lines, fields, offset = [], {}, -1
    if p.suffix.lower() in (".nrrd", ".nhdr") and p.is_file():  # not a FIFO: reading it would block
        try:
            lines, fields, offset = read_nrrd_header(p)  # comments and key:=value pairs are no fields
        except (OSError, CardsegError):  # not a NRRD: ITK and the header check say so
            pass
    kinds, data = fields.get("kinds", "").split(), fields.get("data file") or fields.get("datafile")
    if (
        len(kinds) not in (3, 4)
        or kinds.count("time") != 1
        or (data or "").startswith("LIST")
        or "%" in (data or "")
        or (not data and offset < 0)
        or not fields.get("line skip", "0").strip().isdigit()
    ):
        yield p
        return
    skip = int(fields.get("line skip", "0")) + (0 if data else len(lines) + 1)  # attached: past the header too
    keep = [
        ln.encode("latin-1")
        for ln in lines
        if (nrrd_field(ln) or ("",))[0] not in ("kinds", "data file", "datafile", "line skip")
    ]
    keep += [
        b"kinds: " + " ".join("list" if k == "time" else k for k in kinds).encode(),
        b"line skip: %d" % skip,
        b"data file: " + os.fsencode(os.path.abspath(p.parent / data if data else p)),
    ]
    with tempfile.TemporaryDirectory(prefix="cardseg-nrrd-") as tmp:
        header = Path(tmp) / "frames.nhdr"
        header.write_bytes(b"\n".join(keep) + b"\n\n")
        yield header


def _read_via(p: Path, source: Path, frame: Optional[int], user_spacing: Optional[Sequence[float]] = None):
    """Read ``p`` (through the header ``source``, where that is not ``p``: see :func:`_nrrd_time_axis_as_list`)."""
    reader = sitk.ImageFileReader()
    reader.SetFileName(str(source))
    _inspect_before_itk(p)
    try:
        with _native_stderr_muted():
            reader.ReadImageInformation()
    except RuntimeError as exc:
        if not os.access(p, os.R_OK):
            raise CardsegError(f"{p}: cannot be read (permission denied)") from None
        start = read_nifti_head(p) if p.name.lower().endswith((".nii", ".nii.gz")) else None
        if start is not None and start.order is not None:  # it starts as a NIfTI (sizeof_hdr 348 or 540): NIfTI-2,
            _inspect_before_itk(p, "NiftiImageIO", start)  # or a header fault to name, from that one read; else junk
        reason = re.search(r"ITK ERROR: (.+)", str(exc))  # e.g. a NIfTI whose axes are not orthonormal
        raise CardsegError(
            f"{p}: not a readable image (NIfTI, NRRD, MHA, DICOM; PNG/JPEG/BMP/TIFF with --spacing)"
            + (f": {reason.group(1).strip()}" if reason else "")
        ) from None
    io = reader.GetImageIO() or sitk.ImageFileReader.GetImageIOFromFileName(str(p))
    size = tuple(reader.GetSize())
    frames = _frames_as_components(reader, io)
    if frames:  # a cine whose frames ITK reads as components: its size as a 4D image's (x, y, z, frames)
        size = size + (1,) * (3 - len(size)) + (frames,)
    if (reader.GetNumberOfComponents() != 1 and not frames) or (
        _COMPONENT_OF.get(reader.GetPixelID()) if frames else reader.GetPixelID()
    ) not in _SUPPORTED_PIXELS:
        raise CardsegError(
            f"{p}: unsupported pixel type {sitk.GetPixelIDValueAsString(reader.GetPixelID())} "
            "(need a scalar grey-level image)"
        )
    has_spacing = True
    if io == "GDCMImageIO":  # one DICOM file: its own position, orientation and spacings, as in a series
        from cardseg.io.dicom import read_dicom_file

        _check_file_voxels(math.prod(int(n) for n in size), p)
        return read_dicom_file(p, frame, user_spacing), True, False
    direction = _orthonormal(reader.GetDirection(), p, io)
    if io in INSPECTORS:
        try:
            declared, check_data = INSPECTORS[io](p)
        except (ValueError, struct.error, IndexError, OSError) as exc:
            raise CardsegError(f"{p}: malformed {io.replace('ImageIO', '')} header ({_first_line(exc)})") from None
        _check_file_voxels(declared.voxels, p)
        if declared.spacing is not None:
            # the header's own values (before a reader turns 0 into 1 mm), where the user gave none
            own = list(declared.spacing)[:3]
            given = list(user_spacing or [])
            check_spacing(
                given + own[len(given) :],
                p,
                header=io == "NiftiImageIO" and not given,
                given=len(given),
                unit=(declared.unit, declared.mm_per_unit),
            )
        else:
            has_spacing = False
        _check_frame_before_reading(size, p, frame)
        check_data()
    elif io in RASTER_IO:
        _check_file_voxels(math.prod(int(n) for n in size), p)
        has_spacing = False
    else:
        raise CardsegError(
            f"{p}: {io.replace('ImageIO', '')} files are not supported "
            "(NIfTI, NRRD, MHA, DICOM; PNG/JPEG/BMP/TIFF with --spacing)"
        )
    try:
        with _native_stderr_muted():
            img = reader.Execute()
    except RuntimeError as exc:
        raise CardsegError(f"{p}: image data cannot be read ({_first_line(exc)})") from None
    if frames:
        img = sitk.VectorIndexSelectionCast(img, frame)
    img.SetDirection(direction)
    return img, has_spacing, bool(frames)


def _frames_as_components(reader: sitk.ImageFileReader, io: str) -> int:
    """How many frames ITK read as the components of a vector pixel: those of a NRRD axis whose kind is in
    :data:`_FRAME_KINDS` (a cine; frames are chosen with ``frame`` as in a 4D image); 0 for anything else."""
    key = "NRRD_kinds[pixel]"
    if io != "NrrdImageIO" or reader.GetNumberOfComponents() < 2 or not reader.HasMetaDataKey(key):
        return 0
    return reader.GetNumberOfComponents() if reader.GetMetaData(key).strip().lower() in _FRAME_KINDS else 0


def _orthonormal(direction: Sequence[float], p: Path, io: str) -> tuple:
    """The image's direction made exactly orthonormal, or a one-line refusal naming the header
    field when it is skewed or scaled beyond :data:`DIRECTION_TOLERANCE`."""
    exact = nearest_orthonormal(direction)
    if exact is None:
        n = int(round(np.sqrt(len(direction))))
        lengths = ", ".join(f"{v:.6g}" for v in np.linalg.norm(np.reshape(direction, (n, n)), axis=0))
        raise CardsegError(
            f"{p}: {_DIRECTION_FIELD.get(io, 'direction matrix')} is not orthonormal (axis lengths "
            f"{lengths}, {skew_degrees(direction):.3g} degrees from orthogonal; tolerance "
            f"{DIRECTION_TOLERANCE:g}); cardseg writes its outputs on an orthogonal grid, so it cannot "
            "return them where this image lies"
        )
    return tuple(float(v) for v in exact.ravel())


def _first_line(exc: Exception) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    msg = next((ln for ln in lines if "Exception" not in ln and "itk::" not in ln), lines[-1] if lines else "")
    return msg[:160]


def _check_file_voxels(n: int, p: Path) -> None:
    if n > MAX_FILE_VOXELS:
        raise CardsegError(
            f"{p}: the file declares {n:,d} voxels; the limit is {MAX_FILE_VOXELS:,d} "
            f"(about {MAX_FILE_VOXELS * 4 >> 20} MB as float32)"
        )


def _check_size(size: tuple, p: Path) -> None:
    n = math.prod(int(n) for n in size)
    if n > MAX_VOLUME_VOXELS:
        raise CardsegError(
            f"{p}: the volume to segment has {n:,d} voxels; the limit is {MAX_VOLUME_VOXELS:,d} ({LIMIT_MEMORY_NOTE})"
        )
    if min(size[:2]) < MIN_INPLANE:
        raise CardsegError(f"{p}: in-plane size {size[0]}x{size[1]} is too small (at least {MIN_INPLANE} pixels)")


def _check_frame_before_reading(size: tuple, p: Path, frame: Optional[int]) -> None:
    if len(size) == 4:
        if frame is None:
            raise CardsegError(
                f"{p}: 4D image with {size[3]} frames; choose one with --frame N or a batch "
                f"manifest's frame column (0..{size[3] - 1})"
            )
        if not 0 <= frame < size[3]:
            raise CardsegError(f"{p}: --frame {frame} is out of range (0..{size[3] - 1})")
    elif frame is not None:
        raise CardsegError(f"{p}: --frame given but the image is {len(size)}D, not 4D")


def check_spacing(
    spacing: Sequence[float], p: Path, header: bool = False, given: int = 0, unit: tuple = ("mm", 1.0)
) -> None:
    """Each spatial axis' spacing (mm) within the plausible MRI range; the message names axis and value.
    ``given``: how many leading axes the user's ``--spacing`` set (their message says so); ``unit``: the
    header's unit of length and mm per unit (a NIfTI in metres names its pixdim in metres too)."""
    bad = implausible_spacing(spacing)
    if bad is None:
        return
    axis, value, lo, hi = bad
    if axis < given:
        raise CardsegError(
            f"{p}: --spacing gives axis {_AXES[axis]} {value:g} mm, outside the plausible "
            f"range {lo:g}-{hi:g} mm for MRI"
        )
    where = f"pixdim[{axis + 1}]" if header else "spacing"
    value_text = f"{value:g} mm" if unit[0] == "mm" else f"{value / unit[1]:g} {unit[0]} ({value:g} mm)"
    raise CardsegError(
        f"{p}: {where} of axis {_AXES[axis]} is {value_text}, outside the plausible range "
        f"{lo:g}-{hi:g} mm for MRI (give the right one with --spacing)"
    )


def _as_3d(img: sitk.Image, p: Path, frame: Optional[int]) -> sitk.Image:
    dim = img.GetDimension()
    if dim == 4:
        _check_frame_before_reading(tuple(img.GetSize()), p, frame)
        size = list(img.GetSize())
        size[3] = 0
        return sitk.Extract(img, size=size, index=[0, 0, 0, frame])
    if p.is_file():
        _check_frame_before_reading(tuple(img.GetSize()), p, frame)
    if dim == 2:
        return sitk.JoinSeries([img])
    if dim != 3:
        raise CardsegError(f"{p}: {dim}D images are not supported")
    return img


#: the smallest share of voxels that must differ from the image's commonest value: an MR image
#: has noise or anatomy nearly everywhere; one of a few bright voxels on a blank field is not one
MIN_SIGNAL_FRACTION = 0.01


def check_array(a: np.ndarray, p: Path) -> None:
    """Values of the volume ``(Z, Y, X)``: finite, not constant, and with signal in at least
    :data:`MIN_SIGNAL_FRACTION` of its voxels (a blank field would be segmented as a heart)."""
    if not np.isfinite(a).all():
        raise CardsegError(f"{p}: image contains NaN or infinite values")
    if float(a.max()) == float(a.min()):
        raise CardsegError(f"{p}: image is constant ({float(a.min()):g} everywhere)")
    values, counts = np.unique(a, return_counts=True)
    background = values[np.argmax(counts)]
    differing = a.size - int(counts.max())
    if differing < MIN_SIGNAL_FRACTION * a.size:
        raise CardsegError(
            f"{p}: image holds almost no signal: {differing:,d} of {a.size:,d} voxels differ from {float(background):g}"
        )
