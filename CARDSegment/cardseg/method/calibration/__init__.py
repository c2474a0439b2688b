"""Calibrators: one interface (:class:`Calibrator`) for CARD and the baselines."""

from cardseg.method.calibration.base import (REGISTRY, Calibrator, calibrator_from_dict, method_label, register,
                                             temperature_scale)
from cardseg.method.calibration.calibnet import CalibNet
from cardseg.method.calibration.card import CARD, temperature_field
from cardseg.method.calibration.ets import EnsembleTemperatureScaling
from cardseg.method.calibration.hts import EntropyTemperatureScaling, entropy_temperature, normalized_log_entropy
from cardseg.method.calibration.lts import LocalTemperatureScaling
from cardseg.method.calibration.netbase import NetworkCalibrator
from cardseg.method.calibration.pts import ParameterizedTemperatureScaling
from cardseg.method.calibration.simple import TemperatureScaling, Uncalibrated

__all__ = ["REGISTRY", "Calibrator", "calibrator_from_dict", "method_label", "register", "temperature_scale", "CARD",
           "temperature_field", "EnsembleTemperatureScaling", "EntropyTemperatureScaling", "entropy_temperature",
           "normalized_log_entropy", "TemperatureScaling", "Uncalibrated", "NetworkCalibrator",
           "ParameterizedTemperatureScaling", "LocalTemperatureScaling", "CalibNet"]
