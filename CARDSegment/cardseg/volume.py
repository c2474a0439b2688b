"""Reading and writing image volumes with their geometry (SimpleITK).

Arrays are in SimpleITK order ``(Z, Y, X)`` = ``(k, j, i)``: a slice is one ``(j, i)`` plane of
the image's third axis, taken as it is stored (no reorientation).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import SimpleITK as sitk

from .errors import CardsegError

#: smallest in-plane size (pixels) accepted as an image rather than a mistake
MIN_INPLANE = 16

_SUPPORTED = {
    sitk.sitkUInt8, sitk.sitkInt8, sitk.sitkUInt16, sitk.sitkInt16, sitk.sitkUInt32, sitk.sitkInt32,
    sitk.sitkUInt64, sitk.sitkInt64, sitk.sitkFloat32, sitk.sitkFloat64,
}


@dataclass
class Volume:
    """A 3D scalar image: ``array (Z, Y, X)`` float32 plus its geometry (x, y, z order)."""

    array: np.ndarray
    spacing: tuple
    origin: tuple
    direction: tuple

    @property
    def shape(self):
        return self.array.shape

    def ijk_to_lps(self) -> np.ndarray:
        """4x4 matrix from voxel index (i, j, k) to physical LPS coordinates (mm)."""
        d = np.asarray(self.direction, dtype=float).reshape(3, 3)
        m = np.eye(4)
        m[:3, :3] = d * np.asarray(self.spacing, dtype=float)[None, :]
        m[:3, 3] = self.origin
        return m

    def to_image(self, array: Optional[np.ndarray] = None, is_vector: bool = False) -> sitk.Image:
        """A SimpleITK image of ``array`` (default: this volume's) on this volume's grid.

        array: ``(Z, Y, X)`` or, with ``is_vector``, ``(Z, Y, X, C)``.
        """
        img = sitk.GetImageFromArray(self.array if array is None else array, isVector=is_vector)
        img.SetSpacing(self.spacing)
        img.SetOrigin(self.origin)
        img.SetDirection(self.direction)
        return img

    @classmethod
    def from_image(cls, img: sitk.Image) -> "Volume":
        return cls(
            array=sitk.GetArrayFromImage(img).astype(np.float32, copy=False),
            spacing=tuple(img.GetSpacing()),
            origin=tuple(img.GetOrigin()),
            direction=tuple(img.GetDirection()),
        )


def _read_any(path: str) -> sitk.Image:
    if os.path.isdir(path):
        reader = sitk.ImageSeriesReader()
        series = reader.GetGDCMSeriesIDs(path)
        if not series:
            raise CardsegError(f"{path}: folder holds no DICOM series")
        if len(series) > 1:
            raise CardsegError(f"{path}: folder holds {len(series)} DICOM series; point to a folder with one")
        reader.SetFileNames(reader.GetGDCMSeriesFileNames(path, series[0]))
        try:
            return reader.Execute()
        except RuntimeError as exc:
            raise CardsegError(f"{path}: cannot read the DICOM series ({_first_line(exc)})") from None
    if not os.path.exists(path):
        raise CardsegError(f"{path}: no such file or folder")
    try:
        return sitk.ReadImage(path)
    except RuntimeError as exc:
        raise CardsegError(f"{path}: not a readable image ({_first_line(exc)})") from None


def _first_line(exc: Exception) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    msg = next((ln for ln in lines if "Exception" not in ln and "itk::" not in ln), lines[-1] if lines else "")
    return msg[:200]


def read_volume(path: str, frame: Optional[int] = None) -> Volume:
    """Read NIfTI, NRRD, MHA (any SimpleITK format) or a DICOM series folder as a 3D volume.

    A 2D image becomes one slice; a 4D image needs ``frame`` (0-based, last axis). Raises
    :class:`CardsegError` for anything that is not a finite, non-constant scalar image of a
    plausible size.
    """
    img = _read_any(str(path))
    if img.GetNumberOfComponentsPerPixel() != 1 or img.GetPixelID() not in _SUPPORTED:
        raise CardsegError(f"{path}: unsupported pixel type {img.GetPixelIDTypeAsString()} (need a scalar grey-level image)")
    dim = img.GetDimension()
    if dim == 4:
        n = img.GetSize()[3]
        if frame is None:
            raise CardsegError(f"{path}: 4D image with {n} frames; choose one with --frame N (0..{n - 1})")
        if not 0 <= frame < n:
            raise CardsegError(f"{path}: --frame {frame} is out of range (0..{n - 1})")
        size = list(img.GetSize())
        size[3] = 0
        img = sitk.Extract(img, size=size, index=[0, 0, 0, frame])
    elif frame is not None:
        raise CardsegError(f"{path}: --frame given but the image is {dim}D, not 4D")
    if dim == 2:
        img = sitk.JoinSeries([img])
    elif dim not in (2, 3, 4):
        raise CardsegError(f"{path}: {dim}D images are not supported")
    vol = Volume.from_image(img)
    a = vol.array
    if min(a.shape[1:]) < MIN_INPLANE:
        raise CardsegError(f"{path}: in-plane size {a.shape[2]}x{a.shape[1]} is too small (at least {MIN_INPLANE} pixels)")
    if not np.isfinite(a).all():
        raise CardsegError(f"{path}: image contains NaN or infinite values")
    if float(a.max()) == float(a.min()):
        raise CardsegError(f"{path}: image is constant ({float(a.min()):g} everywhere)")
    if min(vol.spacing) <= 0:
        raise CardsegError(f"{path}: non-positive voxel spacing {vol.spacing}")
    return vol
