import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.method.diffusion import (
    CategoricalSchedule,
    cosine_alpha_bar,
    default_sampling_steps,
    one_hot,
    uniform_state,
)


def test_cosine_schedule_decreases_from_near_one_to_zero():
    abar = cosine_alpha_bar(50)
    assert abar.shape == (50,) and abar.dtype == np.float64
    assert np.all(abar[1:] < abar[:-1])
    assert 0.99 < abar[0] < 1.0
    assert abar[-1] == 0.0
    # the cosine form, normalised at time 0
    s = 0.008

    def f(tau):
        return math.cos((tau + s) / (1 + s) * math.pi / 2) ** 2

    assert abs(float(abar[24]) - f(25 / 50) / f(0)) < 1e-12


def test_default_steps_match_the_paper():
    assert default_sampling_steps(50, 5) == [49, 37, 24, 12, 0]
    assert default_sampling_steps(50, 1) == [0]


def _random_dist(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64).softmax(dim=1)


def test_forward_at_top_step_is_uniform_and_at_bottom_close_to_x0():
    sched = CategoricalSchedule(50)
    x0 = one_hot(torch.randint(0, 4, (2, 5, 5)), 4, torch.float64)
    top = sched.forward_probs(x0, torch.tensor([49, 49]))
    assert torch.allclose(top, torch.full_like(top, 0.25))
    bottom = sched.forward_probs(x0, torch.tensor([0, 0]))
    assert (bottom - x0).abs().max() < 0.01


def test_posterior_is_a_distribution_and_equals_x0_at_step_zero():
    sched = CategoricalSchedule(50)
    x_t = one_hot(torch.randint(0, 4, (3, 6, 6)), 4, torch.float64)
    x0 = one_hot(torch.randint(0, 4, (3, 6, 6)), 4, torch.float64)
    post = sched.posterior(x_t, x0, torch.tensor([5, 30, 49]))
    assert torch.allclose(post.sum(dim=1), torch.ones(3, 6, 6, dtype=torch.float64))
    assert (post >= 0).all()
    assert torch.allclose(sched.posterior(x_t, x0, torch.tensor([0, 0, 0])), x0)


def test_posterior_matches_bayes_rule_by_enumeration():
    """q(x_{t-1}|x_t,x0) ∝ q(x_t|x_{t-1}) q(x_{t-1}|x0), computed class by class."""
    sched = CategoricalSchedule(50)
    k, t = 3, 20
    x0 = one_hot(torch.tensor([[[1]]]), k, torch.float64)
    x_t = one_hot(torch.tensor([[[2]]]), k, torch.float64)
    alpha = float(sched.alpha(torch.tensor([t]))[0])
    prev = sched.forward_probs(x0, torch.tensor([t - 1]))[0, :, 0, 0]
    lik = torch.tensor([alpha * (j == 2) + (1 - alpha) / k for j in range(k)], dtype=torch.float64)
    expected = lik * prev / (lik * prev).sum()
    got = sched.posterior(x_t, x0, torch.tensor([t]))[0, :, 0, 0]
    assert torch.allclose(got, expected)


def test_variational_kl_zero_iff_prediction_equals_x0():
    sched = CategoricalSchedule(50)
    x0 = one_hot(torch.randint(0, 4, (2, 8, 8)), 4, torch.float64)
    t = torch.tensor([10, 40])
    x_t = sched.q_sample(x0, t, generator=torch.Generator().manual_seed(0))
    assert sched.variational_kl(x_t, x0, x0, t).abs().max() < 1e-10
    wrong = _random_dist((2, 4, 8, 8), 1)
    assert sched.variational_kl(x_t, x0, wrong, t).mean() > 1e-3


def test_q_sample_frequencies_follow_the_forward_probabilities():
    sched = CategoricalSchedule(50)
    x0 = one_hot(torch.zeros(1, 100, 100, dtype=torch.long), 4)
    t = torch.tensor([30])
    x_t = sched.q_sample(x0, t, generator=torch.Generator().manual_seed(0))
    keep = x_t[0, 0].mean().item()
    expected = sched.forward_probs(x0, t)[0, 0, 0, 0].item()
    assert abs(keep - expected) < 0.02


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 49), st.integers(0, 10_000))
def test_reverse_step_is_one_hot_argmax_of_prediction(t, seed):
    sched = CategoricalSchedule(50)
    p = _random_dist((1, 4, 5, 5), seed).float()
    nxt = sched.reverse_step(p, t)
    assert torch.equal(nxt.argmax(dim=1), p.argmax(dim=1))
    assert torch.equal(nxt.sum(dim=1), torch.ones(1, 5, 5))


@pytest.mark.parametrize("t", [49, 37, 0])
def test_reverse_step_keeps_a_near_tie_in_order_at_every_step(t):
    """Two classes a hair apart (1e-6, the difference between two backends' networks) keep their
    order at every step, the noisiest included, where abar_{t-1} * 1e-6 is below float32's
    resolution next to the uniform term: the step does not depend on that rounding."""
    sched = CategoricalSchedule(50)
    p = np.full((1, 4, 1, 3), 0.25, dtype=np.float32)
    p[0, :, 0, 0] = [0.25 - 1e-6, 0.25 + 1e-6, 0.25, 0.25]  # class 1 ahead of class 0 (which argmax takes on ties)
    p[0, :, 0, 1] = [0.1, 0.3, 0.3 + 1e-6, 0.3 - 1e-6]  # class 2 ahead
    p[0, :, 0, 2] = [0.7, 0.1, 0.1, 0.1]
    for arr in (p, torch.from_numpy(p)):
        nxt = np.asarray(sched.reverse_step(arr, t))
        assert nxt[0, :, 0].argmax(axis=0).tolist() == [1, 2, 0]
        assert nxt.dtype == np.float32 and nxt.sum(axis=1).tolist() == [[[1.0, 1.0, 1.0]]]


def test_schedule_tables_agree():
    """The tensor table of training, the scalar of the reverse step and the function are one schedule."""
    sched = CategoricalSchedule(50)
    assert torch.equal(sched.alpha_bar, torch.from_numpy(cosine_alpha_bar(50)))
    prev = sched.abar_prev(torch.arange(50))
    assert [sched.abar_prev_value(t) for t in range(50)] == prev.tolist()


def test_uniform_state():
    u = uniform_state((2, 3, 4), 4)
    assert u.shape == (2, 4, 3, 4) and torch.allclose(u.sum(dim=1), torch.ones(2, 3, 4))
