import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cardseg.method.calibration import (
    CARD,
    REGISTRY,
    TemperatureScaling,
    Uncalibrated,
    calibrator_from_dict,
    temperature_field,
    temperature_scale,
)

LN2 = math.log(2)

params = st.tuples(st.floats(1.0, 5.0), st.floats(0.0, 20.0), st.floats(0.0, LN2), st.floats(1e-3, 1.0))


@settings(max_examples=80, deadline=None)
@given(params, st.integers(0, 10_000))
def test_temperature_within_bounds_and_monotone(p, seed):
    tau_min, extra, w_b, w_k = p
    tau_max = tau_min + extra
    g = torch.Generator().manual_seed(seed)
    tac = torch.rand(64, generator=g, dtype=torch.float64) * LN2
    tau = temperature_field(tac, tau_min, tau_max, w_b, w_k)
    assert (tau >= tau_min - 1e-12).all() and (tau <= tau_max + 1e-12).all()
    order = tac.argsort()
    assert (tau[order].diff() >= -1e-12).all()


@settings(max_examples=60, deadline=None)
@given(params, st.integers(0, 10_000), st.floats(0.5, 30.0))
def test_card_never_changes_the_segmentation_and_only_attenuates(p, seed, scale):
    tau_min, extra, w_b, w_k = p
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(2, 4, 5, 7, generator=g, dtype=torch.float64)
    assume((logits.topk(2, dim=1).values.diff(dim=1).abs() > 1e-9).all())  # no exact ties
    tac = torch.rand(2, 5, 7, generator=g, dtype=torch.float64) * LN2
    card = CARD(tau_min, tau_min + extra, w_b, w_k)
    q = card.probabilities(logits, tac)
    assert torch.allclose(q.sum(dim=1), torch.ones(2, 5, 7, dtype=torch.float64))
    assert torch.equal(q.argmax(dim=1), logits.argmax(dim=1))
    # tau >= 1: top-label confidence never rises above the plain softmax
    assert (q.max(dim=1).values <= logits.softmax(dim=1).max(dim=1).values + 1e-12).all()


def test_temperature_scale_matches_softmax_of_scaled_logits():
    z = torch.randn(1, 3, 2, 2)
    tau = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
    got = temperature_scale(z, tau).exp()
    want = torch.softmax(z / tau[:, None], dim=1)
    assert torch.allclose(got, want)
    assert torch.allclose(TemperatureScaling(2.5).probabilities(z), torch.softmax(z / 2.5, dim=1))
    assert torch.allclose(Uncalibrated().probabilities(z), torch.softmax(z, dim=1))


def test_card_parameter_constraints():
    with pytest.raises(ValueError):
        CARD(tau_min=0.5)
    with pytest.raises(ValueError):
        CARD(tau_min=3.0, tau_max=2.0)
    with pytest.raises(ValueError):
        CARD(w_k=0.0)
    with pytest.raises(ValueError):
        CARD().log_probs(torch.randn(1, 4, 2, 2))


def test_calibrators_round_trip_through_dicts():
    for cal in (CARD(1.2, 4.0, 0.05, 0.02), TemperatureScaling(1.7), Uncalibrated()):
        back = calibrator_from_dict(cal.to_dict())
        assert type(back) is type(cal) and back.params() == cal.params()
    assert {"card", "ts", "uc"} <= set(REGISTRY)
    with pytest.raises(ValueError):
        calibrator_from_dict({"method": "nope"})
