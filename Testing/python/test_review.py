"""The review list: region formation, the error model, the caught-fraction arithmetic, and the
rank map ``regions.nii.gz`` against ``report.json``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import SimpleITK as sitk
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.base.errors import CardsegError
from cardseg.review.regions import (
    FEATURES,
    ErrorModel,
    LabelRule,
    flagged_regions,
    rank_regions,
    region_features,
    region_labels,
)
from cardseg.review.evaluation import ReviewTally, catch_matrix, near_errors, substantial_errors


def test_substantial_errors_ignore_slivers_and_small_blobs():
    truth = np.zeros((2, 40, 40), np.uint8)
    pred = truth.copy()
    pred[0, 5:12, 5:12] = 1  # 49 px blob: substantial
    pred[0, 20, 0:40] = 2  # one-pixel line of 40 px: removed by the opening
    pred[1, 30:34, 30:34] = 3  # 16 px: too small
    pred[1, 2:8, 2:8] = 1  # 36 px: substantial
    errs = substantial_errors(pred, truth)
    assert len(errs) == 2
    assert errs[0][0].sum() == 49 and not errs[0][1].any()
    assert errs[1][1].sum() == 36


def test_caught_fractions_match_a_hand_made_example():
    # volume A: errors e0 (slice 0) and e1 (slice 1); volume B: error e2
    e = np.zeros((3, 2, 30, 30), bool)
    e[0, 0, 0:6, 0:6] = True
    e[1, 1, 10:16, 10:16] = True
    e[2, 0, 20:26, 20:26] = True
    ranks_a = np.zeros((2, 30, 30), np.uint16)
    ranks_a[0, 7, 7] = 1  # distance from e0's corner (5, 5): sqrt(8) > 2: misses
    ranks_a[0, 6, 5] = 2  # one pixel below e0: catches e0
    ranks_a[0, 12, 12] = 3  # right slice? no: e1 is on slice 1, so this misses
    ranks_a[1, 18, 12] = 3  # two pixels below e1 (row 15 -> 17 is 2 px; 18 is 3 px): misses
    ranks_a[1, 17, 12] = 3  # ... but this one is 2 px away: region 3 catches e1
    ranks_b = np.zeros((2, 30, 30), np.uint16)
    ranks_b[0, 23, 23] = 1  # inside e2
    ca = catch_matrix(ranks_a, 3, near_errors([e[0], e[1]]))
    cb = catch_matrix(ranks_b, 1, near_errors([e[2]]))
    assert ca.tolist() == [[False, False], [True, False], [False, True]]
    assert cb.tolist() == [[True]]
    t = ReviewTally()
    t.add(ca)
    t.add(cb)
    s = t.summary()
    assert s["substantial_errors"] == 3
    assert s["caught_top1"] == pytest.approx(1 / 3)  # only B's first region catches
    assert s["caught_top3"] == pytest.approx(3 / 3) and s["caught_all"] == pytest.approx(1.0)
    assert s["regions_per_volume"] == pytest.approx(2.0)
    assert s["empty_region_fraction"] == pytest.approx(1 / 4)


def test_connectivity_merge_and_minimum_size():
    tac = np.zeros((3, 30, 30), np.float32)
    tac[0, 2:6, 2:6] = 0.3
    tac[1, 2:6, 2:6] = 0.3  # same place on the next slice
    tac[0, 2:6, 9:13] = 0.3  # 3 px gap in-plane from the first
    tac[2, 25, 25] = 0.3  # 1 voxel
    lab, n = region_labels(tac, LabelRule(0.1, 1, "3d", 0))
    assert n == 3  # the two stacked squares join; the neighbour and the voxel stay apart
    lab, n = region_labels(tac, LabelRule(0.1, 1, "slice", 0))
    assert n == 4
    lab, n = region_labels(tac, LabelRule(0.1, 1, "3d", 2))
    assert n == 2 and (lab > 0).sum() == (tac > 0.1).sum()  # merged across the gap, no voxel added
    lab, n = region_labels(tac, LabelRule(0.1, 2, "3d", 0))
    assert n == 2
    with pytest.raises(CardsegError):
        region_labels(tac, LabelRule(0.1, 1, "4d"))


def test_error_model_ranks_and_refuses_a_malformed_model():
    tac = np.zeros((2, 20, 20), np.float32)
    tac[0, 1:3, 1:3] = 0.6  # small, strong
    tac[1, 5:15, 5:15] = 0.12  # large, weak
    pred = np.zeros((2, 20, 20), np.uint8)
    lab, n = region_labels(tac, LabelRule(0.1, 1))
    f = region_features(tac, pred, lab, n)
    assert f.shape == (2, len(FEATURES))
    coef = np.zeros(len(FEATURES))
    coef[FEATURES.index("max_tac")] = 5.0
    model = ErrorModel(np.zeros(len(FEATURES)), np.ones(len(FEATURES)), coef, -1.0)
    order, p = rank_regions(f, model)
    assert order.tolist() == [0, 1] and p[0] > p[1]
    assert p[0] == pytest.approx(1 / (1 + np.exp(-(5 * 0.6 - 1))), rel=1e-5)
    order, p = rank_regions(f, None)  # no model: by summed disagreement
    assert order.tolist() == [1, 0] and p is None
    assert ErrorModel.from_dict(model.to_dict()).probability(f) == pytest.approx(model.probability(f))
    bad = {**model.to_dict(), "features": list(FEATURES)[:-1]}
    with pytest.raises(CardsegError, match="regions.model"):
        ErrorModel.from_dict(bad)
    regs, ranks = flagged_regions(
        tac,
        pred,
        {"flag_threshold": 0.1, "min_voxels": 1, "model": model.to_dict(), "max_regions": 1},
        np.eye(4),
        (1, 1, 1),
        ["bg"],
    )
    assert len(regs) == 1 and regs[0]["p_error"] == pytest.approx(float(model.probability(f)[0]))
    assert (ranks == 1).sum() == 4 and ranks.max() == 1  # the capped region is not in the map


def test_bundle_without_a_region_model_is_refused_in_one_line(tiny_bundle, rotated_nifti, tmp_path):
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    cfg = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
    del cfg["regions"]["model"]
    (bundle / "bundle.json").write_text(json.dumps(cfg), encoding="utf-8")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cardseg",
            "segment",
            str(rotated_nifti),
            "-o",
            str(tmp_path / "o"),
            "--bundle",
            str(bundle),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "regions.model" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_regions_map_agrees_with_the_report(tiny_bundle, rotated_nifti, tmp_path):
    """On the oblique, anisotropic volume: ranks, voxel counts and centroids of regions.nii.gz
    are those of report.json, with a fitted model stored in the bundle."""
    import shutil

    from cardseg.bundle.loading import update_config
    from cardseg.cli import main

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    coef = np.linspace(-1, 1, len(FEATURES))
    model = ErrorModel(np.zeros(len(FEATURES)), np.ones(len(FEATURES)), coef, 0.3)
    update_config(
        bundle, {"regions": {"flag_threshold": 0.0, "min_voxels": 3, "max_regions": 4, "model": model.to_dict()}}
    )
    assert main(["segment", str(rotated_nifti), "-o", str(tmp_path / "o"), "--bundle", str(bundle), "--quiet"]) == 0
    rep = json.loads((tmp_path / "o" / "report.json").read_text(encoding="utf-8"))
    img = sitk.ReadImage(str(tmp_path / "o" / "regions.nii.gz"))
    ref = sitk.ReadImage(str(rotated_nifti))
    assert img.GetSize() == ref.GetSize()
    assert np.allclose(img.GetDirection(), ref.GetDirection(), atol=1e-6)
    ranks = sitk.GetArrayFromImage(img)
    regs = rep["regions"]
    assert 1 <= len(regs) <= 4 and rep["region_ranking"] == "p_error"
    assert [r["id"] for r in regs] == list(range(1, len(regs) + 1))
    assert int(ranks.max()) == len(regs)
    p = [r["p_error"] for r in regs]
    assert p == sorted(p, reverse=True)
    for r in regs:
        zz, yy, xx = np.nonzero(ranks == r["id"])
        assert len(zz) == r["voxels"]
        assert [xx.mean(), yy.mean(), zz.mean()] == pytest.approx(r["centroid_ijk"], abs=1e-6)
        lps = img.TransformContinuousIndexToPhysicalPoint(r["centroid_ijk"])
        assert np.allclose(lps, r["centroid_lps"], atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.booleans())
def test_region_features_are_each_regions_own_statistics(seed, with_fov):
    """Every feature of every region equals what its own voxels give, computed one region at a
    time with plain masks (the function computes them all at once over the regions' voxels)."""
    from scipy import ndimage

    from cardseg.review.regions import end_position

    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 7)), int(rng.integers(6, 30)), int(rng.integers(6, 30)))
    tac = rng.random(shape) * 0.7
    pred = rng.integers(0, 4, shape)
    lab, n = ndimage.label(ndimage.gaussian_filter(rng.random(shape), 1) > 0.55)
    fov = rng.random(shape[1:]) > 0.2 if with_fov else None
    got = region_features(tac, pred, lab, n, fov)
    assert got.shape == (n, len(FEATURES))
    inside_fov = np.broadcast_to(np.ones(shape[1:], bool) if fov is None else fov, shape)
    for i in range(n):
        m = lab == i + 1
        v = tac[m]
        want = (
            np.log1p(v.sum()),
            v.max(),
            v.mean(),
            np.log(m.sum()),
            m.any(axis=(1, 2)).sum(),
            (pred[m] > 0).mean(),
            np.unique(pred[m]).size,
            end_position(np.nonzero(m)[0].mean(), shape[0]),
            inside_fov[m].mean(),
        )
        np.testing.assert_allclose(got[i], want, rtol=1e-12, atol=1e-12)
