"""The error-map rule of flagged regions: voxel features and map, hole filling, the summed-map
ranking, the Platt step, the fit's cross-fitting, and the bootstrap intervals of the measure."""

from __future__ import annotations

import numpy as np
import pytest

from cardseg.base.errors import CardsegError
from cardseg.review import coverage as cv
from cardseg.review.error_map import VOXEL_FEATURES, boundary_distance, error_probability, voxel_features
from cardseg.review.regions import (
    FEATURES,
    ErrorModel,
    LabelRule,
    feature_map,
    flagged_regions,
    form_regions,
    rank_regions,
    region_features,
    region_labels,
)

from conftest import blob_error_maps


def voxel_model(coef_of: dict, intercept: float = -2.0) -> ErrorModel:
    coef = np.array([coef_of.get(f, 0.0) for f in VOXEL_FEATURES])
    return ErrorModel(np.zeros(len(VOXEL_FEATURES)), np.ones(len(VOXEL_FEATURES)), coef, intercept, VOXEL_FEATURES)


def heart(z=5, y=40, x=40):
    pred = np.zeros((z, y, x), np.uint8)
    pred[:, 10:30, 10:30] = 1
    pred[:, 15:25, 15:25] = 3
    return pred


def test_voxel_features_columns_and_boundary_distance():
    pred = heart()
    tac = np.zeros(pred.shape, np.float32)
    tac[2, 20, 20] = 0.5
    where = np.zeros(pred.shape, bool)
    where[0, 20, 20] = where[2, 20, 20] = where[2, 0, 0] = True
    f = voxel_features(tac, pred, where)
    assert f.shape == (3, len(VOXEL_FEATURES)) and f.dtype == np.float32
    col = {n: f[:, i] for i, n in enumerate(VOXEL_FEATURES)}
    # scan order: (0, 20, 20), (2, 0, 0), (2, 20, 20)
    assert col["end_position"].tolist() == [1.0, 0.0, 0.0]
    assert col["pred_lv"].tolist() == [1.0, 0.0, 1.0] and col["pred_rv"].tolist() == [0.0, 0.0, 0.0]
    assert col["tac_s2"][2] > col["tac_s2"][0] == 0.0
    d = boundary_distance(pred)
    assert d[2, 20, 20] == pytest.approx(4.0) and d[2, 15, 15] == 0.0  # LV centre 5 px inside its 2-px border band


def test_error_probability_zero_outside_allowed_and_rises_with_tac():
    pred = heart()
    tac = np.zeros(pred.shape, np.float32)
    tac[2, 12:18, 12:18] = 0.4
    allowed = cv.heart_neighbourhood(pred, 3)
    p = error_probability(tac, pred, voxel_model({"log_tac_s2": 1.0}), allowed)
    assert p.shape == pred.shape and p.dtype == np.float32
    assert (p[~allowed] == 0).all() and (p[allowed] > 0).all()
    assert p[2, 14, 14] > p[2, 35 - 3, 20] and p[2, 14, 14] > p[0, 14, 14]


def test_fill_holes_turns_a_ring_into_a_blob():
    score = np.zeros((1, 20, 20), np.float32)
    score[0, 5:15, 5:15] = 1.0
    score[0, 7:13, 7:13] = 0.0  # a ring around an unflagged error
    ring, n = region_labels(score, LabelRule(0.5, 1, "3d"))
    blob, m = region_labels(score, LabelRule(0.5, 1, "3d", fill_holes=True))
    assert n == m == 1
    assert (ring > 0).sum() == 100 - 36 and (blob > 0).sum() == 100
    errors = np.zeros(score.shape, np.int32)
    errors[0, 7:13, 7:13] = 1
    assert not cv.covered(errors, 1, ring > 0)[0] and cv.covered(errors, 1, blob > 0)[0]
    allowed = np.zeros(score.shape, bool)
    allowed[0, :, :10] = True  # filling stays inside the allowed voxels
    half, _ = region_labels(score, LabelRule(0.5, 1, "3d", fill_holes=True), allowed)
    assert not (half[~allowed] > 0).any()


def test_error_map_rule_needs_a_voxel_model_and_respects_its_cap():
    pred = heart()
    tac = np.zeros(pred.shape, np.float32)
    tac[1:4, 12:28, 12:28] = 0.5
    base = {
        "map": "error_probability",
        "flag_threshold": 0.3,
        "grow_threshold": 0.15,
        "min_voxels": 1,
        "neighbourhood_px": 5,
        "fill_holes": True,
        "max_ml": 0.2,
    }
    with pytest.raises(CardsegError, match="voxel_model"):
        form_regions(tac, pred, base, (1.0, 1.0, 1.0))
    settings = {**base, "voxel_model": voxel_model({"log_tac_s2": 2.0}, 3.0).to_dict()}
    score = feature_map(tac, pred, settings)
    assert score.max() > 0.3
    lab, n = form_regions(tac, pred, settings, (1.0, 1.0, 1.0))
    assert n >= 1 and np.bincount(lab.ravel())[1:].max() <= 200  # 0.2 ml of 1 mm^3 voxels
    assert np.array_equal(form_regions(tac, pred, settings, (1.0, 1.0, 1.0), score)[0], lab)
    with pytest.raises(CardsegError, match="regions.voxel_model"):
        feature_map(tac, pred, {**settings, "voxel_model": voxel_model({}).to_dict() | {"features": ["x"]}})
    regs, ranks = flagged_regions(
        tac, pred, {**settings, "ranking": "summed_map"}, np.eye(4), (1.0, 1.0, 1.0), ["bg", "RV", "MYO", "LV"]
    )
    assert [r["id"] for r in regs] == list(range(1, len(regs) + 1)) and int(ranks.max()) == len(regs)


