"""Where a NIfTI-1 header places its image, checked before it is trusted: an sform that ITK would not read as
written (skewed, or scaled against ``pixdim``), and an sform and qform (both set) that place the image apart, are
refused in one line. :func:`cardseg.io.headers.inspect_nifti` calls these on the header fields it parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence, Tuple

import numpy as np

from cardseg.base.errors import CardsegError
from cardseg.io.limits import (
    DIRECTION_TOLERANCE,
    INPLANE_SPACING_MM,
    SFORM_QFORM_DIRECTION,
    SFORM_QFORM_ORIGIN_MM,
    SLICE_SPACING_MM,
    orthonormal_error,
    skew_degrees,
)


def _lengths(values: Sequence[float], unit: str, mm_per_unit: float) -> str:
    """``"1.6, 1.4, 8 mm"``; in a file that writes lengths in another unit, that unit first and mm after."""
    text = ", ".join(f"{v:g}" for v in values)
    return f"{text} mm" if unit == "mm" else f"{text} {unit} ({', '.join(f'{v * mm_per_unit:g}' for v in values)} mm)"


def check_sform(
    path: Path, srow: Tuple[float, ...], pixdim: Tuple[float, ...], axes: int, unit: Tuple[str, float] = ("mm", 1.0)
) -> None:
    """A NIfTI sform that ITK would not read as written is refused: ITK falls back to the qform when the sform is
    skewed and takes the spacing from ``pixdim`` whatever the sform scales say. ``unit``: the header's unit of
    length and mm per unit (``xyzt_units``); a refusal gives lengths in it and in mm."""
    m = np.asarray(srow, dtype=float).reshape(3, 4)[:, :axes]
    norms = np.linalg.norm(m, axis=0)
    if not np.isfinite(m).all() or (norms == 0).any():
        raise CardsegError(f"{path}: NIfTI sform (srow_x/y/z) has a zero or non-finite axis")
    if orthonormal_error(m / norms) > DIRECTION_TOLERANCE:
        raise CardsegError(
            f"{path}: NIfTI sform (srow_x/y/z) is skewed: its axes are {skew_degrees(m):.3g} degrees "
            "from orthogonal; cardseg writes its outputs on an orthogonal grid, so it cannot "
            "return them where this image lies"
        )
    own = np.abs(np.asarray(pixdim[1 : axes + 1], dtype=float))
    # an implausible pixdim is refused by the spacing check, naming it (or replaced by --spacing)
    plausible = [
        lo <= v * unit[1] <= hi for v, (lo, hi) in zip(own, (INPLANE_SPACING_MM, INPLANE_SPACING_MM, SLICE_SPACING_MM))
    ]
    if any(ok and abs(n - v) > DIRECTION_TOLERANCE * v for ok, n, v in zip(plausible, norms, own)):
        raise CardsegError(
            f"{path}: NIfTI sform (srow_x/y/z) scales the axes by {_lengths(norms, *unit)} but pixdim "
            f"says {_lengths(own, *unit)}; the file contradicts itself"
        )


def qform_matrix(quatern: Tuple[float, ...], qfac: float) -> np.ndarray:
    """The rotation (columns: axis directions) of a NIfTI qform, as the NIfTI-1 standard defines it."""
    b, c, d = (float(v) for v in quatern[:3])
    a = 1.0 - (b * b + c * c + d * d)
    if a < 1e-7:  # a 180-degree turn: (b, c, d) is a unit vector up to float32 rounding (as nifti1_io does)
        norm = np.sqrt(b * b + c * c + d * d) or 1.0
        b, c, d, a = b / norm, c / norm, d / norm, 0.0
    else:
        a = np.sqrt(a)
    r = np.array(
        [
            [a * a + b * b - c * c - d * d, 2 * (b * c - a * d), 2 * (b * d + a * c)],
            [2 * (b * c + a * d), a * a + c * c - b * b - d * d, 2 * (c * d - a * b)],
            [2 * (b * d - a * c), 2 * (c * d + a * b), a * a + d * d - c * c - b * b],
        ]
    )
    r[:, 2] *= -1.0 if qfac < 0 else 1.0
    return r


def check_qform_agrees(
    path: Path, srow: Tuple[float, ...], quatern: Tuple[float, ...], qfac: float, axes: int, mm_per_unit: float
) -> None:
    """Both sform and qform set (codes > 0) must place the image alike: ITK reads one, other software (nibabel,
    Slicer's other readers) the other, so outputs written where one says would lie elsewhere for the rest."""
    m = np.asarray(srow, dtype=float).reshape(3, 4)
    s_dirs = m[:, :axes] / np.linalg.norm(m[:, :axes], axis=0)
    q_dirs = qform_matrix(quatern, qfac)[:, :axes]
    apart = float(np.linalg.norm(m[:, 3] - np.asarray(quatern[3:6], dtype=float))) * mm_per_unit
    turned = float(np.abs(s_dirs - q_dirs).max()) if np.isfinite(q_dirs).all() else float("inf")
    if apart > SFORM_QFORM_ORIGIN_MM or turned > SFORM_QFORM_DIRECTION:
        angle = round(np.degrees(2 * np.arcsin(min(float(np.linalg.norm(s_dirs - q_dirs, axis=0).max()) / 2, 1.0))), 4)
        raise CardsegError(
            f"{path}: NIfTI sform and qform (both set) disagree: their origins are {apart:.3g} mm "
            f"apart and their axes up to {angle:.3g} degrees; readers differ in which they take, so "
            "the outputs would not lie where the input does for all of them; keep the right one and "
            "set the other's code to 0 (sform_code or qform_code)"
        )
