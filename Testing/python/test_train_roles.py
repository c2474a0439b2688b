"""Roles of the one training loop: the plain (deterministic) and aleatoric segmentors of the
conventional baselines, and the Kendall-Gal loss and prediction they use."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import cardseg.cli
from cardseg.method.networks import build_network
from cardseg.method.networks.discriminative import AleatoricSegmentor, aleatoric_nll, predictive_logits
from cardseg.bundle.scaffold import parse_network
from cardseg_train.training.losses import AleatoricLoss, SegmentationLoss
from cardseg_train.training.runs import load_run_network

SMOKE = ["--smoke", "--data", "synthetic", "--quiet"]


def test_predictive_logits_match_a_hand_computed_mixture():
    mu = torch.tensor([2.0, 0.0]).view(1, 2, 1, 1)
    log_var = torch.tensor([math.log(4.0), 0.0]).view(1, 2, 1, 1)  # sigma 2 and 1
    eps = torch.tensor([[1.0, -1.0], [-0.5, 0.5]]).view(2, 1, 2, 1, 1)
    out = predictive_logits(mu, log_var, eps)[0, :, 0, 0]
    # samples: (2 + 2*1, 0 - 1) = (4, -1) and (2 - 1, 0 + 0.5) = (1, 0.5)
    p1 = np.exp([4.0, -1.0]) / np.exp([4.0, -1.0]).sum()
    p2 = np.exp([1.0, 0.5]) / np.exp([1.0, 0.5]).sum()
    assert out.exp().numpy() == pytest.approx((p1 + p2) / 2, rel=1e-5)


def test_aleatoric_nll_is_cross_entropy_without_variance_and_rewards_variance_on_errors():
    torch.manual_seed(0)
    mu = torch.randn(2, 4, 5, 5)
    labels = torch.randint(0, 4, (2, 5, 5))
    tiny = torch.full_like(mu, -10.0)  # sigma ~ 0.007: the samples are the mean logits
    ce = torch.nn.functional.cross_entropy(mu, labels)
    assert float(aleatoric_nll(mu, tiny, labels, samples=8)) == pytest.approx(float(ce), rel=1e-2)
    # confidently wrong logits: variance lowers the loss (the head learns where it is unsure)
    wrong = torch.nn.functional.one_hot((labels + 1) % 4, 4).permute(0, 3, 1, 2).float() * 8.0
    assert float(aleatoric_nll(wrong, torch.full_like(wrong, 3.0), labels, 64)) < float(
        aleatoric_nll(wrong, tiny, labels, 64)
    )


def test_losses_keep_the_diffusion_terms_and_weights():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 16, 16, requires_grad=True)
    labels = torch.randint(0, 4, (2, 16, 16))
    total, terms = SegmentationLoss()(logits, labels)
    assert set(terms) == {"ce", "dice", "boundary"}
    assert float(total.detach()) == pytest.approx(
        float(terms["ce"] + terms["dice"] + 0.5 * terms["boundary"]), rel=1e-6
    )
    total.backward()
    assert logits.grad is not None and float(logits.grad.abs().sum()) > 0
    log_var = torch.zeros_like(logits, requires_grad=True)
    total, terms = AleatoricLoss(samples=4)(logits, log_var, labels)
    total.backward()
    assert float(log_var.grad.abs().sum()) > 0  # the variance head is trained


def test_aleatoric_prediction_is_repeatable_and_a_distribution():
    net = build_network({"arch": "discriminative", "backbone": "unet", "aleatoric": True, "num_classes": 4}).eval()
    assert isinstance(net, AleatoricSegmentor)
    x = torch.rand(2, 1, 32, 32)
    with torch.no_grad():
        a, b = net(x), net(x)
    assert torch.equal(a, b) and a.shape == (2, 4, 32, 32)
    assert torch.allclose(a.exp().sum(1), torch.ones(2, 32, 32), atol=1e-5)


def test_parse_network_for_plain_segmentors():
    assert parse_network("discriminative:swinunetr-tiny") == {
        "arch": "discriminative",
        "backbone": "swinunetr",
        "feature_size": 24,
    }
    assert parse_network("discriminative:unet") == {"arch": "discriminative", "backbone": "unet"}
    with pytest.raises(ValueError, match="unknown SwinUNETR size"):
        parse_network("discriminative:swinunetr-huge")


@pytest.mark.parametrize(
    "role,cls", [("deterministic", "DiscriminativeSegmentor"), ("aleatoric", "AleatoricSegmentor")]
)
def test_cli_trains_each_role(tmp_path, role, cls):
    out = tmp_path / role
    assert cardseg.cli.main(["train", "--role", role, *SMOKE, "--steps", "3", "--out", str(out)]) == 0
    net, cfg, meta = load_run_network(out)
    assert type(net).__name__ == cls and cfg.role == role and cfg.kind == role
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps_done"] == 3 and 0.0 <= meta["val"]["dice"] <= 1.0


def test_role_and_network_must_match(tmp_path, capsys):
    rc = cardseg.cli.main(
        ["train", "--role", "deterministic", "--size", "time-unet:tiny", *SMOKE, "--out", str(tmp_path / "x")]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "--role deterministic cannot train time-unet:tiny" in err
    assert not (tmp_path / "x").exists()
