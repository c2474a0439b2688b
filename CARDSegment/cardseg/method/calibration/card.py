"""CARD: temperature field from the TAC map (paper Eq. 8)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from cardseg.base import arrays
from cardseg.method.calibration.base import Calibrator, register, temperature_scale


def temperature_field(tac: Any, tau_min: float, tau_max: float, w_b: float, w_k: float) -> Any:
    """Paper Eq. 8: ``τ(v) = τ_min + σ((d̄(v) - w_b) / w_k) · (τ_max - τ_min)``.

    tac: TAC map ``d̄`` of any shape, e.g. ``(B, H, W)``, a tensor or a numpy array → ``τ`` of the same shape and kind, within
    ``[τ_min, τ_max]`` and monotonically increasing in ``d̄``. Requires ``1 ≤ τ_min ≤ τ_max``
    and ``w_k > 0``.
    """
    return tau_min + arrays.sigmoid((tac - w_b) / w_k) * (tau_max - tau_min)


@register
class CARD(Calibrator):
    """Trajectory-aware pixel-wise temperature scaling (paper Sec. IV-B); tensors or numpy arrays."""

    name = "card"
    label = "CARD"
    needs_tac = True

    def __init__(self, tau_min: float = 1.0, tau_max: float = 3.0, w_b: float = 0.1, w_k: float = 0.05):
        if not 1.0 <= tau_min <= tau_max:
            raise ValueError(f"CARD needs 1 <= tau_min <= tau_max, got tau_min={tau_min}, tau_max={tau_max}")
        if w_k <= 0 or w_b < 0:
            raise ValueError(f"CARD needs w_b >= 0 and w_k > 0, got w_b={w_b}, w_k={w_k}")
        self.tau_min, self.tau_max, self.w_b, self.w_k = float(tau_min), float(tau_max), float(w_b), float(w_k)

    def temperature(self, tac: Any, outside: Optional[np.ndarray] = None) -> Any:
        """Eq. 8 of ``tac`` (e.g. ``(Z, H, W)``), and ``τ_min`` where ``outside`` (numpy bool over
        the trailing axes of ``tac``: ``(H, W)`` for ``(Z, H, W)``, or ``tac``'s own shape) is true:
        the pixels outside the networks' field of view, which the engine makes background without
        running the networks (no disagreement was measured there; their confident logits stand)."""
        tau = temperature_field(tac, self.tau_min, self.tau_max, self.w_b, self.w_k)
        if outside is not None and np.any(outside):
            tau[(..., arrays.like(np.asarray(outside, bool), tau))] = self.tau_min
        return tau

    def log_probs(
        self, logits: Any, tac: Optional[Any] = None, outside: Optional[np.ndarray] = None, **inputs: Any
    ) -> Any:
        """Eq. 4 with Eq. 8's field; ``outside``: as in :meth:`temperature`."""
        if tac is None:
            raise ValueError("CARD needs the TAC map of the dual trajectory")
        return temperature_scale(
            logits,
            self.temperature(
                tac.to(logits.dtype) if arrays.is_tensor(tac) else tac.astype(logits.dtype, copy=False), outside
            ),
        )

    def params(self):
        return {"tau_min": self.tau_min, "tau_max": self.tau_max, "w_b": self.w_b, "w_k": self.w_k}
