"""Choosing the region rule and fitting p_error on labelled maps (synthetic, so the answer is known)."""

from __future__ import annotations

import numpy as np
import pytest

from cardseg.review.regions import FEATURES, ErrorModel
from cardseg_train.review.fit import fit_logistic, region_ece, select_settings
from cardseg_train.review.measure import study

from conftest import blob_error_maps


def test_selection_prefers_the_rule_that_covers_the_errors_and_p_error_ranks_them_first():
    maps = [blob_error_maps(i, f"patient{i:03d}_frame01") for i in range(6)]
    grid = {
        "smooth_px": (0.0,),
        "connectivity": ("slice",),
        "flag_threshold": (0.05, 0.2),
        "max_ml": (None,),
        "ranking": ("p_error",),
    }
    res = select_settings(maps, grid=grid, max_regions=6, max_burden=1.0)
    cands = {c["flag_threshold"]: c for c in res["candidates"]}
    assert cands[0.05]["covered_all"] == pytest.approx(1.0) and cands[0.2]["covered_all"] == pytest.approx(1.0)
    v = res["validation"]["cross_validated"]
    assert v["covered_top3"] == pytest.approx(1.0) and v["substantial_errors"] == 12
    model = res["model"]
    assert isinstance(model, ErrorModel) and model.coef.shape == (len(FEATURES),)
    out = study(maps, res["settings"], model)["clean"]
    assert out["substantial_errors"] == 12 and out["covered_top3"] == pytest.approx(1.0)
    assert out["by_regions"][0]["covered"] >= 0.5  # the first region of each volume holds an error
    # the decoys hold nothing: each volume's first two regions are its two errors
    assert out["same_burden"]["boundary"] < out["covered_top3"]


def test_burden_cap_excludes_rules_that_cover_the_heart():
    maps = [blob_error_maps(i, f"patient{i:03d}_frame01") for i in range(4)]
    for m in maps:
        m.tac[:, 9:39, 9:39] = np.maximum(m.tac[:, 9:39, 9:39], 0.03)  # a weak band over the whole heart
    grid = {
        "smooth_px": (0.0,),
        "connectivity": ("3d",),
        "flag_threshold": (0.02, 0.1),
        "max_ml": (None,),
        "ranking": ("p_error",),
    }
    res = select_settings(maps, grid=grid, max_burden=0.3)
    assert res["settings"]["flag_threshold"] == 0.1  # 0.02 would make one region of the whole heart


def test_logistic_fit_lowers_the_loss_and_recovers_the_direction():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, len(FEATURES)))
    y = rng.uniform(size=400) < 1 / (1 + np.exp(-(2 * x[:, 1] - 1)))
    m = fit_logistic(x, y, l2=1e-3)
    p = m.probability(x)
    base = np.full(400, y.mean())
    nll = lambda q: -np.mean(y * np.log(q) + (1 - y) * np.log(1 - q))  # noqa: E731
    assert nll(p) < nll(base) - 0.1
    assert np.argmax(np.abs(m.coef)) == 1 and m.coef[1] > 0
    assert region_ece(p, y) < 0.1
    assert region_ece(np.array([0.05, 0.95]), np.array([False, True])) == pytest.approx(0.05)


def test_maps_are_cached_and_reused(tiny_bundle, synthetic_volume, tmp_path, monkeypatch):
    from cardseg.bundle.loading import load_bundle
    from cardseg_train.review import data as review_data
    from cardseg_train.evaluation.segmentation import LabelledVolume

    vol, lab = synthetic_volume
    item = LabelledVolume("patient900_frame01", "patient900", vol, lab)
    bundle = load_bundle(tiny_bundle)
    first = review_data.collect_maps(bundle, [item], ["clean", "spike"], tmp_path)
    assert [m.condition for m in first] == ["clean", "spike"]
    assert first[0].pred.shape == lab.shape and first[0].tac.shape == lab.shape
    assert not np.array_equal(first[0].tac, first[1].tac)  # the corruption changed the trajectory

    def boom(*a, **k):
        raise AssertionError("recomputed a cached map")

    monkeypatch.setattr(review_data, "compute_maps", boom)
    again = review_data.collect_maps(bundle, [item], ["clean", "spike"], tmp_path)
    assert np.array_equal(again[0].pred, first[0].pred)
    assert np.allclose(again[1].tac, first[1].tac, atol=1e-3)  # stored as float16


