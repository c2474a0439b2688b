"""Choosing how regions are formed and fitting ``p_error``, on the validation split only.

For every candidate setting (connectivity, TAC threshold, merge radius, smallest region) the
regions of each clean validation volume are formed with the engine's own
:func:`cardseg.review.regions.region_labels`, described by :func:`cardseg.review.regions.region_features`,
and labelled 1 when they catch a substantial error (:mod:`cardseg.review.evaluation`). A logistic
model (L2, standardised features) predicts that label; it is fitted leave-one-patient-out so
that the setting is chosen on out-of-sample rankings: the setting that catches the most
substantial errors within the first :data:`BUDGET` regions per volume, with at most
``max_regions`` regions per volume and a review burden (:mod:`cardseg.review.evaluation`) of at
most :data:`MAX_BURDEN`, wins. The final model is then fitted on all validation
regions of that setting. Test patients are never read here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np
from scipy import optimize

from cardseg.review.regions import FEATURES, ErrorModel, rank_regions, region_features, region_labels
from cardseg.review.evaluation import ReviewTally, catch_matrix, near_errors, substantial_errors

from .review_data import VolumeMaps

#: the review budget the selection maximises: errors caught within the first BUDGET regions
BUDGET = 3
#: regions reported per volume at most
MAX_REGIONS = 6
#: the first BUDGET regions may cover at most this share of the predicted heart (review burden)
MAX_BURDEN = 0.25
GRID = {"connectivity": ("3d", "slice"), "flag_threshold": (0.035, 0.045, 0.06, 0.075, 0.1),
        "merge_px": (0, 2, 4), "min_voxels": (10, 30)}


@dataclass
class VolumeRegions:
    """One volume's candidate regions under one setting: features ``(n, F)``, catches ``(n, E)``,
    sizes ``(n,)`` voxels, and the volume's predicted foreground voxels."""

    case: str
    patient: str
    features: np.ndarray
    catches: np.ndarray
    sizes: np.ndarray
    foreground: int


def patient_of(case: str) -> str:
    return case.split("_")[0]


def volume_regions(maps: VolumeMaps, near: Sequence[np.ndarray], settings: dict) -> VolumeRegions:
    lab, n = region_labels(maps.tac, settings["flag_threshold"], settings["min_voxels"], settings["connectivity"],
                           settings["merge_px"])
    feats = region_features(maps.tac, maps.pred, lab, n)
    sizes = np.bincount(lab.ravel(), minlength=n + 1)[1:]
    return VolumeRegions(maps.case, patient_of(maps.case), feats, catch_matrix(lab, n, near), sizes,
                         int((maps.pred > 0).sum()))


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 0.05) -> ErrorModel:
    """Logistic regression on standardised features by L-BFGS (mean log-loss + ``l2 |w|^2``)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    mean = x.mean(axis=0) if len(x) else np.zeros(x.shape[1])
    scale = x.std(axis=0) if len(x) else np.ones(x.shape[1])
    scale = np.where(scale > 1e-9, scale, 1.0)
    z = (x - mean) / scale

    def loss(w):
        logit = z @ w[:-1] + w[-1]
        p = 1.0 / (1.0 + np.exp(-logit))
        nll = np.mean(np.logaddexp(0.0, logit) - y * logit)
        grad = np.concatenate([z.T @ (p - y) / len(y) + 2 * l2 * w[:-1], [np.mean(p - y)]])
        return nll + l2 * float(w[:-1] @ w[:-1]), grad

    w0 = np.zeros(x.shape[1] + 1)
    if len(y) and 0 < y.mean() < 1:
        w0[-1] = np.log(y.mean() / (1 - y.mean()))
    res = optimize.minimize(loss, w0, jac=True, method="L-BFGS-B")
    return ErrorModel(mean, scale, res.x[:-1], float(res.x[-1]))


def score(volumes: Sequence[VolumeRegions], models: Dict[str, Optional[ErrorModel]],
          max_regions: Optional[int] = MAX_REGIONS) -> ReviewTally:
    """Rank each volume's regions with its patient's model (``None``: summed disagreement), keep at
    most ``max_regions``, and tally the errors caught."""
    tally = ReviewTally()
    for v in volumes:
        order, _ = rank_regions(v.features, models.get(v.patient), max_regions)
        tally.add(v.catches[order] if len(order) else np.zeros((0, v.catches.shape[1]), bool), v.sizes[order],
                  v.foreground)
    return tally


def cross_validated(volumes: Sequence[VolumeRegions], l2: float = 0.05) -> Dict[str, ErrorModel]:
    """One model per patient, fitted on the other patients' regions (leave one patient out)."""
    out = {}
    for p in sorted({v.patient for v in volumes}):
        rest = [v for v in volumes if v.patient != p]
        x = np.concatenate([v.features for v in rest]) if rest else np.zeros((0, len(FEATURES)))
        y = np.concatenate([v.catches.any(axis=1) for v in rest]) if rest else np.zeros(0)
        out[p] = fit_logistic(x, y, l2)
    return out


