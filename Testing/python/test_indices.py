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
SCALES = {"LV_volume": 2.0, "RV_volume": 2.2, "LV_stroke_volume": 2.5, "RV_stroke_volume": 2.4,
          "LV_ejection_fraction": 3.0, "RV_ejection_fraction": 2.8, "LV_mass": 1.5}


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
    assert out == pytest.approx({"LVEDV_ml": 150, "LVESV_ml": 60, "LVSV_ml": 90, "LVEF": 60.0, "RVEDV_ml": 160,
                                 "RVESV_ml": 80, "RVSV_ml": 80, "RVEF": 50.0, "LVM_g": 105.0})
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
    assert ix.volume_spread(labels, _onehot(labels, 2), np.full((2, 4, 4), 0.6, np.float32), spacing, 0.1) \
        == pytest.approx([0.0, 0.0])


def _subject_arrays(confidence, disagreement, seed=0):
    """ED and ES arrays of a synthetic subject, ``confidence`` and ``disagreement`` at class edges."""
    from cardseg.bundle.scaffold import synthetic_cine_volume

    _, lab_ed = synthetic_cine_volume(shape=(4, 64, 64), spacing=(2.0, 2.0, 8.0), seed=seed)
    lab_es = lab_ed.copy()
    lab_es[lab_es == 3] = 2  # a smaller LV cavity at ES
    out = []
    for lab in (lab_ed, lab_es):
        edge = lab != np.roll(lab, 1, axis=2)
        conf = np.where(edge, confidence, 0.999)  # uncertain at the class edges only
        p = np.zeros(lab.shape + (4,), np.float32)
        for k in range(4):
            p[..., k] = np.where(lab == k, conf, (1 - conf) / 3)
        d = np.where(edge, disagreement, 0.0).astype(np.float32)
        out.append({"labels": lab, "probs": p, "disagreement": d})
    return out


@pytest.mark.parametrize("what", ["probabilities", "disagreement"])
def test_intervals_widen_with_uncertainty(what):
    block = {"nominal": 0.9, "scales": SCALES, "spread": {"flag_threshold": 0.1}}
    widths = []
    levels = [0.95, 0.85, 0.7, 0.55] if what == "probabilities" else [0.0, 0.05, 0.2, 0.4, 0.69]
    for level in levels:
        ed, es = _subject_arrays(level, 0.0) if what == "probabilities" else _subject_arrays(0.8, level)
        out = ix.subject_from_arrays(ed, es, (2.0, 2.0, 8.0), (2.0, 2.0, 8.0), NAMES, block)
        for n in ix.INDEX_NAMES:
            assert out[n]["low"] <= out[n]["value"] <= out[n]["high"]
        widths.append([out[n]["high"] - out[n]["low"] for n in ix.INDEX_NAMES])
    widths = np.array(widths)
    assert np.all(np.diff(widths, axis=0) >= -1e-9)  # never narrower
    assert np.all(widths[-1] > widths[0])  # and wider in the end
    # the values do not depend on the uncertainty
    assert out["LVEDV_ml"]["value"] == pytest.approx(ix.subject_from_arrays(
        *_subject_arrays(0.99, 0.0), (2.0, 2.0, 8.0), (2.0, 2.0, 8.0), NAMES, block)["LVEDV_ml"]["value"])


def test_interval_cut_to_possible_values():
    assert ix.interval("LVEDV_ml", 5.0, 10.0, 1.0) == (0.0, 15.0)
    assert ix.interval("LVEF", 95.0, 10.0, 1.0) == (85.0, 100.0)
    assert ix.interval("LVSV_ml", 5.0, 10.0, 1.0) == (0.0, 15.0)
    assert ix.interval("RVEF", 5.0, 10.0, 1.0) == (0.0, 15.0)
    assert ix.interval("LVM_g", 100.0, 10.0, 2.0) == (80.0, 120.0)
    # a value outside the range (ESV > EDV in a poor segmentation) stays inside its own interval
    assert ix.interval("LVSV_ml", -3.0, 10.0, 1.0) == (-3.0, 7.0)
    assert ix.interval("LVEF", -3.0, 1.0, 1.0) == (-3.0, -2.0)
    assert ix.interval("LVEF", 101.0, 5.0, 1.0) == (96.0, 101.0)


# --------------------------------------------------------------------------------------------
# coverage and the conformal fit
# --------------------------------------------------------------------------------------------
def test_coverage_by_hand():
    truth = [1.0, 2.0, 3.0, 4.0, np.nan]
    low = [0.0, 2.0, 3.5, 0.0, 0.0]
    high = [2.0, 3.0, 4.0, 3.9, 9.0]
    # inside: 1 in [0, 2], 2 in [2, 3] (closed); outside: 3 < 3.5, 4 > 3.9; NaN skipped
    assert ix.coverage(truth, low, high) == 0.5
    assert ix.coverage(2.0, 2.0, 2.0) == 1.0
    assert math.isnan(ix.coverage([np.nan], [0.0], [1.0]))


