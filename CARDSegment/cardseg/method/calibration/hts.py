"""HTS: entropy-based temperature scaling (Balanya, Maroñas and Ramos, 2024)."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from cardseg.method.calibration.base import Calibrator, register, temperature_scale

#: lower clamp of the normalised log-entropy (a one-hot softmax has zero entropy: log 0 = -inf)
LOG_ENTROPY_FLOOR = -9.0
#: smallest temperature used, so a very negative softplus argument cannot divide by zero
TEMPERATURE_FLOOR = 1e-4


def normalized_log_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``ℓ(v) = max(log(H(v) / log K), -9)`` with ``H`` the entropy of ``Softmax(z(v))``.

    logits: ``(B, K, *S)`` → ``(B, *S)``, within ``[-9, 0]``.
    """
    k = logits.shape[1]
    logp = torch.log_softmax(logits, dim=1)
    entropy = (-(logp.exp() * logp).sum(dim=1)).clamp_min(0.0)
    return torch.log(entropy / math.log(k)).clamp(min=LOG_ENTROPY_FLOOR, max=0.0)


def entropy_temperature(logits: torch.Tensor, w: float, b: float) -> torch.Tensor:
    """``T(v) = max(softplus(w · ℓ(v) + b), 1e-4)``: logits ``(B, K, *S)`` → ``(B, *S)``."""
    return F.softplus(w * normalized_log_entropy(logits) + b).clamp_min(TEMPERATURE_FLOOR)


@register
class EntropyTemperatureScaling(Calibrator):
    """HTS: one temperature per pixel from the normalised entropy of the pixel's own softmax.

    ``q(v) = Softmax(z(v) / T(v))``, ``T(v) = softplus(w · log(H(v) / log K) + b)`` with the
    log-entropy clamped at -9 (see :func:`normalized_log_entropy`). A positive ``w`` cools
    confident (low-entropy) pixels less than uncertain ones and vice versa for a negative ``w``;
    either way the predicted label never changes. logits ``(B, K, *S)`` → log-probabilities
    of the same shape; the TAC map is ignored. The authors initialise ``w = 0.1, b = 0.8``.
    """

    name = "hts"
    label = "HTS"

    def __init__(self, w: float = 0.1, b: float = 0.8):
        if not (math.isfinite(w) and math.isfinite(b)):
            raise ValueError(f"HTS parameters must be finite, got w={w}, b={b}")
        self.w, self.b = float(w), float(b)

    def temperature(self, logits: torch.Tensor) -> torch.Tensor:
        return entropy_temperature(logits, self.w, self.b)

    def log_probs(
        self, logits: torch.Tensor, tac: Optional[torch.Tensor] = None, **inputs: torch.Tensor
    ) -> torch.Tensor:
        return temperature_scale(logits, self.temperature(logits))

    def params(self):
        return {"w": self.w, "b": self.b}
