"""Calibrators: one interface (:class:`Calibrator`) for CARD and the baselines."""

from .base import REGISTRY, Calibrator, calibrator_from_dict, register, temperature_scale
from .card import CARD, temperature_field
from .ets import EnsembleTemperatureScaling
from .hts import EntropyTemperatureScaling, entropy_temperature, normalized_log_entropy
from .simple import TemperatureScaling, Uncalibrated

__all__ = ["REGISTRY", "Calibrator", "calibrator_from_dict", "register", "temperature_scale", "CARD",
           "temperature_field", "EnsembleTemperatureScaling", "EntropyTemperatureScaling", "entropy_temperature",
           "normalized_log_entropy", "TemperatureScaling", "Uncalibrated"]
