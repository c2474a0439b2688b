"""The one calibrator interface shared by CARD and every baseline.

A calibrator turns the primary's terminal logits ``z (B, K, *S)`` (``S`` any spatial shape) and,
for trajectory-aware methods, the TAC map ``d̄ (B, *S)`` into calibrated class probabilities
``q (B, K, *S)``. Fitting lives in ``cardseg_train.calibration.fit`` (and ``calibration_fit_nets``
for the small networks); here each calibrator only holds its fitted parameters (JSON-able, stored
in ``bundle.json``) and applies them.

Some calibrators read more than the logits and the TAC: they name the extra per-pixel inputs in
``needs_inputs`` and receive them as keyword arguments of :meth:`Calibrator.log_probs`, on the
logits' grid: ``image`` ``(B, *S)`` (the normalised network input, after any perturbation),
``aug_mean`` / ``aug_std`` ``(B, K, *S)`` (the logits' mean and standard deviation over
photometric augmentations of the input, CalibNet). A ``spatial`` calibrator (a convolutional
network) needs ``S = (H, W)``, whole slices or crops of them, not a list of pixels. Every
calibrator accepts (and ignores) inputs it does not need.

CARD, UC and TS (and :func:`temperature_scale`) take torch tensors or numpy arrays alike
(:mod:`cardseg.base.arrays`), so the ONNX Runtime path calibrates without importing torch; the
other calibrators are torch modules. Each lives in its own module, imported when a bundle or a
caller first names its method (:func:`calibrator_class`), so that naming CARD imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar, Dict, Optional, Tuple, Type

from cardseg.base import arrays

if TYPE_CHECKING:
    import torch

#: the module of :mod:`cardseg.method.calibration` that defines each method
MODULES = {
    "card": "card",
    "uc": "simple",
    "ts": "simple",
    "ets": "ets",
    "hts": "hts",
    "lts": "lts",
    "pts": "pts",
    "calibnet": "calibnet",
}


def temperature_scale(logits: Any, temperature: Any) -> Any:
    """Paper Eq. 4: ``q(v) = Softmax(z(v) / τ(v))``, returned as log-probabilities.

    logits: ``(B, K, *S)``; temperature: a positive scalar or a ``(B, *S)`` field (one τ per
    pixel shared by all K logits, so the argmax never changes) → ``(B, K, *S)``; tensors or
    numpy arrays, the result of the logits' kind.
    """
    if arrays.ndim(temperature) > 0:
        temperature = arrays.expand_dims(temperature, 1)
    return arrays.log_softmax(logits / temperature, axis=1)


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

    def log_probs(
        self, logits: torch.Tensor, tac: Optional[torch.Tensor] = None, **inputs: torch.Tensor
    ) -> torch.Tensor:
        raise NotImplementedError

    def probabilities(
        self, logits: torch.Tensor, tac: Optional[torch.Tensor] = None, **inputs: torch.Tensor
    ) -> torch.Tensor:
        return arrays.exp(self.log_probs(logits, tac, **inputs))

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
    cls = load_all().get(name)
    label = cls.label if cls is not None and cls.label else name
    if name == "card" or not on_primary:
        return label
    return "Primary (UC)" if name == "uc" else f"Primary+{label}"


def load_all() -> Dict[str, Type[Calibrator]]:
    """:data:`REGISTRY` with every method's module imported (torch among them)."""
    for module in sorted(set(MODULES.values())):
        importlib.import_module(f"{__package__}.{module}")
    return REGISTRY


def calibrator_class(name: str) -> Type[Calibrator]:
    """The class of method ``name``, its module imported now if need be; ``ValueError`` if unknown."""
    if name not in REGISTRY and name in MODULES:
        importlib.import_module(f"{__package__}.{MODULES[name]}")
    if name not in REGISTRY:
        raise ValueError(f"unknown calibration method {name!r} (choose from {', '.join(sorted(MODULES))})")
    return REGISTRY[name]


def calibrator_from_dict(d: dict) -> Calibrator:
    """Rebuild a calibrator from ``{"method": name, **params}``."""
    d = dict(d)
    name = d.pop("method")
    return calibrator_class(name).from_params(d)
