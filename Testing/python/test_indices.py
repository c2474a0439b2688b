"""Cardiac indices and their intervals (:mod:`cardseg.cohort.indices`, ``cardseg fit-indices``)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg.cohort import indices as ix
from cardseg.bundle.folder import read_config
from cardseg.bundle.loading import update_config
from cardseg.cli import main
from cardseg.base.errors import CardsegError

from conftest import ACDC, assert_figure

NAMES = ["background", "RV", "MYO", "LV"]
#: a fitted model per index: relative errors for volumes and mass, points for EF
MODELS = {
    n: {
        "bias": 0.01 if n in ix.RELATIVE else 0.5,
        "sd": 0.05 if n in ix.RELATIVE else 3.0,
        "pivot": 2.0,
        "half_width": 0.1 if n in ix.RELATIVE else 6.0,
        "n": 10,
    }
    for n in ix.INDEX_NAMES
}


# --------------------------------------------------------------------------------------------
# volumes and formulas, by hand
# --------------------------------------------------------------------------------------------
def test_class_volumes_by_hand():
    labels = np.zeros((2, 3, 4), np.uint8)
    labels[0, 0, :3] = 1  # 3 RV voxels
    labels[1, :2, :2] = 3  # 4 LV voxels
    labels[1, 2, 3] = 2  # 1 MYO voxel
    spacing = (1.5, 2.0, 10.0)  # 30 mm^3 = 0.03 ml per voxel
    assert ix.voxel_volume_ml(spacing) == pytest.approx(0.03)
    vols = ix.class_volumes(labels, spacing, 4)
    assert vols == pytest.approx([16 * 0.03, 3 * 0.03, 1 * 0.03, 4 * 0.03])
    assert ix.structure_volumes(vols, NAMES) == pytest.approx({"LV": 0.12, "RV": 0.09, "MYO": 0.03})


def test_indices_formulas():
    ed = {"LV": 150.0, "RV": 160.0, "MYO": 100.0}
    es = {"LV": 60.0, "RV": 80.0, "MYO": 110.0}
    out = ix.cardiac_indices(ed, es)
    assert list(out) == list(ix.INDEX_NAMES)
    assert out == pytest.approx(
        {
            "LVEDV_ml": 150,
            "LVESV_ml": 60,
            "LVSV_ml": 90,
            "LVEF": 60.0,
            "RVEDV_ml": 160,
            "RVESV_ml": 80,
            "RVSV_ml": 80,
            "RVEF": 50.0,
            "LVM_g": 105.0,
        }
    )
    assert math.isnan(ix.cardiac_indices({"LV": 0.0, "RV": 1.0, "MYO": 1.0}, es)["LVEF"])


def test_missing_class_is_one_line_error():
    with pytest.raises(CardsegError, match="class named 'LV'"):
        ix.structure_volumes([1.0, 2.0, 3.0], ["background", "RV", "MYO"])


def test_delta_method_by_hand():
    ed, es = {"LV": 100.0, "RV": 100.0, "MYO": 80.0}, {"LV": 40.0, "RV": 50.0, "MYO": 80.0}
    sd_ed, sd_es = {"LV": 3.0, "RV": 6.0, "MYO": 4.0}, {"LV": 4.0, "RV": 8.0, "MYO": 9.0}
    s = ix.index_spreads(ed, es, sd_ed, sd_es)
    assert s["LVEDV_ml"] == 3.0 and s["LVESV_ml"] == 4.0 and s["LVSV_ml"] == pytest.approx(5.0)
    assert s["RVSV_ml"] == pytest.approx(10.0)
    # EF = 100 (1 - ES/ED): dEF/dED = 100 ES/ED^2 = 0.4 per ml, dEF/dES = -100/ED = -1 per ml
    assert s["LVEF"] == pytest.approx(math.hypot(0.4 * 3.0, 1.0 * 4.0))
    assert s["LVM_g"] == pytest.approx(1.05 * 4.0)
    # the delta method against sampling, for small errors
    rng = np.random.default_rng(0)
    e = rng.normal(100, 3, 200_000)
    x = rng.normal(40, 4, 200_000)
    assert np.std(100 * (1 - x / e)) == pytest.approx(s["LVEF"], rel=0.03)


# --------------------------------------------------------------------------------------------
# spreads
# --------------------------------------------------------------------------------------------
def _onehot(labels, k=4):
    return np.eye(k, dtype=np.float32)[labels]


def test_volume_spread_by_hand():
    spacing = (1.0, 1.0, 10.0)  # 0.01 ml per voxel
    labels = np.zeros((2, 4, 4), np.int64)
    p = _onehot(labels, 2)
    p[0, 0, 0] = p[0, 0, 1] = p[1, 0, 0] = [0.5, 0.5]  # three coin flips: two in slice 0, one in slice 1
    d = np.zeros((2, 4, 4), np.float32)
    sd = ix.volume_spread(labels, p, d, spacing, flag_threshold=0.1)
    # expected misassigned voxels per slice, slices in quadrature: slice 0 1.0, slice 1 0.5
    assert sd[1] == pytest.approx(0.01 * math.sqrt(1.0 + 0.25))
    assert sd[0] == pytest.approx(sd[1])  # 1 - p0 where the segmentation says background
    # a flagged region over the two stacked voxels (0,0,0), (1,0,0) adds (0.5 + 0.5)^2
    d[:, 0, 0] = 0.3
    assert ix.volume_spread(labels, p, d, spacing, 0.1)[1] == pytest.approx(0.01 * math.sqrt(1.25 + 1.0))
    # one voxel at 10% of being class 1: 0.1 voxel expected wrong (a Bernoulli sd would say 0.3)
    p = _onehot(labels, 2)
    p[1, 2, 2] = [0.9, 0.1]
    assert ix.volume_spread(labels, p, np.zeros_like(d), spacing, 0.1) == pytest.approx([0.001, 0.001])
    # certain voxels carry no spread, wherever the disagreement is
    assert ix.volume_spread(
        labels, _onehot(labels, 2), np.full((2, 4, 4), 0.6, np.float32), spacing, 0.1
    ) == pytest.approx([0.0, 0.0])


# --------------------------------------------------------------------------------------------
# intervals from a fitted block
# --------------------------------------------------------------------------------------------
def _block(models=MODELS, volumes=None):
    config = {
        "calibration": {"method": "card", "tau_min": 1.0, "tau_max": 3.0, "w_b": 0.1, "w_k": 0.05},
        "networks": {},
    }
    return ix.make_block(config, models, 0.9, 0.1, volumes=volumes)


def test_subject_intervals_by_hand():
    values = ix.cardiac_indices({"LV": 150.0, "RV": 160.0, "MYO": 100.0}, {"LV": 60.0, "RV": 80.0, "MYO": 110.0})
    out = ix.subject_intervals(values, _block())
    assert out["nominal"] == 0.9
    # EF: value + bias -+ half width, in points
    assert (out["LVEF"]["low"], out["LVEF"]["high"]) == pytest.approx((60 + 0.5 - 6, 60 + 0.5 + 6))
    # volumes: relative, value * (1 + bias -+ half width)
    assert (out["LVEDV_ml"]["low"], out["LVEDV_ml"]["high"]) == pytest.approx((150 * 0.91, 150 * 1.11))
    assert out["LVM_g"]["value"] == pytest.approx(105.0)
    assert out["LVM_g"]["high"] - out["LVM_g"]["low"] == pytest.approx(2 * 0.1 * 105.0)


def test_index_error_matches_the_model_units():
    assert ix.index_error("LVEF", 55.0, 50.0) == -5.0
    assert ix.index_error("LVEDV_ml", 100.0, 110.0) == pytest.approx(0.1)
    assert math.isnan(ix.index_error("RVESV_ml", 0.0, 10.0))


def test_interval_cut_to_possible_values():
    wide = {n: {**m, "half_width": 80.0 if n.endswith("EF") else 3.0} for n, m in MODELS.items()}
    values = ix.cardiac_indices({"LV": 100.0, "RV": 100.0, "MYO": 50.0}, {"LV": 30.0, "RV": 40.0, "MYO": 50.0})
    out = ix.subject_intervals(values, _block(wide))
    assert out["LVEF"]["low"] == 0.0 and out["LVEF"]["high"] == 100.0
    assert out["LVEDV_ml"]["low"] == 0.0 and out["LVEDV_ml"]["high"] == pytest.approx(100 * 4.01)
    # an EF outside [0, 100] from a poor segmentation keeps its value inside its interval
    assert ix.cut("LVEF", -30.0, 30.0, -10.0) == (-10.0, 30.0)


def test_coverage_by_hand():
    assert ix.coverage([1, 2, 3, 4], [0, 2.5, 3, 0], [1, 3, 3, 3.9]) == 0.5
    assert ix.coverage([1, float("nan")], [0, 0], [2, 2]) == 1.0
    assert math.isnan(ix.coverage([float("nan")], [0], [1]))


def test_corrected_volumes_drop_islands_and_fill_gaps():
    from cardseg.cohort import index_volumes as iv

    lab = np.zeros((6, 8, 8), np.uint8)
    lab[0:5, 2:6, 2:6] = 3  # an LV of 5 slices x 16 voxels
    lab[2] = 0  # ... with a gap at slice 2
    lab[5, 0, 0] = 3  # and a stray voxel below the apex, not connected
    spacing = (1.0, 1.0, 10.0)  # 0.01 ml per voxel
    raw = iv.corrected_volumes(lab, spacing, NAMES, {})
    assert raw["LV"] == pytest.approx(65 * 0.01)
    fixed = iv.corrected_volumes(lab, spacing, NAMES)
    # a one-slice gap does not split the LV (slices 1 and 3 overlap in-plane): only the stray voxel goes ...
    assert iv.slice_areas(iv.drop_islands(lab, [3]), 3).tolist() == [16, 16, 0, 16, 16, 0]
    # ... and the gap at slice 2 gets its neighbours' mean area
    assert fixed["LV"] == pytest.approx(80 * 0.01)
    # two empty slices do separate: the smaller part goes
    lab2 = lab.copy()
    lab2[3] = 0
    assert iv.slice_areas(iv.drop_islands(lab2, [3]), 3).tolist() == [16, 16, 0, 0, 0, 0]
    assert iv.fill_slice_gaps([10, 9, 1, 8, 0]).tolist() == [10, 9, 8.5, 8, 0]
    assert iv.fill_slice_gaps([10, 9, 3, 8]).tolist() == [10, 9, 3, 8]  # 3 >= 0.25 * 8: not a gap
    assert iv.fill_slice_gaps([0, 5, 0, 0]).tolist() == [0, 5, 0, 0]  # the apex ends: not a gap


def test_fit_block_and_measure_on_a_synthetic_problem():
    """Validation and test errors drawn from one location-scale family: the fitted intervals cover
    about the nominal share of many test subjects, and the in-sample validation check agrees."""
    from cardseg_train.indices.fit import Subject, fit_block, measure

    rng = np.random.default_rng(2)

    def subjects(n, scale, group):
        out = []
        for i in range(n):
            ed = {"LV": rng.uniform(100, 200), "RV": rng.uniform(100, 200), "MYO": rng.uniform(60, 120)}
            es = {"LV": ed["LV"] * rng.uniform(0.3, 0.6), "RV": ed["RV"] * rng.uniform(0.3, 0.6), "MYO": ed["MYO"]}
            values = ix.cardiac_indices(ed, es)
            truth = {
                n_: (
                    v * (1 + scale * 0.05 * rng.standard_normal())
                    if n_ in ix.RELATIVE
                    else v + 1.0 + scale * 3.0 * rng.standard_normal()
                )
                for n_, v in values.items()
            }
            out.append(Subject(f"{group}{i}", values, truth, {n_: 1.0 for n_ in ix.INDEX_NAMES}, group))
        return out

    val, pool, test = subjects(120, 1.0, "val"), subjects(60, 0.3, "train:clean"), subjects(2000, 1.0, "test")
    config = {
        "calibration": {"method": "card", "tau_min": 1.0, "tau_max": 3.0, "w_b": 0.1, "w_k": 0.05},
        "networks": {},
    }
    block = fit_block(val, pool, config, 0.8, 0.1, {"split": "val"})
    assert block["fit"]["subjects"] == 120 and block["fit"]["pool_subjects"] == {"train:clean": 60}
    assert block["models"]["LVEF"]["errors"] == "absolute" and block["models"]["LVEDV_ml"]["errors"] == "relative"
    assert block["models"]["LVEF"]["sd"] == pytest.approx(3.0, rel=0.2)
    m = measure(test, block)
    for name in ("LVEF", "RVEF", "LVEDV_ml", "LVM_g"):
        assert m["indices"][name]["coverage"] == pytest.approx(0.8, abs=0.07)
        lo, hi = m["indices"][name]["coverage_ci95"]
        assert lo <= m["indices"][name]["coverage"] <= hi
    c = m["lvef_categories"]
    assert c["n"] == 2000 and 0 < c["straddling"] < 2000 and c["implies_true_category"] <= 2000


def _rows(errors, widths=None):
    """Measurement rows with LVEF errors ``value - truth`` and interval widths (centred on the value)."""
    widths = widths if widths is not None else [4.0] * len(errors)
    return [
        {
            "patient": f"p{i:02d}",
            "LVEF": {"value": 50.0 + d, "truth": 50.0, "low": 50.0 + d - w / 2, "high": 50.0 + d + w / 2},
        }
        for i, (d, w) in enumerate(zip(errors, widths))
    ]


def test_mae_bootstrap_interval_and_paired_difference_by_hand():
    from cardseg_train.indices.stats import mae_intervals, paired_difference

    errors = [1.0, -2.0, 3.0, 0.5, -0.5, 4.0, -1.0, 2.0, 0.0, 1.5]
    ci = mae_intervals(_rows(errors), ["LVEF"])["LVEF"]
    mae = np.mean(np.abs(errors))
    assert ci[0] < mae < ci[1] and ci[0] >= 0.0 and ci[1] <= max(np.abs(errors))
    # every patient's error one point larger in size, every interval 2 points narrower: the paired
    # difference is exactly +1 MAE and -2 width in every resample
    worse = [d + (1.0 if d >= 0 else -1.0) for d in errors]
    diff = paired_difference(_rows(worse, [2.0] * 10), _rows(errors), ["LVEF"])["LVEF"]
    assert diff["patients"] == 10
    assert diff["mae"]["difference"] == pytest.approx(1.0) and diff["mae"]["ci95"] == pytest.approx([1.0, 1.0])
    assert diff["mean_width"]["difference"] == pytest.approx(-2.0)
    # coverage: the +-1 interval no longer holds errors of 1 or more
    assert diff["coverage"]["difference"] < 0 and diff["coverage"]["ci95"][0] <= diff["coverage"]["difference"]
    with pytest.raises(ValueError, match="share 0 patients"):
        paired_difference(_rows(errors), [{**r, "patient": "x" + r["patient"]} for r in _rows(errors)], ["LVEF"])


def test_conformal_half_width_is_the_rank_of_the_absolute_errors():
    from cardseg_train.studies.indices_design import conformal_half

    a = np.arange(1.0, 11.0)  # 10 errors: ceil(11 * 0.9) = 10 -> the largest
    assert conformal_half(a, 0.9) == 10.0 and conformal_half(a, 0.8) == 9.0
    assert conformal_half(a[:8], 0.9) == float("inf")  # ceil(9 * 0.9) = 9 > 8


def test_too_few_subjects_refused_in_one_line():
    from cardseg_train.indices.fit import Subject, fit_models

    one = Subject("a", {n: 50.0 for n in ix.INDEX_NAMES}, {n: 51.0 for n in ix.INDEX_NAMES}, {})
    with pytest.raises(CardsegError) as err:
        fit_models([one], [], 0.9)
    assert "cannot fit" in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------------------------
# from real `cardseg segment` folders
# --------------------------------------------------------------------------------------------
def test_spread_threshold_is_a_tac_value():
    """The spread's region term thresholds the TAC: the fitted indices block's own threshold first
    (a new review rule leaves it as fitted), then a TAC review rule's; the threshold of another map
    (TAC + flips, a probability) is no TAC value."""
    assert ix.spread_tac_threshold({"regions": {"flag_threshold": 0.05}}) == 0.05
    assert ix.spread_tac_threshold({"regions": {"map": "tac", "flag_threshold": 0.12}}) == 0.12
    for other in ("error_probability", "tac_flips"):
        assert ix.spread_tac_threshold({"regions": {"map": other, "flag_threshold": 0.2}}) == ix.SPREAD_TAC_THRESHOLD
    assert (
        ix.spread_tac_threshold(
            {"regions": {"map": "tac_flips", "flag_threshold": 0.2}, "indices": {"spread": {"flag_threshold": 0.06}}}
        )
        == 0.06
    )
    assert (
        ix.spread_tac_threshold(
            {"regions": {"map": "tac", "flag_threshold": 0.12}, "indices": {"spread": {"flag_threshold": 0.06}}}
        )
        == 0.06
    )
    assert ix.spread_tac_threshold({}) == ix.SPREAD_TAC_THRESHOLD
    assert 0.0 < ix.SPREAD_TAC_THRESHOLD < math.log(2)
    # the shipped bundle: its spread uses the threshold its indices were fitted with
    from cardseg.bundle.folder import check_bundle

    cfg = check_bundle(None).config
    assert ix.spread_tac_threshold(cfg) == cfg["indices"]["spread"]["flag_threshold"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_bundle):
    """ED and ES runs (card) of two synthetic volumes, and a uc run, with the tiny bundle."""
    from cardseg.bundle.phantom import synthetic_cine_volume

    root = tmp_path_factory.mktemp("indices")
    bundle = root / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    update_config(bundle, {"regions": {"flag_threshold": 0.05}})
    for phase, seed in (("ed", 11), ("es", 12)):
        vol, _ = synthetic_cine_volume(shape=(3, 72, 64), spacing=(1.6, 1.4, 8.0), seed=seed)
        sitk.WriteImage(vol.to_image(), str(root / f"{phase}.nii.gz"))
        assert (
            main(
                ["segment", str(root / f"{phase}.nii.gz"), "-o", str(root / phase), "--bundle", str(bundle), "--quiet"]
            )
            == 0
        )
    assert (
        main(
            [
                "segment",
                str(root / "es.nii.gz"),
                "-o",
                str(root / "uc"),
                "--bundle",
                str(bundle),
                "--quiet",
                "--method",
                "uc",
            ]
        )
        == 0
    )
    return root, bundle


def _fit_block_into(bundle, models=MODELS):
    cfg = read_config(bundle)
    block = ix.make_block(
        cfg,
        models,
        0.9,
        cfg["regions"]["flag_threshold"],
        fit={"split": "synthetic", "subjects": 0, "date": "2026-01-01"},
    )
    return update_config(bundle, {"indices": block})


def test_indices_from_folders(folders, tmp_path):
    root, bundle = folders
    refit = tmp_path / "bundle"
    shutil.copytree(bundle, refit)
    cfg = _fit_block_into(refit)
    out = ix.indices_from_folders(root / "ed", root / "es", cfg)
    assert out["nominal"] == 0.9
    assert set(out) == set(ix.INDEX_NAMES) | {"nominal"}
    # the values are the (corrected) segmentation's volumes, computed by hand from the written files
    from cardseg.cohort import index_volumes as iv

    seg = sitk.ReadImage(str(root / "ed" / "segmentation.nii.gz"))
    ml = np.prod(seg.GetSpacing()) / 1000.0
    lab = sitk.GetArrayFromImage(seg)
    fixed = iv.drop_islands(lab, [1, 3])
    assert out["LVEDV_ml"]["value"] == pytest.approx(iv.fill_slice_gaps(iv.slice_areas(fixed, 3)).sum() * ml)
    assert out["LVM_g"]["value"] == pytest.approx(1.05 * (lab == 2).sum() * ml)
    for n in ix.INDEX_NAMES:
        r = out[n]
        if math.isnan(r["value"]) or (n in ix.RELATIVE and r["value"] <= 0):  # no relative error of nothing
            assert math.isnan(r["low"]) and math.isnan(r["high"])
            continue
        assert r["low"] <= r["high"]
        assert all(isinstance(r[k], float) for k in ("value", "low", "high"))
    # without the corrections the values are report.json's volumes
    cfg_raw = update_config(refit, {"indices": {**cfg["indices"], "volumes": {}}})
    raw = ix.indices_from_folders(root / "ed", root / "es", cfg_raw)
    report = json.loads((root / "ed" / "report.json").read_text())
    assert raw["RVEDV_ml"]["value"] == pytest.approx(report["class_volumes_ml"]["RV"], abs=0.05)  # 0.1 ml in the report
    # twice the half width gives twice the width (away from the cut at 0)
    doubled = {n: {**m, "half_width": 2 * m["half_width"]} for n, m in MODELS.items()}
    out2 = ix.indices_from_folders(root / "ed", root / "es", _fit_block_into(refit, doubled))
    w = out["LVEDV_ml"]["high"] - out["LVEDV_ml"]["low"]
    assert out2["LVEDV_ml"]["high"] - out2["LVEDV_ml"]["low"] == pytest.approx(2 * w)


def test_missing_block_is_refused_in_one_line(folders):
    root, bundle = folders
    cfg = read_config(bundle)
    cfg.pop("indices", None)
    with pytest.raises(CardsegError) as err:
        ix.indices_from_folders(root / "ed", root / "es", cfg)
    assert "has no fitted index intervals" in str(err.value) and "\n" not in str(err.value)
    cfg["indices"] = ix.make_block(cfg, MODELS, 0.9, 0.1)
    cfg["indices"]["models"] = {n: m for n, m in cfg["indices"]["models"].items() if n != "RVEF"}
    with pytest.raises(CardsegError, match="no model for RVEF"):
        ix.indices_from_folders(root / "ed", root / "es", cfg)
    cfg["indices"] = {**ix.make_block(cfg, MODELS, 0.9, 0.1), "method": "split-conformal"}
    with pytest.raises(CardsegError, match="fitted with method 'split-conformal'"):
        ix.indices_from_folders(root / "ed", root / "es", cfg)


def test_uc_folder_and_stale_fit_are_refused(folders, tmp_path):
    root, bundle = folders
    refit = tmp_path / "bundle"
    shutil.copytree(bundle, refit)
    cfg = _fit_block_into(refit)
    with pytest.raises(CardsegError, match="--method card"):
        ix.indices_from_folders(root / "ed", root / "uc", cfg)
    (tmp_path / "partial").mkdir()
    with pytest.raises(CardsegError, match="no segmentation.nii.gz"):
        ix.indices_from_folders(root / "ed", tmp_path / "partial", cfg)
    # calibration refitted after the intervals: the intervals no longer apply
    cfg = update_config(refit, {"calibration": {"tau_max": cfg["calibration"]["tau_max"] + 0.5}})
    with pytest.raises(CardsegError, match="fitted for another calibration"):
        ix.indices_from_folders(root / "ed", root / "es", cfg)


def test_the_shipped_bundles_intervals_belong_to_its_calibration_and_weights():
    """A release that refits the calibration or swaps a network must refit the intervals too:
    otherwise every cardseg batch with a manifest refuses the shipped bundle."""
    from cardseg.bundle.folder import BUNDLES_DIR, DEFAULT_NAME

    cfg = read_config(BUNDLES_DIR / DEFAULT_NAME)
    block = ix.fitted_block(cfg)
    assert block["calibration"]["weights"] == {s["file"]: s["sha256"] for s in cfg["networks"].values()}


def test_schema_checks_the_block(tiny_bundle, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    cfg = _fit_block_into(bundle)
    scales = cfg["indices"]["scales"]
    assert scales == {n: m["half_width"] for n, m in MODELS.items()}
    for change, message in (
        ({"nominal": 1.0}, "indices.nominal"),
        ({"scales": {**scales, "LVM_g": 0.0}}, "indices.scales.LVM_g"),
        ({"scales": {}}, "indices.scales must hold one scale per index family"),
        ({"spread": {"model": "x", "flag_threshold": 0.9}}, "indices.spread.flag_threshold"),
    ):
        with pytest.raises(CardsegError, match=message):
            update_config(bundle, {"indices": {**cfg["indices"], **change}})
    assert read_config(bundle)["indices"]["scales"] == scales  # a refused change leaves the file as it was


# --------------------------------------------------------------------------------------------
# the command, on real validation/test patients with the tiny bundle
# --------------------------------------------------------------------------------------------
@pytest.mark.skipif(not (ACDC / "volumes").is_dir(), reason="ACDC data not present")
def test_fit_indices_command(tiny_bundle, tmp_path, monkeypatch):
    from cardseg_train.evaluation import segmentation as evaluation

    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    real = evaluation.acdc_h5_volumes
    # three patients (both frames) per split, the training pool included, keeps it quick
    monkeypatch.setattr(evaluation, "acdc_h5_volumes", lambda data, split, spacing=1.5: real(data, split, spacing)[:6])
    out = tmp_path / "measured"
    assert (
        main(
            [
                "fit-indices",
                "--bundle",
                str(bundle),
                "--data",
                str(ACDC),
                "--level",
                "0.5",
                "--cache",
                str(tmp_path / "cache"),
                "--measure-test",
                str(out),
            ]
        )
        == 0
    )
    block = read_config(bundle)["indices"]
    assert block["nominal"] == 0.5 and block["fit"]["split"] == "val" and block["fit"]["subjects"] == 3
    assert block["fit"]["pool_subjects"] == {"train:clean": 3} and block["method"] == ix.METHOD
    assert set(block["models"]) == set(ix.INDEX_NAMES) and "date" in block["fit"]
    result = json.loads((out / "indices.json").read_text())
    assert result["subjects"] == 3 and result["settings"]["split"] == "test"
    assert result["lvef_categories"]["n"] == 3 and all(r["LVEF"]["label"].startswith("LVEF ") for r in result["rows"])
    assert set(result["indices"]) == set(ix.INDEX_NAMES)
    assert (out / "indices.md").read_text().startswith("# Cardiac indices")
    assert_figure(out / "indices_coverage.png")
    # cached: a measurement with the stored fit runs without segmenting again
    n = len(list((tmp_path / "cache").rglob("*.npz")))
    assert n == 18  # 6 validation, 6 training (under cache/evidence), 6 test volumes
    assert (
        main(
            [
                "fit-indices",
                "--bundle",
                str(bundle),
                "--data",
                str(ACDC),
                "--cache",
                str(tmp_path / "cache"),
                "--measure-test",
                str(out),
                "--no-fit",
            ]
        )
        == 0
    )
    assert len(list((tmp_path / "cache").rglob("*.npz"))) == n
    # measured again beside the first measurement: the same block on the same patients differs by nothing
    from cardseg_train.indices.fit import main as fit_main

    again = tmp_path / "again"
    assert (
        fit_main(
            [
                "--bundle",
                str(bundle),
                "--data",
                str(ACDC),
                "--cache",
                str(tmp_path / "cache"),
                "--no-fit",
                "--measure-test",
                str(again),
                "--previous",
                str(out),
            ]
        )
        == 0
    )
    second = json.loads((again / "indices.json").read_text())
    lo, hi = second["indices"]["LVEF"]["mae_ci95"]
    assert lo <= second["indices"]["LVEF"]["mae"] <= hi
    diff = second["versus_previous"]["differences"]["LVEF"]
    assert diff["patients"] == 3 and diff["mae"]["difference"] == 0.0 and diff["mae"]["ci95"] == [0.0, 0.0]
    assert "Against the previous measurement" in (again / "indices.md").read_text()
    assert (
        fit_main(
            [
                "--bundle",
                str(bundle),
                "--data",
                str(ACDC),
                "--no-fit",
                "--measure-test",
                str(again),
                "--previous",
                str(tmp_path / "nowhere"),
            ]
        )
        == 2
    )