def test_conformal_quantile_by_hand():
    scores = [5.0, 1.0, 3.0, 2.0, 4.0, 10.0, 7.0, 6.0, 9.0, 8.0]
    assert ix.conformal_quantile(scores, 0.9) == 10.0  # ceil(11 * 0.9) = 10th smallest
    assert ix.conformal_quantile(scores, 0.5) == 6.0  # ceil(5.5) = 6th
    assert ix.conformal_quantile(scores[:5], 0.9) == math.inf  # 5 scores cannot give 90%


def _synthetic_subjects(n, rng, noise=1.0):
    """Indices whose error is spread * N(0, noise): the true interval is +-1.645 noise spreads."""
    values, truths, spreads = [], [], []
    for _ in range(n):
        v = {name: float(rng.uniform(40, 80)) for name in ix.INDEX_NAMES}  # no cut at 0 or 100 reached
        s = {name: float(rng.uniform(0.5, 3.0)) for name in ix.INDEX_NAMES}
        t = {name: v[name] + s[name] * noise * float(rng.normal()) for name in ix.INDEX_NAMES}
        values.append(v), truths.append(t), spreads.append(s)
    return values, truths, spreads


def test_fit_reaches_nominal_coverage_on_a_synthetic_problem():
    rng = np.random.default_rng(1)
    fit = _synthetic_subjects(200, rng, noise=1.7)
    scales, counts = ix.fit_scales(*fit, level=0.9)
    assert counts == {"LV_volume": 400, "RV_volume": 400, "LV_stroke_volume": 200, "RV_stroke_volume": 200,
                      "LV_ejection_fraction": 200, "RV_ejection_fraction": 200, "LV_mass": 200}
    for fam, s in scales.items():
        assert s == pytest.approx(1.645 * 1.7, rel=0.12)
    block = {"nominal": 0.9, "scales": scales}
    values, truths, spreads = _synthetic_subjects(3000, rng, noise=1.7)
    for name in ix.INDEX_NAMES:
        iv = [ix.subject_intervals(v, s, block)[name] for v, s in zip(values, spreads)]
        cov = ix.coverage([t[name] for t in truths], [i["low"] for i in iv], [i["high"] for i in iv])
        assert cov == pytest.approx(0.9, abs=0.03)


def test_fit_block_and_measure_on_a_synthetic_problem():
    from cardseg_train.indices_fit import Subject, fit_block, measure

    rng = np.random.default_rng(2)
    val = [Subject(f"v{i}", *x) for i, x in enumerate(zip(*_synthetic_subjects(100, rng)))]
    test = [Subject(f"t{i}", *x) for i, x in enumerate(zip(*_synthetic_subjects(1000, rng)))]
    config = {"calibration": {"method": "card", "tau_min": 1.0, "tau_max": 3.0, "w_b": 0.1, "w_k": 0.05},
              "networks": {}}
    block = fit_block(val, config, 0.8, 0.1, {"split": "val"})
    assert block["fit"]["subjects"] == 100 and block["fit"]["residuals"]["LV_mass"] == 100
    assert all(c >= 0.8 for c in block["fit"]["validation_coverage_in_sample"].values())
    m = measure(test, block)
    for fam in ix.FAMILIES:
        assert m["families"][fam]["coverage"] == pytest.approx(0.8, abs=0.05)
        lo, hi = m["families"][fam]["coverage_ci95"]
        assert lo <= m["families"][fam]["coverage"] <= hi


def test_too_few_residuals_refused():
    rng = np.random.default_rng(3)
    with pytest.raises(CardsegError, match="LV_stroke_volume family"):
        ix.fit_scales(*_synthetic_subjects(5, rng), level=0.9)


# --------------------------------------------------------------------------------------------
# from real `cardseg segment` folders
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_bundle):
    """ED and ES runs (card) of two synthetic volumes, and a uc run, with the tiny bundle."""
    from cardseg.bundle.scaffold import synthetic_cine_volume

    root = tmp_path_factory.mktemp("indices")
    bundle = root / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    update_config(bundle, {"regions": {"flag_threshold": 0.05}})
    for phase, seed in (("ed", 11), ("es", 12)):
        vol, _ = synthetic_cine_volume(shape=(3, 72, 64), spacing=(1.6, 1.4, 8.0), seed=seed)
        sitk.WriteImage(vol.to_image(), str(root / f"{phase}.nii.gz"))
        assert main(["segment", str(root / f"{phase}.nii.gz"), "-o", str(root / phase), "--bundle", str(bundle),
                     "--quiet"]) == 0
    assert main(["segment", str(root / "es.nii.gz"), "-o", str(root / "uc"), "--bundle", str(bundle), "--quiet",
                 "--method", "uc"]) == 0
    return root, bundle


def _fit_block_into(bundle, scales=SCALES):
    cfg = read_config(bundle)
    block = ix.make_block(cfg, scales, 0.9, cfg["regions"]["flag_threshold"],
                          fit={"split": "synthetic", "subjects": 0, "date": "2026-01-01"})
    return update_config(bundle, {"indices": block})