def test_flip_maps_are_collected_as_the_engine_computes_them_and_cached_beside(
    tiny_bundle, synthetic_volume, tmp_path, monkeypatch
):
    from cardseg.bundle.loading import load_bundle
    from cardseg.segment import SegmentOptions, flip_disagreement_map, normalized_slices, trajectory_on_slices
    from cardseg_train.review import data as review_data
    from cardseg_train.evaluation.segmentation import LabelledVolume

    vol, lab = synthetic_volume
    item = LabelledVolume("patient900_frame01", "patient900", vol, lab)
    bundle = load_bundle(tiny_bundle)
    plain = review_data.collect_maps(bundle, [item], ["clean"], tmp_path)
    assert plain[0].flips is None and not list(tmp_path.glob("*__flips.npz"))
    with_flips = review_data.MapOptions(flips=True)
    first = review_data.collect_maps(bundle, [item], ["clean"], tmp_path, with_flips)  # the maps' file had none
    slices01 = normalized_slices(vol, bundle)
    traj = trajectory_on_slices(slices01, vol.spacing[:2], bundle, SegmentOptions("card"))
    assert np.allclose(first[0].flips, flip_disagreement_map(slices01, vol.spacing[:2], bundle, traj), atol=1e-6)
    assert np.allclose(first[0].tac, plain[0].tac, atol=1e-3) and float(first[0].flips.max()) > 0

    def boom(*a, **k):
        raise AssertionError("recomputed a cached map")

    with monkeypatch.context() as mp:
        mp.setattr(review_data, "compute_maps", boom)
        again = review_data.collect_maps(bundle, [item], ["clean"], tmp_path, with_flips)
    assert np.allclose(again[0].flips, first[0].flips, atol=2e-3)  # stored as float16
    (flips_file,) = tmp_path.glob("*__flips.npz")
    # maps made afresh without flips (another pixel size, say) leave no flips of the earlier maps behind
    review_data._save(tmp_path / "patient900_frame01__clean.npz", plain[0])
    assert not flips_file.exists()


def test_review_maps_under_the_calibration_pools_perturbations(tiny_bundle, synthetic_volume, tmp_path):
    """``pool:KIND`` maps: the engine's run on the normalised slices perturbed as the calibration
    pool perturbs them (same seeding), labels untouched; an unknown kind is refused."""
    from cardseg.bundle.loading import load_bundle
    from cardseg.segment import SegmentOptions, normalized_slices, trajectory_on_slices
    from cardseg_train.review import data as review_data
    from cardseg_train.data.perturb import perturb_image
    from cardseg_train.data.corruptions import corruption_rng
    from cardseg_train.evaluation.segmentation import LabelledVolume

    vol, lab = synthetic_volume
    item = LabelledVolume("patient900_frame01", "patient900", vol, lab)
    bundle = load_bundle(tiny_bundle)
    clean, gamma = review_data.collect_maps(bundle, [item], ["clean", "pool:gamma"], tmp_path)
    img = perturb_image(normalized_slices(vol, bundle), "gamma", corruption_rng(item.case, "pool:gamma", 0))
    expected = trajectory_on_slices(img, vol.spacing[:2], bundle, SegmentOptions("card"))
    assert np.allclose(gamma.tac, np.asarray(expected.tac), atol=1e-3)  # float16 cache
    assert not np.allclose(gamma.tac, clean.tac, atol=1e-3)
    assert np.array_equal(gamma.truth, clean.truth) and gamma.condition == "pool:gamma"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "patient900_frame01__clean.npz",
        "patient900_frame01__pool-gamma.npz",
    ]  # no ':' in names
    with pytest.raises(ValueError, match="unknown pool perturbation 'blur'"):
        review_data.compute_maps(bundle, item, "pool:blur")


def test_the_second_pass_searches_around_the_winner_and_never_does_worse():
    from cardseg_train.review.fit import refine_grid, two_pass

    maps = [blob_error_maps(i, f"patient{i:03d}_frame01") for i in range(4)]
    grid = refine_grid(
        {"smooth_px": 0.0, "connectivity": "slice", "flag_threshold": 0.08, "max_ml": 2.0, "ranking": "p_error"}
    )
    assert grid["flag_threshold"] == (0.07, 0.08, 0.09) and grid["max_ml"] == (2.0, 3.0, 4.0)
    first = select_settings(
        maps,
        grid={
            "smooth_px": (0.0,),
            "connectivity": ("slice",),
            "flag_threshold": (0.2,),
            "max_ml": (0.1,),
            "ranking": ("p_error",),
        },
        max_burden=1.0,
    )
    res = two_pass(maps, first=first)
    assert {c["pass"] for c in res["candidates"]} == {1, 2}
    assert (
        res["validation"]["cross_validated"]["covered_top3"] >= first["validation"]["cross_validated"]["covered_top3"]
    )
    assert res["settings"]["max_ml"] in (0.1, 0.15, 0.2)
