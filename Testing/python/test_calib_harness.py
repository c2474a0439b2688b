"""The calibration harness of ``cardseg evaluate``: case summaries, cache, table, report, CLI."""

import json
import math
import shutil

import numpy as np
import pytest
import torch

from cardseg.bundle.loading import update_config
from cardseg.method.calibration import CARD, TemperatureScaling, Uncalibrated
from cardseg.metrics.calibration import calibration_metrics
from cardseg.cli import main
from cardseg.method.agreement import agreement_score
from cardseg.metrics.segmentation import roi_mask
from cardseg_train.calibration import harness as ce
from cardseg_train.calibration.report import markdown_table, write_report

from conftest import ACDC, assert_figure

NAMES = ["background", "RV", "MYO", "LV"]


def _volume(seed=0, z=3, size=40):
    """Labels with a disc of class 3 ringed by class 2 on slices 1.., an empty slice 0, and
    logits that agree with the labels except for a wrong patch."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    r = np.hypot(yy - size / 2, xx - size / 2)
    lab = np.zeros((z, size, size), np.uint8)
    for k in range(1, z):
        lab[k][r < 8] = 3
        lab[k][(r >= 8) & (r < 11)] = 2
    logits = rng.normal(0, 0.3, size=(z, 4, size, size)).astype(np.float32)
    onehot = np.moveaxis(np.eye(4, dtype=np.float32)[lab], -1, 1)
    logits += 6.0 * onehot
    wrong = np.zeros_like(lab, bool)
    wrong[1:, 14:20, 14:20] = True  # predicted MYO inside the LV
    logits[:, 2][wrong] += 12.0
    tac = np.where(wrong, 0.5, 0.02).astype(np.float32)
    return logits, tac, lab, wrong


def test_summarize_case_keeps_roi_pixels_dice_and_slice_agreement():
    logits, tac, lab, wrong = _volume()
    res = ce.summarize_case("p1_f1", "p1", "clean", ce.CaseMaps(logits, tac), lab, NAMES)
    roi = roi_mask(lab > 0, ce.ROI_RADIUS)
    assert res.logits.shape == (4, int(roi.sum())) and res.labels.shape == res.tac.shape == (int(roi.sum()),)
    assert np.array_equal(res.labels, lab[roi]) and np.allclose(res.tac, tac[roi])
    pred = logits.argmax(1)
    assert res.dice["LV"] == pytest.approx(
        2 * ((pred == 3) & (lab == 3)).sum() / ((pred == 3).sum() + (lab == 3).sum())
    )
    assert math.isnan(res.dice["RV"])  # absent from both
    assert res.slice_index == [1, 2]  # slice 0 has no ground-truth foreground
    assert res.slice_agreement[0] == pytest.approx(agreement_score(tac[1], roi[1]))
    assert res.agreement == pytest.approx(agreement_score(tac, roi)) and 0 < res.agreement < 1
    assert res.lcc == pytest.approx(1.0) and res.lcc_reference is None
    # per 2D slice (paper Fig. 2a): a stray island on one slice lowers that slice's ratio only
    ref = logits.copy()
    ref[2, 1, 0:2, 0:2] += 40.0  # 4 RV pixels in a corner of slice 2, apart from the heart
    res = ce.summarize_case("p1_f1", "p1", "clean", ce.CaseMaps(logits, tac, reference_logits=ref), lab, NAMES)
    heart = int((ref[2].argmax(0) > 0).sum()) - 4
    assert res.lcc_reference == pytest.approx((1.0 + heart / (heart + 4)) / 2)
    with pytest.raises(ValueError, match="shapes"):
        ce.summarize_case("x", "x", "clean", ce.CaseMaps(logits[:, :3], tac), lab, NAMES)


def test_case_cache_round_trip_and_key(tmp_path):
    logits, tac, lab, _ = _volume()
    res = ce.summarize_case("p1_f1", "p1", "motion", ce.CaseMaps(logits, tac), lab, NAMES)
    cache = ce.CaseCache(tmp_path, "k")
    assert cache.load("p1_f1", "motion") is None
    cache.save(res)
    back = cache.load("p1_f1", "motion")
    assert np.array_equal(back.logits, res.logits) and np.array_equal(back.labels, res.labels)
    assert back.meta() == json.loads(json.dumps(res.meta()))
    assert not list(tmp_path.rglob("*.tmp*"))
    k = ce.CaseCache.make_key({"primary": "a"}, {"seed": 0})
    assert (
        k
        != ce.CaseCache.make_key({"primary": "b"}, {"seed": 0})
        != ce.CaseCache.make_key({"primary": "a"}, {"seed": 1})
    )


def _results():
    out = []
    for i, cond in enumerate(["clean", "clean", "motion", "motion"]):
        logits, tac, lab, _ = _volume(seed=i)
        out.append(ce.summarize_case(f"c{i % 2}", f"p{i % 2}", cond, ce.CaseMaps(logits, tac), lab, NAMES))
    return out


def test_calibration_table_pools_pixels_and_card_wins_where_tac_marks_the_errors():
    results = _results()
    cals = {
        "uc": Uncalibrated(),
        "ts": TemperatureScaling(2.0),
        "card": CARD(tau_min=1.0, tau_max=30.0, w_b=0.2, w_k=0.02),
    }
    t = ce.calibration_table(results, cals, NAMES)
    assert t["conditions"] == ["clean", "motion"] and t["volumes"] == 2
    # pooled NLL equals the metric on the concatenated pixels
    clean = [r for r in results if r.condition == "clean"]
    p = np.concatenate([torch.softmax(torch.from_numpy(r.logits.T) / 2.0, 1).numpy() for r in clean])
    y = np.concatenate([r.labels for r in clean])
    ref = calibration_metrics(p, y)
    assert t["pooled"]["clean"]["ts"]["nll"] == pytest.approx(ref["nll"], rel=1e-5)
    assert t["pooled"]["clean"]["ts"]["ece"] == pytest.approx(ref["ece"], rel=1e-5)
    assert t["mean_nll"]["ts"] == pytest.approx(
        (t["pooled"]["clean"]["ts"]["nll"] + t["pooled"]["motion"]["ts"]["nll"]) / 2
    )
    assert t["artifacts_only_nll"]["ts"] == pytest.approx(t["pooled"]["motion"]["ts"]["nll"])
    # CARD's pooled NLL: each ROI pixel's logits divided by Eq. 8's temperature of its own TAC,
    # computed here by hand from the parameters
    motion = [r for r in results if r.condition == "motion"]
    z = np.concatenate([r.logits.T for r in motion]).astype(np.float64)
    d = np.concatenate([r.tac for r in motion]).astype(np.float64)
    tau = 1.0 + (30.0 - 1.0) / (1.0 + np.exp(-(d - 0.2) / 0.02))
    zs = z / tau[:, None]
    logp = zs - zs.max(1, keepdims=True) - np.log(np.exp(zs - zs.max(1, keepdims=True)).sum(1, keepdims=True))
    y = np.concatenate([r.labels for r in motion])
    assert t["pooled"]["motion"]["card"]["nll"] == pytest.approx(-logp[np.arange(y.size), y].mean(), rel=1e-4)
    assert t["lowest_mean_nll"] == min(t["mean_nll"], key=t["mean_nll"].get)
    assert t["card_vs_best_post_hoc"]["best_baseline"] == "ts"  # the only post-hoc baseline given
    assert t["card_vs_best_post_hoc"]["card_over_best"] == pytest.approx(t["mean_nll"]["card"] / t["mean_nll"]["ts"])
    assert sum(t["confidence_histogram"]["clean"]["uc"]) == t["pooled"]["clean"]["uc"]["n"] == y.size
    seg = t["segmentation"]["motion"]
    assert 0 < seg["dice"]["mean"] < 1 and len(t["agreement_vs_dice"]["per_condition"]["clean"]["dice"]) == 4


def test_pearson_r_matches_numpy_and_refuses_degenerate_input():
    rng = np.random.default_rng(1)
    x = rng.random(30)
    y = 0.5 * x + 0.1 * rng.random(30)
    assert ce.pearson_r(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert ce.pearson_r(list(x) + [float("nan")], list(y) + [0.3]) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert ce.pearson_r([1, 2], [3, 4]) is None and ce.pearson_r([1, 1, 1], [1, 2, 3]) is None


def test_report_files(tmp_path):
    cals = {"uc": Uncalibrated(), "ts": TemperatureScaling(2.0), "card": CARD(1.0, 30.0, 0.2, 0.02)}
    t = ce.calibration_table(_results(), cals, NAMES)
    paths = write_report(t, tmp_path / "rep", "synthetic")
    for key in ("nll", "reliability", "histograms", "agreement"):
        assert_figure(paths[key])
    md = paths["md"].read_text(encoding="utf-8")
    assert "| CARD |" in md and "Primary+TS" in md and "clean ECE" in md and "motion ACE" in md
    rows = paths["csv"].read_text(encoding="utf-8").strip().splitlines()
    assert len(rows) == 1 + 2 * 3 and rows[0].startswith("condition,method,ece")
    back = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert back["mean_nll"]["card"] == pytest.approx(t["mean_nll"]["card"])
    assert markdown_table(t).count("\n|") >= 3 + 3 + 2


def test_bundle_calibrators_need_fitted_values(tiny_bundle):
    from cardseg.bundle.loading import load_bundle
    from cardseg.base.errors import CardsegError

    with pytest.raises(CardsegError, match="fit-calibration"):
        ce.bundle_calibrators(load_bundle(tiny_bundle))


def _fitted_copy(tiny_bundle, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    update_config(
        bundle,
        {
            "calibration": {"method": "card", "tau_min": 1.0, "tau_max": 4.0, "w_b": 0.05, "w_k": 0.01, "fitted": True},
            "baselines": {
                "uc": {"method": "uc"},
                "ts": {"method": "ts", "temperature": 1.5},
                "ets": {"method": "ets", "temperature": 1.5, "w0": 0.8, "w1": 0.1, "w2": 0.1},
                "hts": {"method": "hts", "w": 0.1, "b": 0.8},
            },
        },
    )
    return bundle


def test_evaluate_refuses_bad_arguments_before_any_work(tiny_bundle, tmp_path, capsys):
    import subprocess
    import sys

    out = tmp_path / "ev"
    for extra, msg in (
        (["--conditions", "clean,fog"], "unknown condition fog"),
        (["--methods", "card,platt"], "unknown method platt"),
        (["--panel", "x:haze"], "unknown --panel condition haze"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "cardseg", "evaluate", "--bundle", str(tiny_bundle), "--out", str(out), *extra],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2 and msg in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.skipif(not (ACDC / "volumes").is_dir(), reason="ACDC data not present")
def test_evaluate_command_end_to_end_and_resume(tiny_bundle, tmp_path, monkeypatch):
    bundle = _fitted_copy(tiny_bundle, tmp_path)
    out, cache = tmp_path / "ev", tmp_path / "cache"
    args = [
        "evaluate",
        "--bundle",
        str(bundle),
        "--data",
        str(ACDC),
        "--split",
        "val",
        "--out",
        str(out),
        "--max-cases",
        "2",
        "--conditions",
        "clean,spike",
        "--cache",
        str(cache),
        "--quiet",
        "--threads",
        "2",
    ]
    assert main(args) == 0
    t = json.loads((out / "calibration.json").read_text(encoding="utf-8"))
    assert t["conditions"] == ["clean", "spike"] and t["methods"] == list(ce.METHODS) and t["volumes"] == 2
    assert t["settings"]["split"] == "val" and all(c.startswith("patient") for c in t["settings"]["cases"])
    assert all(t["pooled"][c][m]["n"] > 1000 for c in t["conditions"] for m in t["methods"])
    assert len(list(cache.rglob("*.npz"))) == 4
    # every sampled step's JS is cached at the ROI pixels: their mean is the cached TAC (Eq. 7)
    key_dir = next(p.parent for p in cache.rglob("*.npz"))
    res = ce.CaseCache(key_dir.parent, key_dir.name).load(t["settings"]["cases"][0], "spike")
    assert res.js_steps == [49, 37, 24, 12, 0] and res.step_js.shape == (5, res.tac.size)
    assert np.allclose(res.tac_over(res.js_steps), res.tac, atol=2e-3)
    assert np.allclose(res.tac_over([0]), res.step_js[4].astype(np.float32))
    assert len(list(out.glob("panel_*.png"))) == 1 and len(list(out.glob("conditions_*.png"))) == 1
    assert json.loads((out / "dice.json").read_text(encoding="utf-8"))["summary"]["mean"] >= 0
    # a second run resumes from the cache: no trajectory is run again, the table is identical
    monkeypatch.setattr(ce, "run_case", lambda *a, **k: pytest.fail("ran a cached case again"))
    assert main(args[:-2] + ["--panel", "none"]) == 0
    again = json.loads((out / "calibration.json").read_text(encoding="utf-8"))
    assert again["mean_nll"] == t["mean_nll"]


def test_method_names_come_from_the_calibrators_and_the_segmentor():
    results = _results()
    cals = {"uc": Uncalibrated(), "ts": TemperatureScaling(2.0), "card": CARD(1.0, 3.0, 0.1, 0.05)}
    on_primary = ce.calibration_table(results, cals, NAMES)
    assert on_primary["labels"] == {"uc": "Primary (UC)", "ts": "Primary+TS", "card": "CARD"}
    plain = ce.calibration_table(
        results, {"uc": Uncalibrated(), "ts": TemperatureScaling(2.0)}, NAMES, segmentor="deterministic"
    )
    assert plain["labels"] == {"uc": "UC", "ts": "TS"}
    text = markdown_table(plain)
    assert "| TS |" in text and "Primary+TS" not in text
