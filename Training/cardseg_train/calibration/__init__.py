"""Fitting the calibrators on source validation (``cardseg fit-calibration``) and the calibration harness of ``cardseg evaluate``."""