def test_indices_from_folders(folders, tmp_path):
    root, bundle = folders
    refit = tmp_path / "bundle"
    shutil.copytree(bundle, refit)
    cfg = _fit_block_into(refit)
    out = ix.indices_from_folders(root / "ed", root / "es", cfg)
    assert out["nominal"] == 0.9
    assert set(out) == set(ix.INDEX_NAMES) | {"nominal"}
    # the values are the segmentation's volumes, computed by hand from the written files
    seg = sitk.ReadImage(str(root / "ed" / "segmentation.nii.gz"))
    ml = np.prod(seg.GetSpacing()) / 1000.0
    lab = sitk.GetArrayFromImage(seg)
    assert out["LVEDV_ml"]["value"] == pytest.approx((lab == 3).sum() * ml)
    assert out["LVM_g"]["value"] == pytest.approx(1.05 * (lab == 2).sum() * ml)
    report = json.loads((root / "ed" / "report.json").read_text())
    assert out["RVEDV_ml"]["value"] == pytest.approx(report["class_volumes_ml"]["RV"])
    for n in ix.INDEX_NAMES:
        r = out[n]
        if math.isnan(r["value"]):
            continue
        assert r["low"] <= r["value"] <= r["high"]
        assert all(isinstance(r[k], float) for k in ("value", "low", "high"))
    # the same numbers as from the arrays in memory; twice the scales give (about) twice the width
    cfg2 = _fit_block_into(refit, {f: 2 * s for f, s in SCALES.items()})
    out2 = ix.indices_from_folders(root / "ed", root / "es", cfg2)
    w = out["LVEDV_ml"]["high"] - out["LVEDV_ml"]["value"]
    assert out2["LVEDV_ml"]["high"] - out2["LVEDV_ml"]["value"] == pytest.approx(2 * w)


def test_missing_block_is_refused_in_one_line(folders):
    root, bundle = folders
    cfg = read_config(bundle)
    cfg.pop("indices", None)
    with pytest.raises(CardsegError) as err:
        ix.indices_from_folders(root / "ed", root / "es", cfg)
    assert "has no fitted index intervals" in str(err.value) and "\n" not in str(err.value)
    cfg["indices"] = {**ix.make_block(cfg, SCALES, 0.9, 0.1)}
    cfg["indices"]["scales"] = {f: s for f, s in SCALES.items() if f != "RV_ejection_fraction"}
    with pytest.raises(CardsegError, match="no scale for RV_ejection_fraction"):
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


def test_schema_checks_the_block(tiny_bundle, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    cfg = _fit_block_into(bundle)
    assert cfg["indices"]["scales"] == SCALES
    for change, message in (({"nominal": 1.0}, "indices.nominal"),
                            ({"scales": {**SCALES, "LV_mass": 0.0}}, "indices.scales.LV_mass"),
                            ({"scales": {}}, "indices.scales must hold one scale per index family"),
                            ({"spread": {"model": "x", "flag_threshold": 0.9}}, "indices.spread.flag_threshold")):
        with pytest.raises(CardsegError, match=message):
            update_config(bundle, {"indices": {**cfg["indices"], **change}})
    assert read_config(bundle)["indices"]["scales"] == SCALES  # a refused change leaves the file as it was


# --------------------------------------------------------------------------------------------
# the command, on real validation/test patients with the tiny bundle
# --------------------------------------------------------------------------------------------
@pytest.mark.skipif(not (ACDC / "volumes").is_dir(), reason="ACDC data not present")
def test_fit_indices_command(tiny_bundle, tmp_path, monkeypatch):
    from cardseg_train import evaluation

    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    real = evaluation.acdc_h5_volumes
    # two patients (both frames) per split keeps it quick; level 0.5 is reachable with 2 subjects
    monkeypatch.setattr(evaluation, "acdc_h5_volumes", lambda data, split, spacing=1.5: real(data, split, spacing)[:4])
    out = tmp_path / "measured"
    assert main(["fit-indices", "--bundle", str(bundle), "--data", str(ACDC), "--level", "0.5",
                 "--cache", str(tmp_path / "cache"), "--measure-test", str(out)]) == 0
    block = read_config(bundle)["indices"]
    assert block["nominal"] == 0.5 and block["fit"]["split"] == "val" and block["fit"]["subjects"] == 2
    assert set(block["scales"]) == set(ix.FAMILIES) and "date" in block["fit"]
    result = json.loads((out / "indices.json").read_text())
    assert result["subjects"] == 2 and result["settings"]["split"] == "test"
    assert set(result["indices"]) == set(ix.INDEX_NAMES)
    assert (out / "indices.md").read_text().startswith("# Cardiac indices")
    assert_figure(out / "indices_coverage.png")
    # cached: a measurement with the stored fit runs without segmenting again
    n = len(list((tmp_path / "cache").rglob("*.npz")))
    assert n == 8
    assert main(["fit-indices", "--bundle", str(bundle), "--data", str(ACDC), "--cache", str(tmp_path / "cache"),
                 "--measure-test", str(out), "--no-fit"]) == 0
    assert len(list((tmp_path / "cache").rglob("*.npz"))) == n
