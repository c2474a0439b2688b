"""Augmentation, the loss terms and the construction of training inputs (no training here)."""

from __future__ import annotations

import math

import pytest
import torch

from cardseg.method.diffusion import CategoricalSchedule, one_hot
from cardseg_train.data.augment import AugmentConfig, BatchAugment
from cardseg_train.training.losses import DiffusionLoss, LossWeights, boundary_band, boundary_ce, soft_dice_loss
from cardseg_train.training.steps import InputRecipe, draw_steps, lr_factor, make_training_inputs, sample_noisy_state

K = 4
SCHED = CategoricalSchedule(num_steps=50)


def _labels(b=2, n=32):
    lab = torch.zeros(b, n, n, dtype=torch.long)
    lab[:, 8:20, 6:16] = 3
    lab[:, 10:14, 18:28] = 1
    lab[:, 22:26, 6:20] = 2
    return lab


# ---------------------------------------------------------------------------- augmentation
def test_augment_off_is_identity():
    g = torch.Generator().manual_seed(0)
    img, lab = torch.rand(3, 1, 32, 32), _labels(3)
    a, b = BatchAugment(AugmentConfig.off())(img, lab, g)
    assert torch.allclose(a, img, atol=1e-5) and torch.equal(b, lab)


def test_augment_flip():
    cfg = AugmentConfig.off()
    cfg.p_flip_x = 1.0
    img, lab = torch.rand(2, 1, 16, 16), _labels(2, 16)
    a, b = BatchAugment(cfg)(img, lab, torch.Generator().manual_seed(1))
    assert torch.allclose(a, img.flip(-1), atol=1e-5) and torch.equal(b, lab.flip(-1))


def test_augment_moves_image_and_label_together():
    cfg = AugmentConfig(p_gamma=0, p_contrast=0, p_noise=0, p_spatial=1.0)
    lab = _labels(8, 48)
    img = lab[:, None].float() / 3.0  # the image encodes the label exactly
    a, b = BatchAugment(cfg)(img, lab, torch.Generator().manual_seed(2))
    assert b.dtype == lab.dtype and a.shape == img.shape
    assert not torch.equal(b, lab)  # something moved
    agree = ((a[:, 0] * 3).round().long() == b).float().mean()
    assert agree > 0.97  # only pixels on interpolated edges may differ
    assert set(b.unique().tolist()) <= {0, 1, 2, 3}


def test_augment_reproducible_and_in_range():
    img, lab = torch.rand(4, 1, 32, 32), _labels(4)
    aug = BatchAugment(AugmentConfig(p_gamma=1, p_contrast=1, p_noise=1))
    a1, b1 = aug(img, lab, torch.Generator().manual_seed(5))
    a2, b2 = aug(img, lab, torch.Generator().manual_seed(5))
    assert torch.equal(a1, a2) and torch.equal(b1, b2)
    assert float(a1.min()) >= 0.0 and float(a1.max()) <= 1.0


# ---------------------------------------------------------------------------- losses
def _t(b, v):
    return torch.full((b,), v, dtype=torch.long)


@pytest.mark.parametrize("t", [0, 12, 37, 49])
def test_kl_zero_at_truth_positive_otherwise(t):
    lab = _labels()
    x0 = one_hot(lab, K)
    x_t = sample_noisy_state(SCHED, lab, _t(2, t), K, torch.Generator().manual_seed(0))
    loss = DiffusionLoss(SCHED)
    perfect = loss.kl_term(x0 * 1e4, lab, x_t, _t(2, t))  # softmax is exactly the one-hot label
    assert abs(float(perfect)) < 1e-7
    wrong = loss.kl_term(torch.randn(2, K, 32, 32), lab, x_t, _t(2, t))
    if t < 49:
        assert float(wrong) > 1e-4
    else:  # alpha_{T-1} = 0: posterior still depends on x0 through abar_{T-2} > 0
        assert float(wrong) >= 0.0


def test_kl_with_uniform_state():
    lab = _labels()
    u = torch.full((2, K, 32, 32), 1.0 / K)
    loss = DiffusionLoss(SCHED)
    assert abs(float(loss.kl_term(one_hot(lab, K) * 1e4, lab, u, _t(2, 49)))) < 1e-7
    assert float(loss.kl_term(torch.zeros(2, K, 32, 32), lab, u, _t(2, 49))) > 0


def test_ce_dice_boundary_sane():
    lab = _labels()
    good = one_hot(lab, K) * 20.0
    flat = torch.zeros(2, K, 32, 32)
    assert float(torch.nn.functional.cross_entropy(good, lab)) < 1e-6
    assert float(soft_dice_loss(good, lab)) < 1e-3
    assert float(soft_dice_loss(one_hot((lab + 1) % K, K) * 20.0, lab)) > 0.95
    assert float(boundary_ce(flat, lab)) == pytest.approx(math.log(K), abs=1e-5)
    assert float(boundary_ce(good, lab)) < 1e-6
    assert float(boundary_ce(flat, torch.zeros_like(lab))) == 0.0  # no edges, no term


