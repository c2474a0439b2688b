"""Calibration fitting: recovery on synthetic pools with known truth, gradients, constraints,
speed, the pool's perturbations and the threshold rules."""

import time

import numpy as np
import pytest
import torch
from scipy.special import expit, softmax

from cardseg.method.calibration import CARD, EnsembleTemperatureScaling, EntropyTemperatureScaling, TemperatureScaling
from cardseg_train.calibration.fit import FITTERS, fit_calibrator, fit_card, fit_ets, fit_hts, fit_ts, pool_nll
from cardseg_train.calibration.objectives import card_objective, ets_objective, hts_objective, log_entropy
from cardseg_train.data.perturb import PERTURBATIONS, apply_perturbation, perturb_image, perturbation_params
from cardseg_train.calibration.pool import (
    PoolItem,
    PoolItemMeta,
    concat_pool,
    ood_agreement_threshold,
    pixel_flag_threshold,
    pool_item,
    pool_thresholds,
)

TRUE_CARD = (1.0, 7.0, 0.2, 0.04)


def synthetic_pool(n, seed, temperature=None, items=4, k=4):
    """Labels drawn from softmax(u); observed logits u · T with T = ``temperature`` (scalar) or,
    by default, T growing with the TAC as CARD's Eq. 8 with ``TRUE_CARD``."""
    rng = np.random.default_rng(seed)
    u = rng.normal(0.0, 2.0, (n, k))
    y = (softmax(u, axis=1).cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    d = rng.uniform(0.0, 0.5, n)
    if temperature is None:
        tmin, tmax, wb, wk = TRUE_CARD
        t = tmin + expit((d - wb) / wk) * (tmax - tmin)
    else:
        t = np.full(n, float(temperature))
    z = u * t[:, None]
    return [PoolItem(z[i::items].T, y[i::items], d[i::items], case=f"c{i}") for i in range(items)]


@pytest.fixture(scope="module")
def ts_pool():
    return synthetic_pool(60_000, seed=1, temperature=3.0)


@pytest.fixture(scope="module")
def card_pool():
    return synthetic_pool(100_000, seed=2)


def test_ts_recovers_the_temperature(ts_pool):
    cal = fit_ts(ts_pool)
    assert isinstance(cal, TemperatureScaling)
    assert cal.temperature == pytest.approx(3.0, rel=0.05)


def test_ets_and_hts_on_a_global_temperature(ts_pool):
    ts, ets, hts = fit_ts(ts_pool), fit_ets(ts_pool), fit_hts(ts_pool)
    assert isinstance(ets, EnsembleTemperatureScaling) and isinstance(hts, EntropyTemperatureScaling)
    # the simplex constraint holds and ETS is never worse than TS on its pool
    assert min(ets.w0, ets.w1, ets.w2) >= 0 and abs(ets.w0 + ets.w1 + ets.w2 - 1) < 1e-9
    assert pool_nll(ets, ts_pool) <= pool_nll(ts, ts_pool) + 1e-6
    # with one true temperature, ETS and HTS both find it again
    assert ets.w0 > 0.9 and ets.temperature == pytest.approx(3.0, rel=0.1)
    assert abs(hts.w) < 0.1 and np.log1p(np.exp(hts.b)) == pytest.approx(3.0, rel=0.1)


def test_card_recovers_a_tac_dependent_temperature_and_beats_ts(card_pool):
    info = {}
    t0 = time.process_time()  # CPU time: not inflated by other processes on a busy machine
    card = fit_card(card_pool, info=info)
    elapsed = time.process_time() - t0
    assert isinstance(card, CARD)
    assert 1.0 <= card.tau_min <= card.tau_max and card.w_b >= 0 and card.w_k > 0
    assert card.tau_min == pytest.approx(1.0, abs=0.2) and card.tau_max == pytest.approx(7.0, rel=0.1)
    assert card.w_b == pytest.approx(0.2, abs=0.02) and card.w_k == pytest.approx(0.04, rel=0.3)
    tau = card.temperature(torch.tensor([0.0, 0.1, 0.2, 0.3, 0.5]))
    assert (tau.diff() > 0).all()
    nll_card, nll_ts = pool_nll(card, card_pool), pool_nll(fit_ts(card_pool), card_pool)
    assert nll_card < 0.95 * nll_ts
    assert info["nll"] == pytest.approx(nll_card, rel=1e-6)  # fitted objective = engine's own NLL
    assert info["nll"] <= info["nll_start"]
    assert elapsed < 30.0, f"CARD fit on 1e5 pixels took {elapsed:.1f} s of CPU"


def _finite_difference(f, x, h):
    g = np.zeros_like(x)
    for i in range(len(x)):
        e = np.zeros_like(x)
        e[i] = h[i]
        g[i] = (f(x + e) - f(x - e)) / (2 * h[i])
    return g


def test_card_on_a_small_tac_scale_is_not_held_at_a_fixed_floor():
    """A TAC-last-like pool: the disagreement a thousand times smaller (TAC up to 5e-4, transition
    width 4e-5 nats). The fit recovers the width instead of stopping at the old fixed floor of 1e-3."""
    pool = synthetic_pool(60_000, seed=5)
    scale = 1e-3
    tmin, tmax, wb, wk = TRUE_CARD
    small = []
    for it in pool:
        d = it.tac * scale
        t = tmin + expit((d - wb * scale) / (wk * scale)) * (tmax - tmin)
        t_old = tmin + expit((it.tac - wb) / wk) * (tmax - tmin)
        small.append(PoolItem(it.logits / t_old[None, :] * t[None, :], it.labels, d, case=it.case))
    card = fit_card(small)
    assert card.w_k < 1e-3 and card.w_k == pytest.approx(wk * scale, rel=0.3)
    assert card.w_b == pytest.approx(wb * scale, rel=0.1) and card.tau_max == pytest.approx(7.0, rel=0.1)


def test_analytic_gradients_match_finite_differences():
    z, y, d = concat_pool(synthetic_pool(3000, seed=4))
    for params in ([1.3, 5.0, 0.15, 0.05], [1.0, 2.0, 0.3, 0.2], [2.0, 9.0, 0.01, 0.01]):
        x = np.array(params, float)
        _, g = card_objective(x, z, y, d)
        fd = _finite_difference(lambda p: card_objective(p, z, y, d)[0], x, 1e-6 * np.maximum(1, np.abs(x)))
        assert np.allclose(g, fd, rtol=1e-4, atol=1e-7), (params, g, fd)
    for params in ([2.0, 0.5, 0.3, 0.2], [0.7, 0.2, 0.2, 0.6]):
        x = np.array(params, float)
        _, g = ets_objective(x, z, y)
        fd = _finite_difference(lambda p: ets_objective(p, z, y)[0], x, np.full(4, 1e-6))
        assert np.allclose(g, fd, rtol=1e-4, atol=1e-7), (params, g, fd)
    ell = log_entropy(z)
    for params in ([0.1, 0.8], [-0.6, 1.5]):
        x = np.array(params, float)
        _, g = hts_objective(x, z, y, ell)
        fd = _finite_difference(lambda p: hts_objective(p, z, y, ell)[0], x, np.full(2, 1e-6))
        assert np.allclose(g, fd, rtol=1e-4, atol=1e-7), (params, g, fd)


def test_objectives_equal_the_engine_calibrators():
    pool = synthetic_pool(2000, seed=5)
    z, y, d = concat_pool(pool)
    assert card_objective(TRUE_CARD, z, y, d)[0] == pytest.approx(pool_nll(CARD(*TRUE_CARD), pool), rel=1e-9)
    ets = EnsembleTemperatureScaling(2.0, 0.5, 0.3, 0.2)
    assert ets_objective([2.0, 0.5, 0.3, 0.2], z, y)[0] == pytest.approx(pool_nll(ets, pool), rel=1e-9)
    hts = EntropyTemperatureScaling(-0.3, 1.1)
    assert hts_objective([-0.3, 1.1], z, y, log_entropy(z))[0] == pytest.approx(pool_nll(hts, pool), rel=1e-9)


def test_card_constraints_hold_when_the_data_want_sharpening():
    """Under-confident logits would need τ < 1: CARD stays at τ_min = 1 (attenuation only)."""
    pool = synthetic_pool(20_000, seed=6, temperature=0.5)
    card = fit_card(pool)
    assert card.tau_min == 1.0 and card.tau_max >= card.tau_min and card.w_k >= 1e-3 and card.w_b >= 0
    assert fit_ts(pool).temperature == pytest.approx(0.5, rel=0.1)


def test_fit_calibrator_interface(ts_pool):
    assert set(FITTERS) == {"uc", "ts", "ets", "hts", "card"}
    for method in FITTERS:
        cal = fit_calibrator(method, ts_pool[:1])
        assert cal.name == method
    with pytest.raises(ValueError):
        fit_calibrator("platt", ts_pool)
    with pytest.raises(ValueError):
        fit_ts([])


def test_pool_item_gathers_roi_pixels_and_subsamples():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 8, 9)).astype(np.float32)
    tac = rng.random((3, 8, 9)).astype(np.float32)
    labels = rng.integers(0, 4, (3, 8, 9))
    roi = rng.random((3, 8, 9)) > 0.4
    item = pool_item(logits, tac, labels, roi, meta=PoolItemMeta(case="c", variant="gamma", agreement=0.9))
    n = int(roi.sum())
    assert item.logits.shape == (4, n) and item.labels.shape == (n,) and item.tac.shape == (n,)
    zz, yy, xx = np.nonzero(roi)
    assert np.array_equal(item.logits[:, 0], logits[zz[0], :, yy[0], xx[0]])
    assert item.labels[5] == labels[zz[5], yy[5], xx[5]]
    sub = pool_item(logits, tac, labels, roi, np.random.default_rng(1), max_pixels=10)
    sub2 = pool_item(logits, tac, labels, roi, np.random.default_rng(1), max_pixels=10)
    assert sub.labels.shape == (10,) and np.array_equal(sub.tac, sub2.tac)
    with pytest.raises(ValueError):
        PoolItem(np.zeros((4, 3)), np.zeros(2), np.zeros(3))


