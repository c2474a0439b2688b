"""Pixels outside the networks' field of view: CARD gives them tau_min in the engine, and the
evaluation and the calibration pool treat them the same way (one rule: ``CARD.temperature``)."""

import numpy as np
import torch

from cardseg.method.calibration import CARD
from cardseg.method.calibration.card import temperature_field
from cardseg_train.calibration import harness as ce

NAMES = ["background", "RV", "MYO", "LV"]
CAL = CARD(tau_min=1.0, tau_max=4.0, w_b=0.05, w_k=0.02)


def test_temperature_outside_the_view_is_tau_min_for_numpy_and_torch():
    rng = np.random.default_rng(0)
    tac = rng.uniform(0, 0.3, size=(3, 5, 6)).astype(np.float32)
    outside = np.zeros((5, 6), bool)
    outside[:, :2] = True
    want = temperature_field(tac, 1.0, 4.0, 0.05, 0.02)
    for t in (tac, torch.from_numpy(tac)):
        tau = np.asarray(CAL.temperature(t, outside=outside))
        assert np.all(tau[:, outside] == 1.0) and np.allclose(tau[:, ~outside], want[:, ~outside])
        assert np.allclose(np.asarray(CAL.temperature(t)), want)  # no mask: Eq. 8 everywhere
    assert (want[:, outside] > 1.0).all()  # so the mask made the difference
    flat = tac.reshape(-1)
    tau = CAL.temperature(flat, outside=np.arange(flat.size) % 2 == 0)  # a mask of the TAC's own shape
    assert np.all(tau[::2] == 1.0) and np.allclose(tau[1::2], want.reshape(-1)[1::2])


def test_log_probs_outside_the_view_are_the_plain_softmax():
    rng = np.random.default_rng(1)
    logits = torch.from_numpy(rng.normal(0, 3, size=(1, 4, 5, 6)).astype(np.float32))
    tac = torch.full((1, 5, 6), 0.2)
    outside = np.zeros((5, 6), bool)
    outside[2:, 3:] = True
    lp = CAL.log_probs(logits, tac, outside=outside)
    plain = torch.log_softmax(logits, dim=1)
    assert torch.allclose(lp[..., torch.from_numpy(outside)], plain[..., torch.from_numpy(outside)], atol=1e-6)
    assert not torch.allclose(lp[..., torch.from_numpy(~outside)], plain[..., torch.from_numpy(~outside)])
    assert torch.equal(lp.argmax(1), plain.argmax(1))


def _case():
    z, size = 2, 30
    yy, xx = np.mgrid[:size, :size]
    lab = np.zeros((z, size, size), np.uint8)
    lab[:, np.hypot(yy - 15, xx - 4) < 5] = 3  # a heart at the left edge
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 1, size=(z, 4, size, size)).astype(np.float32)
    logits += 4.0 * np.moveaxis(np.eye(4, dtype=np.float32)[lab], -1, 1)
    tac = np.full(lab.shape, 0.2, np.float32)
    fov = np.ones((size, size), bool)
    fov[:, :3] = False
    return logits, tac, lab, fov


def test_evaluation_gives_card_tau_min_outside_the_view_and_caches_the_mask(tmp_path):
    logits, tac, lab, fov = _case()
    res = ce.summarize_case("p_f1", "p", "clean", ce.CaseMaps(logits, tac, field_of_view=fov), lab, NAMES)
    roi = ce.roi_mask(lab > 0, ce.ROI_RADIUS)
    want = np.broadcast_to(~fov, lab.shape)[roi]
    assert want.any() and np.array_equal(res.outside_view, want)
    probs = ce.calibrated_probs(CAL, res)
    plain = torch.softmax(torch.from_numpy(res.logits.T), dim=1).numpy()
    assert np.allclose(probs[want], plain[want], atol=1e-6) and not np.allclose(probs[~want], plain[~want])
    cache = ce.CaseCache(tmp_path, "k")
    cache.save(res)
    back = cache.load("p_f1", "clean")
    assert np.array_equal(back.outside_view, want) and np.allclose(ce.calibrated_probs(CAL, back), probs)
    inside = ce.summarize_case(
        "p_f1", "p", "clean", ce.CaseMaps(logits, tac, field_of_view=np.ones_like(fov)), lab, NAMES
    )
    assert inside.outside_view is None
    cache.save(inside)
    assert cache.load("p_f1", "clean").outside_view is None


def test_the_calibration_pool_keeps_no_pixel_outside_the_view(tiny_bundle, monkeypatch):
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.metrics.segmentation import roi_mask
    from cardseg_train.calibration import pool as cp
    from cardseg_train.evaluation.segmentation import LabelledVolume

    vol, lab = synthetic_cine_volume(shape=(2, 64, 56), spacing=(3.0, 2.5, 8.0), seed=2)
    bundle = load_bundle(tiny_bundle)
    real = cp.engine_card_outputs
    cut = np.ones(lab.shape[1:], bool)
    cut[:, : lab.shape[2] // 2] = False  # pretend the field of view ends in the middle of the heart

    def narrower(*args, **kwargs):
        logits, tac, step_js, offset, fov = real(*args, **kwargs)
        return logits, tac, step_js, offset, fov & cut

    monkeypatch.setattr(cp, "engine_card_outputs", narrower)
    item = cp.build_pool(
        bundle,
        [LabelledVolume("s_frame01", "s", vol, lab)],
        cp.PoolOptions(variants=("clean",), roi_radius=3, max_pixels_per_item=None, spatial=True),
    )[0]
    roi = roi_mask(lab > 0, 3)
    assert (roi & ~cut).any() and item.labels.size == int((roi & cut).sum())
    z0, z1, y0, y1, x0, x1 = item.spatial.box  # the spatial baselines' crop holds the same pixels
    assert int(item.spatial.roi.sum()) == item.labels.size
    assert not (item.spatial.roi & ~cut[None, y0:y1, x0:x1]).any()


def test_the_review_measures_card_entropy_uses_tau_min_outside_the_view(tmp_path):
    from cardseg_train.review import data as rd

    logits, tac, lab, fov = _case()
    maps = rd.VolumeMaps(
        "p_f1",
        "clean",
        logits.argmax(1).astype(np.uint8),
        lab,
        tac,
        (1.5, 1.5, 8.0),
        logits.astype(np.float16),
        fov=fov,
    )
    path = tmp_path / "m.npz"
    rd._save(path, maps)  # noqa: SLF001 - the cache's own round trip
    back = rd._load(path)  # noqa: SLF001
    assert np.array_equal(back.fov, fov)
    rd.entropy_maps(back, CAL)
    outside = np.broadcast_to(~fov, lab.shape)
    assert np.allclose(back.entropy_card[outside], back.entropy_uc[outside], atol=1e-5)
    assert (back.entropy_card[~outside] > back.entropy_uc[~outside] + 1e-4).mean() > 0.9  # heated inside
