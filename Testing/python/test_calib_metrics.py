"""Calibration metrics: hand-computed cases, a MONAI cross-check, properties, streaming."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.metrics.calibration import (
    CalibrationAccumulator,
    ace,
    adaptive_bins,
    calibration_metrics,
    ece,
    nll,
    reliability_diagram,
    roi_pixels,
    sce,
)

# five pixels, three classes (worked by hand in test_ece_by_hand)
P5 = np.array([[0.9, 0.05, 0.05], [0.85, 0.1, 0.05], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4], [0.1, 0.45, 0.45]])
Y5 = np.array([0, 1, 1, 0, 2])


def test_ece_by_hand():
    # confidences .9 (right), .85 (wrong), .5 (right), .4 (wrong), .45 (argmax tie → class 1, wrong)
    # bins 9: |1-.9|·1/5 = .02; 8: .85·1/5 = .17; 5: .5·1/5 = .1; 4: |0-.425|·2/5 = .17 → 0.46
    assert ece(P5, Y5) == pytest.approx(0.46, abs=1e-12)
    rd = reliability_diagram(P5, Y5)
    assert rd.count.tolist() == [0, 0, 0, 0, 2, 1, 0, 0, 1, 1]
    assert rd.confidence[4] == pytest.approx(0.425) and rd.accuracy[4] == 0.0
    assert rd.accuracy[9] == 1.0 and math.isnan(rd.accuracy[0])
    d = rd.to_dict()
    assert d["accuracy"][0] is None and len(d["edges"]) == 11


def test_ace_by_hand():
    p0 = np.array([0.9, 0.7, 0.65, 0.2, 0.1])
    p = np.stack([p0, 1 - p0], axis=1)
    y = np.array([0, 0, 1, 1, 0])
    # R = 2, N = 5: inner edge = 3rd smallest value (index floor(5/2) = 2)
    # class 0: {.1, .2} acc 1/2 conf .15 → .35; {.65, .7, .9} acc 2/3 conf .75 → 1/12
    # class 1: {.1, .3} acc 0 conf .2 → .2; {.35, .8, .9} acc 2/3 conf 2.05/3 → 1/60
    assert ace(p, y, n_bins=2) == pytest.approx((0.35 + 1 / 12 + 0.2 + 1 / 60) / 4, abs=1e-12)
    assert adaptive_bins(p0, 2).tolist() == [1, 1, 1, 0, 0]


def test_ace_equal_mass_and_ties():
    v = np.random.default_rng(0).random(103)
    counts = np.bincount(adaptive_bins(v, 10), minlength=10)
    assert counts.sum() == 103 and counts.max() - counts.min() <= 1
    # a run of ties stays in one bin; empty bins are skipped in the mean
    p = np.tile([[0.7, 0.3]], (10, 1))
    y = np.array([0] * 7 + [1] * 3)
    assert ace(p, y) == pytest.approx(0.0, abs=1e-12)
    y = np.array([0] * 5 + [1] * 5)
    assert ace(p, y) == pytest.approx(0.2, abs=1e-12)


def test_nll_and_sce_by_hand():
    assert nll(P5, Y5) == pytest.approx(-np.mean(np.log([0.9, 0.1, 0.5, 0.3, 0.45])))
    assert nll(np.array([[1.0, 0.0]]), np.array([1])) == pytest.approx(-math.log(1e-12))
    # two pixels, K = 2: class 0 probs .8 (y=0) and .3 (y=1); class 1 probs .2, .7
    # class 0: bin 8 |1-.8|, bin 3 |0-.3| → (.2 + .3)/2; class 1: bin 2 |0-.2|, bin 7 |1-.7| → (.2 + .3)/2
    p = np.array([[0.8, 0.2], [0.3, 0.7]])
    assert sce(p, np.array([0, 1])) == pytest.approx(0.25)


def test_sce_matches_monai_calibration_error():
    from monai.metrics import CalibrationErrorMetric

    g = torch.Generator().manual_seed(3)
    k, h, w = 4, 40, 36
    logits = 3 * torch.randn(1, k, h, w, generator=g)
    probs = torch.softmax(logits, dim=1)
    labels = torch.distributions.Categorical(probs=torch.softmax(logits / 2, dim=1).permute(0, 2, 3, 1)).sample()
    onehot = torch.nn.functional.one_hot(labels, k).permute(0, 3, 1, 2).float()
    metric = CalibrationErrorMetric(num_bins=10, include_background=True, calibration_reduction="expected")
    metric(y_pred=probs, y=onehot)
    want = float(metric.aggregate())
    got = sce(probs[0].reshape(k, -1).T, labels.reshape(-1))
    assert got == pytest.approx(want, abs=1e-5)
    assert got > 0.01


def test_inputs_torch_and_roi_pixels():
    probs = torch.softmax(torch.randn(3, 4, 5, 6), dim=1)  # (Z, K, Y, X)
    roi = torch.rand(3, 5, 6) > 0.5
    got = roi_pixels(probs, roi.numpy())
    assert got.shape == (int(roi.sum()), 4)
    assert np.allclose(got, probs.permute(0, 2, 3, 1)[roi].numpy())
    with pytest.raises(ValueError):
        ece(np.ones((3, 2)) / 2, np.array([0, 1, 2]))


@st.composite
def prob_sets(draw):
    k = draw(st.integers(2, 5))
    n = draw(st.integers(1, 60))
    seed = draw(st.integers(0, 2**31))
    sharp = draw(st.floats(0.1, 30))
    rng = np.random.default_rng(seed)
    z = sharp * rng.normal(size=(n, k))
    p = np.exp(z - z.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True), rng.integers(0, k, n)


@settings(max_examples=60, deadline=None)
@given(prob_sets())
def test_metrics_lie_in_range(data):
    p, y = data
    m = calibration_metrics(p, y)
    for key in ("ece", "sce", "ace"):
        assert 0.0 <= m[key] <= 1.0
    assert m["nll"] >= 0.0 and m["n"] == len(y)


@st.composite
def calibrated_groups(draw):
    """Groups of m pixels sharing one probability vector c/m whose labels follow c exactly."""
    k = draw(st.integers(2, 4))
    m = draw(st.integers(1, 12))
    groups = draw(
        st.lists(
            st.lists(st.integers(0, 12), min_size=k, max_size=k).filter(lambda c: sum(c) > 0), min_size=1, max_size=8
        )
    )
    probs, labels = [], []
    for c in groups:
        c = np.asarray(c, float)
        scale = m * c / c.sum()
        counts = np.floor(scale).astype(int)
        counts[0] += m - counts.sum()  # integer counts summing to m
        probs.append(np.tile(counts / m, (m, 1)))
        labels.append(np.repeat(np.arange(k), counts))
    return np.concatenate(probs), np.concatenate(labels)


@settings(max_examples=60, deadline=None)
@given(calibrated_groups())
def test_perfectly_calibrated_construction_scores_zero(data):
    p, y = data
    for f in (ece, sce, ace):
        assert f(p, y) == pytest.approx(0.0, abs=1e-9)


def test_accumulator_pools_volumes_like_one_shot():
    rng = np.random.default_rng(1)
    z = 2 * rng.normal(size=(5000, 4))
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    y = rng.integers(0, 4, 5000)
    want = calibration_metrics(p, y)
    acc = CalibrationAccumulator(4)
    for chunk in np.array_split(np.arange(5000), 7):
        acc.add(p[chunk], y[chunk])
    got = acc.result()
    assert got["ace_exact"] and got["n"] == 5000
    for key in ("ece", "sce", "ace", "nll"):
        assert got[key] == pytest.approx(want[key], abs=1e-6)
    assert np.array_equal(acc.reliability().count, reliability_diagram(p, y).count)
    # over the cap: a seeded subsample (deterministic), ACE close to the exact value
    runs = []
    for _ in range(2):
        small = CalibrationAccumulator(4, ace_max_pixels=1500, seed=5)
        for chunk in np.array_split(np.arange(5000), 7):
            small.add(p[chunk], y[chunk])
        runs.append(small.result())
    assert not runs[0]["ace_exact"] and runs[0]["ace"] == runs[1]["ace"]
    assert runs[0]["ece"] == pytest.approx(want["ece"], abs=1e-9)
    assert runs[0]["ace"] == pytest.approx(want["ace"], abs=0.03)


def test_accumulator_add_volume_and_empty():
    acc = CalibrationAccumulator(3)
    assert math.isnan(acc.result()["ece"])
    probs = np.full((2, 3, 4, 4), 1 / 3)
    labels = np.zeros((2, 4, 4), int)
    roi = np.zeros((2, 4, 4), bool)
    roi[0, 1:3, 1:3] = True
    acc.add_volume(probs, labels, roi)
    r = acc.result()
    assert r["n"] == 4 and r["nll"] == pytest.approx(math.log(3))
    assert r["ece"] == pytest.approx(2 / 3)