def test_perturbations_are_label_free_seeded_and_in_range():
    img = np.clip(np.random.default_rng(0).gamma(2.0, 0.15, (3, 32, 30)), 0, 1).astype(np.float32)
    for kind in PERTURBATIONS:
        a = perturb_image(img, kind, np.random.default_rng(7))
        b = perturb_image(img, kind, np.random.default_rng(7))
        assert a.shape == img.shape and a.dtype == np.float32 and np.array_equal(a, b)
        assert not np.allclose(a, img)
        p = perturbation_params(kind, np.random.default_rng(7))
        if kind == "contrast":
            assert 0.6 <= p["contrast"] <= 1.5 and a.min() >= 0 and a.max() <= 1
        elif kind == "gamma":
            assert 0.6 <= p["gamma"] <= 1.5
            assert np.allclose(a, img ** p["gamma"], atol=1e-6)
        else:
            assert p["sigma"] in (0.05, 0.10, 0.15)
            assert np.std(a - img) == pytest.approx(p["sigma"], rel=0.1)
    assert np.allclose(apply_perturbation(img, "contrast", {"contrast": 1.0}), img)
    # why the pool perturbs the engine-normalised input: the engine's per-slice robust min-max
    # would undo a contrast factor below 1 applied before it
    from cardseg.io.preprocess import normalize_volume

    low = apply_perturbation(img, "contrast", {"contrast": 0.7})
    assert not np.allclose(low, img) and np.allclose(normalize_volume(low), normalize_volume(img), atol=1e-5)
    with pytest.raises(ValueError):
        perturb_image(img, "blur", np.random.default_rng(0))


