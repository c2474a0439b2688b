"""cardseg_train: datasets, training, calibration fitting and evaluation for CARDSegment.

Imports :mod:`cardseg`; the engine never imports this package (its CLI reaches
``train``, ``fit-calibration`` and ``evaluate`` through :mod:`cardseg_train.cli`, lazily).
"""
