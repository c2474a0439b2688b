"""PTS: parameterized temperature scaling (Tomani, Cremers and Buettner, ECCV 2022)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cardseg.method.calibration.base import register
from cardseg.method.calibration.netbase import TEMPERATURE_FLOOR, NetworkCalibrator, logit_input


class _PTSNet(nn.Module):
    """An MLP ``top_k → hidden (ReLU) × layers → 1``: ``(N, top_k)`` → ``(N,)``."""

    def __init__(self, top_k: int, hidden: int, layers: int):
        super().__init__()
        self.hidden = nn.ModuleList([nn.Linear(top_k if i == 0 else hidden, hidden) for i in range(layers)])
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.out(x)[..., 0]


@register
class ParameterizedTemperatureScaling(NetworkCalibrator):
    """PTS: one temperature per pixel from the pattern of the pixel's own sorted logits.

    For each pixel the logits ``z (K,)`` are sorted in decreasing order, the first ``top_k`` kept,
    clipped to ``±100`` and divided by 10 (:func:`~cardseg.method.calibration.netbase.logit_input`); a
    small MLP (``layers`` hidden layers of ``hidden`` ReLU units; the authors use 2 x 5) maps them
    to ``o`` and ``T = max(|o|, 0.05)``; ``q = Softmax(z / T)``.
    The temperature depends only on the pixel's logits (no image, no neighbours, no TAC), so
    it runs on any layout: logits ``(B, K, *S)`` → log-probabilities ``(B, K, *S)``, temperature
    ``(B, *S)``. A positive temperature never changes the predicted label. Here ``top_k`` is the
    number of classes (the authors' ``min(10, K)``).
    """

    name = "pts"
    label = "PTS"
    arch_defaults = {"num_classes": 4, "top_k": 4, "hidden": 5, "layers": 2}

    def build(self, arch: dict) -> nn.Module:
        return _PTSNet(arch["top_k"], arch["hidden"], arch["layers"])

    @staticmethod
    def positive(o: torch.Tensor) -> torch.Tensor:
        return o.abs().clamp_min(TEMPERATURE_FLOOR)

    def sorted_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The network's input: ``(B, K, *S)`` → ``(B, *S, top_k)``, decreasing, clipped and
        rescaled, float32."""
        z = self._float(logits).movedim(1, -1)
        return logit_input(z.sort(dim=-1, descending=True).values[..., : self.arch["top_k"]])

    def raw_output(self, logits: torch.Tensor, **inputs: torch.Tensor) -> torch.Tensor:
        return self.net(self.sorted_logits(logits))
