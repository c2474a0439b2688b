"""LTS: local temperature scaling (Ding, Han, Liu and Niethammer, ICCV 2021)."""

from __future__ import annotations

import torch
from torch import nn

from cardseg.method.calibration.base import register
from cardseg.method.calibration.netbase import NetworkCalibrator, logit_input

#: the leaves of the temperature tree read the logits; a fifth one reads the image
LOGIT_LEAVES = 4


class _LTSTree(nn.Module):
    """The authors' tree of single-channel convolutions: ``(B, K, H, W)`` logits and ``(B, H, W)``
    image → ``o (B, H, W)``.

    Every node is one ``kernel x kernel`` convolution with dilation ``dilation`` and reflect
    padding (size kept) to one channel. Four leaves on the logits give temperatures ``1 + conv``;
    two gates (sigmoids of convolutions of the logits) mix them in pairs and a third mixes the
    pairs; a fifth leaf on the image (``1 + conv``) is mixed with that by a fourth gate; the output
    is ``o = mix + 1``. All weights zero, every leaf is 1 and ``o = 2``.
    """

    def __init__(self, num_classes: int, kernel: int, dilation: int):
        super().__init__()

        def node(c_in: int) -> nn.Conv2d:
            return nn.Conv2d(
                c_in, 1, kernel, padding=dilation * (kernel // 2), dilation=dilation, padding_mode="reflect"
            )

        self.leaves = nn.ModuleList([node(num_classes) for _ in range(LOGIT_LEAVES)])
        self.gates = nn.ModuleList([node(num_classes) for _ in range(LOGIT_LEAVES - 1)])
        self.image_leaf = node(1)
        self.image_gate = node(num_classes)

    def forward(self, z: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        leaf = [1.0 + conv(z) for conv in self.leaves]
        g = [torch.sigmoid(conv(z)) for conv in self.gates]
        left = g[0] * leaf[0] + (1.0 - g[0]) * leaf[1]
        right = g[1] * leaf[2] + (1.0 - g[1]) * leaf[3]
        logit_t = g[2] * left + (1.0 - g[2]) * right
        gi = torch.sigmoid(self.image_gate(z))
        mixed = gi * logit_t + (1.0 - gi) * (1.0 + self.image_leaf(image[:, None]))
        return (mixed + 1.0)[:, 0]


@register
class LocalTemperatureScaling(NetworkCalibrator):
    """LTS: a temperature map predicted from the logits and the image by the authors' tree of
    dilated convolutions (:class:`_LTSTree`: 5 x 5 kernels, dilation 2, reflect padding, as in
    their code; 9 nodes, ``8 (25 K + 1) + 26`` weights, 834 for K = 4).

    Inputs: logits ``(B, K, H, W)`` (clipped to ``±100`` and divided by 10) and ``image``
    ``(B, H, W)`` (the normalised network input on the logits' grid). The tree gives ``o`` and
    ``T = max(ReLU(o) + 1e-8, 0.05)`` per pixel (the authors' ``ReLU(o) + 1e-8`` with the floor
    every network calibrator here shares); ``q = Softmax(z / T)``, log-probabilities
    ``(B, K, H, W)``. The authors start from all weights zero, ``T = 2``; here the untrained
    calibrator is the identity (weights zero, leaf biases ``t0 - 2`` for ``T ≡ t0 = 1``:
    :meth:`set_constant_temperature`), and the fitter starts it at the TS temperature. A positive
    temperature never changes the predicted label. Needs whole slices or crops of at least
    ``dilation * (kernel // 2) + 1`` pixels a side (``spatial``), not pixel lists.
    """

    name = "lts"
    label = "LTS"
    needs_inputs = ("image",)
    spatial = True
    arch_defaults = {"num_classes": 4, "kernel": 5, "dilation": 2}

    def build(self, arch: dict) -> nn.Module:
        return _LTSTree(arch["num_classes"], arch["kernel"], arch["dilation"])

    def set_constant_temperature(self, t0: float) -> None:
        """Zero every weight and gate bias, leaf biases ``t0 - 2``: every leaf ``t0 - 1``, ``T ≡ t0``."""
        with torch.no_grad():
            for p in self.net.parameters():
                p.zero_()
            for conv in [*self.net.leaves, self.net.image_leaf]:
                conv.bias.fill_(float(t0) - 2.0)

    def raw_output(self, logits: torch.Tensor, image: torch.Tensor = None, **inputs: torch.Tensor) -> torch.Tensor:
        if image.shape != logits.shape[:1] + logits.shape[2:]:
            raise ValueError(f"lts: image {tuple(image.shape)} does not match logits {tuple(logits.shape)}")
        reach = self.arch["dilation"] * (self.arch["kernel"] // 2)
        if min(logits.shape[2:]) <= reach:
            raise ValueError(f"lts needs slices larger than {reach} px a side, got {tuple(logits.shape[2:])}")
        return self.net(logit_input(self._float(logits)), self._float(image))
