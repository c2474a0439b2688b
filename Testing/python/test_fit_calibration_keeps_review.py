"""``cardseg fit-calibration`` on a bundle whose regions rule ``fit-review`` fitted, and with a
baseline fit ``bundle.json`` would refuse (a synthetic pool: no data is read)."""

import json
import shutil

import numpy as np
import pytest

from cardseg.bundle.calibration_schema import HTS_RANGE
from cardseg.bundle.folder import read_config
from cardseg.cli import main
from cardseg.method.calibration import EntropyTemperatureScaling
from cardseg_train.calibration import calibrate
from cardseg_train.calibration import fit as calibration_fit
from cardseg_train.calibration.pool import PoolItem

#: the shipped bundle's regions keys as fit-review writes them (values of a small rule)
REVIEW_BLOCK = {
    "map": "tac",
    "connectivity": "3d",
    "fill_holes": True,
    "smooth_px": 0.0,
    "merge_px": 0,
    "min_voxels": 10,
    "neighbourhood_px": 10,
    "ranking": "p_error",
    "max_regions": 6,
    "flag_threshold": 0.06,
    "grow_threshold": 0.036,
    "max_ml": 120.0,
    "model": None,
    "fit": {"objective": "substantial errors covered by the first 3 regions", "split": "val"},
    "previous": {"flag_threshold": 0.1},
}


def synthetic_pool(n: int = 400, seed: int = 0):
    """Clean and perturbed items whose logits are over-confident in proportion to the TAC (so
    CARD has something to fit); TAC values well below REVIEW_BLOCK's grow threshold, so that
    fit-calibration's own flag threshold would be refused beside it."""
    rng = np.random.default_rng(seed)
    items = []
    for i, variant in enumerate(["clean", "gamma", "clean", "noise"]):
        labels = rng.integers(0, 4, n)
        tac = rng.uniform(0.0, 0.02, n)
        logits = rng.normal(size=(4, n))
        wrong = rng.random(n) < 20 * tac
        shown = np.where(wrong, (labels + 1) % 4, labels)
        logits[shown, np.arange(n)] += 6.0
        items.append(
            PoolItem(
                logits, labels, tac, case=f"c{i // 2}", variant=variant, agreement=0.9 - 0.01 * i, patient=f"p{i // 2}"
            )
        )
    return items


@pytest.fixture
def bundle(tiny_bundle, tmp_path, monkeypatch):
    path = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, path)
    monkeypatch.setattr(calibrate, "acdc_h5_volumes", lambda data, split: [])  # the pool below stands in
    monkeypatch.setattr(calibrate, "build_pool", lambda *a, **k: synthetic_pool())
    return path


def fit(bundle, *extra):
    return main(["fit-calibration", "--bundle", str(bundle), "--data", "synthetic", "--cache", "", *extra])


def set_regions(bundle, block):
    cfg = read_config(bundle)
    cfg["regions"] = block
    (bundle / "bundle.json").write_text(json.dumps(cfg, indent=2) + "\n")


def test_a_fitted_regions_rule_is_kept_exactly(bundle, capsys):
    set_regions(bundle, REVIEW_BLOCK)
    assert fit(bundle, "--tac-steps", "all") == 0
    cfg = read_config(bundle)
    assert cfg["regions"] == REVIEW_BLOCK
    assert cfg["calibration"]["fitted"] is True
    assert "kept the rule fit-review fitted" in capsys.readouterr().out


def test_an_unfitted_regions_block_gets_the_pool_threshold(bundle):
    before = read_config(bundle)["regions"]
    assert "fit" not in before
    assert fit(bundle) == 0
    regions = read_config(bundle)["regions"]
    tac = np.concatenate([it.tac for it in synthetic_pool() if it.variant == "clean"])
    assert regions["flag_threshold"] != before["flag_threshold"]
    assert 0 < regions["flag_threshold"] <= tac.max()
    assert regions["flag_rule"] == calibrate.FLAG_RULE


def test_hts_fit_stays_in_the_schema_range(monkeypatch):
    seen = {}
    real = calibration_fit.optimize.minimize

    def spy(*a, **k):
        seen["bounds"] = k.get("bounds")
        return real(*a, **k)

    monkeypatch.setattr(calibration_fit.optimize, "minimize", spy)
    hts = calibration_fit.fit_hts(synthetic_pool(), init=(10 * HTS_RANGE[1], 0.8))
    assert seen["bounds"] == [HTS_RANGE, HTS_RANGE]
    assert HTS_RANGE[0] <= hts.w <= HTS_RANGE[1] and HTS_RANGE[0] <= hts.b <= HTS_RANGE[1]


def out_of_range_hts(monkeypatch):
    real = calibrate.fit_calibrator

    def fitter(method, pool, **kw):
        if method == "hts":
            return EntropyTemperatureScaling(2 * HTS_RANGE[0], 0.8)
        return real(method, pool, **kw)

    monkeypatch.setattr(calibrate, "fit_calibrator", fitter)


def test_an_out_of_range_baseline_costs_only_itself(bundle, monkeypatch, capsys):
    old = read_config(bundle)
    out_of_range_hts(monkeypatch)
    assert fit(bundle) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "baseline hts not written" in err and "baselines.hts.w" in err
    cfg = read_config(bundle)
    assert cfg["calibration"]["fitted"] is True and cfg["calibration"] != old["calibration"]
    assert {"uc", "ts", "ets"} <= set(cfg["baselines"])
    assert cfg["baselines"].get("hts") == old.get("baselines", {}).get("hts")


def test_dry_run_checks_what_it_would_write(bundle, monkeypatch, capsys):
    before = (bundle / "bundle.json").read_bytes()
    out_of_range_hts(monkeypatch)
    assert fit(bundle, "--dry-run") == 2
    err = capsys.readouterr().err
    assert "baseline hts not written" in err and "dry run: nothing written" in err
    assert (bundle / "bundle.json").read_bytes() == before
