"""Patient-bootstrap intervals for a cardiac-index measurement (issue 23: every table with 95 %
paired intervals over patients).

The draws are the project's patient bootstrap (:func:`cardseg_train.base.stats.resample_weights`,
2,000 resamples, patients in sorted-name order, seed 0), so two measurements on the same
patients are resampled identically and their difference is a paired one. Inputs are the
``rows`` of :func:`cardseg_train.indices.fit.measure` (per patient and index ``value``,
``truth``, ``low``, ``high``).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

import numpy as np

from cardseg_train.base.stats import BOOTSTRAP_LEVEL, BOOTSTRAP_RESAMPLES, interval, resample_weights


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> List[float]:
    """Exact two-sided ``1 - alpha`` interval of a binomial proportion ``k / n``."""
    from scipy.stats import beta

    if n == 0:
        return [float("nan"), float("nan")]
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return [lo, hi]


def per_patient(rows: Sequence[Mapping], name: str) -> Dict[str, Dict[str, float]]:
    """``{patient: {"abs_error", "inside", "width"}}`` of index ``name``."""
    out = {}
    for r in rows:
        i = r[name]
        out[r["patient"]] = {
            "abs_error": abs(float(i["value"]) - float(i["truth"])),
            "inside": float(i["low"] <= i["truth"] <= i["high"]),
            "width": float(i["high"]) - float(i["low"]),
        }
    return out


def _bootstrap_mean(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Means of ``values`` ``(P,)`` over the patient resamples: ``(resamples,)``."""
    w = resample_weights(values.size, resamples, seed)
    return w @ values / values.size


def mae_intervals(
    rows: Sequence[Mapping], names: Sequence[str], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> Dict[str, List[float]]:
    """95 % patient-bootstrap interval of each index's mean absolute error: ``{name: [lo, hi]}``."""
    out = {}
    for name in names:
        pp = per_patient(rows, name)
        a = np.array([pp[p]["abs_error"] for p in sorted(pp)])
        out[name] = interval(_bootstrap_mean(a, resamples, seed), BOOTSTRAP_LEVEL)
    return out


def paired_difference(
    rows: Sequence[Mapping],
    previous: Sequence[Mapping],
    names: Sequence[str],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Dict[str, dict]:
    """``new - previous`` per index on the patients both measured: MAE, coverage and mean width,
    each ``{"difference", "ci95"}`` (paired patient bootstrap), plus ``"patients"``.

    Raises ValueError when the two share fewer than 2 patients.
    """
    out = {}
    for name in names:
        new, old = per_patient(rows, name), per_patient(previous, name)
        common = sorted(set(new) & set(old))
        if len(common) < 2:
            raise ValueError(f"the two measurements share {len(common)} patients; no paired difference")
        item: dict = {"patients": len(common)}
        for key, label in (("abs_error", "mae"), ("inside", "coverage"), ("width", "mean_width")):
            d = np.array([new[p][key] - old[p][key] for p in common])
            item[label] = {
                "difference": float(d.mean()),
                "ci95": interval(_bootstrap_mean(d, resamples, seed), BOOTSTRAP_LEVEL),
            }
        out[name] = item
    return out
