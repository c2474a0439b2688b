"""Moving the network's field of view onto the heart when the centred grid cuts it off.

The networks see each slice on an ``N x N`` grid of the bundle's pixel spacing, centred on the
slice. A slice with a larger field of view whose heart lies off-centre loses the part beyond the
grid: that part is background, with full confidence, whatever the image shows.

The engine therefore checks the first run's prediction (:func:`recentre_offset`): when the
largest predicted heart component comes within :data:`MARGIN_MM` of the edge of the field of view
on a side where the image goes on, the whole volume is run once more on a grid centred on that
component (one offset for every slice, so the slices stay aligned). Near the edge, not on it:
where the grid cuts a ventricle off, the network often predicts nothing of it at all, and the
rest of the heart stops short of the edge. A heart well inside the grid costs nothing more.

Which of the two runs is kept: the one whose networks agree more (the agreement score of
``report.json``, paper Eq. 5, each over its own predicted heart); a grid centred on the heart is
not always the better one. The documentation's design notes say why and how the rule was chosen.

Whether a bundle does this: its ``field_of_view`` block (``{"recentre": true, "margin_mm": 15}``;
absent: off), or ``$CARDSEG_RECENTRE`` (``1``/``0``) over it.

Arrays are ``(Z, Y, X)`` label maps and ``(Y, X)`` masks; the functions are pure (no files).
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, Tuple

import numpy as np
from scipy import ndimage

from cardseg.base.errors import CardsegError

#: how close (mm, in-plane) to the edge of the field of view the predicted heart may come
MARGIN_MM = 15.0
#: predicted heart voxels that close to the edge before the grid is moved
MIN_EDGE_VOXELS = 10
#: a move shorter than this many slice pixels is not worth another run
MIN_SHIFT_PX = 2.0


def recentre_margin(
    config: Mapping, override: Optional[bool] = None, environ: Optional[Mapping[str, str]] = None
) -> Optional[float]:
    """The margin (mm) within which a heart near the edge moves the grid, or ``None`` when
    recentring is off: ``override`` if given, else ``$CARDSEG_RECENTRE`` (``1``/``0``), else the
    bundle ``config``'s ``field_of_view.recentre`` (default off)."""
    block = config.get("field_of_view") or {}
    on = override
    if on is None:
        value = (os.environ if environ is None else environ).get("CARDSEG_RECENTRE", "").strip().lower()
        if value in ("1", "true", "on", "yes"):
            on = True
        elif value in ("0", "false", "off", "no"):
            on = False
        elif value:
            raise CardsegError(f"CARDSEG_RECENTRE must be 1 or 0 (got {value!r})")
    if on is None:
        on = bool(block.get("recentre", False))
    return float(block.get("margin_mm", MARGIN_MM)) if on else None


def fov_edge(fov: np.ndarray) -> np.ndarray:
    """Bool ``(Y, X)``: pixels of the field of view with a neighbour outside it that is still
    inside the image (where the image goes on beyond the grid). Empty when the grid covers the
    whole slice."""
    fov = np.asarray(fov, bool)
    outside = ~fov
    if not outside.any():
        return np.zeros_like(fov)
    return fov & ndimage.binary_dilation(outside, structure=np.ones((3, 3), bool))


def largest_heart(labels: np.ndarray) -> np.ndarray:
    """Bool ``(Z, Y, X)``: the largest 3D connected component (26-connected) of the predicted
    foreground (every label above 0); empty without foreground."""
    fg = np.asarray(labels) > 0
    if not fg.any():
        return fg
    lab, n = ndimage.label(fg, structure=np.ones((3, 3, 3), bool))
    if n == 1:
        return fg
    sizes = np.bincount(lab.ravel(), minlength=n + 1)
    sizes[0] = 0
    return lab == int(np.argmax(sizes))


def recentre_offset(
    labels: np.ndarray,
    fov: np.ndarray,
    spacing_xy: Tuple[float, float],
    current: Tuple[float, float] = (0.0, 0.0),
    margin_mm: float = MARGIN_MM,
    min_edge_voxels: int = MIN_EDGE_VOXELS,
) -> Optional[Tuple[float, float]]:
    """The grid offset ``(rows, cols)`` in slice pixels (from the slice centre) that centres the
    network grid on the predicted heart, or ``None`` when the grid need not move.

    labels: ``(Z, Y, X)`` the prediction made with the grid at ``current``; fov: ``(Y, X)`` that
    grid's field of view (:meth:`cardseg.io.preprocess.SliceGrid.field_of_view`); spacing_xy:
    in-plane ``(x, y)`` mm. The grid moves when at least ``min_edge_voxels`` voxels of the largest
    heart component lie within ``margin_mm`` of the edge of the field of view where the image goes
    on (:func:`fov_edge`), by at least :data:`MIN_SHIFT_PX`; the new centre is that component's
    centroid.
    """
    labels = np.asarray(labels)
    edge = fov_edge(fov)
    if not edge.any():
        return None
    heart = largest_heart(labels)
    near = ndimage.distance_transform_edt(~edge, sampling=(float(spacing_xy[1]), float(spacing_xy[0]))) <= margin_mm
    if int((heart & near[None]).sum()) < min_edge_voxels:
        return None
    _, ys, xs = np.nonzero(heart)
    ny, nx = labels.shape[1:]
    target = (float(ys.mean()) - (ny - 1) / 2, float(xs.mean()) - (nx - 1) / 2)
    if np.hypot(target[0] - float(current[0]), target[1] - float(current[1])) < MIN_SHIFT_PX:
        return None
    return (round(target[0], 3), round(target[1], 3))


def keep_moved(agreement_centred: Optional[float], agreement_moved: Optional[float]) -> bool:
    """Keep the run on the moved grid only when its networks agree more (a missing score counts as 0)."""
    return (agreement_moved or 0.0) > (agreement_centred or 0.0)


def offset_mm(offset: Tuple[float, float], spacing_xy: Tuple[float, float]) -> list:
    """A grid offset ``(rows, cols)`` in slice pixels as ``[x, y]`` millimetres along the image's
    i and j axes (what ``report.json`` records)."""
    return [round(float(offset[1]) * float(spacing_xy[0]), 3), round(float(offset[0]) * float(spacing_xy[1]), 3)]
