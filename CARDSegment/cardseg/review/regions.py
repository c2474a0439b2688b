"""Flagged regions: where the disagreement asks a reader to look, ranked so the first few matter.

A region is a connected component of ``TAC > flag_threshold`` (paper Eq. 6's map), formed as
the bundle's ``regions`` block says (all chosen on the validation split, see
``cardseg fit-review``):

* ``connectivity``: ``"slice"`` (2D components, each within one slice, 8-connected) or ``"3d"``
  (components that also join the same place on neighbouring slices);
* ``merge_px``: components closer than this many in-plane pixels are merged (the mask is
  dilated by a disk of that radius before labelling; the region keeps only its flagged voxels);
* ``min_voxels``: smaller components are dropped;
* ``max_regions``: at most this many regions per volume are reported (the most likely errors).

Each region gets features (:data:`FEATURES`) and, from the bundle's fitted logistic model
(:class:`ErrorModel`), ``p_error``: the probability that it holds a substantial segmentation
error (:mod:`cardseg.review.evaluation` defines one). Regions are ranked by ``p_error`` (by summed
disagreement where a bundle has no fitted model: ``regions.model`` is ``null``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
from scipy import ndimage

from cardseg.base.errors import CardsegError
from cardseg.metrics.segmentation import roi_mask

#: region features the error model reads, in this order
FEATURES = ("log_sum_tac", "max_tac", "mean_tac", "log_voxels", "slices", "foreground_fraction", "classes",
            "end_position", "fov_fraction")
DEFAULTS = {"connectivity": "3d", "merge_px": 0, "max_regions": None}


def region_labels(tac: np.ndarray, threshold: float, min_voxels: int, connectivity: str = "3d",
                  merge_px: int = 0) -> Tuple[np.ndarray, int]:
    """Label the flagged components of ``tac (Z, Y, X)``: int32 map (0 none, 1..n) and ``n``.

    Labels are numbered in scan order; components under ``min_voxels`` are removed.
    """
    if connectivity not in ("3d", "slice"):
        raise CardsegError(f"regions.connectivity must be '3d' or 'slice' (got {connectivity!r})")
    mask = np.asarray(tac) > threshold
    grown = roi_mask(mask, merge_px)  # per slice, no growth across slices
    if connectivity == "3d":
        structure = np.zeros((3, 3, 3), bool)
        structure[1] = True  # 8-connected in-plane ...
        structure[0, 1, 1] = structure[2, 1, 1] = True  # ... and the same pixel on the neighbouring slices
    else:
        structure = np.zeros((3, 3, 3), bool)
        structure[1] = True
    lab, n = ndimage.label(grown, structure=structure)
    lab = np.where(mask, lab, 0).astype(np.int32)
    if n == 0:
        return lab, 0
    sizes = np.bincount(lab.ravel(), minlength=n + 1)
    keep = np.flatnonzero(sizes >= max(int(min_voxels), 1))
    keep = keep[keep > 0]
    remap = np.zeros(n + 1, np.int32)
    remap[keep] = np.arange(1, keep.size + 1, dtype=np.int32)
    return remap[lab], int(keep.size)


def region_features(tac: np.ndarray, pred: np.ndarray, lab: np.ndarray, n: int,
                    fov: Optional[np.ndarray] = None) -> np.ndarray:
    """Features of regions ``1..n`` of ``lab``: ``(n, len(FEATURES))`` float64.

    tac ``(Z, Y, X)`` disagreement, pred ``(Z, Y, X)`` predicted labels, fov ``(Y, X)`` bool
    field of view (all True if ``None``). See :data:`FEATURES`: log summed and max/mean TAC, log
    size, slices spanned, fraction predicted foreground, distinct predicted classes inside,
    position of the centroid slice from the middle (0) to the first/last slice (1; 0 for a single
    slice), fraction of the region inside the field of view (1 wherever the engine zeroes the TAC
    outside it, as it does today: kept so that a model stays valid if that changes).
    """
    if n == 0:
        return np.zeros((0, len(FEATURES)))
    tac = np.asarray(tac, dtype=np.float64)
    idx = np.arange(1, n + 1)
    vox = ndimage.sum_labels(np.ones_like(tac), lab, idx)
    s = ndimage.sum_labels(tac, lab, idx)
    mx = ndimage.maximum(tac, lab, idx)
    fg = ndimage.sum_labels((np.asarray(pred) > 0).astype(np.float64), lab, idx)
    z = lab.shape[0]
    zc = ndimage.center_of_mass(np.ones_like(tac), lab, idx)
    fov3 = np.ones(lab.shape[1:], bool) if fov is None else np.asarray(fov, bool)
    infov = ndimage.sum_labels(np.broadcast_to(fov3, lab.shape).astype(np.float64), lab, idx)
    out = np.zeros((n, len(FEATURES)))
    objects = ndimage.find_objects(lab)
    for i in range(n):
        sl = objects[i]
        sub = lab[sl] == i + 1
        slices = int(sub.any(axis=(1, 2)).sum())
        classes = np.unique(np.asarray(pred)[sl][sub]).size
        pos = abs(zc[i][0] / (z - 1) - 0.5) * 2.0 if z > 1 else 0.0  # one slice: neither end
        out[i] = (np.log1p(s[i]), mx[i], s[i] / vox[i], np.log(vox[i]), slices, fg[i] / vox[i], classes, pos,
                  infov[i] / vox[i])
    return out


@dataclass
class ErrorModel:
    """Logistic model of ``P(region holds a substantial error | features)``.

    ``p = sigmoid(((f - mean) / scale) @ coef + intercept)`` over :data:`FEATURES`; fitted on the
    validation split (``cardseg fit-review``) and stored in ``bundle.json`` ``regions.model``.
    """

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float

    def probability(self, features: np.ndarray) -> np.ndarray:
        """``(n, F)`` features → ``(n,)`` probabilities."""
        z = ((np.asarray(features, dtype=np.float64) - self.mean) / self.scale) @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-np.clip(z, -50, 50)))

    def to_dict(self) -> dict:
        return {"kind": "logistic", "features": list(FEATURES), "mean": self.mean.tolist(),
                "scale": self.scale.tolist(), "coef": self.coef.tolist(), "intercept": float(self.intercept)}

    @classmethod
    def from_dict(cls, d: dict) -> "ErrorModel":
        """Refuses (one line) a model that is incomplete or was fitted on other features."""
        try:
            if d.get("kind") != "logistic" or list(d["features"]) != list(FEATURES):
                raise ValueError("features")
            arrays = [np.asarray(d[k], dtype=np.float64) for k in ("mean", "scale", "coef")]
            intercept = float(d["intercept"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CardsegError("bundle.json regions.model is not a fitted region error model for these features "
                               "(refit it: cardseg fit-review)") from None
        if any(a.shape != (len(FEATURES),) or not np.isfinite(a).all() for a in arrays) or (arrays[1] <= 0).any():
            raise CardsegError("bundle.json regions.model has malformed mean/scale/coef (refit it: cardseg fit-review)")
        return cls(arrays[0], arrays[1], arrays[2], intercept)


def rank_regions(features: np.ndarray, model: Optional[ErrorModel], max_regions: Optional[int] = None
                 ) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Order of regions to review (indices into ``features``) and their ``p_error``.

    By ``p_error`` (descending) when a model is given, else by summed disagreement; ties keep
    scan order. At most ``max_regions`` are kept.
    """
    n = features.shape[0]
    p = model.probability(features) if model is not None and n else None
    key = p if p is not None else features[:, 0] if n else np.zeros(0)
    order = np.lexsort((np.arange(n), -key)) if n else np.zeros(0, int)
    if max_regions is not None:
        order = order[:int(max_regions)]
    return order, p


