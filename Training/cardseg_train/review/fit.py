"""Choosing how regions are formed and fitting ``p_error``, on the validation split only.

For every candidate setting (review map smoothing, connectivity, flag and grow thresholds, size
cap, ranking) the regions of each clean validation volume are formed with the engine's own
:func:`cardseg.review.regions.form_regions`, described by
:func:`cardseg.review.regions.region_features`, and labelled 1 when they hold at least half of a
substantial error (:mod:`cardseg.review.coverage`). A logistic model (L2, standardised features)
predicts that label; it is fitted leave-one-patient-out so that the setting is chosen on
out-of-sample rankings: the setting whose first :data:`BUDGET` regions per volume cover the most
substantial errors (at least half of each error's pixels) with a median burden (their voxels over
the predicted heart's) of at most :data:`MAX_BURDEN` wins. The final model is then fitted on all
validation regions of that setting. The search runs in two passes (:func:`two_pass`): the grid
:data:`GRID`, then a finer one around its winner. Test patients are never read here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
from scipy import optimize

from cardseg.metrics.calibration import binary_ece
from cardseg.review import coverage as cv
from cardseg.review.regions import FEATURES, ErrorModel, form_regions, rank_regions, region_features

from cardseg_train.review.data import VolumeMaps

#: the review budget the selection maximises: errors covered by the first BUDGET regions
BUDGET = 3
#: regions reported per volume at most
MAX_REGIONS = 6
#: the first BUDGET regions may hold at most this share of the predicted heart (median over volumes)
MAX_BURDEN = 0.10
#: fixed parts of every candidate: smallest region, no merging, the heart's neighbourhood only
FIXED = {"min_voxels": 10, "merge_px": 0, "neighbourhood_px": cv.NEIGHBOURHOOD_PX}
#: the hysteresis grow threshold as a share of the flag threshold
GROW = 0.6
#: (flag 0.04 and cap 120 ml since 2.2.0: the 2.1.0-era fits landed on the grid's lowest flag and largest cap)
GRID = {
    "smooth_px": (0.0, 2.0),
    "connectivity": ("3d", "slice"),
    "flag_threshold": (0.04, 0.06, 0.08, 0.1),
    "max_ml": (15.0, 30.0, 60.0, 120.0),
    "ranking": ("p_error", "p_error_per_ml"),
}


@dataclass
class VolumeRegions:
    """One volume's candidate regions under one setting: features ``(n, F)``, overlap with its
    errors ``(n, E)`` (pixels), error sizes ``(E,)``, region sizes ``(n,)`` voxels and ml, and the
    volume's predicted heart voxels."""

    case: str
    patient: str
    features: np.ndarray
    overlap: np.ndarray
    error_sizes: np.ndarray
    sizes: np.ndarray
    ml: np.ndarray
    heart: int

    @property
    def holds(self) -> np.ndarray:
        """``(n,)`` bool: the region holds at least half of a substantial error."""
        return cv.holds_error(self.overlap, self.error_sizes)


def patient_of(case: str) -> str:
    return case.split("_")[0]


def candidate_settings(settings: dict) -> dict:
    """A grid point as a full ``regions`` block (without model)."""
    s = {**FIXED, **settings}
    s["grow_threshold"] = round(GROW * float(s["flag_threshold"]), 6)
    return s


def volume_errors(maps: VolumeMaps) -> tuple:
    """``(labels, n, sizes)`` of the volume's substantial errors (:mod:`cardseg.review.coverage`)."""
    el, n = cv.error_labels(maps.pred, maps.truth)
    return el, n, cv.error_sizes(el, n)