def held_out_probabilities(volumes: Sequence[VolumeRegions], models: Dict[str, ErrorModel]):
    """``(p_error, caught)`` of every region, each from its held-out patient's model."""
    p = [models[v.patient].probability(v.features) for v in volumes if len(v.features)]
    y = [v.catches.any(axis=1) for v in volumes if len(v.features)]
    return (np.concatenate(p), np.concatenate(y)) if p else (np.zeros(0), np.zeros(0, bool))


def region_ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> Optional[float]:
    """Expected calibration error of ``p_error`` over regions (equal-width bins)."""
    if len(p) == 0:
        return None
    idx = np.minimum((np.asarray(p) * bins).astype(int), bins - 1)
    err = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            err += m.sum() / len(p) * abs(float(np.mean(y[m])) - float(np.mean(p[m])))
    return float(err)


def select_settings(maps: Sequence[VolumeMaps], grid: Optional[dict] = None, max_regions: int = MAX_REGIONS,
                    max_burden: float = MAX_BURDEN, progress=None) -> dict:
    """Grid search on (clean validation) ``maps``; returns the chosen settings, the fitted model and
    every candidate's cross-validated figures."""
    grid = grid or GRID
    prepared = [(m, near_errors(substantial_errors(m.pred, m.truth))) for m in maps]
    keys = list(grid)
    combos = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
    if progress is not None:
        progress.stage("region settings", len(combos))
    rows = []
    best = None
    for settings in combos:
        vols = [volume_regions(m, near, settings) for m, near in prepared]
        cv = score(vols, cross_validated(vols), max_regions)
        summary = cv.summary()
        row = {**settings, **summary}
        rows.append(row)
        objective = (summary[f"caught_top{BUDGET}"] or 0.0, summary["caught_all"] or 0.0)
        burden = summary["top3_size_over_foreground"]  # (score() already keeps at most max_regions)
        if burden is not None and burden <= max_burden and (best is None or objective > best[0]):
            best = (objective, settings, vols)
        if progress is not None:
            progress.advance(1)
    if best is None:
        raise ValueError(f"no candidate setting produced regions within a review burden of {max_burden:.0%}")
    _, settings, vols = best
    x = np.concatenate([v.features for v in vols])
    y = np.concatenate([v.catches.any(axis=1) for v in vols])
    model = fit_logistic(x, y)
    held_out = cross_validated(vols)
    p_cv, y_cv = held_out_probabilities(vols, held_out)
    return {"settings": {**settings, "max_regions": max_regions}, "model": model, "candidates": rows,
            "validation": {**score(vols, {v.patient: model for v in vols}, max_regions).summary(),
                           "cross_validated": score(vols, held_out, max_regions).summary(),
                           "cross_validated_region_ece": region_ece(p_cv, y_cv),
                           "regions_total": int(len(y)), "regions_with_error": int(y.sum())}}


def evaluate_review(maps: Sequence[VolumeMaps], settings: dict, model: Optional[ErrorModel]) -> dict:
    """Per condition: the tally of the bundle's regions and the reliability of ``p_error``."""
    out = {}
    for cond in dict.fromkeys(m.condition for m in maps):
        tally = ReviewTally()
        ps, ys = [], []
        for m in (x for x in maps if x.condition == cond):
            near = near_errors(substantial_errors(m.pred, m.truth))
            v = volume_regions(m, near, settings)
            order, p = rank_regions(v.features, model, settings.get("max_regions"))
            caught = v.catches[order] if len(order) else np.zeros((0, len(near)), bool)
            tally.add(caught, v.sizes[order], v.foreground)
            if p is not None and len(order):
                ps.append(p[order])
                ys.append(caught.any(axis=1))
        p_all = np.concatenate(ps) if ps else np.zeros(0)
        y_all = np.concatenate(ys) if ys else np.zeros(0, bool)
        out[cond] = {**tally.summary(), "region_ece": region_ece(p_all, y_all),
                     "reliability": reliability_bins(p_all, y_all)}
    return out


def reliability_bins(p: np.ndarray, y: np.ndarray, bins: int = 10) -> dict:
    """Per equal-width bin of ``p_error``: count, mean predicted, observed error frequency."""
    idx = np.minimum((np.asarray(p) * bins).astype(int), bins - 1) if len(p) else np.zeros(0, int)
    out = {"count": [], "mean_p": [], "observed": []}
    for b in range(bins):
        m = idx == b
        out["count"].append(int(m.sum()))
        out["mean_p"].append(float(np.mean(p[m])) if m.any() else None)
        out["observed"].append(float(np.mean(y[m])) if m.any() else None)
    return out
