"""ETS and HTS engine calibrators: formulas, invariants, parameter checks, JSON round trip."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cardseg.method.calibration import (
    REGISTRY,
    EnsembleTemperatureScaling,
    EntropyTemperatureScaling,
    TemperatureScaling,
    Uncalibrated,
    calibrator_from_dict,
    entropy_temperature,
    normalized_log_entropy,
)


def test_ets_is_the_stated_mixture():
    g = torch.Generator().manual_seed(0)
    z = 4 * torch.randn(2, 4, 3, 5, generator=g, dtype=torch.float64)
    ets = EnsembleTemperatureScaling(2.5, 0.6, 0.3, 0.1)
    want = 0.6 * torch.softmax(z / 2.5, dim=1) + 0.3 * torch.softmax(z, dim=1) + 0.1 / 4
    got = ets.log_probs(z)
    assert got.shape == z.shape
    assert torch.allclose(got.exp(), want, atol=1e-12)
    # special cases: pure TS, pure UC, pure uniform
    ts = TemperatureScaling(3.0).probabilities(z)
    assert torch.allclose(EnsembleTemperatureScaling(3.0, 1, 0, 0).probabilities(z), ts)
    assert torch.allclose(EnsembleTemperatureScaling(3.0, 0, 1, 0).probabilities(z), Uncalibrated().probabilities(z))
    assert torch.allclose(EnsembleTemperatureScaling(3.0, 0, 0, 1).probabilities(z), torch.full_like(z, 0.25))


def test_ets_log_is_clamped_and_finite():
    z = torch.tensor([[[0.0]], [[-500.0]], [[200.0]]]).permute(1, 0, 2)[..., None]  # (1, 3, 1, 1)
    lp = EnsembleTemperatureScaling(1.0, 1.0, 0.0, 0.0).log_probs(z)
    assert torch.isfinite(lp).all() and lp.min() >= math.log(1e-12) - 1e-9


def test_ets_parameter_checks():
    with pytest.raises(ValueError):
        EnsembleTemperatureScaling(0.0)
    with pytest.raises(ValueError):
        EnsembleTemperatureScaling(1.0, 0.5, 0.2, 0.2)  # sum 0.9
    with pytest.raises(ValueError):
        EnsembleTemperatureScaling(1.0, 1.2, -0.2, 0.0)
    ets = EnsembleTemperatureScaling(1.0, 0.5 + 1e-9, 0.5, 0.0)  # tolerance, renormalised
    assert abs(ets.w0 + ets.w1 + ets.w2 - 1.0) < 1e-15


def test_hts_temperature_formula():
    z = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.1, 0.1, 0.1, 0.1], [60.0, -60.0, -60.0, -60.0]], dtype=torch.float64)
    z = z[:, :, None]  # (3, 4, 1): batch of three pixels
    p = torch.softmax(z, dim=1)
    h = -(p * p.clamp_min(1e-300).log()).sum(dim=1)
    ell = torch.log(h / math.log(4)).clamp(min=-9.0)
    assert torch.allclose(normalized_log_entropy(z), ell)
    assert normalized_log_entropy(z)[1, 0] == pytest.approx(0.0, abs=1e-12)  # uniform: H = log K
    assert normalized_log_entropy(z)[2, 0] == -9.0  # one-hot: clamped
    t = entropy_temperature(z, 0.7, 0.3)
    assert torch.allclose(t, F.softplus(0.7 * ell + 0.3))
    hts = EntropyTemperatureScaling(0.7, 0.3)
    assert torch.allclose(hts.probabilities(z), torch.softmax(z / t[:, None], dim=1))


@settings(max_examples=50, deadline=None)
@given(
    st.floats(-3, 3),
    st.floats(-3, 3),
    st.floats(0.05, 20),
    st.floats(0, 1),
    st.floats(0, 1),
    st.integers(0, 10_000),
    st.floats(0.3, 40),
)
def test_ets_and_hts_keep_the_label_and_normalise(w, b, t, a0, a1, seed, scale):
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(2, 4, 3, 3, generator=g, dtype=torch.float64)
    assume((z.topk(2, dim=1).values.diff(dim=1).abs() > 1e-6).all())
    w0, w1 = a0 * a1, a0 * (1 - a1)
    for cal in (EntropyTemperatureScaling(w, b), EnsembleTemperatureScaling(t, w0, w1, 1 - w0 - w1)):
        lp = cal.log_probs(z)
        assert lp.shape == z.shape and torch.isfinite(lp).all()
        q = lp.exp()
        assert torch.allclose(q.sum(dim=1), torch.ones(2, 3, 3, dtype=torch.float64), atol=1e-9)
        if not (isinstance(cal, EnsembleTemperatureScaling) and cal.w2 > 1 - 1e-9):
            assert torch.equal(q.argmax(dim=1), z.argmax(dim=1))


def test_new_calibrators_are_registered_and_round_trip():
    assert {"ets", "hts"} <= set(REGISTRY)
    for cal in (EnsembleTemperatureScaling(1.8, 0.7, 0.2, 0.1), EntropyTemperatureScaling(-0.4, 1.3)):
        d = cal.to_dict()
        back = calibrator_from_dict(d)
        assert type(back) is type(cal) and back.params() == cal.params()
        assert not back.needs_tac
    with pytest.raises(ValueError):
        EntropyTemperatureScaling(float("nan"), 0.0)
