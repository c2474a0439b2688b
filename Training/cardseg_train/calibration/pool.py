"""The calibration pool: ROI pixels of source-validation volumes and their perturbations
(paper Sec. IV-B).

:func:`build_pool` runs the engine's dual trajectory on source-validation volumes and
label-preserving perturbations of them (:func:`~cardseg_train.data.perturb.perturb_image`:
contrast, gamma, Gaussian noise) applied to the engine-normalised ``[0, 1]`` slices, and keeps
each volume's ROI pixels as a :class:`PoolItem` (logits ``(K, n)``, labels and TAC ``(n,)``).
:func:`pixel_flag_threshold` and :func:`ood_agreement_threshold` give the bundle's region-flag
and out-of-domain thresholds (:func:`pool_thresholds` takes both from a pool). The fitters
(:mod:`cardseg_train.calibration.fit`) read pools.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from cardseg_train.data.perturb import POOL_VARIANTS, perturb_image
from cardseg_train.calibration.spatial import CROP_MARGIN, SpatialItem

if TYPE_CHECKING:
    import torch

LN2 = math.log(2.0)


@dataclass
class PoolItem:
    """ROI pixels of one (possibly perturbed) source-validation volume.

    logits: terminal primary logits ``(K, n)``; labels: ground truth ``(n,)``; tac: TAC
    values ``(n,)``; agreement: the engine's volume agreement score (Eq. 5, over the
    predicted-foreground ROI) when known; step_js: the JS value of each sampled step ``(S, n)``
    in the order of ``steps``, when kept, so the TAC of any step subset can be formed
    later without running the trajectory again (:func:`pool_with_tac_steps`); step_roi_js: per
    step, the mean JS over the predicted-foreground ROI the agreement score uses (so the agreement
    of any step subset is exact: Eq. 5 is linear in the TAC). patient: the patient the volume
    belongs to (held-out splits keep a patient's items together; empty: use ``case``). spatial:
    the ROI box with the image, for the convolutional calibrators (LTS, CalibNet), when built
    with ``spatial=True`` (:mod:`cardseg_train.calibration.spatial`).
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
            raise ValueError(
                f"PoolItem needs logits (K, n), labels (n,), tac (n,); got {self.logits.shape}, "
                f"{self.labels.shape}, {self.tac.shape}"
            )
        if self.step_js is not None:
            self.step_js = np.asarray(self.step_js, dtype=np.float32)
            self.steps = [int(t) for t in (self.steps or [])]
            if self.step_js.shape != (len(self.steps), self.labels.shape[0]):
                raise ValueError(
                    f"PoolItem step_js must be (len(steps), n), got {self.step_js.shape} for "
                    f"{len(self.steps)} steps and n = {self.labels.shape[0]}"
                )


@dataclass(frozen=True)
class PoolItemMeta:
    """What a :class:`PoolItem` records about its volume besides the pixels (the fields of the
    same names there): case, variant, agreement, step_roi_js and patient."""

    case: str = ""
    variant: str = "clean"
    agreement: Optional[float] = None
    step_roi_js: Optional[List[float]] = None
    patient: str = ""


def pool_item(
    logits: np.ndarray,
    tac: np.ndarray,
    labels: np.ndarray,
    roi: np.ndarray,
    rng: Optional[np.random.Generator] = None,
    max_pixels: Optional[int] = None,
    step_js: Optional[Dict[int, np.ndarray]] = None,
    meta: PoolItemMeta = PoolItemMeta(),
) -> PoolItem:
    """Gather the ROI pixels of a volume: logits ``(Z, K, Y, X)``, tac/labels/roi ``(Z, Y, X)``,
    step_js ``{t: (Z, Y, X)}`` (optional); ``meta`` goes into the item as it is.

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
    return PoolItem(
        z,
        y,
        t,
        case=meta.case,
        variant=meta.variant,
        agreement=meta.agreement,
        step_js=js,
        steps=steps,
        step_roi_js=meta.step_roi_js,
        patient=meta.patient,
    )


def pool_with_tac_steps(pool: Sequence[PoolItem], tac_steps: Optional[Sequence[int]]) -> List[PoolItem]:
    """The pool with each item's TAC re-formed over ``tac_steps`` (paper Eq. 7 with another step
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


def engine_card_outputs(
    bundle, slices01: np.ndarray, spacing_xy: Tuple[float, float], device="cpu", batch_size: int = 8
) -> Tuple[np.ndarray, np.ndarray, Dict[int, np.ndarray], tuple, np.ndarray]:
    """The dual trajectory on already normalised slices: ``(logits (Z, K, Y, X), tac (Z, Y, X),
    {t: JS (Z, Y, X)} for each sampled step, the network grid's offset, its field of view (Y, X)
    bool)`` (the grid the engine kept).

    A perturbation must act on the network's own ``[0, 1]`` input scale: the engine's robust
    per-slice min-max normalisation would otherwise undo any affine change (a contrast factor
    below 1 would be a no-op) and rescale added noise. So the pool normalises first
    (:func:`cardseg.segment.normalized_slices`), perturbs, then calls the engine's
    :func:`cardseg.segment.trajectory_on_slices`.
    """
    from cardseg.segment import SegmentOptions, trajectory_on_slices

    traj = trajectory_on_slices(
        np.asarray(slices01, dtype=np.float32),
        tuple(spacing_xy),
        bundle,
        SegmentOptions(method="card", device=device, batch_size=batch_size),
        keep_step_js=True,
    )
    return (
        traj.logits.numpy(),
        traj.tac.numpy(),
        {t: js.numpy() for t, js in traj.step_js.items()},
        traj.offset,
        traj.fov,
    )


@dataclass(frozen=True)
class PoolOptions:
    """How :func:`build_pool` builds a pool.

    variants: the perturbations (:data:`~cardseg_train.data.perturb.POOL_VARIANTS` names, ``clean``
    for the volume as it is); roi_radius: the ROI's dilation of the ground-truth foreground, pixels;
    max_pixels_per_item: the most ROI pixels kept per item (``None``: all); seed: seeds the
    perturbations, the pixel draws and the augmentations; device / batch_size: where and how many
    slices per call the networks run; draws: how often each perturbation is drawn per volume;
    spatial: also keep each item's ROI box (LTS, CalibNet); augmentations: the primary also runs on
    that many photometric augmentations of each item's image (CalibNet; needs ``spatial``);
    crop_margin: pixels of the ROI box around the ROI."""

    variants: Sequence[str] = POOL_VARIANTS
    roi_radius: int = 10
    max_pixels_per_item: Optional[int] = 30_000
    seed: int = 0
    device: "torch.device | str" = "cpu"
    batch_size: int = 8
    draws: int = 1
    spatial: bool = False
    augmentations: int = 0
    crop_margin: int = CROP_MARGIN


def build_pool(
    bundle, cases, options: PoolOptions = PoolOptions(), progress: Optional[Callable[[str], None]] = None
) -> List[PoolItem]:
    """Run the dual trajectory on every case and variant and keep its ROI pixels.

    cases: :class:`~cardseg_train.evaluation.segmentation.LabelledVolume` items (source validation only).
    Each volume is normalised per slice as the engine does (the bundle's percentiles), then
    perturbed (:func:`perturb_image`, generator seeded by ``(seed, case, variant)``; ``clean``
    is left as is) and run through :func:`engine_card_outputs`. The ROI is the ground-truth
    foreground dilated by ``roi_radius`` pixels (per slice, disk), as in the metrics; at most
    ``max_pixels_per_item`` of its pixels are kept (seeded), none outside the networks' field of view,
    for any method (the crops too): there the engine makes the pixels background without the networks,
    so no calibrator's output is fitted on them (CARD gives them ``tau_min``); each perturbation is drawn ``draws``
    times per volume (draw 0 keeps the generator of a single-draw pool). Each item records the volume
    agreement score the engine would report (Eq. 5 over the predicted foreground's ROI,
    dilated by the bundle's ``agreement.roi_dilation_px``).

    ``spatial``: each item also keeps its ROI box (:func:`~cardseg_train.calibration.spatial.spatial_item`,
    ``crop_margin`` pixels around the ROI) for LTS and CalibNet; ``augmentations`` (needs
    ``spatial``): the primary also runs on that many photometric augmentations of the item's
    image, for CalibNet's mean and standard deviation of the logits (generator seeded by
    ``(seed, case, "calibnet-aug:" variant)``, apart from the pool's own draws, so the pixel
    vectors are the same with or without crops). ``progress`` gets one line per item.
    """
    from cardseg.metrics.segmentation import roi_mask
    from cardseg.segment import normalized_slices

    if options.augmentations and not options.spatial:
        raise ValueError("augmentation statistics are kept with the spatial crops: pass spatial=True")

    pool = []
    for case in cases:
        roi = roi_mask(case.labels > 0, options.roi_radius)
        norm = normalized_slices(case.volume, bundle)
        jobs = [(v, k) for v in options.variants for k in range(1 if v == "clean" else max(1, options.draws))]
        for variant, draw in jobs:
            pool.append(_variant_item(bundle, case, norm, roi, variant, draw, options))
            if progress is not None:
                progress(f"{case.case} {variant}: {pool[-1].labels.shape[0]} px, agreement {pool[-1].agreement}")
    return pool


def _variant_item(
    bundle, case, norm: np.ndarray, roi: np.ndarray, variant: str, draw: int, options: PoolOptions
) -> PoolItem:
    """One pool item of :func:`build_pool`: draw ``draw`` of ``variant`` of the case's normalised
    slices ``norm`` ``(Z, Y, X)`` through the engine, its in-view ROI pixels and, with
    ``options.spatial``, its ROI box (with the augmentation statistics where asked)."""
    from cardseg.method.agreement import agreement_score
    from cardseg.metrics.segmentation import roi_mask

    from cardseg_train.calibration.spatial import spatial_item
    from cardseg_train.data.corruptions import corruption_rng

    tag = variant + (f":{draw}" if draw else "")
    rng = corruption_rng(case.case, f"pool:{tag}", options.seed)
    img = norm if variant == "clean" else perturb_image(norm, variant, rng)
    spacing = tuple(case.volume.spacing[:2])
    logits, tac, step_js, offset, fov = engine_card_outputs(bundle, img, spacing, options.device, options.batch_size)
    agreement_radius = int(bundle.config.get("agreement", {}).get("roi_dilation_px", 10))
    pred_roi = roi_mask(logits.argmax(axis=1) > 0, agreement_radius)
    agreement = agreement_score(tac, pred_roi)
    step_roi_js = [float(js[pred_roi].mean()) for js in step_js.values()] if pred_roi.any() else None
    in_view = roi & fov  # what the engine decides without the networks is no calibrator's to fit
    patient = str(getattr(case, "patient", "") or "")
    meta = PoolItemMeta(case.case, variant, agreement, step_roi_js, patient)
    item = pool_item(logits, tac, case.labels, in_view, rng, options.max_pixels_per_item, step_js, meta)
    if options.spatial:
        item.spatial = spatial_item(logits, img, case.labels, in_view, tac, options.crop_margin)
        if options.augmentations:
            aug_rng = corruption_rng(case.case, f"calibnet-aug:{tag}", options.seed)
            _add_augmentation_stats(item.spatial, bundle, img, spacing, offset, aug_rng, options)
    return item


def _add_augmentation_stats(
    sp: SpatialItem,
    bundle,
    img: np.ndarray,
    spacing: Tuple[float, float],
    offset: tuple,
    rng: np.random.Generator,
    options: PoolOptions,
) -> None:
    """Fill the ROI box's CalibNet statistics: the mean and standard deviation of the primary's
    logits over ``options.augmentations`` photometric augmentations (drawn from ``rng``) of
    ``img`` ``(Z, Y, X)``, run on the engine's grid (``spacing``, ``offset``) as the item was."""
    from cardseg_train.calibration.spatial import augmentation_stats, engine_primary_logits

    sp.aug_mean, sp.aug_std = augmentation_stats(
        engine_primary_logits(bundle, spacing, options.device, options.batch_size, offset),
        img,
        sp.box,
        options.augmentations,
        rng,
    )
    sp.augmentations = int(options.augmentations)


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
    return {
        "flag_threshold": pixel_flag_threshold(np.concatenate([it.tac for it in clean]), quantile),
        "out_of_domain_threshold": ood_agreement_threshold([it.agreement for it in clean], margin),
    }
