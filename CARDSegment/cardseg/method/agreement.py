"""Paper Eq. 5: the agreement score of a region, from the TAC map (numpy arrays)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

LN2 = math.log(2.0)


def agreement_score(tac: np.ndarray, roi: np.ndarray) -> Optional[float]:
    """Paper Eq. 5: ``Agr = 1 - (1 / (|R| ln 2)) Σ_{v∈R} d̄(v)``, in ``[0, 1]``.

    tac: TAC map ``d̄`` (any shape, values in ``[0, ln 2]``); roi: bool mask ``R`` of the same
    shape. ``None`` when R is empty.
    """
    roi = np.asarray(roi, dtype=bool)
    n = int(roi.sum())
    if n == 0:
        return None
    return float(1.0 - np.asarray(tac, dtype=np.float64)[roi].sum() / (n * LN2))
