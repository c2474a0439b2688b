"""The ablation's paired patient bootstrap: pooled metrics recomputed from resampled pixels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.base.errors import CardsegError
from cardseg.metrics.calibration import ace, ece, nll, sce
from cardseg_train.comparison import ablation_bootstrap as ab
from cardseg_train.base.stats import interval, resample_weights

K = 4


def _volume(rng, n, sharp=3.0):
    labels = rng.integers(0, K, n)
    logits = rng.normal(0, 1, (n, K))
    logits[np.arange(n), labels] += sharp * rng.uniform(0, 1, n)
    p = np.exp(logits - logits.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)).astype(np.float32), labels


def _variant(volumes):
    v = ab.VariantPixels(K)
    for patient, p, y in volumes:
        v.add(patient, p, y)
    return v


def _patients(seed, n_patients=4, sizes=(60, 140)):
    rng = np.random.default_rng(seed)
    return [(f"p{i}", *_volume(rng, int(rng.integers(*sizes)))) for i in range(n_patients) for _ in range(2)]


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 5))
def test_every_resample_is_the_metric_of_the_repeated_pixels(seed, n_patients):
    volumes = _patients(seed, n_patients)
    names = sorted({v[0] for v in volumes})
    weights = resample_weights(len(names), 6, seed)
    got = _variant(volumes).samples(names, weights)
    for r, w in enumerate(weights):
        ps = [p for name, p, _ in volumes for _ in range(int(w[names.index(name)]))]
        ys = [y for name, _, y in volumes for _ in range(int(w[names.index(name)]))]
        p, y = np.concatenate(ps), np.concatenate(ys)
        want = [ece(p, y), sce(p, y), ace(p, y), nll(p, y)]
        np.testing.assert_allclose(got[r], want, rtol=1e-9, atol=1e-12)


def test_ties_and_single_patient_draws_match_the_library_ace():
    rng = np.random.default_rng(3)
    p, y = _volume(rng, 300)
    p = np.round(p, 1)  # many equal values: bins left empty, ties shared
    volumes = [("a", p[:100], y[:100]), ("b", p[100:], y[100:])]
    weights = np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 2.0]])
    got = _variant(volumes).samples(["a", "b"], weights)
    assert got[0, 2] == pytest.approx(ace(p, y), rel=1e-12)
    assert got[1, 2] == pytest.approx(ace(np.concatenate([p[:100]] * 2), np.concatenate([y[:100]] * 2)), rel=1e-12)
    assert got[2, 2] == pytest.approx(ace(p[100:], y[100:]), rel=1e-12)


def test_identical_variants_give_a_zero_width_difference():
    volumes = _patients(0, 5)
    bs = ab.bootstrap_variants({"Proposed": _variant(volumes), "Copy": _variant(volumes)}, resamples=200)
    for m in ab.METRICS:
        assert bs["difference"]["Copy"][m] == [0.0, 0.0]
        assert bs["pairwise"]["Copy"]["Proposed"][m] == bs["pairwise"]["Proposed"]["Copy"][m] == [0.0, 0.0]
        lo, hi = bs["interval"]["Copy"][m]
        assert lo < hi  # the rows themselves do vary across resamples


def test_a_constant_nll_shift_is_the_difference_in_every_resample():
    """Every true-class probability divided by e^c: each pixel's NLL grows by exactly c."""
    c = 0.37
    volumes = _patients(1, 5)
    shifted = []
    for name, p, y in volumes:
        q = p.astype(np.float64).copy()
        q[np.arange(y.size), y] *= np.exp(-c)
        shifted.append((name, q, y))
    bs = ab.bootstrap_variants({"Proposed": _variant(volumes), "Shifted": _variant(shifted)}, resamples=300)
    assert bs["difference"]["Shifted"]["nll"] == pytest.approx([-c, -c], abs=1e-6)
    assert bs["pairwise"]["Shifted"]["Proposed"]["nll"] == pytest.approx([c, c], abs=1e-6)
    assert "| Shifted | Proposed |" in "\n".join(ab.bootstrap_markdown(bs))


def test_draws_are_the_evaluation_bootstrap_draws_and_intervals_bracket_the_samples():
    volumes = _patients(2, 6)
    variant = _variant(volumes)
    names = sorted({v[0] for v in volumes})
    bs = ab.bootstrap_variants({"Proposed": variant}, resamples=500, seed=7)
    samples = variant.samples(names, resample_weights(len(names), 500, 7))
    for j, m in enumerate(ab.METRICS):
        assert bs["interval"]["Proposed"][m] == interval(samples[:, j])
    assert bs["patients"] == 6 and bs["resamples"] == 500 and bs["seed"] == 7
    assert "Proposed" not in bs["difference"]


def test_markdown_names_rows_without_pixels():
    bs = ab.bootstrap_variants({"Proposed": _variant(_patients(4, 3))}, resamples=50, without=["Dual U-Net"])
    text = "\n".join(ab.bootstrap_markdown(bs))
    assert "| Proposed |" in text and "No interval for Dual U-Net" in text
    assert ab.bootstrap_markdown(None) == []


def test_variants_on_different_patients_are_refused():
    a, b = _variant(_patients(5, 3)), _variant(_patients(6, 2))
    with pytest.raises(CardsegError, match="different patients"):
        ab.bootstrap_variants({"Proposed": a, "Other": b}, resamples=10)
