"""Calibrators: one interface (:class:`Calibrator`) for CARD and the baselines.

CARD, UC and TS (and the functions of their equations) are imported with the package and need no
torch; the baselines that are torch modules (ETS, HTS, LTS, PTS, CalibNet) are imported the first
time one of their names, or :data:`REGISTRY`, is asked for (``from cardseg.method.calibration
import LocalTemperatureScaling`` works as before), or when a bundle names their method
(:func:`calibrator_from_dict`)."""

import importlib

from cardseg.method.calibration.base import (
    MODULES,
    Calibrator,
    calibrator_class,
    calibrator_from_dict,
    load_all,
    method_label,
    register,
    temperature_scale,
)
from cardseg.method.calibration.card import CARD, temperature_field
from cardseg.method.calibration.simple import TemperatureScaling, Uncalibrated

#: the names the torch-based modules provide, imported on first use (PEP 562)
LAZY = {
    "EnsembleTemperatureScaling": "ets",
    "EntropyTemperatureScaling": "hts",
    "entropy_temperature": "hts",
    "normalized_log_entropy": "hts",
    "LocalTemperatureScaling": "lts",
    "NetworkCalibrator": "netbase",
    "ParameterizedTemperatureScaling": "pts",
    "CalibNet": "calibnet",
}

__all__ = [
    "REGISTRY",
    "MODULES",
    "Calibrator",
    "calibrator_class",
    "calibrator_from_dict",
    "load_all",
    "method_label",
    "register",
    "temperature_scale",
    "CARD",
    "temperature_field",
    "TemperatureScaling",
    "Uncalibrated",
    *LAZY,
]


def __getattr__(name: str):
    if name == "REGISTRY":  # every method registered
        return load_all()
    if name in LAZY:
        return getattr(importlib.import_module(f"{__name__}.{LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
