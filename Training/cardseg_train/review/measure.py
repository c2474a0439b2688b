"""The review study's measure: covered errors against burden, the baselines at the same burden,
voxel-level error detection, and ``p_error`` reliability, per condition.

Per volume (:func:`volume_study`) the rule's regions are formed and ranked as the engine does
(:func:`cardseg.review.regions.form_regions`); every baseline then flags as many voxels of the
same volume as the rule's first :data:`TOP` regions hold (:mod:`cardseg.review.coverage`).
:func:`condition_summary` pools a condition's volumes.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from cardseg.metrics.calibration import binary_ece_consistency, equal_width_bins
from cardseg.metrics.detection import detection_scores
from cardseg.review import coverage as cv
from cardseg.review.evaluation import near_errors
from cardseg.review.regions import ErrorModel, feature_map, form_regions, rank_regions, region_features, region_settings

from cardseg_train.base.stats import BOOTSTRAP_LEVEL, BOOTSTRAP_RESAMPLES, interval, resample_weights
from cardseg_train.review.data import VolumeMaps
from cardseg_train.review.fit import patient_of

#: the review budget: the first TOP regions per volume
TOP = 3
#: burdens (share of the predicted heart) of the coverage curves
BURDENS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5)
#: the maps whose highest voxels are baselines (VolumeMaps attribute -> name in the tables)
VOXEL_MAPS = {
    "tac": "TAC voxels",
    "tac_flips": "TAC + flip voxels",
    "entropy_card": "CARD calibrated entropy",
    "entropy_uc": "primary entropy (uc)",
}  # TAC + flips: where the maps hold the flipped runs
#: random baselines are averaged over this many draws
DRAWS = 5


def touched_errors(errors: np.ndarray, n: int, flagged: np.ndarray) -> int:
    """Errors with a flagged voxel within 2 in-plane pixels (the retired measure, for the control)."""
    masks = [errors == i for i in range(1, n + 1)]
    return int(sum(bool(flagged[g].any()) for g in near_errors(masks)))


def regions_in_order(m: VolumeMaps, settings: dict, model: Optional[ErrorModel]):
    """``(labels, order, p)``: the rule's regions of ``m`` (labels ``(Z, Y, X)``), the review order
    (indices, at most ``max_regions``) and every region's ``p_error`` (``None`` without a model)."""
    s = region_settings(settings)
    score = feature_map(m.tac, m.pred, s, m.flips)
    lab, n = form_regions(m.tac, m.pred, s, m.spacing, score)
    feats = region_features(score, m.pred, lab, n)
    ml = np.bincount(lab.ravel(), minlength=n + 1)[1:] * float(np.prod(m.spacing)) / 1000.0
    order, p = rank_regions(feats, model, s.get("max_regions"), s["ranking"], ml)
    return lab, order, p


def volume_study(
    m: VolumeMaps, settings: dict, model: Optional[ErrorModel], rng: np.random.Generator, with_detection: bool = True
) -> dict:
    """One volume: covered errors of the first 1..k regions, the baselines at the burden of the
    first :data:`TOP`, the coverage curves of the voxel maps, and the voxels for detection AUCs."""
    errors, n = cv.error_labels(m.pred, m.truth)
    sizes = cv.error_sizes(errors, n)
    heart = cv.heart_voxels(m.pred)
    near = cv.heart_neighbourhood(m.pred)
    boundary = cv.predicted_boundary(m.pred)
    lab, order, p = regions_in_order(m, settings, model)
    ranks = np.zeros(int(lab.max()) + 1, np.int32)
    ranks[order + 1] = np.arange(1, order.size + 1)
    rank_map = ranks[lab]
    overlap = cv.overlap_matrix(errors, n, rank_map, order.size)
    vox = np.bincount(rank_map.ravel(), minlength=order.size + 1)[1:]
    top = rank_map > 0
    top &= rank_map <= TOP
    budget = int(vox[:TOP].sum())
    voxel_ml = float(np.prod(m.spacing)) / 1000.0
    out = {
        "case": m.case,
        "errors": n,
        "heart_voxels": heart,
        "voxel_ml": voxel_ml,
        "covered_k": cv.covered_top_k(overlap, sizes).sum(axis=1).tolist(),
        "burden_k": (np.cumsum(np.concatenate([[0], vox])) / max(heart, 1)).tolist(),
        "top_voxels": budget,
        "top_burden": budget / heart if heart else float("nan"),
        "top_ml": budget * voxel_ml,
        "touched_top": touched_errors(errors, n, top),
        "p_error": [] if p is None else p[order].tolist(),
        "holds_error": cv.holds_error(overlap, sizes).tolist(),
        "same_burden": {},
        "curves": {},
    }
    for key in VOXEL_MAPS:
        score = getattr(m, key)
        if score is None:
            continue
        out["same_burden"][key] = int(cv.covered(errors, n, cv.top_voxels(score, near, budget)).sum())
        out["curves"][key] = cv.covered_at_burdens(errors, n, score, near, heart, BURDENS)
    draws = [cv.random_voxels(boundary, budget, rng) for _ in range(DRAWS)]
    out["same_burden"]["boundary"] = float(np.mean([cv.covered(errors, n, d).sum() for d in draws]))
    out["touched_boundary"] = float(np.mean([touched_errors(errors, n, d) for d in draws]))
    out["curves"]["boundary"] = [
        float(
            np.mean(
                [cv.covered(errors, n, cv.random_voxels(boundary, int(round(b * heart)), rng)).sum() for _ in range(2)]
            )
        )
        for b in BURDENS
    ]
    top_map = np.where(top, rank_map, 0)
    out["same_burden"]["random_regions"] = float(
        np.mean(
            [
                cv.covered(errors, n, cv.random_regions(top_map, min(TOP, order.size), near, rng) > 0).sum()
                for _ in range(DRAWS)
            ]
        )
    )
    if with_detection:
        wrong = (m.pred != m.truth)[near]
        score_rank = np.where(rank_map > 0, 1.0 / np.maximum(rank_map, 1), 0.0)  # first region highest
        out["detection"] = {
            "wrong": wrong,
            "tac": m.tac[near],
            "regions": score_rank[near],
            "boundary": boundary[near].astype(np.float32),
            **{k: v[near] for k in ("tac_flips", "entropy_card", "entropy_uc") if (v := getattr(m, k)) is not None},
        }
    return out


