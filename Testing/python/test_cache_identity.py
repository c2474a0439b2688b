"""Every cache of network outputs is keyed by what shapes them: moving the grid (recentring), the
grid, the steps or the weights never reuses old arrays (cardseg_train.base.cache_identity)."""

import copy
from types import SimpleNamespace

import pytest

from cardseg_train.calibration import calibrate

from cardseg_train.calibration import harness as calibration_eval

from cardseg_train.indices import evidence as indices_evidence

from cardseg_train.indices import fit as indices_fit

from cardseg_train.review import data as review_data
from cardseg_train.base.cache_identity import maps_identity


def fake_bundle(**config_changes):
    config = {
        "input_size": 128,
        "pixel_spacing_mm": 1.75,
        "preprocessing": {"clip": [0.5, 99.5]},
        "diffusion": {"sampled_steps": [999, 750, 500, 250, 0]},
        "calibration": {"method": "card"},
        "agreement": {"roi_dilation_px": 10},
    }
    for key, value in config_changes.items():
        config[key] = value
    return SimpleNamespace(
        config=config,
        checksums={"primary": "a" * 64, "reference": "b" * 64},
        sampled_steps=config["diffusion"]["sampled_steps"],
        tac_steps=None,
    )


def keys(bundle):
    """The cache key of each tool for one bundle (the same other settings throughout)."""
    ev = calibration_eval.evaluation_settings("/data", "val", 0, 1.0, bundle)
    return {
        "evaluate": calibration_eval.CaseCache.make_key(bundle.checksums, ev),
        "review": review_data.cache_key(bundle, "val", 0),
        "indices_fit": indices_fit.cache_key(bundle, {"split": "val"}),
        "evidence": indices_evidence.evidence_key(bundle, {"split": "val"}),
        "pool": calibrate.pool_key(bundle.checksums, calibrate.pool_settings(bundle, "/data", ["clean"], 1, 0, 1000)),
    }


@pytest.fixture(autouse=True)
def no_env_recentre(monkeypatch):
    monkeypatch.delenv("CARDSEG_RECENTRE", raising=False)


def test_same_bundle_same_keys():
    assert keys(fake_bundle()) == keys(fake_bundle())


@pytest.mark.parametrize(
    "change",
    [
        {"field_of_view": {"recentre": True}},
        {"input_size": 96},
        {"pixel_spacing_mm": 1.5},
        {"preprocessing": {"clip": [1.0, 99.0]}},
        {"diffusion": {"sampled_steps": [999, 750, 500, 250, 0], "schedule": "linear"}},
    ],
)
def test_what_shapes_the_maps_changes_every_key(change):
    before, after = keys(fake_bundle()), keys(fake_bundle(**change))
    assert all(before[k] != after[k] for k in before), change


def test_recentring_from_the_environment_changes_every_key(monkeypatch):
    before = keys(fake_bundle())
    monkeypatch.setenv("CARDSEG_RECENTRE", "1")
    after = keys(fake_bundle())
    assert all(before[k] != after[k] for k in before)


def test_recentring_margin_and_agreement_roi_count_only_when_on():
    on = {"recentre": True, "margin_mm": 15}
    a = maps_identity(fake_bundle(field_of_view=on))
    assert a["field_of_view"] == {"margin_mm": 15.0, "agreement_roi_px": 10}
    assert maps_identity(fake_bundle(field_of_view={**on, "margin_mm": 20}))["field_of_view"]["margin_mm"] == 20.0
    # off: the ROI radius does not choose a grid, so it does not key the maps
    off = [maps_identity(fake_bundle(agreement={"roi_dilation_px": r})) for r in (5, 10)]
    assert off[0] == off[1] and off[0]["field_of_view"] is None


def test_other_weights_change_every_key():
    b = fake_bundle()
    other = copy.deepcopy(b)
    other.checksums["reference"] = "c" * 64
    before, after = keys(b), keys(other)
    assert all(before[k] != after[k] for k in before)
