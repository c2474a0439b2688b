"""Metrics, one home: the agreement score and segmentation measures (:mod:`.segmentation`) and
the calibration errors (:mod:`.calibration`: ECE, SCE, ACE, NLL, reliability). Numpy only."""
