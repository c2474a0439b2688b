"""The one calibrator interface shared by CARD and every baseline.

A calibrator turns the primary's terminal logits ``z (B, K, *S)`` (``S`` any spatial shape) and,
for trajectory-aware methods, the TAC map ``d̄ (B, *S)`` into calibrated class probabilities
``q (B, K, *S)``. Fitting lives in ``cardseg_train.calibration_fit``; here each calibrator only
holds its fitted parameters (JSON-able, stored in ``bundle.json``) and applies them.
"""

from __future__ import annotations

from typing import ClassVar, Dict, Optional, Type

import torch


def temperature_scale(logits: torch.Tensor, temperature: torch.Tensor | float) -> torch.Tensor:
    """Paper Eq. 2: ``q(v) = Softmax(z(v) / τ(v))``, returned as log-probabilities.

    logits: ``(B, K, *S)``; temperature: a positive scalar or a ``(B, *S)`` field (one τ per
    pixel shared by all K logits, so the argmax never changes) → ``(B, K, *S)``.
    """
    if torch.is_tensor(temperature) and temperature.dim() > 0:
        temperature = temperature.unsqueeze(1)
    return torch.log_softmax(logits / temperature, dim=1)


class Calibrator:
    """Base class: ``log_probs(logits, tac)`` → calibrated log-probabilities ``(B, K, *S)``."""

    name: ClassVar[str] = ""
    #: whether the method needs the TAC map (and so the reference trajectory)
    needs_tac: ClassVar[bool] = False

    def log_probs(self, logits: torch.Tensor, tac: Optional[torch.Tensor] = None) -> torch.Tensor:
        raise NotImplementedError

    def probabilities(self, logits: torch.Tensor, tac: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.log_probs(logits, tac).exp()

    def params(self) -> Dict[str, float]:
        """Fitted parameters, JSON-able."""
        return {}

    @classmethod
    def from_params(cls, params: Dict[str, float]) -> "Calibrator":
        return cls(**params)  # type: ignore[call-arg]

    def to_dict(self) -> dict:
        return {"method": self.name, **self.params()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v:.4g}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


REGISTRY: Dict[str, Type[Calibrator]] = {}


def register(cls: Type[Calibrator]) -> Type[Calibrator]:
    REGISTRY[cls.name] = cls
    return cls


def calibrator_from_dict(d: dict) -> Calibrator:
    """Rebuild a calibrator from ``{"method": name, **params}``."""
    d = dict(d)
    name = d.pop("method")
    if name not in REGISTRY:
        raise ValueError(f"unknown calibration method {name!r} (choose from {', '.join(sorted(REGISTRY))})")
    return REGISTRY[name].from_params(d)