def flagged_regions(tac: np.ndarray, labels: np.ndarray, settings: dict, ijk_to_lps: np.ndarray, spacing: tuple,
                    class_names: Sequence[str], fov: Optional[np.ndarray] = None) -> Tuple[List[dict], np.ndarray]:
    """Regions of a volume, most likely error first, and their rank map.

    tac, labels: ``(Z, Y, X)``; settings: the bundle's ``regions`` block; ``ijk_to_lps`` the
    volume's 4x4 index-to-LPS matrix, ``spacing`` its (x, y, z) voxel size in mm. Returns the
    region dicts (id = rank, 1 = review first; voxels, volume_mm3, centroid_ijk/lps, bbox_ijk
    ``[[i0, i1], [j0, j1], [k0, k1]]`` inclusive, mean/max/summed disagreement, the predicted
    classes inside, p_error or ``None``) and a uint16 map ``(Z, Y, X)`` of those ranks (0: none).
    """
    s = {**DEFAULTS, **settings}
    lab, n = region_labels(tac, float(s["flag_threshold"]), int(s["min_voxels"]), s["connectivity"],
                           int(s["merge_px"]))
    feats = region_features(tac, labels, lab, n, fov)
    model = ErrorModel.from_dict(s["model"]) if s.get("model") else None
    order, p = rank_regions(feats, model, s.get("max_regions"))
    dtype = np.uint16 if order.size < 65535 else np.uint32
    rank_of = np.zeros(n + 1, dtype)
    rank_of[order + 1] = np.arange(1, order.size + 1, dtype=dtype)
    rank_map = rank_of[lab]
    voxel_mm3 = float(np.prod(spacing))
    objects = ndimage.find_objects(lab)
    tac = np.asarray(tac)
    regions = []
    for rank, i in enumerate(order.tolist(), start=1):
        sl = objects[i]
        sub = lab[sl] == i + 1
        zz, yy, xx = np.nonzero(sub)
        k, j, ii = zz + sl[0].start, yy + sl[1].start, xx + sl[2].start
        values = tac[sl][sub]
        centroid_ijk = [float(ii.mean()), float(j.mean()), float(k.mean())]
        lps = (np.asarray(ijk_to_lps) @ np.array(centroid_ijk + [1.0]))[:3]
        present = np.unique(np.asarray(labels)[sl][sub])
        regions.append({
            "id": rank,
            "voxels": int(sub.sum()),
            "volume_mm3": float(sub.sum() * voxel_mm3),
            "centroid_ijk": centroid_ijk,
            "centroid_lps": [float(v) for v in lps],
            "bbox_ijk": [[int(ii.min()), int(ii.max())], [int(j.min()), int(j.max())], [int(k.min()), int(k.max())]],
            "mean_disagreement": float(values.mean()),
            "max_disagreement": float(values.max()),
            "summed_disagreement": float(values.sum()),
            "classes": [class_names[c] for c in present.tolist()],
            "p_error": None if p is None else float(p[i]),
        })
    return regions, rank_map