def reliability(p: np.ndarray, y: np.ndarray, bins: int = 10) -> dict:
    """Equal-width bins of ``p_error``: count, mean predicted, observed frequency; the ECE beside
    what a perfectly calibrated ``p_error`` shows on as many regions
    (:func:`cardseg.metrics.calibration.binary_ece_consistency`); the regions' ``p_error`` and
    outcomes themselves (``p``, ``holds``: conditions can be pooled, :func:`pooled_reliability`)."""
    p = np.asarray(p, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    idx = equal_width_bins(p, bins)
    out = {"count": [], "mean_p": [], "observed": []}
    for b in range(bins):
        sel = idx == b
        out["count"].append(int(sel.sum()))
        out["mean_p"].append(float(p[sel].mean()) if sel.any() else None)
        out["observed"].append(float(y[sel].mean()) if sel.any() else None)
    check = binary_ece_consistency(p, y, bins)
    out["ece"] = check["ece"] if len(p) else None
    out.update({k: check[k] for k in ("calibrated_median", "calibrated_q90", "consistency_p")} if len(p) else {})
    out["p"] = [round(float(v), 6) for v in p]
    out["holds"] = [int(v) for v in y]
    return out


def regions_of(rel: dict) -> tuple:
    """``(p_error, holds)`` of a :func:`reliability` result. Results written before the regions'
    own values were kept give them back from the bins: each bin's regions at the bin's mean
    ``p_error``, ``round(observed * count)`` of them holding an error. The ECE is then the same; the
    calibrated figures are a close, slightly high estimate (at the bin's mean the binomial spread
    is at least the regions' own, larger by the spread of ``p_error`` within a 0.1-wide bin)."""
    if "p" in rel:
        return np.asarray(rel["p"], dtype=np.float64), np.asarray(rel["holds"], dtype=np.float64)
    p, y = [], []
    for n, m, o in zip(rel["count"], rel["mean_p"], rel["observed"]):
        if n:
            k = int(round(o * n))
            p += [m] * n
            y += [1.0] * k + [0.0] * (n - k)
    return np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)


def pooled_reliability(summaries: Dict[str, dict]) -> Optional[dict]:
    """:func:`reliability` over the regions of every condition of ``{condition: summary}`` together
    (a condition without regions adds none; None when no condition has any)."""
    rels = [s.get("reliability") for s in summaries.values() if s.get("reliability") is not None]
    if not rels:
        return None
    parts = [regions_of(r) for r in rels]
    return reliability(np.concatenate([q[0] for q in parts]), np.concatenate([q[1] for q in parts]))


