"""The retired review measure ("caught": a region voxel within 2 pixels of an error), kept only as
a control beside :mod:`cardseg.review.coverage`, which replaced it: almost every substantial error
touches the predicted boundary, so a shell along that boundary "catches" nearly all of them while
covering none. Nothing chooses or reports a rule by this measure any more.

Definitions:

* A **substantial error** is, per slice, a connected component (8-connected) of wrong voxels
  (prediction != ground truth) of at least :data:`MIN_ERROR_PX` pixels, after a binary opening
  with a 3 x 3 square (one pixel), so that one-pixel boundary slivers do not count.
* A region **catches** an error when one of its voxels lies on the error's slice within
  :data:`CATCH_RADIUS_PX` pixels (Euclidean, in-plane) of it.
* The **caught fraction** of the top ``k`` regions: errors caught by at least one of the first
  ``k`` regions of their volume, over all errors, pooled over the volumes.
* The **review burden**: the voxels of the first three regions over the predicted foreground
  (heart) voxels of their volume, averaged over volumes; a rule that merges the whole heart into
  one region would catch everything and help nobody, and this number shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
from scipy import ndimage

from cardseg.metrics.segmentation import roi_mask

MIN_ERROR_PX = 30
CATCH_RADIUS_PX = 2
#: the review burden counts the size of this many first regions
BURDEN_REGIONS = 3


def substantial_errors(pred: np.ndarray, truth: np.ndarray, min_px: int = MIN_ERROR_PX) -> List[np.ndarray]:
    """The substantial errors of a volume: a list of bool masks ``(Z, Y, X)``, one per error."""
    wrong = np.asarray(pred) != np.asarray(truth)
    out = []
    square = np.ones((3, 3), bool)
    for z in range(wrong.shape[0]):
        opened = ndimage.binary_opening(wrong[z], structure=square)
        lab, n = ndimage.label(opened, structure=square)
        if n == 0:
            continue
        sizes = np.bincount(lab.ravel(), minlength=n + 1)
        for i in np.flatnonzero(sizes >= min_px):
            if i == 0:
                continue
            m = np.zeros(wrong.shape, bool)
            m[z] = lab == i
            out.append(m)
    return out


def near_errors(errors: Sequence[np.ndarray], radius: int = CATCH_RADIUS_PX) -> List[np.ndarray]:
    """Each error mask grown in-plane by ``radius`` (a region touching the grown mask catches it)."""
    return [roi_mask(e, radius) for e in errors]


def catch_matrix(region_map: np.ndarray, n_regions: int, near: Sequence[np.ndarray]) -> np.ndarray:
    """``(n_regions, n_errors)`` bool: region ``r + 1`` of ``region_map`` catches error ``e``.

    region_map ``(Z, Y, X)``: 0 outside regions, else the region's number (a rank, or a label);
    near: the errors grown by :func:`near_errors`.
    """
    out = np.zeros((n_regions, len(near)), bool)
    for e, grown in enumerate(near):
        hit = np.unique(region_map[grown])
        hit = hit[(hit > 0) & (hit <= n_regions)]
        out[hit - 1, e] = True
    return out


@dataclass
class ReviewTally:
    """Pooled over volumes: errors, errors caught within the top ``k``, regions, empty regions."""

    budgets: Sequence[int] = (1, 3, 5)
    errors: int = 0
    caught: Dict[str, int] = field(default_factory=dict)
    regions: int = 0
    empty_regions: int = 0
    volumes: int = 0
    burden: List[float] = field(default_factory=list)

    def add(self, catches: np.ndarray, sizes: Optional[np.ndarray] = None, foreground: int = 0) -> None:
        """One volume's :func:`catch_matrix` (regions in rank order); ``sizes`` (voxels of each
        region, same order) and the predicted ``foreground`` voxel count measure the review
        burden: the size of the first :data:`BURDEN_REGIONS` regions over the predicted heart."""
        n_regions, n_errors = catches.shape
        if sizes is not None and foreground > 0:
            self.burden.append(float(np.sum(sizes[:BURDEN_REGIONS])) / foreground)
        self.volumes += 1
        self.errors += n_errors
        self.regions += n_regions
        self.empty_regions += int((~catches.any(axis=1)).sum()) if n_regions else 0
        for k in [*self.budgets, None]:
            key = "all" if k is None else str(k)
            top = catches[:k] if k is not None else catches
            self.caught[key] = self.caught.get(key, 0) + int(top.any(axis=0).sum())

    def fraction(self, k: Optional[int] = None) -> Optional[float]:
        key = "all" if k is None else str(k)
        return self.caught.get(key, 0) / self.errors if self.errors else None

    def summary(self) -> dict:
        return {
            "volumes": self.volumes,
            "substantial_errors": self.errors,
            **{f"caught_top{k}": self.fraction(k) for k in self.budgets},
            "caught_all": self.fraction(None),
            "regions_per_volume": self.regions / self.volumes if self.volumes else None,
            "empty_region_fraction": self.empty_regions / self.regions if self.regions else None,
            "top3_size_over_foreground": float(np.mean(self.burden)) if self.burden else None,
        }