def test_boundary_band_geometry():
    lab = torch.zeros(1, 20, 20, dtype=torch.long)
    lab[0, 5:15, 5:15] = 1
    band = boundary_band(lab, radius=1)[0]
    # one pixel either side of the square's edge: a ring of width 2
    assert band[5, 10] and band[4, 10] and not band[6, 10] and not band[3, 10] and not band[10, 10]
    assert int(band.sum()) == 12 * 12 - 8 * 8


def test_total_is_weighted_sum():
    lab = _labels()
    logits = torch.randn(2, K, 32, 32, requires_grad=True)
    x_t = sample_noisy_state(SCHED, lab, _t(2, 20), K, torch.Generator().manual_seed(0))
    w = LossWeights(kl=0.5, ce=2.0, dice=0.25, boundary=3.0)
    total, terms = DiffusionLoss(SCHED, w)(logits, lab, x_t, _t(2, 20))
    expect = 0.5 * terms["kl"] + 2.0 * terms["ce"] + 0.25 * terms["dice"] + 3.0 * terms["boundary"]
    assert float(total.detach()) == pytest.approx(float(expect), rel=1e-5)
    total.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    only_ce, _ = DiffusionLoss(SCHED, LossWeights(kl=0, ce=1, dice=0, boundary=0))(logits, lab, x_t, _t(2, 20))
    assert float(only_ce.detach()) == pytest.approx(
        float(torch.nn.functional.cross_entropy(logits, lab).detach()), rel=1e-6
    )


# ---------------------------------------------------------------------------- training inputs
def test_noisy_state_follows_forward_process():
    lab = torch.randint(0, K, (4, 64, 64))
    g = torch.Generator().manual_seed(0)
    for t in (0, 20, 49):
        x_t = sample_noisy_state(SCHED, lab, _t(4, t), K, g)
        assert torch.equal(x_t.sum(1), torch.ones(4, 64, 64))
        keep = (x_t.argmax(1) == lab).float().mean()
        expect = float(SCHED.forward_probs(one_hot(lab[:1, :1, :1], K), _t(1, t))[0, :, 0, 0][lab[0, 0, 0]])
        assert float(keep) == pytest.approx(expect, abs=0.02)


def test_uniform_start_and_image_dropout():
    lab, img = _labels(6), torch.rand(6, 1, 32, 32)
    g = torch.Generator().manual_seed(0)
    im, x_t, t = make_training_inputs(SCHED, img, lab, K, InputRecipe(p_uniform=1.0, p_uncond=1.0), generator=g)
    assert torch.equal(t, _t(6, 49)) and torch.allclose(x_t, torch.full_like(x_t, 0.25)) and float(im.abs().max()) == 0
    im, x_t, t = make_training_inputs(SCHED, img, lab, K, InputRecipe(p_uniform=0.0, p_uncond=0.0), generator=g)
    assert (
        torch.equal(im, img)
        and torch.equal(x_t.sum(1), torch.ones(6, 32, 32))
        and set(x_t.unique().tolist()) <= {0.0, 1.0}
    )


def test_focused_steps_are_the_samplers_and_its_first_step_starts_uniform():
    """p_focus draws a slice's step from the sampler's steps; a focused slice at T-1 gets the exact
    uniform state (what inference starts from), others a one-hot x_t; p_focus 0 draws as before."""
    steps = [49, 37, 24, 12, 0]
    lab, img = _labels(64), torch.rand(64, 1, 32, 32)
    _, x_t, t = make_training_inputs(
        SCHED,
        img,
        lab,
        K,
        InputRecipe(p_uniform=0.0, p_uncond=0.0, p_focus=1.0, focus_steps=steps),
        generator=torch.Generator().manual_seed(1),
    )
    assert set(t.tolist()) == set(steps)
    top = t == 49
    assert torch.allclose(x_t[top], torch.full_like(x_t[top], 0.25))
    assert set(x_t[~top].unique().tolist()) <= {0.0, 1.0}
    # a share of p_focus: about half the slices off the sampler's steps stay possible
    t_half = draw_steps(50, 4000, 0.5, steps, torch.Generator().manual_seed(2))
    off = float((~torch.isin(t_half, torch.tensor(steps))).float().mean())
    assert off == pytest.approx(0.5 * 45 / 50, abs=0.03)
    # without focus the draws are the plain recipe's, random number for random number
    a = make_training_inputs(SCHED, img, lab, K, InputRecipe(0.15, 0.2), torch.Generator().manual_seed(3))
    b = make_training_inputs(SCHED, img, lab, K, InputRecipe(0.15, 0.2, 0.0, steps), torch.Generator().manual_seed(3))
    assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_warmup_schedule():
    assert lr_factor(0, 10, 100) == pytest.approx(0.1)
    assert lr_factor(9, 10, 100) == 1.0 and lr_factor(50, 10, 100) == 1.0
    assert lr_factor(100, 10, 100, "cosine") == pytest.approx(0.1)
    assert lr_factor(10, 10, 100, "cosine") == pytest.approx(1.0)
