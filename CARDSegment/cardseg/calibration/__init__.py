"""Calibrators: one interface (:class:`Calibrator`) for CARD and the baselines."""

from .base import REGISTRY, Calibrator, calibrator_from_dict, temperature_scale
from .card import CARD, temperature_field
from .simple import TemperatureScaling, Uncalibrated

__all__ = ["REGISTRY", "Calibrator", "calibrator_from_dict", "temperature_scale", "CARD", "temperature_field",
           "TemperatureScaling", "Uncalibrated"]
