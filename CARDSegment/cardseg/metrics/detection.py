"""Voxel-level detection of segmentation errors by a map: AUROC and AUPRC (MONAI's metrics).

A map "detects" an error voxel when it ranks it above correct voxels; both areas are computed
over the voxels given (the review study passes the heart's neighbourhood). Pure: no files.
"""

from __future__ import annotations

import warnings
from typing import Dict, Optional

import numpy as np
import torch


def detection_scores(score: np.ndarray, wrong: np.ndarray) -> Dict[str, Optional[float]]:
    """``{"auroc", "auprc", "positives", "voxels"}`` of ``score`` for the bool ``wrong``.

    score, wrong: same shape, any (flattened). AUPRC is MONAI's average precision (its baseline is
    the positive share, given as ``prevalence``); both areas are ``None`` when ``wrong`` holds a
    single class.
    """
    s = torch.as_tensor(np.asarray(score, dtype=np.float64).ravel())
    y = torch.as_tensor(np.asarray(wrong, dtype=bool).ravel().astype(np.int64))
    if s.shape != y.shape:
        raise ValueError(f"score and wrong must have the same size ({s.numel()} != {y.numel()})")
    positives = int(y.sum())
    out: Dict[str, Optional[float]] = {
        "auroc": None,
        "auprc": None,
        "positives": positives,
        "voxels": int(y.numel()),
        "prevalence": positives / y.numel() if y.numel() else None,
    }
    if positives == 0 or positives == y.numel():
        return out
    from monai.metrics import compute_average_precision, compute_roc_auc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["auroc"] = float(compute_roc_auc(s, y))
        out["auprc"] = float(compute_average_precision(s, y))
    return out
