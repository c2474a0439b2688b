"""Do the flagged regions hold the mistakes? Covered errors, review burden and the trivial maps.

Definitions (fitting, evaluation and tests share them):

* A **substantial error** is, per slice, a connected component (8-connected) of wrong voxels
  (prediction != ground truth) of at least ``MIN_ERROR_PX`` pixels after a binary opening with a
  3 x 3 square (:func:`error_labels`; :mod:`cardseg.review.evaluation` has the same definition
  as a list of masks).
* An error is **covered** by a set of flagged voxels when at least :data:`COVER_SHARE` of its
  pixels lie inside that set (:func:`covered`). Touching an error is not enough: a shell along
  the predicted boundary touches nearly every error and covers none.
* The **burden** of a set of flagged voxels is its size over the predicted heart's (every
  non-background label) voxels of the same volume, and its volume in ml.
* The **baselines** flag the same number of voxels in the same volume (:func:`top_voxels`,
  :func:`random_voxels`, :func:`random_regions`): the highest values of a map (TAC, an entropy)
  inside the heart's neighbourhood (:func:`heart_neighbourhood`), random pixels of the predicted
  boundary (:func:`predicted_boundary`), or the regions themselves moved to random places.

Arrays are ``(Z, Y, X)``; everything here is pure (no files).
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from scipy import ndimage

from cardseg.metrics.segmentation import roi_mask
from cardseg.review.evaluation import MIN_ERROR_PX

#: an error is covered when at least this share of its pixels is flagged
COVER_SHARE = 0.5
#: the heart's neighbourhood: predicted heart (on the slice or a neighbouring one) dilated by this
NEIGHBOURHOOD_PX = 10

_SQUARE = np.ones((3, 3), bool)


def error_labels(pred: np.ndarray, truth: np.ndarray, min_px: int = MIN_ERROR_PX) -> Tuple[np.ndarray, int]:
    """Substantial errors as one int32 label map ``(Z, Y, X)`` (0 none, 1..n, slice by slice in scan
    order) and their number ``n``."""
    wrong = np.asarray(pred) != np.asarray(truth)
    out = np.zeros(wrong.shape, np.int32)
    n = 0
    for z in range(wrong.shape[0]):
        lab, k = ndimage.label(ndimage.binary_opening(wrong[z], structure=_SQUARE), structure=_SQUARE)
        if k == 0:
            continue
        sizes = np.bincount(lab.ravel(), minlength=k + 1)
        keep = np.flatnonzero(sizes >= min_px)
        keep = keep[keep > 0]
        remap = np.zeros(k + 1, np.int32)
        remap[keep] = np.arange(n + 1, n + 1 + keep.size, dtype=np.int32)
        out[z] = remap[lab]
        n += int(keep.size)
    return out, n


def overlap_matrix(errors: np.ndarray, n_errors: int, regions: np.ndarray, n_regions: int) -> np.ndarray:
    """``(n_regions, n_errors)`` int64: pixels of error ``e + 1`` inside region ``r + 1``.

    errors, regions: int label maps ``(Z, Y, X)`` (0 none); region labels above ``n_regions``
    are ignored.
    """
    e = np.asarray(errors).ravel()
    r = np.asarray(regions).ravel().astype(np.int64)
    both = (e > 0) & (r > 0) & (r <= n_regions)
    flat = (r[both] - 1) * n_errors + (e[both] - 1)
    return np.bincount(flat, minlength=n_regions * n_errors).reshape(n_regions, n_errors)


def error_sizes(errors: np.ndarray, n_errors: int) -> np.ndarray:
    """``(n_errors,)`` pixels of each error of a label map."""
    return np.bincount(np.asarray(errors).ravel(), minlength=n_errors + 1)[1:]


def covered(errors: np.ndarray, n_errors: int, flagged: np.ndarray, share: float = COVER_SHARE) -> np.ndarray:
    """``(n_errors,)`` bool: at least ``share`` of each error's pixels lie in the bool ``flagged``."""
    inside = np.bincount(np.asarray(errors)[np.asarray(flagged, bool)], minlength=n_errors + 1)[1:]
    return inside >= share * error_sizes(errors, n_errors)


def covered_top_k(overlap: np.ndarray, sizes: np.ndarray, share: float = COVER_SHARE) -> np.ndarray:
    """``(n_regions + 1, n_errors)`` bool: row ``k`` says which errors the first ``k`` regions
    (rows of ``overlap``, disjoint, in review order) cover together."""
    cum = np.vstack([np.zeros((1, overlap.shape[1]), overlap.dtype), np.cumsum(overlap, axis=0)])
    return cum >= share * np.asarray(sizes)[None, :]


def holds_error(overlap: np.ndarray, sizes: np.ndarray, share: float = COVER_SHARE) -> np.ndarray:
    """``(n_regions,)`` bool: the region alone holds at least ``share`` of some error (what
    ``p_error`` predicts)."""
    if overlap.shape[1] == 0:
        return np.zeros(overlap.shape[0], bool)
    return (overlap >= share * np.asarray(sizes)[None, :]).any(axis=1)


