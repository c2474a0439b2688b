"""Fitting the error-map rule of flagged regions, on the validation split only.

The rule (``regions.map = "error_probability"``): a voxel error-probability map
(:mod:`cardseg.review.error_map`), 3D hysteresis on it near the predicted heart, holes filled
slice by slice, regions cut to a volume cap, ranked by the summed map (expected wrong voxels),
``p_error`` from the region model of :mod:`cardseg_train.review.fit` with a Platt step.

Everything is cross-fitted by patient so that the choice is made on held-out figures: the voxel
model of each patient is fitted on the other patients' voxels (:func:`cross_fitted_maps`); the
candidate rules (:data:`GRID`) cut regions from those held-out maps; their region models are
fitted leave-one-patient-out and the Platt step on the other patients' held-out logits
(:func:`evaluate_candidate`). The candidate whose first :data:`~cardseg_train.review.fit.BUDGET`
regions cover the most substantial errors at a median burden of at most
:data:`~cardseg_train.review.fit.MAX_BURDEN` wins (:func:`fit_error_map_rule`); its models are
then fitted on all validation patients. Test patients are never read here.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from cardseg.metrics.detection import detection_scores
from cardseg.review import coverage as cv
from cardseg.review.error_map import VOXEL_FEATURES, error_probability, smoothed, voxel_features
from cardseg.review.regions import ErrorModel, form_regions, rank_regions, region_features

from cardseg_train.review.data import VolumeMaps
from cardseg_train.review.fit import (
    BUDGET,
    MAX_BURDEN,
    MAX_REGIONS,
    VolumeRegions,
    fit_logistic,
    patient_of,
    region_ece,
    volume_errors,
)

#: share of each training fold's voxels the voxel model is fitted on (fixed draw; memory, time)
VOXEL_SHARE = 0.35
#: L2 weight of the voxel model (standardised features; many voxels, little shrinkage needed)
VOXEL_L2 = 1e-3
#: the rule's fixed parts: hysteresis grows to this share of the flag threshold, 3D, holes filled
FIXED = {
    "map": "error_probability",
    "connectivity": "3d",
    "fill_holes": True,
    "smooth_px": 0.0,
    "merge_px": 0,
    "min_voxels": 10,
    "neighbourhood_px": cv.NEIGHBOURHOOD_PX,
    "ranking": "summed_map",
    "max_regions": MAX_REGIONS,
}
GROW = 0.5
#: the TAC quantile (heart neighbourhood, clean validation) the disagreement overlays show brightest
DISPLAY_QUANTILE = 0.99
#: candidate flag thresholds (probabilities) and size caps (ml)
GRID = {"flag_threshold": (0.15, 0.2, 0.25), "max_ml": (30.0, 40.0, 50.0, 60.0)}


def voxel_data(m: VolumeMaps) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(features (N, F), wrong (N,) bool, where (Z, Y, X) bool)`` over the heart's neighbourhood
    of one volume; ``wrong``: the voxel lies in a substantial error."""
    where = cv.heart_neighbourhood(m.pred)
    errors, _ = cv.error_labels(m.pred, m.truth)
    return voxel_features(m.tac, m.pred, where), (errors > 0)[where], where


def fit_voxel_model(x: np.ndarray, y: np.ndarray, seed: int = 0) -> ErrorModel:
    """Logistic voxel model over :data:`VOXEL_FEATURES` on a fixed :data:`VOXEL_SHARE` of the voxels."""
    keep = np.random.default_rng(seed).random(len(y)) < VOXEL_SHARE
    return dataclasses.replace(fit_logistic(x[keep], y[keep], VOXEL_L2), features=VOXEL_FEATURES)


