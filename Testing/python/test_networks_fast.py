"""Inference-time rewrites: same function, cheaper kernel (cardseg.method.networks.fast)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cardseg.bundle.loading import load_bundle
from cardseg.method.networks import build_network
from cardseg.method.networks.fast import instance_to_group_norm


def _randomise_affine(net: nn.Module) -> None:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.InstanceNorm2d) and m.affine:
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))


@pytest.mark.parametrize(
    "spec",
    [
        {"arch": "time-swinunetr", "size": "mini"},
        {"arch": "time-unet", "size": "tiny"},
        {"arch": "discriminative", "backbone": "unet"},
    ],
)
def test_group_norm_rewrite_keeps_the_logits(spec):
    torch.manual_seed(0)
    net = build_network({**spec, "num_classes": 4}).eval()
    _randomise_affine(net)
    n_instance = sum(isinstance(m, nn.InstanceNorm2d) for m in net.modules())
    assert n_instance > 0
    x = torch.rand(2, 1, 64, 64)
    args = (
        (x,)
        if spec["arch"] == "discriminative"
        else (x, torch.softmax(torch.randn(2, 4, 64, 64), 1), torch.tensor([49, 12]))
    )
    with torch.no_grad():
        before = net(*args)
        assert instance_to_group_norm(net) == n_instance
        after = net(*args)
    assert not any(isinstance(m, nn.InstanceNorm2d) for m in net.modules())
    assert sum(isinstance(m, nn.GroupNorm) for m in net.modules()) >= n_instance
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    assert set(net.state_dict()) == set(build_network({**spec, "num_classes": 4}).state_dict())  # same keys


def test_norms_with_running_statistics_are_left_alone():
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.InstanceNorm2d(3, track_running_stats=True), nn.InstanceNorm2d(3))
    assert instance_to_group_norm(net) == 1
    assert isinstance(net[1], nn.InstanceNorm2d) and isinstance(net[2], nn.GroupNorm)
    assert net[2].num_groups == 3 and not net[2].affine


def test_cpu_bundle_runs_group_norms(tiny_bundle):
    b = load_bundle(tiny_bundle, device="cpu")
    for net in (b.primary, b.reference):
        assert not any(isinstance(m, nn.InstanceNorm2d) for m in net.modules())
