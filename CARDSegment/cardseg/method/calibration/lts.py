"""LTS: local temperature scaling (Ding, Han, Liu and Niethammer, ICCV 2021)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cardseg.method.calibration.base import register
from cardseg.method.calibration.netbase import NetworkCalibrator, logit_input


class _LTSNet(nn.Module):
    """Dilated convolutions on ``[logits, image]``: ``(B, K + 1, H, W)`` → ``(B, H, W)``.

    One ``kernel x kernel`` convolution (ReLU) per entry of ``dilations``, ``hidden`` channels,
    padded to keep the size, then an output convolution to one channel.
    """

    def __init__(self, num_classes: int, hidden: int, kernel: int, dilations):
        super().__init__()
        self.convs = nn.ModuleList([
            nn.Conv2d(num_classes + 1 if i == 0 else hidden, hidden, kernel, padding=d * (kernel // 2), dilation=d)
            for i, d in enumerate(dilations)])
        self.out = nn.Conv2d(hidden, 1, kernel, padding=kernel // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.relu(conv(x))
        return self.out(x)[:, 0]


@register
class LocalTemperatureScaling(NetworkCalibrator):
    """LTS: a temperature map predicted from the logits and the image by a small CNN.

    Inputs: logits ``(B, K, H, W)`` (clipped to ``±100`` and divided by 10) and ``image`` ``(B, H, W)`` (the
    normalised network input on the logits' grid), stacked into ``K + 1`` channels; the network
    (:class:`_LTSNet`, default 3 dilated 5 x 5 convolutions of 8 channels, dilations 1, 2, 4: a
    33-pixel receptive field) gives ``o`` and ``T = max(o, 0.05)`` per pixel;
    ``q = Softmax(z / T)``, log-probabilities ``(B, K, H, W)``. Untrained (or zero last layer
    with bias 1) it is the identity, as the authors' zero initialisation. A positive temperature
    never changes the predicted label. Needs whole slices or crops (``spatial``), not pixel lists.
    """

    name = "lts"
    label = "LTS"
    needs_inputs = ("image",)
    spatial = True
    arch_defaults = {"num_classes": 4, "hidden": 8, "kernel": 5, "dilations": [1, 2, 4]}

    def build(self, arch: dict) -> nn.Module:
        return _LTSNet(arch["num_classes"], arch["hidden"], arch["kernel"], arch["dilations"])

    def raw_output(self, logits: torch.Tensor, image: torch.Tensor = None, **inputs: torch.Tensor) -> torch.Tensor:
        if image.shape != logits.shape[:1] + logits.shape[2:]:
            raise ValueError(f"lts: image {tuple(image.shape)} does not match logits {tuple(logits.shape)}")
        return self.net(torch.cat([logit_input(self._float(logits)), self._float(image)[:, None]], dim=1))
