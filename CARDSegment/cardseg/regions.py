"""Flagged regions: 3D connected components of high disagreement, ranked for review."""

from __future__ import annotations

from typing import List

import numpy as np
from scipy import ndimage


def flagged_regions(tac: np.ndarray, labels: np.ndarray, threshold: float, min_voxels: int,
                    ijk_to_lps: np.ndarray, spacing: tuple, class_names: List[str]) -> List[dict]:
    """Connected components (3D, face connectivity) of ``tac > threshold``, largest concern first.

    tac, labels: ``(Z, Y, X)`` TAC map and predicted labels; components smaller than
    ``min_voxels`` are dropped; the rest are ranked by summed disagreement. ``ijk_to_lps`` is
    the volume's 4x4 index-to-LPS matrix, ``spacing`` its (x, y, z) voxel size in mm.
    Each region: id (1 = most concerning), voxels, volume_mm3, centroid_ijk, centroid_lps,
    bbox_ijk ``[[i0, i1], [j0, j1], [k0, k1]]`` (inclusive), mean/max disagreement and the
    predicted classes it covers (background included when present).
    """
    mask = np.asarray(tac) > threshold
    lab, n = ndimage.label(mask)
    if n == 0:
        return []
    index = np.arange(1, n + 1)
    sizes = ndimage.sum_labels(mask, lab, index)
    sums = ndimage.sum_labels(tac, lab, index)
    keep = [i for i in range(n) if sizes[i] >= min_voxels]
    keep.sort(key=lambda i: (-sums[i], i))
    voxel_mm3 = float(np.prod(spacing))
    objects = ndimage.find_objects(lab)
    regions = []
    for rank, i in enumerate(keep, start=1):
        sl = objects[i]
        sub = lab[sl] == i + 1
        zz, yy, xx = np.nonzero(sub)
        k = zz + sl[0].start
        j = yy + sl[1].start
        ii = xx + sl[2].start
        values = np.asarray(tac)[sl][sub]
        centroid_ijk = [float(ii.mean()), float(j.mean()), float(k.mean())]
        lps = (np.asarray(ijk_to_lps) @ np.array(centroid_ijk + [1.0]))[:3]
        present = np.unique(np.asarray(labels)[sl][sub])
        regions.append({
            "id": rank,
            "voxels": int(sizes[i]),
            "volume_mm3": float(sizes[i] * voxel_mm3),
            "centroid_ijk": centroid_ijk,
            "centroid_lps": [float(v) for v in lps],
            "bbox_ijk": [[int(ii.min()), int(ii.max())], [int(j.min()), int(j.max())], [int(k.min()), int(k.max())]],
            "mean_disagreement": float(values.mean()),
            "max_disagreement": float(values.max()),
            "summed_disagreement": float(sums[i]),
            "classes": [class_names[c] for c in present.tolist()],
        })
    return regions
