"""Statistics of an evaluation: finite means, Pearson r, and the paired patient bootstrap.

The bootstrap resamples *patients* (the unit the test split is drawn in; a patient's ED and ES
volumes stay together) with replacement, and recomputes each method's pooled NLL per condition
from per-volume sums (NLL summed over the volume's ROI pixels, and their count), then the block
NLL (mean over conditions). Every method sees the same resampled patients, so the interval of
``CARD - method`` is a paired one.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

#: resamples of the patient bootstrap and the interval's coverage
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_LEVEL = 0.95


def mean_finite(values) -> Optional[float]:
    """Mean of the finite values (None entries skipped); None when there are none."""
    v = [float(x) for x in values if x is not None and np.isfinite(x)]
    return float(np.mean(v)) if v else None


def pearson_r(x: Sequence[float], y: Sequence[float]) -> Optional[float]:
    """Pearson correlation of the finite pairs; None with fewer than 3 or no spread."""
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if a.size < 3 or a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def volume_nll_sums(per_volume: Dict[str, Dict[str, List[dict]]], conditions: Sequence[str], methods: Sequence[str]):
    """``per_volume[condition][method]`` = ``[{"patient", "nll_sum", "n"}, ...]`` (same volume
    order for every method) → ``(patients (P,), sums (C, M, P), counts (C, P))`` summed per patient."""
    first = per_volume[conditions[0]][methods[0]]
    patients = sorted({v["patient"] for v in first})
    index = {p: i for i, p in enumerate(patients)}
    sums = np.zeros((len(conditions), len(methods), len(patients)))
    counts = np.zeros((len(conditions), len(patients)))
    for ci, c in enumerate(conditions):
        for mi, m in enumerate(methods):
            for v in per_volume[c][m]:
                sums[ci, mi, index[v["patient"]]] += v["nll_sum"]
                if mi == 0:
                    counts[ci, index[v["patient"]]] += v["n"]
    return patients, sums, counts


def resample_weights(patients: int, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> np.ndarray:
    """The patient draws of the bootstrap as multiplicities ``(resamples, patients)``: row ``r``
    counts how often each patient (in sorted-name order) was drawn in resample ``r`` (each row
    sums to ``patients``). Every bootstrap here uses these draws, so equal ``seed`` and patient
    count give the same resampled patients."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, patients, size=(resamples, patients))
    weights = np.zeros((resamples, patients))
    np.add.at(weights, (np.repeat(np.arange(resamples), patients), draws.ravel()), 1.0)
    return weights


def paired_bootstrap(
    sums: np.ndarray, counts: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> np.ndarray:
    """Block NLL of every method under ``resamples`` patient resamples.

    sums ``(C, M, P)`` NLL summed per condition, method and patient; counts ``(C, P)`` ROI pixels
    → ``(resamples, M)``: for each resample, the mean over conditions of the pooled NLL
    (``sum of sums / sum of counts`` over the drawn patients, with multiplicity).
    """
    weights = resample_weights(sums.shape[2], resamples, seed)
    num = np.einsum("cmp,rp->rcm", sums, weights)
    den = np.einsum("cp,rp->rc", counts, weights)[:, :, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        pooled = num / den
    return np.nanmean(pooled, axis=1)


def interval(samples: np.ndarray, level: float = BOOTSTRAP_LEVEL) -> List[float]:
    """Percentile interval ``[lo, hi]`` of 1D samples."""
    a = (1 - level) / 2
    lo, hi = np.nanquantile(samples, [a, 1 - a])
    return [float(lo), float(hi)]


def bootstrap_block_nll(
    per_volume: Dict[str, Dict[str, List[dict]]],
    conditions: Sequence[str],
    methods: Sequence[str],
    reference: str = "card",
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> dict:
    """95 % patient-bootstrap intervals of every method's block NLL, and of ``reference - method``
    (paired) and ``reference / method`` for every other method. JSON-able."""
    patients, sums, counts = volume_nll_sums(per_volume, conditions, methods)
    boot = paired_bootstrap(sums, counts, resamples, seed)
    out = {
        "unit": "patient",
        "patients": len(patients),
        "resamples": int(resamples),
        "level": BOOTSTRAP_LEVEL,
        "seed": int(seed),
        "block_nll": {m: interval(boot[:, i]) for i, m in enumerate(methods)},
        "reference": reference if reference in methods else None,
        "difference": {},
        "ratio": {},
    }
    if reference in methods:
        r = methods.index(reference)
        for i, m in enumerate(methods):
            if i != r:
                out["difference"][m] = interval(boot[:, r] - boot[:, i])
                out["ratio"][m] = interval(boot[:, r] / boot[:, i])
    return out
