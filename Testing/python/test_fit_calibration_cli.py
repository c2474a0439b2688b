"""``cardseg fit-calibration`` end to end on two real validation patients with a tiny bundle."""

import shutil

import numpy as np
import pytest

from cardseg.bundle.loading import load_bundle
from cardseg.bundle.folder import read_config
from cardseg.cli import main
from cardseg_train.calibration import calibrate
from cardseg_train.calibration.pool import PoolItem

from conftest import ACDC


def test_pool_cache_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    pool = [
        PoolItem(
            rng.normal(size=(4, 50)), rng.integers(0, 4, 50), rng.random(50), case=f"c{i}", variant=v, agreement=0.9
        )
        for i, v in enumerate(["clean", "gamma"])
    ]
    calibrate.save_pool(pool, tmp_path / "p.npz")
    back = calibrate.load_pool(tmp_path / "p.npz")
    assert [(b.case, b.variant, b.agreement) for b in back] == [("c0", "clean", 0.9), ("c1", "gamma", 0.9)]
    assert np.array_equal(back[1].logits, pool[1].logits) and np.array_equal(back[0].labels, pool[0].labels)
    k1 = calibrate.pool_key({"a": "1"}, {"draws": 1})
    assert k1 != calibrate.pool_key({"a": "2"}, {"draws": 1}) and k1 != calibrate.pool_key({"a": "1"}, {"draws": 2})


@pytest.mark.skipif(not (ACDC / "volumes").is_dir(), reason="ACDC data not present")
def test_fit_calibration_writes_fitted_values_only_into_bundle_json(tiny_bundle, tmp_path, monkeypatch):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    weights = {p.name: p.read_bytes() for p in bundle.glob("*.safetensors")}
    real = calibrate.acdc_h5_volumes
    monkeypatch.setattr(calibrate, "acdc_h5_volumes", lambda data, split: real(data, split)[:2])  # keep it quick
    assert (
        main(
            [
                "fit-calibration",
                "--bundle",
                str(bundle),
                "--data",
                str(ACDC),
                "--max-pixels",
                "3000",
                "--cache",
                str(tmp_path / "cache"),
                "--tac-steps",
                "auto",
            ]
        )
        == 0
    )
    cfg = read_config(bundle)
    sets = cfg["calibration"]["fit"]["tac_step_sets"]
    assert set(sets["pool_nll"]) == {"all", "mid", "last"}
    assert sets["pool_nll"][sets["chosen"]] == min(sets["pool_nll"].values())
    assert cfg["calibration"]["tac_steps"] == {"all": None, "mid": [24, 12, 0], "last": [0]}[sets["chosen"]]
    cal = cfg["calibration"]
    assert cal["fitted"] is True and cal["method"] == "card"
    assert 1.0 <= cal["tau_min"] <= cal["tau_max"] and cal["w_k"] > 0 and cal["w_b"] >= 0
    assert cal["fit"]["pool"]["split"] == "val" and cal["fit"]["pool"]["items"] == 2 * 4
    nll = cal["fit"]["pool_nll"]
    assert nll["card"] <= nll["uc"] + 1e-9 and nll["ts"] <= nll["uc"] + 1e-9
    assert cfg["agreement"]["out_of_domain_threshold"] is not None and cfg["regions"]["flag_threshold"] > 0
    assert set(cfg["baselines"]) == {"uc", "ts", "ets", "hts"}
    assert {p.name: p.read_bytes() for p in bundle.glob("*.safetensors")} == weights
    assert load_bundle(bundle).calibrator.tau_max == cal["tau_max"]
    # a second run reuses the cached pool
    assert len(list((tmp_path / "cache").glob("pool-*.npz"))) == 1
    assert (
        main(
            [
                "fit-calibration",
                "--bundle",
                str(bundle),
                "--data",
                str(ACDC),
                "--max-pixels",
                "3000",
                "--cache",
                str(tmp_path / "cache"),
                "--dry-run",
            ]
        )
        == 0
    )
