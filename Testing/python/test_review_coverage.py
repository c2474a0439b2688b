"""The review measure: covered errors, burden, the baselines and detection AUCs on hand-made volumes;
the size cap of regions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.metrics.detection import detection_scores
from cardseg.review import coverage as cv
from cardseg.review.regions import LabelRule, cap_voxels_of, flagged_regions, form_regions, region_labels


def _heart_with_two_errors():
    """A 2-slice volume: LV disk-ish square with MYO ring; error A (8 x 8 = 64 px) on slice 0,
    error B (6 x 10 = 60 px) on slice 1, plus a 1-px sliver that is not substantial."""
    truth = np.zeros((2, 40, 40), np.uint8)
    truth[:, 8:32, 8:32] = 2
    truth[:, 12:28, 12:28] = 3
    pred = truth.copy()
    pred[0, 12:20, 12:20] = 2  # A: LV called MYO
    pred[1, 20:26, 14:24] = 1  # B: LV called RV
    pred[0, 30, 8:32] = 0  # a one-pixel sliver: removed by the opening
    return pred, truth


def test_error_labels_and_covered_fraction_by_hand():
    pred, truth = _heart_with_two_errors()
    lab, n = cv.error_labels(pred, truth)
    assert n == 2 and cv.error_sizes(lab, n).tolist() == [64, 60]
    flagged = np.zeros(pred.shape, bool)
    flagged[0, 12:16, 12:20] = True  # exactly half of A (32 of 64)
    flagged[1, 20:22, 14:24] = True  # 20 of B's 60: a third
    assert cv.covered(lab, n, flagged).tolist() == [True, False]
    flagged[0, 12, 12] = False  # one pixel less than half of A
    assert cv.covered(lab, n, flagged).tolist() == [False, False]
    flagged[1, 22, 14:24] = True  # 30 of 60: half of B
    assert cv.covered(lab, n, flagged).tolist() == [False, True]


def test_a_boundary_shell_touches_every_error_and_covers_none():
    pred, truth = _heart_with_two_errors()
    lab, n = cv.error_labels(pred, truth)
    shell = cv.predicted_boundary(pred)
    assert cv.covered(lab, n, shell).sum() == 0
    from cardseg_train.review.measure import touched_errors

    assert touched_errors(lab, n, shell) == n  # the retired measure counts both as caught
    share, ml = cv.burden(int(shell.sum()), pred, (1.5, 1.5, 8.0))
    assert share == pytest.approx(shell.sum() / (pred > 0).sum())
    assert ml == pytest.approx(shell.sum() * 1.5 * 1.5 * 8.0 / 1000.0)


def test_top_k_coverage_adds_disjoint_regions_in_order():
    pred, truth = _heart_with_two_errors()
    lab, n = cv.error_labels(pred, truth)
    regions = np.zeros(pred.shape, np.int32)
    regions[0, 12:20, 12:16] = 1  # 32 px of A: half
    regions[1, 20:23, 14:24] = 2  # 30 of B: half
    regions[0, 16:20, 16:20] = 3  # 16 more px of A
    ov = cv.overlap_matrix(lab, n, regions, 3)
    assert ov.tolist() == [[32, 0], [0, 30], [16, 0]]
    cov = cv.covered_top_k(ov, cv.error_sizes(lab, n))
    assert cov.sum(axis=1).tolist() == [0, 1, 2, 2]
    assert cv.holds_error(ov, cv.error_sizes(lab, n)).tolist() == [True, True, False]
    split = np.zeros(pred.shape, np.int32)
    split[0, 12:20, 12:14] = 1  # 16 of A
    split[0, 12:20, 14:16] = 2  # 16 more: together half, alone neither
    ov = cv.overlap_matrix(lab, n, split, 2)
    assert cv.covered_top_k(ov, cv.error_sizes(lab, n))[-1].tolist() == [True, False]
    assert not cv.holds_error(ov, cv.error_sizes(lab, n)).any()


def test_voxel_baselines_flag_the_same_number_of_voxels():
    pred, truth = _heart_with_two_errors()
    lab, n = cv.error_labels(pred, truth)
    support = cv.heart_neighbourhood(pred, 3)
    score = np.zeros(pred.shape, np.float32)
    score[lab == 1] = 2.0  # an oracle map: A first, then B
    score[lab == 2] = 1.0
    score[0, 0, 0] = 5.0  # outside the neighbourhood: never chosen
    top = cv.top_voxels(score, support, 94)
    assert top.sum() == 94 and not top[0, 0, 0]
    assert cv.covered(lab, n, top).tolist() == [True, True]  # all of A (64) and 30 of B's 60
    assert cv.covered(lab, n, cv.top_voxels(score, support, 93)).tolist() == [True, False]
    rng = np.random.default_rng(0)
    boundary = cv.predicted_boundary(pred)
    rnd = cv.random_voxels(boundary, 50, rng)
    assert rnd.sum() == 50 and not (rnd & ~boundary).any()
    assert cv.random_voxels(boundary, 10**6, rng).sum() == boundary.sum()  # capped at the support


def test_random_regions_keep_sizes_and_stay_on_their_slices():
    pred, _ = _heart_with_two_errors()
    support = cv.heart_neighbourhood(pred, 2)
    regions = np.zeros(pred.shape, np.int32)
    regions[0, 10:14, 10:15] = 1
    regions[1, 20:23, 20:23] = 2
    rng = np.random.default_rng(3)
    moved = cv.random_regions(regions, 2, support, rng)
    assert (moved == 1).sum() <= 20 and (moved == 2).sum() <= 9
    assert (moved == 1)[1].sum() == 0 and (moved == 2)[0].sum() == 0
    sizes = [np.mean([(cv.random_regions(regions, 2, support, rng) == r).sum() for _ in range(20)]) for r in (1, 2)]
    assert sizes[0] > 15 and sizes[1] > 6  # moved within the grid, mostly whole


def test_detection_scores_match_hand_computed_areas():
    s = np.array([0.1, 0.4, 0.35, 0.8])
    y = np.array([False, False, True, True])
    d = detection_scores(s, y)
    assert d["auroc"] == pytest.approx(0.75)  # 3 of the 4 positive-negative pairs ordered right
    assert d["auprc"] == pytest.approx((1 / 1 + 2 / 3) / 2)  # precision at each positive
    assert detection_scores(s, np.zeros(4, bool))["auroc"] is None
    perfect = detection_scores(np.array([0.0, 1.0, 2.0]), np.array([False, True, True]))
    assert perfect["auroc"] == pytest.approx(1.0) and perfect["auprc"] == pytest.approx(1.0)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    cap=st.integers(1, 60),
    conn=st.sampled_from(["3d", "slice"]),
    grow=st.sampled_from([None, 0.1]),
    fill=st.booleans(),
)
def test_a_region_never_exceeds_its_cap(seed, cap, conn, grow, fill):
    rng = np.random.default_rng(seed)
    tac = rng.uniform(0, 0.4, (3, 24, 24)).astype(np.float32)
    tac[1, 8:16, 8:16] = 0.35
    tac[1, 11:13, 11:13] = 0.0  # a hole that fill_holes (the shipped rule's setting) closes
    lab, n = region_labels(tac, LabelRule(0.2, 1, conn, 0, grow_threshold=grow, cap_voxels=cap, fill_holes=fill))
    sizes = np.bincount(lab.ravel(), minlength=n + 1)[1:]
    assert sizes.size == n and (sizes >= 1).all() and (sizes <= cap).all()
    if not fill:  # filled holes may hold low values; otherwise every voxel passed the threshold
        assert (tac[lab > 0] > (0.2 if grow is None else 0.1)).all()


def test_the_ml_cap_holds_in_the_engine_regions():
    tac = np.full((2, 30, 30), 0.3, np.float32)  # one region over everything
    pred = np.zeros((2, 30, 30), np.uint8)
    pred[:, 5:25, 5:25] = 3
    spacing = (1.5, 1.5, 8.0)  # 18 mm3 a voxel
    cap = cap_voxels_of(1.0, spacing)
    assert cap == 55
    s = {
        "flag_threshold": 0.1,
        "min_voxels": 1,
        "max_ml": 1.0,
        "model": None,
        "connectivity": "3d",
        "neighbourhood_px": 2,
        "smooth_px": 1.0,
    }
    lab, n = form_regions(tac, pred, s, spacing)
    assert n == 1 and (lab > 0).sum() == cap
    near = cv.heart_neighbourhood(pred, 2)
    assert not (lab[~near] > 0).any()
    regions, ranks = flagged_regions(tac, pred, s, np.eye(4), spacing, ["bg", "RV", "MYO", "LV"])
    assert [r["voxels"] for r in regions] == [cap] and regions[0]["volume_mm3"] <= 1000.0


def test_bad_region_settings_are_refused_in_one_line():
    from cardseg.base.errors import CardsegError

    tac = np.zeros((1, 8, 8), np.float32)
    pred = np.zeros((1, 8, 8), np.uint8)
    base = {"flag_threshold": 0.1, "min_voxels": 1}
    for bad, word in (
        ({"max_ml": 0}, "max_ml"),
        ({"ranking": "size"}, "ranking"),
        ({"smooth_px": -1}, "smooth_px"),
        ({"grow_threshold": 0.2}, "grow_threshold"),
    ):
        with pytest.raises(CardsegError, match=word) as e:
            form_regions(tac, pred, {**base, **bad}, (1, 1, 1))
        assert "\n" not in str(e.value)


def test_a_maps_coverage_curve_counts_the_errors_its_top_voxels_cover():
    """Two 6x6 errors on a 20x20 'heart'; the map is highest on the first, then on the second:
    flagging 9 % of the heart (36 voxels) covers the first, 18 % both, 1 % neither."""
    pred = np.zeros((1, 32, 32), np.uint8)
    pred[0, 6:26, 6:26] = 3
    truth = pred.copy()
    truth[0, 7:13, 7:13] = 2
    truth[0, 18:24, 18:24] = 2
    errors, n = cv.error_labels(pred, truth, min_px=30)
    score = np.zeros(pred.shape, np.float32)
    score[0, 7:13, 7:13] = 2.0
    score[0, 18:24, 18:24] = 1.0
    support = np.ones(pred.shape, bool)
    assert cv.covered_at_burdens(errors, n, score, support, 400, (0.01, 0.09, 0.18)) == [0, 1, 2]
