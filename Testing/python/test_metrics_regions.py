import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.method.agreement import agreement_score
from cardseg.metrics.segmentation import agreement_report, disk, lcc_ratio, roi_mask
from cardseg.review.regions import flagged_regions

LN2 = math.log(2)


def test_disk_and_roi_dilation_radius():
    assert disk(1).sum() == 5 and disk(10).shape == (21, 21)
    fg = np.zeros((2, 41, 41), bool)
    fg[0, 20, 20] = True
    roi = roi_mask(fg, 10)
    assert roi[0].sum() == disk(10).sum()
    assert roi[0, 20, 30] and not roi[0, 20, 31] and not roi[0, 28, 28]  # 8² + 8² > 10²
    assert not roi[1].any()  # per slice: nothing leaks across slices


def test_agreement_score_bounds_and_value():
    roi = np.ones((1, 4, 4), bool)
    assert agreement_score(np.zeros((1, 4, 4)), roi) == 1.0
    assert abs(agreement_score(np.full((1, 4, 4), LN2), roi)) < 1e-12
    tac = np.zeros((1, 4, 4))
    tac[0, 0, 0] = LN2
    assert abs(agreement_score(tac, roi) - (1 - 1 / 16)) < 1e-12
    assert agreement_score(tac, np.zeros_like(roi)) is None


def test_agreement_report_per_slice_and_class():
    labels = np.zeros((2, 30, 30), np.uint8)
    labels[0, 10:14, 10:14] = 3
    tac = np.zeros((2, 30, 30))
    tac[0, 12, 12] = LN2
    rep = agreement_report(tac, labels, 2, ["background", "RV", "MYO", "LV"])
    assert rep["agreement_per_slice"][1] is None
    assert rep["agreement_per_slice"][0] == rep["agreement"] < 1.0
    assert rep["agreement_per_class"]["RV"] is None and rep["agreement_per_class"]["LV"] == rep["agreement"]


def test_lcc_ratio():
    fg = np.zeros((1, 10, 10), bool)
    fg[0, :2, :3] = True  # 6
    fg[0, 7:, 7:] = True  # 9
    assert abs(lcc_ratio(fg) - 9 / 15) < 1e-12
    assert lcc_ratio(np.zeros((1, 3, 3), bool)) is None


def test_flagged_regions_ranked_filtered_and_located():
    tac = np.zeros((3, 20, 20), np.float32)
    labels = np.zeros((3, 20, 20), np.uint8)
    tac[0:2, 2:5, 2:5] = 0.3  # 18 voxels, sum 5.4
    labels[0:2, 2:5, 2:5] = 2
    tac[1, 10:16, 10:14] = 0.5  # 24 voxels, sum 12
    tac[2, 18, 18] = 0.6  # 1 voxel: dropped
    m = np.eye(4)
    m[:3, :3] = np.diag([2.0, 3.0, 5.0])
    m[:3, 3] = [10, 20, 30]
    settings = {"flag_threshold": 0.1, "min_voxels": 2, "model": None}
    regs, ranks = flagged_regions(tac, labels, settings, m, (2.0, 3.0, 5.0), ["background", "RV", "MYO", "LV"])
    assert [r["voxels"] for r in regs] == [24, 18]
    first, second = regs
    assert first["id"] == 1 and first["volume_mm3"] == 24 * 30.0
    assert first["bbox_ijk"] == [[10, 13], [10, 15], [1, 1]]
    assert first["centroid_ijk"] == pytest.approx([11.5, 12.5, 1.0])
    assert first["centroid_lps"] == pytest.approx([10 + 2 * 11.5, 20 + 3 * 12.5, 30 + 5 * 1.0])
    assert first["mean_disagreement"] == pytest.approx(0.5) and first["classes"] == ["background"]
    assert second["classes"] == ["MYO"]
    assert first["p_error"] is None  # no fitted model: ranked by summed disagreement
    assert (ranks == 1).sum() == 24 and (ranks == 2).sum() == 18 and ranks.max() == 2
    regs, ranks = flagged_regions(tac, labels, {**settings, "flag_threshold": 0.9}, m, (1, 1, 1), ["b"])
    assert regs == [] and not ranks.any()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), radius=st.integers(0, 12), density=st.floats(0.0, 0.05))
def test_roi_mask_is_the_disk_dilation(seed, radius, density):
    """The distance-transform ROI equals a binary dilation with the disk, slice by slice (the
    definition), for any mask and radius, empty slices included."""
    from scipy import ndimage

    rng = np.random.default_rng(seed)
    fg = rng.random((3, 37, 29)) < density
    fg[1] = False
    expected = np.stack([ndimage.binary_dilation(s, structure=disk(radius)) if radius > 0 else s for s in fg])
    np.testing.assert_array_equal(roi_mask(fg, radius), expected)
    np.testing.assert_array_equal(roi_mask(fg[0], radius), expected[0])