def test_threshold_rules():
    tac = np.linspace(0.0, 0.5, 1001)
    assert pixel_flag_threshold(tac) == pytest.approx(0.495)
    assert ood_agreement_threshold([0.93, 0.88, None, 0.91]) == pytest.approx(0.87)
    pool = [
        PoolItem(np.zeros((4, 3)), np.zeros(3), np.array([0.1, 0.2, 0.3]), variant="clean", agreement=0.9),
        PoolItem(np.zeros((4, 3)), np.zeros(3), np.array([0.6, 0.6, 0.6]), variant="noise", agreement=0.5),
        PoolItem(np.zeros((4, 2)), np.zeros(2), np.array([0.0, 0.4]), variant="clean", agreement=0.95),
    ]
    th = pool_thresholds(pool, quantile=1.0)
    assert th == {"flag_threshold": pytest.approx(0.4), "out_of_domain_threshold": pytest.approx(0.89)}
    with pytest.raises(ValueError):
        ood_agreement_threshold([None])


def test_build_pool_runs_the_engine_on_each_variant(tiny_bundle):
    from cardseg.bundle.loading import load_bundle
    from cardseg.metrics.segmentation import roi_mask
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.segment import SegmentOptions, segment_volume
    from cardseg_train.data.perturb import POOL_VARIANTS
    from cardseg_train.calibration.pool import PoolOptions, build_pool
    from cardseg_train.evaluation.segmentation import LabelledVolume

    vol, lab = synthetic_cine_volume(shape=(2, 64, 56), spacing=(3.0, 2.5, 8.0), seed=2)
    cases = [LabelledVolume("synthetic_frame01", "synthetic", vol, lab)]
    bundle = load_bundle(tiny_bundle)
    pool = build_pool(bundle, cases, PoolOptions(roi_radius=3, max_pixels_per_item=None, seed=0))
    assert [it.variant for it in pool] == list(POOL_VARIANTS)
    # the clean item is exactly what the engine computes on the volume
    ref = segment_volume(vol, bundle, SegmentOptions("card"))
    roi = roi_mask(lab > 0, 3)
    want = pool_item(ref.logits, ref.disagreement, lab, roi)
    assert np.array_equal(pool[0].logits, want.logits) and np.array_equal(pool[0].tac, want.tac)
    assert pool[0].agreement == pytest.approx(ref.report["agreement"], abs=1e-12)
    # perturbed variants differ and are seeded per case and variant
    again = build_pool(bundle, cases, PoolOptions(variants=("noise",), roi_radius=3, max_pixels_per_item=None, seed=0))
    assert np.array_equal(again[0].logits, pool[-1].logits)
    for it in pool:
        assert it.logits.shape == (4, it.labels.shape[0]) and it.labels.shape[0] == int(roi.sum())
        assert (it.tac >= 0).all() and (it.tac <= np.log(2) + 1e-6).all()
        assert it.agreement is not None and 0.0 <= it.agreement <= 1.0
    for it in pool[1:]:
        assert not np.array_equal(pool[0].logits, it.logits), it.variant
    th = pool_thresholds(pool)
    assert th["out_of_domain_threshold"] == pytest.approx(pool[0].agreement - 0.01)
    assert isinstance(fit_card(pool), CARD)


