"""What the small-network calibrators (PTS, LTS, CalibNet) share.

Each holds a tiny torch module that maps its inputs to one raw value ``o`` per pixel; the
temperature is a positive function of ``o`` (``|o|`` for PTS, ``o`` for LTS and CalibNet), floored
at :data:`TEMPERATURE_FLOOR`, and the logits are divided by it (paper Eq. 4). One positive
temperature per pixel, shared by all K logits, never changes the predicted label.

Parameters, JSON-able and stored in ``bundle.json`` without pickle: ``arch`` (the method's
hyper-parameters, integers and lists of integers, ``num_classes`` among them) and ``weights``
(``{tensor name: {"shape": [...], "values": [...]}}``, the module's tensors as flat lists of
numbers written with 9 significant digits, which float32 reads back exactly).
``cardseg.bundle.calibration_schema`` checks both without torch; ``NET_CALIBRATOR_ARCH`` and
:func:`~cardseg.method.calibrator_arch.net_arch_problem` are the one statement of the allowed
settings.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Dict, Optional

import torch
from torch import nn

from cardseg.method.calibration.base import Calibrator, temperature_scale
from cardseg.method.calibrator_arch import NET_CALIBRATOR_ARCH, net_arch_problem

#: smallest temperature a network calibrator gives (the lower bound of the fitted TS temperature)
TEMPERATURE_FLOOR = 0.05
#: logits (and their augmentation means) are clipped to +-this before entering a network
LOGIT_CLIP = 100.0
#: ... and then divided by this, so that the first layer's inputs are of order one for the tens a
#: confident network's logits reach (a fixed rescaling a first linear layer could absorb: it only
#: conditions the optimisation, e.g. keeps Adam's first steps from silencing every ReLU)
LOGIT_SCALE = 10.0


def logit_input(z: torch.Tensor) -> torch.Tensor:
    """Logits (or their augmentation mean or std) as a network reads them: clipped, rescaled."""
    return z.clamp(-LOGIT_CLIP, LOGIT_CLIP) / LOGIT_SCALE


def encode_state(module: nn.Module) -> Dict[str, dict]:
    """A module's tensors as ``{name: {"shape": [...], "values": [flat list]}}`` (JSON-able)."""
    out = {}
    for name, t in module.state_dict().items():
        flat = t.detach().to(torch.float32).reshape(-1).tolist()
        out[name] = {"shape": list(t.shape), "values": [float(f"{v:.9g}") for v in flat]}
    return out


def decode_state(weights: Any, method: str) -> Dict[str, torch.Tensor]:
    """The inverse of :func:`encode_state`; a ``ValueError`` for anything malformed."""
    if not isinstance(weights, dict):
        raise ValueError(f"{method} weights must be an object of tensors")
    out = {}
    for name, entry in weights.items():
        if not isinstance(entry, dict) or set(entry) != {"shape", "values"}:
            raise ValueError(f"{method} weights[{name!r}] must be an object with shape and values")
        shape, values = entry["shape"], entry["values"]
        if not isinstance(shape, list) or any(not isinstance(s, int) or s < 0 for s in shape):
            raise ValueError(f"{method} weights[{name!r}].shape must be a list of sizes")
        if not isinstance(values, list) or len(values) != math.prod(shape):
            raise ValueError(f"{method} weights[{name!r}].values must hold {math.prod(shape)} numbers")
        t = torch.tensor(values, dtype=torch.float32).reshape(shape)
        if not torch.isfinite(t).all():
            raise ValueError(f"{method} weights[{name!r}] must be finite")
        out[name] = t
    return out


