"""Calibrators: one interface (:class:`Calibrator`) for CARD and the baselines."""

from .base import REGISTRY, Calibrator, calibrator_from_dict, method_label, register, temperature_scale
from .calibnet import CalibNet
from .card import CARD, temperature_field
from .ets import EnsembleTemperatureScaling
from .hts import EntropyTemperatureScaling, entropy_temperature, normalized_log_entropy
from .lts import LocalTemperatureScaling
from .netbase import NetworkCalibrator
from .pts import ParameterizedTemperatureScaling
from .simple import TemperatureScaling, Uncalibrated

__all__ = ["REGISTRY", "Calibrator", "calibrator_from_dict", "method_label", "register", "temperature_scale", "CARD",
           "temperature_field", "EnsembleTemperatureScaling", "EntropyTemperatureScaling", "entropy_temperature",
           "normalized_log_entropy", "TemperatureScaling", "Uncalibrated", "NetworkCalibrator",
           "ParameterizedTemperatureScaling", "LocalTemperatureScaling", "CalibNet"]