def condition_summary(vols: Sequence[dict], max_regions: Optional[int]) -> dict:
    """Pool one condition's :func:`volume_study` results into its table row, curves and AUCs."""
    errors = sum(v["errors"] for v in vols)

    def frac(c):
        return c / errors if errors else None

    k_max = max(len(v["covered_k"]) for v in vols) - 1 if vols else 0
    by_k = []
    for k in range(1, k_max + 1):
        cov = sum(v["covered_k"][min(k, len(v["covered_k"]) - 1)] for v in vols)
        bur = [v["burden_k"][min(k, len(v["burden_k"]) - 1)] for v in vols]
        by_k.append({"regions": k, "covered": frac(cov), "median_burden": float(np.nanmedian(bur))})
    p = np.concatenate([np.asarray(v["p_error"], float) for v in vols]) if vols else np.zeros(0)
    y = np.concatenate([np.asarray(v["holds_error"], bool)[: len(v["p_error"])] for v in vols]) if vols else []
    same = (
        {key: frac(sum(v["same_burden"].get(key, 0) for v in vols)) for key in vols[0]["same_burden"]} if vols else {}
    )
    curves = {
        key: [frac(sum(v["curves"][key][i] for v in vols)) for i in range(len(BURDENS))]
        for key in (vols[0]["curves"] if vols else {})
    }
    top_k = min(TOP, k_max) if k_max else 0
    row = {
        "volumes": len(vols),
        "substantial_errors": errors,
        "covered_top3": frac(sum(v["covered_k"][min(TOP, len(v["covered_k"]) - 1)] for v in vols)),
        "covered_all": frac(sum(v["covered_k"][-1] for v in vols)),
        "median_burden_top3": float(np.nanmedian([v["top_burden"] for v in vols])) if vols else None,
        "median_ml_top3": float(np.median([v["top_ml"] for v in vols])) if vols else None,
        "touched_top3": frac(sum(v["touched_top"] for v in vols)),
        "touched_boundary_same_burden": frac(sum(v["touched_boundary"] for v in vols)),
        "regions_per_volume": float(np.mean([len(v["covered_k"]) - 1 for v in vols])) if vols else None,
        "regions_holding_nothing": float(1 - np.mean(y)) if len(y) else None,
        "same_burden": same,
        "top_regions": top_k,
        "max_regions": max_regions,
    }
    row["intervals"] = covered_intervals(vols)
    rel = reliability(p, y) if len(p) else None
    return {
        **row,
        "p_error_ece": None if rel is None else rel["ece"],
        "reliability": rel,
        "by_regions": by_k,
        "curves": {"burdens": list(BURDENS), **curves},
        "detection": detection_table(vols),
    }


def covered_intervals(vols: Sequence[dict], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict:
    """95% patient-bootstrap intervals (patients drawn with replacement, a patient's volumes
    together; :func:`cardseg_train.base.stats.resample_weights`) of the covered fraction of the
    rule's first :data:`TOP` regions and of each baseline at the same burden: ``{"level",
    "resamples", "patients", "covered_top3": [lo, hi], "same_burden": {key: [lo, hi]}}``."""
    if not vols:
        return {}
    patients = sorted({patient_of(v["case"]) for v in vols})
    index = {q: i for i, q in enumerate(patients)}
    keys = list(vols[0]["same_burden"])
    counts = np.zeros((2 + len(keys), len(patients)))  # errors, rule top 3, baselines
    for v in vols:
        i = index[patient_of(v["case"])]
        counts[0, i] += v["errors"]
        counts[1, i] += v["covered_k"][min(TOP, len(v["covered_k"]) - 1)]
        for j, k in enumerate(keys):
            counts[2 + j, i] += v["same_burden"].get(k, 0)
    w = resample_weights(len(patients), resamples, seed)
    drawn = w @ counts.T  # (resamples, rows)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = drawn[:, 1:] / drawn[:, :1]
    return {
        "level": BOOTSTRAP_LEVEL,
        "resamples": resamples,
        "patients": len(patients),
        "covered_top3": interval(frac[:, 0]),
        "same_burden": {k: interval(frac[:, 1 + j]) for j, k in enumerate(keys)},
    }


def detection_table(vols: Sequence[dict]) -> Dict[str, dict]:
    """Voxel-level AUROC and AUPRC of each map for wrong voxels, pooled over the volumes' heart
    neighbourhoods."""
    parts = [v["detection"] for v in vols if "detection" in v]
    if not parts:
        return {}
    wrong = np.concatenate([d["wrong"] for d in parts])
    keys = [k for k in parts[0] if k != "wrong"]
    return {k: detection_scores(np.concatenate([d[k] for d in parts]), wrong) for k in keys}


def study(
    maps: Sequence[VolumeMaps],
    settings: dict,
    model: Optional[ErrorModel],
    seed: int = 0,
    with_detection: bool = True,
    progress=None,
) -> Dict[str, dict]:
    """:func:`condition_summary` per condition of ``maps`` (in their order)."""
    out: Dict[str, List[dict]] = {}
    for i, m in enumerate(maps):
        rng = np.random.default_rng([seed, i])
        out.setdefault(m.condition, []).append(volume_study(m, settings, model, rng, with_detection))
        if progress is not None:
            progress.advance(1)
    return {cond: condition_summary(vols, settings.get("max_regions")) for cond, vols in out.items()}
