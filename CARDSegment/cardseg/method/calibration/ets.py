"""ETS: ensemble temperature scaling (Zhang, Kailkhura and Han, "Mix-n-Match", ICML 2020)."""

from __future__ import annotations

import math
from typing import Optional

import torch

from cardseg.method.calibration.base import Calibrator, register

#: probabilities are clamped here before the log, so a zero-weight mixture never gives ``-inf``
PROB_FLOOR = 1e-12
#: tolerance on ``w0 + w1 + w2 = 1`` when parameters are loaded
WEIGHT_SUM_TOL = 1e-6


@register
class EnsembleTemperatureScaling(Calibrator):
    """ETS: a convex mixture of a tempered softmax, the plain softmax and the uniform distribution.

    ``q(v) = w0 · Softmax(z(v) / t) + w1 · Softmax(z(v)) + w2 / K`` with ``t > 0``,
    ``w0, w1, w2 ∈ [0, 1]`` and ``w0 + w1 + w2 = 1``. All three members rank the classes like
    ``z``, so the predicted label never changes. ``log_probs`` takes logits ``(B, K, *S)`` and
    returns ``log(max(q, 1e-12))`` of the same shape; the TAC map is ignored.
    """

    name = "ets"
    label = "ETS"

    def __init__(self, temperature: float = 1.0, w0: float = 1.0, w1: float = 0.0, w2: float = 0.0):
        if not temperature > 0:
            raise ValueError(f"ETS temperature must be positive, got {temperature}")
        weights = [float(w0), float(w1), float(w2)]
        if any(not (-WEIGHT_SUM_TOL <= w <= 1.0 + WEIGHT_SUM_TOL) for w in weights):
            raise ValueError(f"ETS weights must lie in [0, 1], got {weights}")
        total = sum(weights)
        if abs(total - 1.0) > WEIGHT_SUM_TOL:
            raise ValueError(f"ETS weights must sum to 1, got {weights} (sum {total})")
        weights = [min(max(w, 0.0), 1.0) for w in weights]
        if abs(sum(weights) - 1.0) > 1e-12:  # renormalise (idempotent: a stored set stays as is)
            weights = [w / sum(weights) for w in weights]
        self.temperature = float(temperature)
        self.w0, self.w1, self.w2 = weights

    def log_probs(
        self, logits: torch.Tensor, tac: Optional[torch.Tensor] = None, **inputs: torch.Tensor
    ) -> torch.Tensor:
        k = logits.shape[1]
        members = []
        for w, logp in (
            (self.w0, lambda: torch.log_softmax(logits / self.temperature, dim=1)),
            (self.w1, lambda: torch.log_softmax(logits, dim=1)),
            (self.w2, lambda: torch.full_like(logits, -math.log(k))),
        ):
            if w > 0:
                members.append(math.log(w) + logp())
        mixed = torch.logsumexp(torch.stack(members), dim=0)
        return mixed.clamp_min(math.log(PROB_FLOOR))

    def params(self):
        return {"temperature": self.temperature, "w0": self.w0, "w1": self.w1, "w2": self.w2}