def volume_regions(maps: VolumeMaps, errors, settings: dict) -> VolumeRegions:
    """``errors``: ``(labels, n, sizes)`` of the volume's substantial errors (:func:`volume_errors`)."""
    lab, n = form_regions(maps.tac, maps.pred, settings, maps.spacing)
    feats = region_features(maps.tac, maps.pred, lab, n)
    sizes = np.bincount(lab.ravel(), minlength=n + 1)[1:]
    el, ne, esz = errors
    return VolumeRegions(
        maps.case,
        patient_of(maps.case),
        feats,
        cv.overlap_matrix(el, ne, lab, n),
        esz,
        sizes,
        sizes * float(np.prod(maps.spacing)) / 1000.0,
        cv.heart_voxels(maps.pred),
    )


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 0.05) -> ErrorModel:
    """Logistic regression on standardised features by L-BFGS (mean log-loss + ``l2 |w|^2``)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(y) == 0:  # no regions at all: a model that says nothing (p = 0.5), never NaN
        return ErrorModel(np.zeros(x.shape[1]), np.ones(x.shape[1]), np.zeros(x.shape[1]), 0.0)
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


def volume_scores(
    volumes: Sequence[VolumeRegions],
    models: Dict[str, Optional[ErrorModel]],
    max_regions: Optional[int] = MAX_REGIONS,
    ranking: str = "p_error",
) -> List[dict]:
    """Each volume's regions ranked with its patient's model (``None``: summed disagreement), at
    most ``max_regions`` kept: one dict per volume with ``patient``, ``errors`` (substantial
    errors), ``covered_top`` (covered by the first :data:`BUDGET`), ``covered_all``, ``burden``
    (the first :data:`BUDGET`'s voxels over the predicted heart's), ``order`` and ``p``."""
    out = []
    for v in volumes:
        order, p = rank_regions(v.features, models.get(v.patient), max_regions, ranking, v.ml)
        cov = cv.covered_top_k(v.overlap[order], v.error_sizes)
        out.append(
            {
                "patient": v.patient,
                "errors": len(v.error_sizes),
                "covered_top": int(cov[min(BUDGET, len(order))].sum()),
                "covered_all": int(cov[-1].sum()),
                "burden": float(v.sizes[order][:BUDGET].sum()) / v.heart if v.heart else 0.0,
                "order": order,
                "p": p,
            }
        )
    return out


def score(
    volumes: Sequence[VolumeRegions],
    models: Dict[str, Optional[ErrorModel]],
    max_regions: Optional[int] = MAX_REGIONS,
    ranking: str = "p_error",
) -> dict:
    """:func:`volume_scores` summed over the volumes: covered errors of the first :data:`BUDGET`
    and of all, the median burden, and the ECE of the kept regions' (p_error, holds) pairs."""
    rows = volume_scores(volumes, models, max_regions, ranking)
    errors = sum(r["errors"] for r in rows)
    covered_top = sum(r["covered_top"] for r in rows)
    covered_all = sum(r["covered_all"] for r in rows)
    burdens = [r["burden"] for r in rows]
    kept = sum(len(r["order"]) for r in rows)
    ps = [r["p"][r["order"]] for r in rows if r["p"] is not None and len(r["order"])]
    ys = [v.holds[r["order"]] for v, r in zip(volumes, rows) if r["p"] is not None and len(r["order"])]
    p_all = np.concatenate(ps) if ps else np.zeros(0)
    y_all = np.concatenate(ys) if ys else np.zeros(0, bool)
    return {
        "volumes": len(volumes),
        "substantial_errors": errors,
        "covered_top3": covered_top / errors if errors else None,
        "covered_all": covered_all / errors if errors else None,
        "median_burden_top3": float(np.median(burdens)) if burdens else None,
        "regions_per_volume": kept / len(volumes) if volumes else None,
        "region_ece": region_ece(p_all, y_all),
        "regions": int(len(y_all)),
        "regions_holding_an_error": int(np.sum(y_all)),
    }


def cross_validated(volumes: Sequence[VolumeRegions], l2: float = 0.05) -> Dict[str, ErrorModel]:
    """One model per patient, fitted on the other patients' regions (leave one patient out)."""
    out = {}
    for p in sorted({v.patient for v in volumes}):
        rest = [v for v in volumes if v.patient != p]
        x = np.concatenate([v.features for v in rest]) if rest else np.zeros((0, len(FEATURES)))
        y = np.concatenate([v.holds for v in rest]) if rest else np.zeros(0)
        out[p] = fit_logistic(x, y, l2)
    return out


