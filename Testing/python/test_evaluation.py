import json

import numpy as np
import pytest

from cardseg.bundle.loading import load_bundle
from cardseg.cli import main
from cardseg.bundle.phantom import synthetic_cine_volume
from cardseg_train.evaluation.segmentation import LabelledVolume, acdc_h5_volumes, dice_score, evaluate_dice, summarize

from conftest import ACDC, assert_figure


def test_dice_score_by_hand():
    a = np.zeros((1, 4, 4), np.uint8)
    b = np.zeros((1, 4, 4), np.uint8)
    a[0, :2, :2] = 1  # 4 px
    b[0, :2, :3] = 1  # 6 px, 4 shared
    assert dice_score(a, b, 1) == pytest.approx(8 / 10)
    assert np.isnan(dice_score(a, b, 2))
    assert dice_score(b, b, 1) == 1.0


def test_evaluate_dice_on_a_perfect_and_a_blank_prediction(tiny_bundle):
    vol, lab = synthetic_cine_volume((2, 64, 64), spacing=(3.0, 3.0, 8.0))
    bundle = load_bundle(tiny_bundle)
    rows = evaluate_dice(bundle, [LabelledVolume("syn", "p", vol, lab)])
    assert set(rows[0]) == {"case", "patient", "RV", "MYO", "LV", "mean"}
    assert all(0.0 <= rows[0][k] <= 1.0 for k in ("RV", "MYO", "LV"))
    s = summarize(
        rows + [{"case": "x", "patient": "q", "RV": 1.0, "MYO": 1.0, "LV": float("nan"), "mean": 1.0}],
        bundle.class_names,
    )
    assert s["LV"] == pytest.approx(rows[0]["LV"])  # NaN (class absent) is skipped
    assert s["RV"] == pytest.approx((rows[0]["RV"] + 1) / 2)


@pytest.mark.skipif(not (ACDC / "volumes").is_dir(), reason="ACDC data not present")
def test_acdc_validation_volumes_and_evaluate_command(tiny_bundle, tmp_path):
    vols = acdc_h5_volumes(str(ACDC), "val")
    assert len(vols) == 20 and len({v.patient for v in vols}) == 10
    test_ids = set((ACDC / "test_patients.txt").read_text(encoding="utf-8").split())
    assert not test_ids & {v.patient for v in vols}
    v = vols[0]
    assert v.volume.array.shape == v.labels.shape and set(np.unique(v.labels)) <= {0, 1, 2, 3}
    code = main(
        [
            "evaluate",
            "--bundle",
            str(tiny_bundle),
            "--data",
            str(ACDC),
            "--split",
            "val",
            "--out",
            str(tmp_path / "ev"),
            "--dice-only",
            "--quiet",
        ]
    )
    assert code == 0
    rep = json.loads((tmp_path / "ev" / "dice.json").read_text(encoding="utf-8"))
    assert len(rep["volumes"]) == 20 and 0 <= rep["summary"]["mean"] <= 1
    assert (tmp_path / "ev" / "dice.md").read_text(encoding="utf-8").count("|") > 8


def test_learning_curve_plot_from_a_run_log(tmp_path):
    from cardseg_train.base.plots import plot_learning_curve, read_log

    run = tmp_path / "run"
    run.mkdir()
    (run / "log.csv").write_text(
        "step,lr,loss,val_dice,val_dice_RV,val_dice_MYO,val_dice_LV\n"
        "50,1e-4,2.0,,,,\n100,1e-4,1.5,0.5,0.4,0.5,0.6\n150,1e-4,1.2,,,,\n200,1e-4,1.0,0.7,0.6,0.7,0.8\n"
    )
    rows = read_log(run)
    assert rows[0] == {"step": 50.0, "lr": 1e-4, "loss": 2.0} and rows[3]["val_dice_LV"] == 0.8
    png = plot_learning_curve([run], tmp_path / "curve.png")
    assert_figure(png)


def test_shipped_bundle_is_verified_fitted_and_segments_real_validation_volumes():
    """The default bundle loads with its checksums, carries fitted calibration, and segments."""
    bundle = load_bundle()  # no path: the package's default bundle
    assert bundle.ident == "acdc-2.7.0" and bundle.config["calibration"]["fitted"] is True
    assert bundle.config["agreement"]["out_of_domain_threshold"] is not None
    if not (ACDC / "volumes").is_dir():
        pytest.skip("ACDC data not present")
    cases = acdc_h5_volumes(str(ACDC), "val")[:2]
    rows = evaluate_dice(bundle, cases)
    assert min(r["mean"] for r in rows) > 0.6  # the shipped model card reports the validation Dice
