"""cardseg: the CARDSegment inference engine.

Categorical-diffusion segmentation of MRI slices with CARD calibration: a primary and a
small reference denoiser run along the primary's reverse trajectory; their averaged
Jensen-Shannon disagreement (TAC) becomes a per-pixel temperature for the primary's logits.

Where each equation of the paper lives:

* Eq. 1 forward process, Eq. 3 reverse step, the true posterior: :mod:`cardseg.method.diffusion`
* Eq. 2 the denoisers' class distributions (softmax), per sampled step: :func:`cardseg.method.trajectory.run_trajectory`
* Eq. 4 temperature scaling: :func:`cardseg.method.calibration.temperature_scale`
* Eq. 5 agreement score: :func:`cardseg.method.agreement.agreement_score`
* Eq. 6 Jensen-Shannon divergence, Eq. 7 TAC: :mod:`cardseg.method.trajectory`
* Eq. 8 temperature field: :func:`cardseg.method.calibration.temperature_field`
* Eqs. 9-11 ECE, SCE, ACE: :mod:`cardseg.metrics.calibration`
"""

__version__ = "0.1.0"
