"""``cardseg fit-review --p-error-pool``: the rule chosen on clean validation maps stays, and the
region model behind ``p_error`` is fitted again on the clean maps and on the same volumes under a
shift (``cardseg_train.review.pool``), held out by patient."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cardseg_train.review import pool as review_pool

from cardseg_train.review import report as rr
from cardseg_train.review.fit import select_settings
from conftest import blob_error_maps


#: one candidate setting (the grid search itself is review_fit's and test_review_fit's)
ONE = {
    "smooth_px": (0.0,),
    "connectivity": ("3d",),
    "flag_threshold": (0.1,),
    "max_ml": (30.0,),
    "ranking": ("p_error",),
}


def _rule(maps) -> dict:
    fit = select_settings(maps, grid=ONE)
    fit["settings"] = {**fit["settings"], "map": "tac"}
    return fit


def _maps(condition: str, decoy_tac):
    return [
        dataclasses.replace(
            blob_error_maps(i, f"patient{i:03d}_frame0{1 + i % 2}", decoy_tac=decoy_tac), condition=condition
        )
        for i in range(6)
    ]


def test_a_pooled_p_error_is_calibrated_where_a_clean_one_is_not():
    """Clean: only the errors disagree strongly. Shifted: the decoys (no error) disagree as strongly
    as the errors; a model fitted on clean regions alone calls them likely errors."""
    clean, shifted = _maps("clean", (0.04, 0.06)), _maps("pool:noise", (0.3, 0.5))
    fit = _rule(clean)
    out = review_pool.refit_p_error(fit, {"clean": clean, "pool:noise": shifted})
    assert out["settings"] == fit["settings"] and out["p_error_conditions"] == ["clean", "pool:noise"]
    pool = out["validation"]["pool"]
    assert pool["conditions"] == ["clean", "pool:noise"]
    before, after = pool["clean_model"], pool["pooled_model"]
    assert after["pool:noise"]["substantial_errors"] == before["pool:noise"]["substantial_errors"] == 12
    assert before["pool:noise"]["region_ece"] > 0.2  # the clean model is sure of the decoys
    assert after["pool:noise"]["region_ece"] < before["pool:noise"]["region_ece"] - 0.1
    assert after["all conditions"]["region_ece"] < before["all conditions"]["region_ece"]
    # the pooled model's clean figures are the record's held-out ones; the clean-only model's stay beside them
    assert out["validation"]["cross_validated"] == after["clean"]
    assert out["validation"]["clean_model_cross_validated"] == fit["validation"]["cross_validated"]
    assert after["clean"]["covered_top3"] == pytest.approx(1.0)  # the errors still rank first on clean volumes
    assert out["validation"]["regions_total"] > fit["validation"]["regions_total"]
    assert not np.allclose(out["model"].to_dict()["coef"], fit["model"].to_dict()["coef"])
    block = rr.regions_block(out, {"map": "tac"}, len(clean), 1.0)
    assert block["fit"]["p_error_conditions"] == ["clean", "pool:noise"] and block["map"] == "tac"


def test_a_tac_flips_rule_is_refitted_on_its_summed_map():
    """The TAC + flips family: regions cut from the TAC plus the flipped runs' disagreement, as the
    fit cut them (the rule's settings name the map; the formation runs on the sum)."""
    clean, shifted = _maps("clean", (0.04, 0.06)), _maps("pool:contrast", (0.3, 0.5))
    for m in clean + shifted:
        m.flips = np.zeros(m.tac.shape, np.float32)
    summed = [dataclasses.replace(m, tac=m.tac + m.flips) for m in clean]
    fit = select_settings(summed, grid=ONE)
    fit["settings"] = {**fit["settings"], "map": "tac_flips"}
    out = review_pool.refit_p_error(fit, {"clean": clean, "pool:contrast": shifted})
    assert out["settings"]["map"] == "tac_flips"
    assert out["validation"]["pool"]["clean_model"]["clean"] == fit["validation"]["cross_validated"]
    assert out["validation"]["pool"]["pooled_model"]["pool:contrast"]["substantial_errors"] == 12


def test_the_pool_is_scored_held_out_by_patient():
    """A patient's shifted regions are never scored by a model that saw that patient."""
    clean, shifted = _maps("clean", (0.04, 0.06)), _maps("pool:gamma", (0.3, 0.5))
    fit = _rule(clean)
    seen = []
    real = review_pool.cross_validated

    def spy(volumes, *a, **k):
        models = real(volumes, *a, **k)
        for patient in models:
            seen.append((patient, {v.patient for v in volumes if v.patient != patient}))
        return models

    review_pool.cross_validated = spy
    try:
        review_pool.refit_p_error(fit, {"clean": clean, "pool:gamma": shifted})
    finally:
        review_pool.cross_validated = real
    assert seen and all(patient not in others for patient, others in seen)


def test_the_summed_map_rule_and_the_refusals():
    m = blob_error_maps(0, "patient000_frame01")
    m.flips = np.full(m.tac.shape, 0.25, np.float32)
    summed = review_pool.rule_map(m, {"map": "tac_flips"})
    assert np.allclose(summed.tac, m.tac + 0.25) and review_pool.rule_map(m, {"map": "tac"}) is m
    with pytest.raises(ValueError, match="needs the flipped runs' disagreement"):
        review_pool.rule_map(blob_error_maps(1, "patient001_frame01"), {"map": "tac_flips"})
    with pytest.raises(ValueError, match="tac and tac_flips rules only"):
        review_pool.rule_map(m, {"map": "error_probability"})
    with pytest.raises(ValueError, match="clean maps are needed"):
        review_pool.refit_p_error({"settings": {"map": "tac"}}, {"pool:noise": [m]})
