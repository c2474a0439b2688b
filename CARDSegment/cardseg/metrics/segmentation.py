"""Region-of-interest, agreement reports (the score itself, paper Eq. 5, is
:func:`cardseg.method.agreement.agreement_score`) and connectivity (numpy arrays).

Volumes here are numpy arrays in SimpleITK order ``(Z, Y, X)`` = ``(k, j, i)``: slices are the
first axis and every 2D operation works on the ``(j, i)`` planes.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import numpy as np
from scipy import ndimage

from cardseg.method.agreement import agreement_score

LN2 = math.log(2.0)


def disk(radius: int) -> np.ndarray:
    """Binary disk structuring element of the given radius in pixels, ``(2r+1, 2r+1)``."""
    r = int(radius)
    yy, xx = np.mgrid[-r : r + 1, -r : r + 1]
    return (yy * yy + xx * xx) <= r * r


def roi_mask(foreground: np.ndarray, radius: int) -> np.ndarray:
    """Foreground dilated per slice in 2D by a disk of ``radius`` pixels.

    foreground: bool ``(Z, Y, X)`` or ``(Y, X)`` → bool of the same shape. The same pixels as a
    binary dilation with :func:`disk` (a pixel joins when some foreground pixel of its slice lies
    within ``radius``), computed from the Euclidean distance transform, whose cost does not grow
    with the radius.
    """
    fg = np.asarray(foreground, dtype=bool)
    if radius <= 0:
        return fg.copy()
    if fg.ndim == 2:
        return _dilate_2d(fg, radius)
    return np.stack([_dilate_2d(s, radius) for s in fg])


def roi_mask_square(foreground: np.ndarray, size: int) -> np.ndarray:
    """Foreground dilated per slice in 2D by a ``size`` x ``size`` square kernel (the literal
    reading of "a 10-pixel kernel"; for an even size the kernel reaches ``size // 2 - 1`` pixels
    towards lower indices and ``size // 2`` towards higher ones, scipy's origin convention).

    foreground: bool ``(Z, Y, X)`` or ``(Y, X)`` → bool of the same shape.
    """
    fg = np.asarray(foreground, dtype=bool)
    if size <= 1:
        return fg.copy()
    footprint = (1, size, size) if fg.ndim == 3 else (size, size)
    return ndimage.maximum_filter(fg.astype(np.uint8), size=footprint, mode="constant", cval=0).astype(bool)


def _dilate_2d(fg: np.ndarray, radius: int) -> np.ndarray:
    if not fg.any():
        return fg.copy()
    # exact: distances are square roots of integers, and sqrt(n) <= r exactly when n <= r * r
    return ndimage.distance_transform_edt(~fg) <= radius


def agreement_report(tac: np.ndarray, labels: np.ndarray, radius: int, class_names: List[str]) -> Dict[str, object]:
    """Agreement over the predicted foreground's ROI: whole volume, per slice and per class.

    tac: ``(Z, Y, X)``; labels: predicted integer labels ``(Z, Y, X)`` (0 = background).
    Per class, the ROI is that class's predicted mask dilated the same way.
    """
    roi = roi_mask(labels > 0, radius)
    per_slice = [agreement_score(tac[z], roi[z]) for z in range(tac.shape[0])]
    per_class = {}
    for k, name in enumerate(class_names):
        if k == 0:
            continue
        per_class[name] = agreement_score(tac, roi_mask(labels == k, radius))
    return {"agreement": agreement_score(tac, roi), "agreement_per_slice": per_slice, "agreement_per_class": per_class}


def slice_lcc_ratios(foreground: np.ndarray) -> list:
    """Paper Fig. 2a's LCC ratio per 2D slice: foreground ``(Z, Y, X)`` bool → one value per slice
    (``|largest 4-connected component| / |foreground|`` of that slice; None where it is empty)."""
    fg = np.asarray(foreground, dtype=bool)
    return [lcc_ratio(fg[z]) for z in range(fg.shape[0])]


def mean_slice_lcc_ratio(foreground: np.ndarray) -> Optional[float]:
    """Mean of :func:`slice_lcc_ratios` over the slices with foreground; None if there are none."""
    vals = [v for v in slice_lcc_ratios(foreground) if v is not None]
    return float(np.mean(vals)) if vals else None


def lcc_ratio(foreground: np.ndarray) -> Optional[float]:
    """``|largest connected component| / |foreground|`` (face connectivity, in as many dimensions
    as the array has); None if empty."""
    fg = np.asarray(foreground, dtype=bool)
    total = int(fg.sum())
    if total == 0:
        return None
    lab, n = ndimage.label(fg)
    sizes = np.bincount(lab.ravel())[1:]
    return float(sizes.max() / total)
