"""Ventricular volumes for the cardiac indices, with two anatomical corrections (pure; no I/O).

A ventricle is one connected body that runs from the base to the apex without skipping a
slice. Two kinds of segmentation error break that and cost whole slices of volume, which no
interval should have to absorb (both seen on the validation subjects, never on test):

1. **stray islands** (:func:`largest_component`): a blob of "LV" below the apex or above the
   base, not connected to the ventricle (3D, face connectivity, a one-slice gap bridged where the
   slices above and below overlap in-plane), is dropped (set to background);
2. **gaps** (:func:`fill_slice_gaps`): an interior slice whose segmented area falls below
   ``gap_fraction`` of both neighbours' smaller area (the structure vanishes between two slices
   that hold it) is given the mean of its neighbours' areas. Only the volume is corrected, not
   the label map.

Shapes: label maps ``(Z, Y, X)`` (slices first, SimpleITK order), spacing ``(x, y, z)`` mm.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import numpy as np
from scipy import ndimage

#: the structures whose stray islands are dropped and whose slice gaps are filled (by default)
CORRECTED = ("LV", "RV")
#: an interior slice below this fraction of both neighbours' smaller area is a gap
GAP_FRACTION = 0.25


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 3D face-connected component of a boolean mask ``(Z, Y, X)`` (ties: the first),
    a one-slice gap counting as connected where the slices on both sides overlap in-plane (such a
    gap is a segmentation miss inside the ventricle, :func:`fill_slice_gaps`, not a separation)."""
    m = np.asarray(mask, dtype=bool)
    bridged = m.copy()
    if m.shape[0] > 2:
        bridged[1:-1] |= m[:-2] & m[2:]
    lab, n = ndimage.label(bridged)
    if n <= 1:
        return m.copy()
    sizes = np.bincount(lab[m].ravel(), minlength=n + 1)[1:]
    return m & (lab == (1 + int(np.argmax(sizes))))


def drop_islands(labels: np.ndarray, classes: Sequence[int]) -> np.ndarray:
    """A copy of ``labels`` ``(Z, Y, X)`` with every class of ``classes`` cut to its largest 3D
    component; the rest of that class becomes background (0)."""
    out = np.array(labels, copy=True)
    for k in classes:
        m = out == k
        out[m & ~largest_component(m)] = 0
    return out


def fill_slice_gaps(areas: Sequence[float], gap_fraction: float = GAP_FRACTION) -> np.ndarray:
    """Per-slice areas ``(Z,)`` with interior gaps filled: slice ``z`` strictly between the first and
    last non-empty slices, with ``areas[z] < gap_fraction * min(areas[z-1], areas[z+1])``, gets
    ``(areas[z-1] + areas[z+1]) / 2`` (left to right, each test on the areas as corrected so far)."""
    a = np.array(areas, dtype=float)
    nz = np.nonzero(a > 0)[0]
    if nz.size < 2 or gap_fraction <= 0:
        return a
    for z in range(nz[0] + 1, nz[-1]):
        smaller = min(a[z - 1], a[z + 1])
        if smaller > 0 and a[z] < gap_fraction * smaller:
            a[z] = 0.5 * (a[z - 1] + a[z + 1])
    return a


def slice_areas(labels: np.ndarray, k: int) -> np.ndarray:
    """Voxel count of class ``k`` on every slice: ``(Z,)`` from ``(Z, Y, X)``."""
    lab = np.asarray(labels)
    return (lab == k).reshape(lab.shape[0], -1).sum(axis=1).astype(float)


def corrected_volumes(
    labels: np.ndarray, spacing: Sequence[float], class_names: Sequence[str], correct: Optional[Mapping] = None
) -> Dict[str, float]:
    """``{structure: ml}`` for every named foreground class of ``labels`` ``(Z, Y, X)``.

    correct: ``{"islands": [names], "gaps": [names], "gap_fraction": f}`` (default: both
    corrections for :data:`CORRECTED`); ``{}`` or ``None`` values switch a correction off.
    Classes not named stay as segmented.
    """
    correct = (
        {"islands": list(CORRECTED), "gaps": list(CORRECTED), "gap_fraction": GAP_FRACTION}
        if correct is None
        else correct
    )
    names = list(class_names)
    voxel_ml = float(np.prod([float(s) for s in spacing])) / 1000.0
    islands = [names.index(n) for n in (correct.get("islands") or []) if n in names]
    lab = drop_islands(labels, islands) if islands else np.asarray(labels)
    gaps = set(correct.get("gaps") or [])
    fraction = float(correct.get("gap_fraction", GAP_FRACTION))
    out = {}
    for k, name in enumerate(names):
        if k == 0:
            continue
        areas = slice_areas(lab, k)
        if name in gaps:
            areas = fill_slice_gaps(areas, fraction)
        out[name] = float(areas.sum()) * voxel_ml
    return out