def cross_fitted_maps(maps: Sequence[VolumeMaps], progress=None) -> Tuple[List[np.ndarray], dict]:
    """Each volume's error map from the voxel model fitted without its patient, and the pooled
    held-out voxel detection (AUROC / AUPRC) of that map beside the smoothed TAC's."""
    data = [voxel_data(m) for m in maps]
    patients = [patient_of(m.case) for m in maps]
    out: List[Optional[np.ndarray]] = [None] * len(maps)
    for p in sorted(set(patients)):
        rest = [i for i, q in enumerate(patients) if q != p]
        model = fit_voxel_model(np.concatenate([data[i][0] for i in rest]), np.concatenate([data[i][1] for i in rest]))
        for i, q in enumerate(patients):
            if q == p:
                out[i] = error_probability(maps[i].tac, maps[i].pred, model, data[i][2])
        if progress is not None:
            progress.advance(1)
    wrong = np.concatenate([d[1] for d in data])
    held = np.concatenate([o[d[2]] for o, d in zip(out, data)])
    tac2 = np.concatenate([smoothed(m.tac, 2.0)[d[2]] for m, d in zip(maps, data)])
    detection = {"error_map_held_out": detection_scores(held, wrong), "tac_smoothed_2px": detection_scores(tac2, wrong)}
    return out, detection


def display_max(maps: Sequence[VolumeMaps], q: float = DISPLAY_QUANTILE) -> float:
    """The disagreement shown brightest by the overlays: the ``q`` quantile of the TAC over the
    heart neighbourhoods of ``maps`` (the clean validation volumes)."""
    return float(np.quantile(np.concatenate([m.tac[cv.heart_neighbourhood(m.pred)] for m in maps]), q))


def candidate(flag_threshold: float, max_ml: float) -> dict:
    return {
        **FIXED,
        "flag_threshold": flag_threshold,
        "grow_threshold": round(GROW * flag_threshold, 6),
        "max_ml": max_ml,
    }


def volume_regions(m: VolumeMaps, score: np.ndarray, settings: dict) -> VolumeRegions:
    """Regions cut from the (held-out) error map ``score`` of one volume, as the engine cuts them."""
    lab, n = form_regions(m.tac, m.pred, {**settings, "voxel_model": {"held_out": True}}, m.spacing, score)
    errors, ne, esz = volume_errors(m)
    sizes = np.bincount(lab.ravel(), minlength=n + 1)[1:]
    return VolumeRegions(
        m.case,
        patient_of(m.case),
        region_features(score, m.pred, lab, n),
        cv.overlap_matrix(errors, ne, lab, n),
        esz,
        sizes,
        sizes * float(np.prod(m.spacing)) / 1000.0,
        cv.heart_voxels(m.pred),
    )


def fit_platt(z: np.ndarray, y: np.ndarray) -> Tuple[float, float]:
    """``(a, b)`` of ``sigmoid(a z + b)`` fitted to ``y`` by logistic regression on the logits ``z``."""
    m = fit_logistic(np.asarray(z, dtype=np.float64)[:, None], np.asarray(y, dtype=np.float64), l2=0.0)
    if len(y) == 0:
        return 1.0, 0.0
    return float(m.coef[0] / m.scale[0]), float(m.intercept - m.coef[0] * m.mean[0] / m.scale[0])


