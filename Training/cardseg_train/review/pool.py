"""``p_error`` fitted on the validation volumes under the calibration pool's perturbations too.

The region rule (map, smoothing, thresholds, size cap, ranking) stays the one chosen on the clean
validation volumes (:mod:`cardseg_train.review.fit`); only the logistic region model behind
``p_error`` is fitted again, on the regions of the clean volumes *and* of the same volumes under
the pool's label-preserving perturbations (``pool:contrast``, ``pool:gamma``, ``pool:noise``:
what ``cardseg fit-calibration`` pools; never the test conditions' artifacts). A model fitted on
clean regions alone learns how often a region holds an error on clean images; under a shift the
regions are larger and hold errors more or less often, and its ``p_error`` drifts. Every figure
is held out by patient: a patient's regions, under every condition, are scored with a model
fitted on the other patients' regions only.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from cardseg_train.review.data import rule_map
from cardseg_train.review.fit import cross_validated, fit_logistic, score, volume_errors, volume_regions

#: the calibration pool's perturbations (cardseg_train.data.perturb), as map conditions
POOL_CONDITIONS = ("pool:contrast", "pool:gamma", "pool:noise")


def condition_regions(maps_by_condition: Dict[str, Sequence], settings: dict) -> Dict[str, List]:
    """Each condition's :class:`~cardseg_train.review.fit.VolumeRegions` under ``settings``, cut
    as the fit cut them: from :func:`~cardseg_train.review.data.rule_map`'s map, the formation settings without ``map``."""
    formation = {k: v for k, v in settings.items() if k != "map"}
    out = {}
    for cond, maps in maps_by_condition.items():
        out[cond] = [volume_regions(rule_map(m, settings), volume_errors(m), formation) for m in maps]
    return out


def refit_p_error(fit: dict, maps_by_condition: Dict[str, Sequence]) -> dict:
    """``fit`` (a rule chosen on the clean maps, ``maps_by_condition["clean"]``) with its region
    model fitted again on every condition's regions. The validation record gains ``pool``: per
    condition (and all together), the held-out figures of the clean-only model and of the pooled
    one; ``cross_validated`` becomes the pooled model's on the clean volumes (the clean-only
    model's stays as ``clean_model_cross_validated``)."""
    if "clean" not in maps_by_condition:
        raise ValueError("the clean maps are needed: the rule was chosen on them")
    settings = fit["settings"]
    regions = condition_regions(maps_by_condition, settings)
    every = [v for vols in regions.values() for v in vols]
    max_regions, ranking = settings.get("max_regions"), settings.get("ranking", "p_error")
    clean_only = cross_validated(regions["clean"])
    pooled = cross_validated(every)

    def figures(models) -> dict:
        per = {cond: score(vols, models, max_regions, ranking) for cond, vols in regions.items()}
        return {**per, "all conditions": score(every, models, max_regions, ranking)}

    x = np.concatenate([v.features for v in every])
    y = np.concatenate([v.holds for v in every])
    model = fit_logistic(x, y)
    pooled_figures = figures(pooled)
    validation = {
        **fit["validation"],
        "clean_model_cross_validated": fit["validation"]["cross_validated"],
        "cross_validated": pooled_figures["clean"],
        "in_sample": score(every, {v.patient: model for v in every}, max_regions, ranking),
        "regions_total": int(len(y)),
        "regions_holding_an_error": int(y.sum()),
        "pool": {"conditions": list(regions), "clean_model": figures(clean_only), "pooled_model": pooled_figures},
    }
    return {**fit, "model": model, "validation": validation, "p_error_conditions": list(regions)}