class NetworkCalibrator(Calibrator):
    """Base of PTS, LTS and CalibNet: ``arch`` + ``weights`` → a module → a temperature map.

    Without ``weights`` the module is initialised from ``seed`` (torch's default initialisation,
    without touching the global generator) and its output layer is set to a constant
    temperature 1 (:meth:`set_constant_temperature`): an untrained calibrator is the identity.
    """

    #: the method's default hyper-parameters (``arch``); the allowed ranges are the schema's
    arch_defaults: ClassVar[Dict[str, Any]] = {}

    def __init__(self, arch: Optional[dict] = None, weights: Optional[dict] = None, seed: int = 0):
        arch = dict(self.arch_defaults if arch is None else arch)
        arch = {k: list(v) if isinstance(v, tuple) else v for k, v in arch.items()}
        problem = net_arch_problem(self.name, arch)
        if problem is not None:
            raise ValueError(f"{self.name} arch" + (f".{problem[0]}" if problem[0] else "") + f" {problem[1]}")
        self.arch = {k: arch[k] for k in NET_CALIBRATOR_ARCH[self.name]}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = self.build(self.arch)
        if weights is None:
            self.set_constant_temperature(1.0)
        else:
            state = decode_state(weights, self.name)
            want = {k: tuple(v.shape) for k, v in self.net.state_dict().items()}
            got = {k: tuple(v.shape) for k, v in state.items()}
            if got != want:
                bad = sorted(set(want) ^ set(got)) or [k for k in want if want[k] != got[k]]
                raise ValueError(f"{self.name} weights do not match its arch (first mismatch: {bad[0]})")
            self.net.load_state_dict(state)
        self.net.eval().requires_grad_(False)  # applied frozen; a fitter switches gradients on

    # -- to be provided by each method ------------------------------------------------------
    def build(self, arch: dict) -> nn.Module:
        """The method's module; its last layer is ``out`` (weight and bias), unless the method
        overrides :meth:`set_constant_temperature` (LTS, whose tree has no single last layer)."""
        raise NotImplementedError

    def raw_output(self, logits: torch.Tensor, **inputs: torch.Tensor) -> torch.Tensor:
        """The network's raw per-pixel output ``o (B, *S)`` (float32)."""
        raise NotImplementedError

    @staticmethod
    def positive(o: torch.Tensor) -> torch.Tensor:
        """Temperature from the raw output (LTS, CalibNet: ``max(o, floor)``)."""
        return o.clamp_min(TEMPERATURE_FLOOR)

    # -- shared ------------------------------------------------------------------------------
    def set_constant_temperature(self, t0: float) -> None:
        """Zero the last layer's weights and set its bias so that ``T ≡ t0`` everywhere."""
        with torch.no_grad():
            self.net.out.weight.zero_()
            self.net.out.bias.fill_(float(t0))

    def _float(self, x: torch.Tensor) -> torch.Tensor:
        p = next(self.net.parameters())
        return x.to(device=p.device, dtype=p.dtype)

    def temperature(self, logits: torch.Tensor, **inputs: torch.Tensor) -> torch.Tensor:
        """Per-pixel temperature ``(B, *S)`` (float32, on the module's device), ``>= 0.05``."""
        k = int(self.arch["num_classes"])
        if logits.dim() < 2 or logits.shape[1] != k:
            raise ValueError(f"{self.name} was fitted for {k} classes; got logits of shape {tuple(logits.shape)}")
        if self.spatial and logits.dim() != 4:
            raise ValueError(f"{self.name} needs logits (B, K, H, W), got {tuple(logits.shape)}")
        return self.positive(self.raw_output(logits, **self.require_inputs(inputs)))

    def log_probs(
        self, logits: torch.Tensor, tac: Optional[torch.Tensor] = None, **inputs: torch.Tensor
    ) -> torch.Tensor:
        t = self.temperature(logits, **inputs).to(device=logits.device, dtype=logits.dtype)
        return temperature_scale(logits, t)

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.net.parameters())

    def params(self) -> dict:
        return {
            "arch": {k: list(v) if isinstance(v, list) else v for k, v in self.arch.items()},
            "weights": encode_state(self.net),
        }

    @classmethod
    def from_params(cls, params: dict) -> "NetworkCalibrator":
        extra = set(params) - {"arch", "weights"}
        if extra or "arch" not in params or "weights" not in params:
            raise ValueError(f"{cls.name} takes exactly arch and weights (got {', '.join(params) or 'none'})")
        return cls(arch=params["arch"], weights=params["weights"])

    def summary(self) -> dict:
        return {"method": self.name, "arch": dict(self.arch), "parameters": self.parameter_count()}

    def __repr__(self) -> str:
        arch = ", ".join(f"{k}={v}" for k, v in self.arch.items())
        return f"{type(self).__name__}({arch}; {self.parameter_count()} weights)"
