"""Reading and writing image volumes with their geometry (SimpleITK).

Arrays are in SimpleITK order ``(Z, Y, X)`` = ``(k, j, i)``: a slice is one ``(j, i)`` plane of
the image's third axis, taken as it is stored (no reorientation).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import SimpleITK as sitk

from cardseg.base.errors import CardsegError


@dataclass
class Volume:
    """A 3D scalar image: ``array (Z, Y, X)`` float32 plus its geometry (x, y, z order).

    ``notes``: what the reader had to choose about the geometry, for the report (e.g.
    ``{"slice_spacing_from": "SliceThickness (0018,0050)"}`` for one DICOM slice; ``study_series``, the
    series of a DICOM study folder in slice order); empty otherwise.
    """

    array: np.ndarray
    spacing: tuple
    origin: tuple
    direction: tuple
    notes: dict = field(default_factory=dict)

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
        from cardseg.io.dicom import SLICE_SPACING_KEY
        from cardseg.io.dicom_study import STUDY_SERIES_KEY

        notes = {}
        if img.HasMetaDataKey(SLICE_SPACING_KEY):
            notes["slice_spacing_from"] = img.GetMetaData(SLICE_SPACING_KEY)
        if img.HasMetaDataKey(STUDY_SERIES_KEY):
            notes["study_series"] = json.loads(img.GetMetaData(STUDY_SERIES_KEY))
        return cls(
            array=sitk.GetArrayFromImage(img).astype(np.float32, copy=False),
            spacing=tuple(img.GetSpacing()),
            origin=tuple(img.GetOrigin()),
            direction=tuple(img.GetDirection()),
            notes=notes,
        )


def read_volume(path: os.PathLike, frame: Optional[int] = None, spacing: Optional[Sequence[float]] = None) -> Volume:
    """Read an input image as a 3D volume after every check of :mod:`cardseg.io.inputs`.

    A 2D image becomes one slice; a 4D image needs ``frame`` (0-based, last axis); ``spacing``
    (mm, x y [z]) replaces the file's. Raises :class:`CardsegError` for anything that is not a
    complete, finite, non-constant scalar image of a plausible size and spacing.
    """
    from cardseg.io.inputs import check_array, read_image

    img = read_image(path, frame, spacing)
    _check_float32_range(img, Path(path))
    vol = Volume.from_image(img)
    check_array(vol.array, Path(path))
    return vol


def _check_float32_range(img: sitk.Image, p: Path) -> None:
    """A float64 image whose finite values do not fit float32 (which cardseg computes in) is
    refused naming the largest magnitude; checked slice by slice, so no second full copy is made."""
    if img.GetPixelID() != sitk.sitkFloat64:
        return
    limit = float(np.finfo(np.float32).max)
    worst = 0.0
    for plane in sitk.GetArrayViewFromImage(img):
        mag = np.abs(plane[np.isfinite(plane)])
        if mag.size:
            worst = max(worst, float(mag.max()))
    if worst > limit:
        raise CardsegError(
            f"{p}: image holds values beyond the float32 range (|value| up to {worst:.3g}, "
            f"float32 ends at {limit:.3g}); cardseg computes in float32, rescale the image"
        )
