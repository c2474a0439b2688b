"""Fitting the calibrators on a pool of source-validation pixels (paper Sec. IV-B).

One interface: a *fitter* takes a pool (a list of :class:`PoolItem`) and returns a fitted
engine :class:`~cardseg.calibration.Calibrator`; ``FITTERS[method](pool)`` or
:func:`fit_calibrator`. Every fitter minimises the mean pixel-wise NLL over all pool pixels
(each pixel weighs the same, whichever volume or perturbation it came from) with analytic
gradients, in float64 numpy:

* ``ts``: one ``T``, bounded scalar search on ``log T`` (``T ∈ [0.05, 100]``).
* ``ets``: ``t`` and mixture weights ``(w0, w1, w2)``: ``t`` first fitted as TS, then SLSQP over
  ``(t, w0, w1, w2)`` jointly with ``w_i ∈ [0, 1]``, ``Σ w_i = 1``, started at ``(t_TS, 1, 0, 0)``
  (the TS solution, so ETS never ends worse than TS on the pool).
* ``hts``: ``(w, b)`` by L-BFGS-B from the authors' initialisation ``w = 0.1, b = 0.8``.
* ``card``: ``{τ_min, τ_max, w_b, w_k}`` of Eq. 7: the best point of a coarse grid (evaluated on
  a seeded subsample of at most ``CARD_GRID_PIXELS`` pixels) initialises SLSQP on the whole
  pool under ``1 ≤ τ_min ≤ τ_max ≤ 100``, ``0 ≤ w_b ≤ ln 2``, ``W_K_MIN ≤ w_k ≤ ln 2``.
  Internally ``w_b`` and ``w_k`` are divided by a TAC scale (the pool's 99th TAC percentile)
  so that SLSQP sees variables of comparable size.

The pool is built by :func:`build_pool` from source-validation volumes and label-preserving
perturbations of them (:func:`perturb_image`: contrast, gamma, Gaussian noise) applied to the
engine-normalised ``[0, 1]`` slices, i.e. the network's input scale (applied before the
engine's per-slice robust min-max normalisation, a contrast factor below 1 would be undone
exactly). :func:`pixel_flag_threshold` and :func:`ood_agreement_threshold` give the bundle's
region-flag and out-of-domain thresholds (:func:`pool_thresholds` takes both from a pool).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import optimize
from scipy.special import expit, log_softmax, softmax

from cardseg.method.calibration import (CARD, Calibrator, EnsembleTemperatureScaling, EntropyTemperatureScaling,
                                        TemperatureScaling, Uncalibrated)
from cardseg.method.calibration.hts import LOG_ENTROPY_FLOOR, TEMPERATURE_FLOOR

from .calibration_spatial import CROP_MARGIN, SpatialItem

LN2 = math.log(2.0)

#: the label-preserving perturbations of the fitting pool (CalibNet's photometric set)
PERTURBATIONS = ("contrast", "gamma", "noise")
#: pool variants per source-validation volume: the original and one of each perturbation
POOL_VARIANTS = ("clean",) + PERTURBATIONS
#: contrast factor c: ``x' = m + c (x - m)`` about the image mean m, clipped to [0, 1]
CONTRAST_RANGE = (0.6, 1.5)
#: gamma g: ``x' = x ** g``
GAMMA_RANGE = (0.6, 1.5)
#: additive Gaussian noise: sigma drawn from these levels (CalibNet used 0.15 only; the milder
#: levels keep part of the pool near the source distribution), not clipped
NOISE_SIGMAS = (0.05, 0.10, 0.15)

#: bounds of the temperature-type parameters
TEMPERATURE_BOUNDS = (0.05, 100.0)
TAU_MAX_BOUND = 100.0
#: smallest CARD transition width w_k (TAC units, nats)
W_K_MIN = 1e-3
#: pixels the CARD grid search evaluates (a seeded subsample of the pool)
CARD_GRID_PIXELS = 20_000
#: coarse CARD grid: τ_min values, τ_max - τ_min values, w_b as TAC quantiles, w_k as
#: multiples of the TAC scale
CARD_GRID = {
    "tau_min": (1.0, 1.5, 2.5, 4.0),
    "tau_span": (0.0, 1.0, 3.0, 6.0, 12.0, 25.0),
    "w_b_quantile": (0.05, 0.25, 0.5, 0.75, 0.95),
    "w_k_scale": (0.03, 0.1, 0.3),
}


# --------------------------------------------------------------------------------------------
# The pool


@dataclass
class PoolItem:
    """ROI pixels of one (possibly perturbed) source-validation volume.

    logits: terminal primary logits ``(K, n)``; labels: ground truth ``(n,)``; tac: TAC
    values ``(n,)``; agreement: the engine's volume agreement score (Eq. 4, over the
    predicted-foreground ROI) when known; step_js: the JS value of each sampled step ``(S, n)``
    in the order of ``steps``, when kept, so the TAC of any step subset can be formed
    later without running the trajectory again (:func:`pool_with_tac_steps`); step_roi_js: per
    step, the mean JS over the predicted-foreground ROI the agreement score uses (so the agreement
    of any step subset is exact: Eq. 4 is linear in the TAC). patient: the patient the volume
    belongs to (held-out splits keep a patient's items together; empty: use ``case``). spatial:
    the ROI box with the image, for the convolutional calibrators (LTS, CalibNet), when built
    with ``spatial=True`` (:mod:`cardseg_train.calibration_spatial`).
    """

    logits: np.ndarray
    labels: np.ndarray
    tac: np.ndarray
    case: str = ""
    variant: str = "clean"
    agreement: Optional[float] = None
    step_js: Optional[np.ndarray] = None
    steps: Optional[List[int]] = None
    step_roi_js: Optional[List[float]] = None
    patient: str = ""
    spatial: Optional[SpatialItem] = None

    def __post_init__(self):
        self.logits = np.asarray(self.logits, dtype=np.float32)
        self.labels = np.asarray(self.labels, dtype=np.int64).reshape(-1)
        self.tac = np.asarray(self.tac, dtype=np.float32).reshape(-1)
        if self.logits.ndim != 2 or self.logits.shape[1] != self.labels.shape[0] or self.tac.shape != self.labels.shape:
            raise ValueError(f"PoolItem needs logits (K, n), labels (n,), tac (n,); got {self.logits.shape}, "
                             f"{self.labels.shape}, {self.tac.shape}")
        if self.step_js is not None:
            self.step_js = np.asarray(self.step_js, dtype=np.float32)
            self.steps = [int(t) for t in (self.steps or [])]
            if self.step_js.shape != (len(self.steps), self.labels.shape[0]):
                raise ValueError(f"PoolItem step_js must be (len(steps), n), got {self.step_js.shape} for "
                                 f"{len(self.steps)} steps and n = {self.labels.shape[0]}")


def pool_item(logits: np.ndarray, tac: np.ndarray, labels: np.ndarray, roi: np.ndarray,
              rng: Optional[np.random.Generator] = None, max_pixels: Optional[int] = None, case: str = "",
              variant: str = "clean", agreement: Optional[float] = None,
              step_js: Optional[Dict[int, np.ndarray]] = None, step_roi_js: Optional[List[float]] = None) -> PoolItem:
    """Gather the ROI pixels of a volume: logits ``(Z, K, Y, X)``, tac/labels/roi ``(Z, Y, X)``,
    step_js ``{t: (Z, Y, X)}`` (optional).

    With ``max_pixels``, a uniform random subset (without replacement, drawn from ``rng``)
    of that many ROI pixels is kept, in their original order.
    """
    roi = np.asarray(roi, dtype=bool)
    z = np.moveaxis(np.asarray(logits), 1, 0)[:, roi]
    t, y = np.asarray(tac)[roi], np.asarray(labels)[roi]
    steps = list(step_js) if step_js else None
    js = np.stack([np.asarray(step_js[s])[roi] for s in steps]) if steps else None
    if max_pixels is not None and y.shape[0] > max_pixels:
        rng = rng if rng is not None else np.random.default_rng(0)
        keep = np.sort(rng.choice(y.shape[0], size=max_pixels, replace=False))
        z, t, y = z[:, keep], t[keep], y[keep]
        js = None if js is None else js[:, keep]
    return PoolItem(z, y, t, case=case, variant=variant, agreement=agreement, step_js=js, steps=steps,
                    step_roi_js=step_roi_js)


def pool_with_tac_steps(pool: Sequence[PoolItem], tac_steps: Optional[Sequence[int]]) -> List[PoolItem]:
    """The pool with each item's TAC re-formed over ``tac_steps`` (paper Eq. 6 with another step
    set ``T``, e.g. TAC-mid ``[24, 12, 0]`` or TAC-last ``[0]``; ``None``: every sampled step) from
    its kept per-step JS values."""
    out = []
    for it in pool:
        if it.step_js is None:
            raise ValueError("this pool kept no per-step JS values (rebuild it)")
        rows = list(range(len(it.steps))) if tac_steps is None else [it.steps.index(int(t)) for t in tac_steps]
        tac = it.step_js[rows].mean(axis=0)
        agreement = it.agreement
        if it.step_roi_js is not None and agreement is not None:
            agreement = float(1.0 - np.mean([it.step_roi_js[r] for r in rows]) / LN2)
        # the crops keep no per-step JS: their TAC (over the steps the pool ran with) would not match
        spatial = it.spatial if it.spatial is None or tac_steps is None else dataclasses.replace(it.spatial, tac=None)
        out.append(dataclasses.replace(it, tac=tac, agreement=agreement, spatial=spatial))
    return out


def concat_pool(pool: Sequence[PoolItem]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``z (n, K)`` float64, ``y (n,)`` int64, ``d (n,)`` float64 over all items."""
    if not pool:
        raise ValueError("the calibration pool is empty")
    z = np.concatenate([it.logits.T for it in pool]).astype(np.float64)
    y = np.concatenate([it.labels for it in pool])
    d = np.concatenate([it.tac for it in pool]).astype(np.float64)
    return z, y, d