def evaluate_candidate(vols: Sequence[VolumeRegions]) -> dict:
    """Held-out figures of one candidate: coverage and burden of the first :data:`BUDGET` regions
    (ranked by the summed map), region models leave-one-patient-out, ``p_error`` ECE without and
    with a Platt step fitted on the other patients' held-out logits."""
    patients = sorted({v.patient for v in vols})
    logits: Dict[str, np.ndarray] = {}
    for p in patients:
        rest = [v for v in vols if v.patient != p]
        model = fit_logistic(np.concatenate([v.features for v in rest]), np.concatenate([v.holds for v in rest]))
        for v in vols:
            if v.patient == p:
                logits[v.case] = model.logit(v.features) if len(v.features) else np.zeros(0)
    errors = covered_top = covered_all = 0
    burdens, z_kept, y_kept, pat_kept = [], [], [], []
    for v in vols:
        order, _ = rank_regions(v.features, None, MAX_REGIONS, "summed_map", v.ml)
        cov = cv.covered_top_k(v.overlap[order], v.error_sizes)
        errors += len(v.error_sizes)
        covered_top += int(cov[min(BUDGET, len(order))].sum())
        covered_all += int(cov[-1].sum())
        burdens.append(float(v.sizes[order][:BUDGET].sum()) / v.heart if v.heart else 0.0)
        z_kept.append(logits[v.case][order])
        y_kept.append(v.holds[order])
        pat_kept += [v.patient] * len(order)
    z, y, pk = np.concatenate(z_kept), np.concatenate(y_kept), np.asarray(pat_kept)
    p_raw = 1.0 / (1.0 + np.exp(-z))
    p_platt = np.zeros_like(p_raw)
    for p in patients:
        a, b = fit_platt(z[pk != p], y[pk != p])
        p_platt[pk == p] = 1.0 / (1.0 + np.exp(-(a * z[pk == p] + b)))
    return {
        "volumes": len(vols),
        "substantial_errors": errors,
        "covered_top3": covered_top / errors if errors else None,
        "covered_all": covered_all / errors if errors else None,
        "median_burden_top3": float(np.median(burdens)) if burdens else None,
        "regions_per_volume": len(y) / len(vols) if vols else None,
        "regions": int(len(y)),
        "regions_holding_an_error": int(y.sum()),
        "region_ece_logistic": region_ece(p_raw, y),
        "region_ece": region_ece(p_platt, y),
        "held_out_logits": z.tolist(),
        "holds": y.astype(int).tolist(),
    }


def fit_error_map_rule(
    maps: Sequence[VolumeMaps], grid: Optional[dict] = None, progress=None, max_burden: float = MAX_BURDEN
) -> dict:
    """Choose the candidate (held out) and fit the final voxel model, region model and Platt step.

    Returns ``settings`` (a full ``regions`` rule without models), ``voxel_model``, ``model``,
    every candidate's held-out figures, the chosen one's and the held-out voxel detection."""
    grid = grid or GRID
    combos = list(itertools.product(*(grid[k] for k in ("flag_threshold", "max_ml"))))
    if progress is not None:
        progress.stage("error-map rule", len({patient_of(m.case) for m in maps}) + len(combos))
    held_maps, detection = cross_fitted_maps(maps, progress)
    rows, best = [], None
    for t, cap in combos:
        settings = candidate(t, cap)
        vols = [volume_regions(m, s, settings) for m, s in zip(maps, held_maps)]
        figures = evaluate_candidate(vols)
        rows.append(
            {
                "flag_threshold": t,
                "max_ml": cap,
                **{k: v for k, v in figures.items() if k not in ("held_out_logits", "holds")},
            }
        )
        objective = (figures["covered_top3"] or 0.0, figures["covered_all"] or 0.0)
        if (
            figures["median_burden_top3"] is not None
            and figures["median_burden_top3"] <= max_burden
            and (best is None or objective > best[0])
        ):
            best = (objective, settings, vols, figures)
        if progress is not None:
            progress.advance(1)
    if best is None:
        raise ValueError(f"no candidate rule kept the median burden within {max_burden:.0%}")
    _, settings, vols, figures = best
    voxel = [voxel_data(m) for m in maps]
    voxel_model = fit_voxel_model(np.concatenate([d[0] for d in voxel]), np.concatenate([d[1] for d in voxel]))
    model = fit_logistic(np.concatenate([v.features for v in vols]), np.concatenate([v.holds for v in vols]))
    model.platt = fit_platt(np.asarray(figures["held_out_logits"]), np.asarray(figures["holds"]))
    chosen = {k: v for k, v in figures.items() if k not in ("held_out_logits", "holds")}
    return {
        "settings": settings,
        "voxel_model": voxel_model,
        "model": model,
        "candidates": rows,
        "display_max_disagreement": display_max(maps),
        "validation": {
            "cross_validated": chosen,
            "voxel_detection": detection,
            "regions_total": int(sum(len(v.features) for v in vols)),
            "regions_holding_an_error": int(sum(v.holds.sum() for v in vols)),
        },
    }