def test_summed_map_ranking_ignores_p_error_and_platt_recalibrates():
    feats = np.zeros((3, len(FEATURES)))
    feats[:, 0] = [1.0, 3.0, 2.0]  # log summed map
    coef = np.zeros(len(FEATURES))
    coef[1] = 1.0
    feats[:, 1] = [5.0, -5.0, 0.0]  # p_error order would be 0, 2, 1
    model = ErrorModel(np.zeros(len(FEATURES)), np.ones(len(FEATURES)), coef, 0.0)
    order, p = rank_regions(feats, model, None, "summed_map")
    assert order.tolist() == [1, 2, 0] and p[0] > p[2] > p[1]
    assert rank_regions(feats, model, None, "p_error")[0].tolist() == [0, 2, 1]
    flat = ErrorModel(model.mean, model.scale, model.coef, 0.0, FEATURES, (0.5, -1.0))
    z = model.logit(feats)
    assert np.allclose(flat.probability(feats), 1 / (1 + np.exp(-(0.5 * z - 1.0))))
    back = ErrorModel.from_dict(flat.to_dict())
    assert back.platt == (0.5, -1.0) and np.allclose(back.probability(feats), flat.probability(feats))
    with pytest.raises(CardsegError):
        ErrorModel.from_dict({**flat.to_dict(), "platt": [1.0]})


def test_platt_fit_recovers_a_known_slope():
    from cardseg_train.review.errmap import fit_platt

    rng = np.random.default_rng(0)
    z = rng.normal(0, 2, 20000)
    y = rng.random(z.size) < 1 / (1 + np.exp(-(0.5 * z + 0.3)))
    a, b = fit_platt(z, y)
    assert a == pytest.approx(0.5, abs=0.05) and b == pytest.approx(0.3, abs=0.06)


def test_bootstrap_intervals_of_the_covered_fraction():
    from cardseg_train.review.measure import covered_intervals

    def vol(case, errors, covered, base):
        return {
            "case": case,
            "errors": errors,
            "covered_k": [0, covered, covered, covered],
            "same_burden": {"tac": base},
        }

    same = [vol(f"patient{i:03d}_frame01", 4, 2, 1) for i in range(5)]
    ci = covered_intervals(same, resamples=200)
    assert ci["covered_top3"] == pytest.approx([0.5, 0.5]) and ci["same_burden"]["tac"] == pytest.approx([0.25, 0.25])
    mixed = [
        vol("patient001_frame01", 4, 4, 0),
        vol("patient001_frame02", 4, 4, 0),
        vol("patient002_frame01", 4, 0, 4),
        vol("patient003_frame01", 4, 2, 2),
    ]
    ci = covered_intervals(mixed, resamples=2000)
    lo, hi = ci["covered_top3"]
    assert ci["patients"] == 3 and ci["resamples"] == 2000
    assert 0.0 <= lo < 10 / 16 < hi <= 1.0  # the pooled fraction (10 of 16) inside, the interval not degenerate


def test_fit_chooses_held_out_and_the_engine_reproduces_the_rule():
    from cardseg_train.review.errmap import fit_error_map_rule
    from cardseg_train.review.measure import study

    maps = [blob_error_maps(i, f"patient{i:03d}_frame0{1 + i % 2}", decoy_tac=(0.04, 0.06)) for i in range(6)]
    res = fit_error_map_rule(maps, grid={"flag_threshold": (0.2, 0.3), "max_ml": (5.0,)})
    v = res["validation"]["cross_validated"]
    assert v["substantial_errors"] == 12 and v["covered_top3"] == pytest.approx(1.0)
    assert v["median_burden_top3"] <= 0.10 and 0 <= v["region_ece"] <= 1
    assert res["voxel_model"].features == VOXEL_FEATURES and res["model"].platt is not None
    assert len(res["candidates"]) == 2
    assert 0 < res["display_max_disagreement"] <= 0.5
    det = res["validation"]["voxel_detection"]
    assert det["error_map_held_out"]["auroc"] > 0.9
    settings = {**res["settings"], "voxel_model": res["voxel_model"].to_dict()}
    out = study(maps, settings, res["model"], with_detection=False)["clean"]
    assert out["covered_top3"] == pytest.approx(1.0)
    assert out["intervals"]["covered_top3"] == pytest.approx([1.0, 1.0])


def test_end_position_is_shared_and_a_single_slice_is_neither_end():
    from cardseg.review.error_map import end_position

    assert end_position(np.arange(5), 5).tolist() == [1.0, 0.5, 0.0, 0.5, 1.0]
    assert end_position(np.arange(1), 1).tolist() == [0.0]
    pred = np.zeros((1, 20, 20), np.uint8)
    pred[0, 5:15, 5:15] = 3
    feats = voxel_features(np.full(pred.shape, 0.1, np.float32), pred, pred > 0)
    column = VOXEL_FEATURES.index("end_position")
    assert np.all(feats[:, column] == 0.0)  # as the region feature of a one-slice volume
    lab = (pred > 0).astype(np.int32)
    region = region_features(np.full(pred.shape, 0.1, np.float32), pred, lab, 1)
    assert region[0, FEATURES.index("end_position")] == 0.0
