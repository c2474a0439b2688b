"""Labelled data: ACDC slices and volumes, the slice dataset on the network grid, augmentation, the ACDC-C corruptions and the calibration perturbations."""