def test_tac_step_subsets_from_kept_step_js_match_the_engine(tiny_bundle, tmp_path):
    import shutil

    from cardseg.bundle.loading import load_bundle, update_config
    from cardseg.base.errors import CardsegError
    from cardseg.metrics.segmentation import roi_mask
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.segment import SegmentOptions, segment_volume
    from cardseg_train.calibration.pool import PoolItem, PoolOptions, build_pool, pool_with_tac_steps
    from cardseg_train.evaluation.segmentation import LabelledVolume

    vol, lab = synthetic_cine_volume(shape=(2, 64, 56), spacing=(3.0, 2.5, 8.0), seed=4)
    path = tmp_path / "b"
    shutil.copytree(tiny_bundle, path)
    bundle = load_bundle(path)
    it = build_pool(
        bundle,
        [LabelledVolume("s_frame01", "s", vol, lab)],
        PoolOptions(variants=("clean",), roi_radius=3, max_pixels_per_item=None),
    )[0]
    assert it.steps == bundle.sampled_steps and it.step_js.shape == (5, it.labels.size)
    assert np.allclose(it.step_js.mean(axis=0), it.tac, atol=1e-6)  # TAC = mean of the per-step JS (Eq. 7)
    last = pool_with_tac_steps([it], [0])[0]
    assert np.array_equal(last.logits, it.logits) and not np.allclose(last.tac, it.tac)
    # the engine, told to average step 0 only, gives the same TAC and agreement
    update_config(path, {"calibration": {"tac_steps": [0]}})
    b0 = load_bundle(path)
    assert b0.tac_steps == [0] and b0.calibrator.name == "card"
    ref = segment_volume(vol, b0, SegmentOptions("card"))
    assert np.allclose(last.tac, ref.disagreement[roi_mask(lab > 0, 3)], atol=1e-6)
    assert last.agreement == pytest.approx(ref.report["agreement"], abs=1e-6)
    with pytest.raises(CardsegError, match="tac_steps"):  # not a sampled step: refused before writing
        update_config(path, {"calibration": {"tac_steps": [5]}})
    assert load_bundle(path).tac_steps == [0]
    with pytest.raises(ValueError, match="per-step"):
        pool_with_tac_steps([PoolItem(it.logits, it.labels, it.tac)], [0])
