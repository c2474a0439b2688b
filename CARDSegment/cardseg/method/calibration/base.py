"""The one calibrator interface shared by CARD and every baseline.

A calibrator turns the primary's terminal logits ``z (B, K, *S)`` (``S`` any spatial shape) and,
for trajectory-aware methods, the TAC map ``d̄ (B, *S)`` into calibrated class probabilities
``q (B, K, *S)``. Fitting lives in ``cardseg_train.calibration_fit`` (and ``calibration_fit_nets``
for the small networks); here each calibrator only holds its fitted parameters (JSON-able, stored
in ``bundle.json``) and applies them.

Some calibrators read more than the logits and the TAC: they name the extra per-pixel inputs in
``needs_inputs`` and receive them as keyword arguments of :meth:`Calibrator.log_probs`, on the
logits' grid: ``image`` ``(B, *S)`` (the normalised network input, after any perturbation),
``aug_mean`` / ``aug_std`` ``(B, K, *S)`` (the logits' mean and standard deviation over
photometric augmentations of the input, CalibNet). A ``spatial`` calibrator (a convolutional
network) needs ``S = (H, W)``, whole slices or crops of them, not a list of pixels. Every
calibrator accepts (and ignores) inputs it does not need.
"""

from __future__ import annotations

from typing import ClassVar, Dict, Optional, Tuple, Type

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
    #: how tables and figures name the method (the paper's abbreviation)
    label: ClassVar[str] = ""
    #: whether the method needs the TAC map (and so the reference trajectory)
    needs_tac: ClassVar[bool] = False
    #: extra per-pixel inputs ``log_probs`` needs as keyword arguments (see the module docstring)
    needs_inputs: ClassVar[Tuple[str, ...]] = ()
    #: whether ``log_probs`` needs the 2D layout ``(B, K, H, W)`` (a convolutional calibrator)
    spatial: ClassVar[bool] = False

    def log_probs(self, logits: torch.Tensor, tac: Optional[torch.Tensor] = None,
                  **inputs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def probabilities(self, logits: torch.Tensor, tac: Optional[torch.Tensor] = None,
                      **inputs: torch.Tensor) -> torch.Tensor:
        return self.log_probs(logits, tac, **inputs).exp()

    def require_inputs(self, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """The inputs this calibrator needs, or a ``ValueError`` naming the missing ones."""
        missing = [k for k in self.needs_inputs if inputs.get(k) is None]
        if missing:
            raise ValueError(f"the {self.name} calibration needs {', '.join(missing)} beside the logits")
        return {k: inputs[k] for k in self.needs_inputs}

    def params(self) -> Dict[str, float]:
        """Fitted parameters, JSON-able."""
        return {}

    def summary(self) -> dict:
        """A short JSON-able description for reports (default: :meth:`to_dict`; calibrators with
        many weights give their architecture and parameter count instead)."""
        return self.to_dict()

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


def method_label(name: str, on_primary: bool = True) -> str:
    """How a report names method ``name``: its :attr:`Calibrator.label`, prefixed ``Primary+``
    when it calibrates the diffusion primary (the paper's backbone-matched controls; UC becomes
    ``Primary (UC)``), bare when it calibrates a plain segmentor. CARD is always ``CARD``."""
    cls = REGISTRY.get(name)
    label = cls.label if cls is not None and cls.label else name
    if name == "card" or not on_primary:
        return label
    return "Primary (UC)" if name == "uc" else f"Primary+{label}"


def calibrator_from_dict(d: dict) -> Calibrator:
    """Rebuild a calibrator from ``{"method": name, **params}``."""
    d = dict(d)
    name = d.pop("method")
    if name not in REGISTRY:
        raise ValueError(f"unknown calibration method {name!r} (choose from {', '.join(sorted(REGISTRY))})")
    return REGISTRY[name].from_params(d)