def region_ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> Optional[float]:
    """Expected calibration error of ``p_error`` over regions (equal-width bins); None without regions."""
    return binary_ece(p, y, bins) if len(p) else None


def select_settings(
    maps: Sequence[VolumeMaps],
    grid: Optional[dict] = None,
    max_regions: int = MAX_REGIONS,
    max_burden: float = MAX_BURDEN,
    progress=None,
) -> dict:
    """Grid search on (clean validation) ``maps``; returns the chosen settings, the fitted model and
    every candidate's cross-validated figures. The objective: errors covered by the first
    :data:`BUDGET` regions (then by all reported), among candidates within ``max_burden``."""
    grid = grid or GRID
    errors = [volume_errors(m) for m in maps]
    formation = [k for k in grid if k != "ranking"]
    combos = [dict(zip(formation, values)) for values in itertools.product(*(grid[k] for k in formation))]
    rankings = grid.get("ranking", ("p_error",))
    if progress is not None:
        progress.stage("region settings", len(combos))
    rows, best = [], None
    for combo in combos:
        settings = candidate_settings(combo)
        vols = [volume_regions(m, e, settings) for m, e in zip(maps, errors)]
        held_out = cross_validated(vols)
        for ranking in rankings:
            summary = score(vols, held_out, max_regions, ranking)
            rows.append({**settings, "ranking": ranking, **summary})
            objective = (summary["covered_top3"] or 0.0, summary["covered_all"] or 0.0)
            burden = summary["median_burden_top3"]
            if burden is not None and burden <= max_burden and (best is None or objective > best[0]):
                best = (objective, {**settings, "ranking": ranking}, vols, summary)
        if progress is not None:
            progress.advance(1)
    if best is None:
        raise ValueError(f"no candidate setting produced regions within a median burden of {max_burden:.0%}")
    _, settings, vols, cv_summary = best
    x = np.concatenate([v.features for v in vols])
    y = np.concatenate([v.holds for v in vols])
    model = fit_logistic(x, y)
    return {
        "settings": {**settings, "max_regions": max_regions},
        "model": model,
        "candidates": rows,
        "validation": {
            "in_sample": score(vols, {v.patient: model for v in vols}, max_regions, settings["ranking"]),
            "cross_validated": cv_summary,
            "regions_total": int(len(y)),
            "regions_holding_an_error": int(y.sum()),
        },
    }


def refine_grid(settings: dict) -> dict:
    """The second pass around the first pass's winner: its smoothing, connectivity and ranking, the
    flag threshold x 0.875 / 1 / 1.125 and the size cap x 1 / 1.5 / 2."""
    t, cap = float(settings["flag_threshold"]), settings.get("max_ml")
    return {
        "smooth_px": (settings["smooth_px"],),
        "connectivity": (settings["connectivity"],),
        "flag_threshold": tuple(round(t * f, 4) for f in (0.875, 1.0, 1.125)),
        "max_ml": (None,) if cap is None else tuple(float(cap) * f for f in (1.0, 1.5, 2.0)),
        "ranking": (settings["ranking"],),
    }


def two_pass(
    maps: Sequence[VolumeMaps], first: Optional[dict] = None, progress=None, max_burden: float = MAX_BURDEN
) -> dict:
    """:func:`select_settings` over :data:`GRID`, then over :func:`refine_grid` of its winner (which
    holds that winner, so the second pass never does worse); candidates of both, tagged by pass.
    ``first``: the first pass's result when already computed (within the same ``max_burden``)."""
    first = first or select_settings(maps, progress=progress, max_burden=max_burden)
    second = select_settings(maps, grid=refine_grid(first["settings"]), progress=progress, max_burden=max_burden)
    second["candidates"] = [{**c, "pass": 1} for c in first["candidates"]] + [
        {**c, "pass": 2} for c in second["candidates"]
    ]
    return second