def perturbation_params(kind: str, rng: np.random.Generator) -> Dict[str, float]:
    """Draw one perturbation's parameters (JSON-able)."""
    if kind == "contrast":
        return {"contrast": float(rng.uniform(*CONTRAST_RANGE))}
    if kind == "gamma":
        return {"gamma": float(rng.uniform(*GAMMA_RANGE))}
    if kind == "noise":
        return {"sigma": float(NOISE_SIGMAS[rng.integers(len(NOISE_SIGMAS))])}
    raise ValueError(f"unknown perturbation {kind!r} (choose from {', '.join(PERTURBATIONS)})")


def apply_perturbation(img01: np.ndarray, kind: str, params: Dict[str, float],
                       rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Apply a perturbation to an image scaled to ``[0, 1]`` (any shape); float32 result.

    contrast: ``clip(m + c (x - m), 0, 1)`` with m the image mean; gamma: ``clip(x, 0, 1) ** g``;
    noise: ``x + N(0, sigma²)`` per pixel (noise drawn from ``rng``), not clipped.
    """
    x = np.asarray(img01, dtype=np.float32)
    if kind == "contrast":
        m = float(x.mean())
        return np.clip(m + params["contrast"] * (x - m), 0.0, 1.0).astype(np.float32)
    if kind == "gamma":
        return (np.clip(x, 0.0, 1.0) ** params["gamma"]).astype(np.float32)
    if kind == "noise":
        rng = rng if rng is not None else np.random.default_rng(0)
        return (x + rng.normal(0.0, params["sigma"], x.shape)).astype(np.float32)
    raise ValueError(f"unknown perturbation {kind!r} (choose from {', '.join(PERTURBATIONS)})")


def perturb_image(img01: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """One label-preserving perturbation (``contrast``, ``gamma`` or ``noise``) of a
    ``[0, 1]``-scaled image or volume (the engine's normalised network input), parameters
    drawn once from ``rng`` (seed it per volume, e.g. with
    :func:`cardseg_train.corruptions.corruption_rng`)."""
    return apply_perturbation(img01, kind, perturbation_params(kind, rng), rng)


def engine_card_outputs(bundle, slices01: np.ndarray, spacing_xy: Tuple[float, float], device="cpu",
                        batch_size: int = 8) -> Tuple[np.ndarray, np.ndarray, Dict[int, np.ndarray]]:
    """The dual trajectory on already normalised slices: ``(logits (Z, K, Y, X), tac (Z, Y, X),
    {t: JS (Z, Y, X)} for each sampled step)``.

    A perturbation must act on the network's own ``[0, 1]`` input scale: the engine's robust
    per-slice min-max normalisation would otherwise undo any affine change (a contrast factor
    below 1 would be a no-op) and rescale added noise. So the pool normalises first
    (:func:`cardseg.segment.normalized_slices`), perturbs, then calls the engine's
    :func:`cardseg.segment.trajectory_on_slices`.
    """
    from cardseg.segment import trajectory_on_slices

    traj = trajectory_on_slices(np.asarray(slices01, dtype=np.float32), tuple(spacing_xy), bundle, "card", device,
                                batch_size, keep_step_js=True)
    return traj.logits.numpy(), traj.tac.numpy(), {t: js.numpy() for t, js in traj.step_js.items()}


def build_pool(bundle, cases, variants: Sequence[str] = POOL_VARIANTS, roi_radius: int = 10,
               max_pixels_per_item: Optional[int] = 30_000, seed: int = 0, device="cpu", batch_size: int = 8,
               progress: Optional[Callable[[str], None]] = None, draws: int = 1, spatial: bool = False,
               augmentations: int = 0, crop_margin: int = CROP_MARGIN) -> List[PoolItem]:
    """Run the dual trajectory on every case and variant and keep its ROI pixels.

    cases: :class:`~cardseg_train.evaluation.LabelledVolume` items (source validation only).
    Each volume is normalised per slice as the engine does (the bundle's percentiles), then
    perturbed (:func:`perturb_image`, generator seeded by ``(seed, case, variant)``; ``clean``
    is left as is) and run through :func:`engine_card_outputs`. The ROI is the ground-truth
    foreground dilated by ``roi_radius`` pixels (per slice, disk), as in the metrics; at most
    ``max_pixels_per_item`` of its pixels are kept (seeded); each perturbation is drawn ``draws``
    times per volume (draw 0 keeps the generator of a single-draw pool). Each item records the volume
    agreement score the engine would report (Eq. 4 over the predicted foreground's ROI,
    dilated by the bundle's ``agreement.roi_dilation_px``).

    ``spatial``: each item also keeps its ROI box (:func:`~cardseg_train.calibration_spatial.spatial_item`,
    ``crop_margin`` pixels around the ROI) for LTS and CalibNet; ``augmentations`` (needs
    ``spatial``): the primary also runs on that many photometric augmentations of the item's
    image, for CalibNet's mean and standard deviation of the logits (generator seeded by
    ``(seed, case, "calibnet-aug:" variant)``, apart from the pool's own draws, so the pixel
    vectors are the same with or without crops).
    """
    from cardseg.metrics.segmentation import agreement_score, roi_mask
    from cardseg.segment import normalized_slices

    from .calibration_spatial import augmentation_stats, engine_primary_logits, spatial_item
    from .corruptions import corruption_rng

    if augmentations and not spatial:
        raise ValueError("augmentation statistics are kept with the spatial crops: pass spatial=True")

    agreement_radius = int(bundle.config.get("agreement", {}).get("roi_dilation_px", 10))
    pool = []
    for case in cases:
        roi = roi_mask(case.labels > 0, roi_radius)
        norm = normalized_slices(case.volume, bundle)
        jobs = [(v, k) for v in variants for k in range(1 if v == "clean" else max(1, draws))]
        for variant, draw in jobs:
            tag = variant + (f":{draw}" if draw else "")
            rng = corruption_rng(case.case, f"pool:{tag}", seed)
            img = norm if variant == "clean" else perturb_image(norm, variant, rng)
            spacing = tuple(case.volume.spacing[:2])
            logits, tac, step_js = engine_card_outputs(bundle, img, spacing, device, batch_size)
            pred_roi = roi_mask(logits.argmax(axis=1) > 0, agreement_radius)
            agreement = agreement_score(tac, pred_roi)
            step_roi_js = [float(js[pred_roi].mean()) for js in step_js.values()] if pred_roi.any() else None
            pool.append(pool_item(logits, tac, case.labels, roi, rng, max_pixels_per_item, case=case.case,
                                  variant=variant, agreement=agreement, step_js=step_js, step_roi_js=step_roi_js))
            pool[-1].patient = str(getattr(case, "patient", "") or "")
            if spatial:
                sp = spatial_item(logits, img, case.labels, roi, tac, crop_margin)
                if augmentations:
                    sp.aug_mean, sp.aug_std = augmentation_stats(
                        engine_primary_logits(bundle, spacing, device, batch_size), img, sp.box, augmentations,
                        corruption_rng(case.case, f"calibnet-aug:{tag}", seed))
                    sp.augmentations = int(augmentations)
                pool[-1].spatial = sp
            if progress is not None:
                progress(f"{case.case} {variant}: {pool[-1].labels.shape[0]} px, agreement {agreement}")
    return pool


def pixel_flag_threshold(tac_values: np.ndarray, quantile: float = 0.99) -> float:
    """Region-flag threshold: the ``quantile`` of source-validation TAC values within the ROI
    (clean volumes), so about 1% of in-distribution ROI pixels would be flagged."""
    t = np.asarray(tac_values, dtype=np.float64).reshape(-1)
    if t.size == 0:
        raise ValueError("no TAC values")
    return float(np.quantile(t, quantile))


def ood_agreement_threshold(volume_agreements: Sequence[float], margin: float = 0.01) -> float:
    """Out-of-domain threshold: just below the lowest source-validation volume agreement,
    ``min(agreements) - margin`` (not below 0), so no source-validation volume would be called out
    of domain."""
    a = [float(v) for v in volume_agreements if v is not None and np.isfinite(v)]
    if not a:
        raise ValueError("no volume agreement scores")
    return max(min(a) - margin, 0.0)


def pool_thresholds(pool: Sequence[PoolItem], quantile: float = 0.99, margin: float = 0.01) -> Dict[str, float]:
    """Both thresholds from the ``clean`` items of a pool (keys as in ``bundle.json``)."""
    clean = [it for it in pool if it.variant == "clean"]
    return {"flag_threshold": pixel_flag_threshold(np.concatenate([it.tac for it in clean]), quantile),
            "out_of_domain_threshold": ood_agreement_threshold([it.agreement for it in clean], margin)}


# --------------------------------------------------------------------------------------------
# Objectives (mean NLL and its gradient)


def scaled_nll(z: np.ndarray, y: np.ndarray, temperature) -> Tuple[float, np.ndarray]:
    """Mean NLL of ``Softmax(z / T)`` and its gradient with respect to each pixel's ``T``.

    z ``(n, K)``, y ``(n,)``, temperature scalar or ``(n,)`` → ``(nll, dnll_dT (n,))``; the
    gradient is already divided by n (``d mean / d T_i``).
    """
    n = z.shape[0]
    t = np.broadcast_to(np.asarray(temperature, dtype=np.float64), (n,))
    s = z / t[:, None]
    m = s.max(axis=1, keepdims=True)
    e = np.exp(s - m)
    se = e.sum(axis=1)
    zy = z[np.arange(n), y]
    nll_i = m[:, 0] + np.log(se) - zy / t
    ez = (e * z).sum(axis=1) / se
    return float(nll_i.mean()), (zy - ez) / (t * t) / n


def card_objective(params: Sequence[float], z: np.ndarray, y: np.ndarray, d: np.ndarray) -> Tuple[float, np.ndarray]:
    """Mean NLL of CARD with ``params = (τ_min, τ_max, w_b, w_k)`` and its gradient ``(4,)``."""
    tau_min, tau_max, w_b, w_k = (float(p) for p in params)
    u = (d - w_b) / w_k
    s = expit(u)
    span = tau_max - tau_min
    nll, g = scaled_nll(z, y, tau_min + s * span)
    gs = g * span * s * (1.0 - s)
    grad = np.array([np.sum(g * (1.0 - s)), np.sum(g * s), -np.sum(gs) / w_k, -np.sum(gs * u) / w_k])
    return nll, grad


def ets_objective(params: Sequence[float], z: np.ndarray, y: np.ndarray) -> Tuple[float, np.ndarray]:
    """Mean NLL of ETS with ``params = (t, w0, w1, w2)`` (probabilities floored at 1e-12) and
    its gradient ``(4,)``."""
    t, w0, w1, w2 = (float(p) for p in params)
    n, k = z.shape
    rows = np.arange(n)
    a = softmax(z / t, axis=1)
    b = softmax(z, axis=1)
    ay, by = a[rows, y], b[rows, y]
    p = w0 * ay + w1 * by + w2 / k
    live = p > 1e-12
    pc = np.maximum(p, 1e-12)
    nll = float(-np.log(pc).mean())
    inv = np.where(live, 1.0 / pc, 0.0) / n
    ez = (a * z).sum(axis=1)
    da_dt = ay * (ez - z[rows, y]) / (t * t)
    grad = -np.array([np.sum(inv * w0 * da_dt), np.sum(inv * ay), np.sum(inv * by), np.sum(inv) / k])
    return nll, grad


def log_entropy(z: np.ndarray) -> np.ndarray:
    """HTS input ``ℓ = clip(log(H / log K), -9, 0)`` per pixel, ``z (n, K)`` → ``(n,)``."""
    lp = log_softmax(z, axis=1)
    h = np.maximum(-(np.exp(lp) * lp).sum(axis=1), 0.0)
    with np.errstate(divide="ignore"):
        return np.clip(np.log(h / math.log(z.shape[1])), LOG_ENTROPY_FLOOR, 0.0)


def hts_objective(params: Sequence[float], z: np.ndarray, y: np.ndarray, ell: np.ndarray) -> Tuple[float, np.ndarray]:
    """Mean NLL of HTS with ``params = (w, b)``, given ``ell = log_entropy(z)``, and its gradient."""
    w, b = (float(p) for p in params)
    a = w * ell + b
    t_raw = np.logaddexp(0.0, a)  # softplus
    t = np.maximum(t_raw, TEMPERATURE_FLOOR)
    nll, g = scaled_nll(z, y, t)
    g = np.where(t_raw > TEMPERATURE_FLOOR, g * expit(a), 0.0)
    return nll, np.array([np.sum(g * ell), np.sum(g)])


# --------------------------------------------------------------------------------------------
# Fitters


def _fit_temperature(z: np.ndarray, y: np.ndarray) -> float:
    lo, hi = (math.log(v) for v in TEMPERATURE_BOUNDS)
    res = optimize.minimize_scalar(lambda lt: scaled_nll(z, y, math.exp(lt))[0], bounds=(lo, hi), method="bounded",
                                   options={"xatol": 1e-5})
    return float(math.exp(res.x))


def fit_uc(pool: Sequence[PoolItem]) -> Uncalibrated:
    return Uncalibrated()


def fit_ts(pool: Sequence[PoolItem]) -> TemperatureScaling:
    """TS: the scalar ``T`` minimising the pool's mean NLL."""
    z, y, _ = concat_pool(pool)
    return TemperatureScaling(_fit_temperature(z, y))


def fit_ets(pool: Sequence[PoolItem]) -> EnsembleTemperatureScaling:
    """ETS: TS temperature, then SLSQP over ``(t, w0, w1, w2)`` on the weight simplex."""
    z, y, _ = concat_pool(pool)
    t0 = _fit_temperature(z, y)
    x0 = np.array([t0, 1.0, 0.0, 0.0])
    res = optimize.minimize(ets_objective, x0, args=(z, y), jac=True, method="SLSQP",
                            bounds=[TEMPERATURE_BOUNDS, (0.0, 1.0), (0.0, 1.0), (0.0, 1.0)],
                            constraints=[{"type": "eq", "fun": lambda x: x[1:].sum() - 1.0,
                                          "jac": lambda x: np.array([0.0, 1.0, 1.0, 1.0])}],
                            options={"maxiter": 200, "ftol": 1e-10})
    x = res.x if np.all(np.isfinite(res.x)) and ets_objective(res.x, z, y)[0] <= ets_objective(x0, z, y)[0] else x0
    w = np.clip(x[1:], 0.0, 1.0)
    w = w / w.sum()
    return EnsembleTemperatureScaling(float(np.clip(x[0], *TEMPERATURE_BOUNDS)), *(float(v) for v in w))


def fit_hts(pool: Sequence[PoolItem], init: Tuple[float, float] = (0.1, 0.8)) -> EntropyTemperatureScaling:
    """HTS: ``(w, b)`` by L-BFGS from the authors' initialisation."""
    z, y, _ = concat_pool(pool)
    ell = log_entropy(z)
    res = optimize.minimize(hts_objective, np.asarray(init, float), args=(z, y, ell), jac=True, method="L-BFGS-B",
                            options={"maxiter": 500})
    return EntropyTemperatureScaling(float(res.x[0]), float(res.x[1]))


def _card_grid(d: np.ndarray, scale: float) -> List[Tuple[float, float, float, float]]:
    w_bs = sorted(set(float(np.clip(np.quantile(d, q), 0.0, LN2)) for q in CARD_GRID["w_b_quantile"]))
    w_ks = [max(W_K_MIN, f * scale) for f in CARD_GRID["w_k_scale"]]
    points = []
    for tmin, span in itertools.product(CARD_GRID["tau_min"], CARD_GRID["tau_span"]):
        tmax = min(tmin + span, TAU_MAX_BOUND)
        if span == 0.0:  # w_b and w_k do not matter: one point
            points.append((tmin, tmax, w_bs[len(w_bs) // 2], w_ks[0]))
            continue
        points += [(tmin, tmax, wb, wk) for wb, wk in itertools.product(w_bs, w_ks)]
    return points


def fit_card(pool: Sequence[PoolItem], seed: int = 0, grid_pixels: int = CARD_GRID_PIXELS,
             info: Optional[dict] = None) -> CARD:
    """CARD: coarse grid (on a subsample) → SLSQP on the whole pool (see the module docstring).

    ``info``, if given, is filled with the grid's best point, the SLSQP result and timings.
    """
    z, y, d = concat_pool(pool)
    n = z.shape[0]
    scale = max(float(np.quantile(d, 0.99)), 10 * W_K_MIN)
    t0 = time.perf_counter()
    sub = np.random.default_rng(seed).choice(n, size=grid_pixels, replace=False) if n > grid_pixels else slice(None)
    zs, ys, ds = z[sub], y[sub], d[sub]
    grid = _card_grid(ds, scale)
    values = [card_objective(p, zs, ys, ds)[0] for p in grid]
    start = np.array(grid[int(np.argmin(values))])
    t_grid = time.perf_counter() - t0

    # SLSQP in x = (τ_min, τ_max, w_b / scale, w_k / scale)
    sx = np.array([1.0, 1.0, scale, scale])

    def fun(x):
        f, g = card_objective(x * sx, z, y, d)
        return f, g * sx

    t0 = time.perf_counter()
    x0 = start / sx
    res = optimize.minimize(fun, x0, jac=True, method="SLSQP",
                            bounds=[(1.0, TAU_MAX_BOUND), (1.0, TAU_MAX_BOUND), (0.0, LN2 / scale),
                                    (W_K_MIN / scale, LN2 / scale)],
                            constraints=[{"type": "ineq", "fun": lambda x: x[1] - x[0],
                                          "jac": lambda x: np.array([-1.0, 1.0, 0.0, 0.0])}],
                            options={"maxiter": 300, "ftol": 1e-10})
    t_slsqp = time.perf_counter() - t0
    f0 = fun(x0)[0]
    x = res.x if np.all(np.isfinite(res.x)) and fun(res.x)[0] <= f0 else x0
    p = x * sx
    tau_min = float(max(p[0], 1.0))
    tau_max = float(max(p[1], tau_min))
    w_b = float(np.clip(p[2], 0.0, LN2))
    w_k = float(max(p[3], W_K_MIN))
    if info is not None:
        info.update({"grid_points": len(grid), "grid_best": start.tolist(), "grid_pixels": int(zs.shape[0]),
                     "grid_s": t_grid, "slsqp_s": t_slsqp, "slsqp_iterations": int(res.nit),
                     "slsqp_message": str(res.message), "nll_start": float(f0), "nll": float(fun(x)[0]),
                     "tac_scale": scale, "pixels": int(n)})
    return CARD(tau_min, tau_max, w_b, w_k)


FITTERS: Dict[str, Callable[[Sequence[PoolItem]], Calibrator]] = {
    "uc": fit_uc, "ts": fit_ts, "ets": fit_ets, "hts": fit_hts, "card": fit_card,
}


#: the small-network calibrators, fitted by :mod:`cardseg_train.calibration_fit_nets`
NETWORK_METHODS = ("pts", "lts", "calibnet")


def fit_calibrator(method: str, pool: Sequence[PoolItem], **kwargs) -> Calibrator:
    """Fit ``method`` (one of :data:`FITTERS` or :data:`NETWORK_METHODS`) on the pool."""
    if method in NETWORK_METHODS:
        from .calibration_fit_nets import NET_FITTERS

        return NET_FITTERS[method](pool, **kwargs)
    if method not in FITTERS:
        raise ValueError(f"no fitter for {method!r} (choose from {', '.join((*FITTERS, *NETWORK_METHODS))})")
    return FITTERS[method](pool, **kwargs)


def pool_nll(calibrator: Calibrator, pool: Sequence[PoolItem]) -> float:
    """Mean NLL of an engine calibrator on the pool, through its own ``log_probs``
    (``log q`` floored at ``log 1e-12``, as the NLL metric)."""
    import torch

    total, count = 0.0, 0
    for it in pool:
        z = torch.from_numpy(it.logits.T.astype(np.float64))[:, :, None]  # (n, K, 1)
        tac = torch.from_numpy(it.tac.astype(np.float64))[:, None]  # (n, 1)
        logp = calibrator.log_probs(z, tac if calibrator.needs_tac else None)[:, :, 0]
        lp = logp[torch.arange(z.shape[0]), torch.from_numpy(it.labels)].clamp_min(math.log(1e-12))
        total += float(-lp.sum())
        count += z.shape[0]
    return total / count