def heart_voxels(pred: np.ndarray) -> int:
    """Voxels of the predicted heart (every non-background label)."""
    return int((np.asarray(pred) > 0).sum())


def heart_neighbourhood(pred: np.ndarray, radius: int = NEIGHBOURHOOD_PX) -> np.ndarray:
    """bool ``(Z, Y, X)``: within ``radius`` pixels in-plane of the predicted heart on the same
    slice or on a neighbouring one (so a slice whose heart was missed still has one)."""
    fg = np.asarray(pred) > 0
    near = fg.copy()
    near[1:] |= fg[:-1]
    near[:-1] |= fg[1:]
    return roi_mask(near, radius)


def predicted_boundary(pred: np.ndarray) -> np.ndarray:
    """bool ``(Z, Y, X)``: pixels whose 3 x 3 in-plane neighbourhood holds more than one predicted
    label (a band two pixels wide along every border of the segmentation)."""
    p = np.asarray(pred)
    size = (1, 3, 3)
    return ndimage.maximum_filter(p, size=size, mode="nearest") != ndimage.minimum_filter(p, size=size, mode="nearest")


def top_voxels(score: np.ndarray, support: np.ndarray, n: int) -> np.ndarray:
    """bool ``(Z, Y, X)``: the ``n`` highest values of ``score`` inside ``support`` (ties: scan
    order); all of ``support`` when it has fewer voxels."""
    idx = np.flatnonzero(np.asarray(support, bool))
    out = np.zeros(np.asarray(score).shape, bool)
    n = int(max(0, min(n, idx.size)))
    if n:
        values = np.asarray(score).ravel()[idx]
        pick = np.argsort(-values, kind="stable")[:n]
        out.ravel()[idx[pick]] = True
    return out


def covered_at_burdens(
    errors: np.ndarray, n_errors: int, score: np.ndarray, support: np.ndarray, heart: int, burdens
) -> list:
    """Errors covered by the highest voxels of ``score`` inside ``support``, flagging each share of
    ``burdens`` of the ``heart`` voxels in turn: one count per burden (a map's coverage curve)."""
    return [int(covered(errors, n_errors, top_voxels(score, support, int(round(b * heart)))).sum()) for b in burdens]


def random_voxels(support: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """bool ``(Z, Y, X)``: ``n`` voxels of ``support`` drawn uniformly without replacement."""
    idx = np.flatnonzero(np.asarray(support, bool))
    out = np.zeros(np.asarray(support).shape, bool)
    n = int(max(0, min(n, idx.size)))
    if n:
        out.ravel()[rng.choice(idx, n, replace=False)] = True
    return out


def random_regions(regions: np.ndarray, n_regions: int, support: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """int32 ``(Z, Y, X)``: regions ``1..n_regions`` of ``regions``, each moved in-plane (on its own
    slices) so that its centroid lands on a random voxel of ``support`` on its middle slice (any
    voxel of ``support`` if that slice has none); voxels moved off the grid are dropped, a region
    moved onto an earlier one does not overwrite it. The same sizes and shapes in random places."""
    regions = np.asarray(regions)
    support = np.asarray(support, bool)
    out = np.zeros(regions.shape, np.int32)
    objects = ndimage.find_objects(regions, max_label=n_regions)
    zs_all, ys_all, xs_all = np.nonzero(support)
    for r, sl in enumerate(objects, start=1):
        if sl is None:
            continue
        zz, yy, xx = np.nonzero(regions[sl] == r)
        zz, yy, xx = zz + sl[0].start, yy + sl[1].start, xx + sl[2].start
        zmid = int(np.round(zz.mean()))
        on = np.flatnonzero(zs_all == zmid)
        if on.size == 0 and zs_all.size == 0:
            continue
        pick = rng.choice(on) if on.size else rng.integers(zs_all.size)
        dy = int(ys_all[pick] - np.round(yy.mean()))
        dx = int(xs_all[pick] - np.round(xx.mean()))
        y2, x2 = yy + dy, xx + dx
        ok = (y2 >= 0) & (y2 < regions.shape[1]) & (x2 >= 0) & (x2 < regions.shape[2])
        zz, y2, x2 = zz[ok], y2[ok], x2[ok]
        free = out[zz, y2, x2] == 0
        out[zz[free], y2[free], x2[free]] = r
    return out


def burden(flagged_voxels: int, pred: np.ndarray, spacing: Optional[tuple] = None) -> Tuple[float, Optional[float]]:
    """``(share of the predicted heart, ml)`` of ``flagged_voxels`` voxels (ml ``None`` without a
    ``spacing`` (x, y, z) in mm; share ``nan`` without a predicted heart)."""
    heart = heart_voxels(pred)
    share = flagged_voxels / heart if heart else float("nan")
    ml = None if spacing is None else flagged_voxels * float(np.prod(spacing)) / 1000.0
    return share, ml
