"""Uncalibrated output (UC) and global temperature scaling (TS, Guo et al. 2017)."""

from __future__ import annotations

from typing import Any, Optional

from cardseg.base import arrays
from cardseg.method.calibration.base import Calibrator, register, temperature_scale


@register
class Uncalibrated(Calibrator):
    """UC: the plain softmax of the primary's terminal logits (tensors or numpy arrays)."""

    name = "uc"
    label = "UC"

    def log_probs(self, logits: Any, tac: Optional[Any] = None, **inputs: Any) -> Any:
        return arrays.log_softmax(logits, axis=1)


@register
class TemperatureScaling(Calibrator):
    """TS: one scalar temperature ``T > 0`` for every pixel, ``Softmax(z / T)`` (tensors or numpy arrays)."""

    name = "ts"
    label = "TS"

    def __init__(self, temperature: float = 1.0):
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = float(temperature)

    def log_probs(self, logits: Any, tac: Optional[Any] = None, **inputs: Any) -> Any:
        return temperature_scale(logits, self.temperature)

    def params(self):
        return {"temperature": self.temperature}
