"""What the module says about itself in Slicer's module panel (help, acknowledgement, contributors)."""

#: the module's contributors, as the extension's CMakeLists.txt names them
CONTRIBUTORS = ["CARDSegment maintainers (CARDSegment project)"]

HELP_TEXT = (
    "Segments the ventricles and myocardium in a short-axis cine MRI volume or sequence with a categorical "
    "diffusion model, and shows where not to trust it: a small reference network runs along the "
    "model's own reverse trajectory, and where the two disagree the confidence is lowered (CARD). "
    "Results: a segmentation, the disagreement and temperature maps as overlays with colour "
    "legends, the volume's agreement score, a ranked list of flagged regions to review and, for a cine "
    "sequence, the cardiac indices at end-diastole and end-systole. "
    "Research software, not a medical device: the shipped weights were trained on ACDC data, for research use only."
)

ACKNOWLEDGEMENT_TEXT = (
    "CARD: Calibration via Agreement in Reverse Diffusion. The segmentation runs in a separate "
    "process; nothing leaves this computer."
)

#: the status line when the user declines the research-use terms of the weights
DECLINED_TEXT = "Not run: the research-use terms of the model weights were not accepted."
