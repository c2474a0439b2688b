"""Voxel error probability: where a substantial segmentation error is likely.

The map regions may be cut from instead of the raw TAC (``regions.map = "error_probability"``):
a logistic model, fitted on the validation split (``cardseg fit-review``), of "this voxel lies
in a substantial error" (:mod:`cardseg.review.coverage`) from the TAC smoothed at two scales
and the prediction's geometry (:data:`VOXEL_FEATURES`). CARD's calibrated probabilities
(entropy, one minus the largest probability) were tried as features while the rule was developed
on validation and added nothing measurable once the TAC was in (held-out voxel AUROC and covered
errors alike), so the map needs only what every engine path already has: the TAC and the
predicted labels.

Arrays are ``(Z, Y, X)``; everything here is pure (no files).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from scipy import ndimage

from cardseg.review.coverage import predicted_boundary

#: voxel features of the error-probability model, in this order
VOXEL_FEATURES = (
    "log_tac_s2",
    "log_tac_s4",
    "tac_s2",
    "log_boundary_distance",
    "end_position",
    "end_position_sq",
    "pred_rv",
    "pred_myo",
    "pred_lv",
    "foreground_share",
)
#: TAC floor inside the logarithms
TAC_FLOOR = 1e-3
#: side of the in-plane box whose predicted-foreground share is a feature
SHARE_BOX = 9
#: in-plane distance (pixels) given on a slice without any predicted boundary
FAR_PX = 50.0


def smoothed(a: np.ndarray, sigma_px: float) -> np.ndarray:
    """``a (Z, Y, X)`` smoothed in-plane by a Gaussian of ``sigma_px`` pixels, float32."""
    return ndimage.gaussian_filter(np.asarray(a, dtype=np.float32), (0.0, sigma_px, sigma_px), mode="constant")


def end_position(z_index, slices: int) -> np.ndarray:
    """Where slice position(s) ``z_index`` lie between the middle slice (0) and the first or last
    slice (1) of a volume of ``slices`` slices; 0 in a one-slice volume (neither end). The voxel
    feature and the region feature ``end_position`` both come from here."""
    z = np.asarray(z_index, dtype=np.float64)
    if slices <= 1:
        return np.zeros_like(z)
    return np.abs(z / (slices - 1) - 0.5) * 2.0


def boundary_distance(pred: np.ndarray) -> np.ndarray:
    """In-plane distance (pixels) of each voxel to the nearest predicted boundary pixel
    (:func:`cardseg.review.coverage.predicted_boundary`), per slice; ``(Z, Y, X)`` float32."""
    p = np.asarray(pred)
    edge = predicted_boundary(p)
    out = np.full(p.shape, FAR_PX, np.float32)
    for z in range(p.shape[0]):
        if edge[z].any():
            out[z] = ndimage.distance_transform_edt(~edge[z])
    return out


def voxel_features(tac: np.ndarray, pred: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Features (:data:`VOXEL_FEATURES`) of the voxels selected by bool ``where``: ``(N, F)`` float32.

    tac ``(Z, Y, X)`` disagreement, pred ``(Z, Y, X)`` predicted labels (0 background, 1 RV,
    2 MYO, 3 LV as in the ACDC bundle). ``end_position``: the slice's distance from the middle
    slice (0) to the first or last (1), as the regions' feature of the same name.
    """
    pred = np.asarray(pred)
    where = np.asarray(where, bool)
    pos = end_position(np.arange(pred.shape[0]), pred.shape[0])
    pos3 = np.broadcast_to(pos[:, None, None].astype(np.float32), pred.shape)
    s2, s4 = smoothed(tac, 2.0), smoothed(tac, 4.0)
    share = ndimage.uniform_filter((pred > 0).astype(np.float32), size=(1, SHARE_BOX, SHARE_BOX))
    columns = (
        np.log(s2 + TAC_FLOOR),
        np.log(s4 + TAC_FLOOR),
        s2,
        np.log1p(boundary_distance(pred)),
        pos3,
        pos3**2,
        pred == 1,
        pred == 2,
        pred == 3,
        share,
    )
    return np.stack([np.asarray(c)[where].astype(np.float32) for c in columns], axis=-1)


def error_probability(tac: np.ndarray, pred: np.ndarray, model, allowed: Optional[np.ndarray] = None) -> np.ndarray:
    """The model's probability that each voxel lies in a substantial error, float32 ``(Z, Y, X)``;
    0 outside bool ``allowed`` (everywhere when ``None``). ``model`` has ``probability((N, F))``
    over :data:`VOXEL_FEATURES` (:class:`cardseg.review.regions.ErrorModel`)."""
    tac = np.asarray(tac)
    where = np.ones(tac.shape, bool) if allowed is None else np.asarray(allowed, bool)
    out = np.zeros(tac.shape, np.float32)
    if where.any():
        out[where] = model.probability(voxel_features(tac, pred, where)).astype(np.float32)
    return out
