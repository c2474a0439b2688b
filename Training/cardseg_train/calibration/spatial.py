"""Spatial crops for the convolutional calibrators (LTS, CalibNet).

The fitting pool (:class:`~cardseg_train.calibration.pool.PoolItem`) and the evaluation cache
(:class:`~cardseg_train.calibration.harness.CaseResult`) hold the ROI pixels of a volume as vectors
``(K, n)``: enough for TS, ETS, HTS, CARD and PTS, which read one pixel at a time, but not for a
network that reads a neighbourhood and the image. A :class:`SpatialItem` adds what those need:
one box around the volume's ROI (the slices holding ROI pixels, the ROI's in-plane bounding box
widened by :data:`CROP_MARGIN` pixels, clipped to the image) with the terminal logits, the
network input image, the labels, the ROI mask and the TAC inside it, and, for CalibNet, the
mean and standard deviation of the primary's logits over photometric augmentations of the
image (:func:`augmentation_stats`). Everything is on the volume's own grid, as the pixel vectors.

The ROI pixels of a crop, read in C order (``crop[..., roi]``), are exactly the pixel vectors of
the same volume in the same order (cropping keeps the lexicographic order of ``(z, y, x)``), so a
spatial calibrator's probabilities line up with every other method's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from cardseg.method.calibration import Calibrator
from cardseg.method.calibration.calibnet import AUGMENTATION_KINDS, AUGMENTATION_NOISE_SIGMA

from cardseg_train.data.perturb import apply_perturbation, perturbation_params

#: pixels kept around the ROI's bounding box (at least the calibrators' receptive field radius:
#: 16 for the default LTS, 16 + 4 for the default CalibNet, whose outer pixels see zero padding)
CROP_MARGIN = 16
#: log-probabilities are floored here in every NLL, as the NLL metric does
LOG_FLOOR = math.log(1e-12)


@dataclass
class SpatialItem:
    """The ROI box of one volume (one variant or condition), on the volume's grid.

    box: ``(z0, z1, y0, y1, x0, x1)``, half-open; logits ``(Z', K, h, w)`` float32; image
    ``(Z', h, w)`` float32 (the normalised network input, after any perturbation or corruption);
    labels ``(Z', h, w)`` uint8; roi ``(Z', h, w)`` bool; tac ``(Z', h, w)`` float32 or None;
    aug_mean / aug_std ``(Z', K, h, w)`` float32 over ``augmentations`` augmented runs (None, 0
    when not computed).
    """

    box: Tuple[int, int, int, int, int, int]
    logits: np.ndarray
    image: np.ndarray
    labels: np.ndarray
    roi: np.ndarray
    tac: Optional[np.ndarray] = None
    aug_mean: Optional[np.ndarray] = None
    aug_std: Optional[np.ndarray] = None
    augmentations: int = 0

    def __post_init__(self):
        self.box = tuple(int(v) for v in self.box)
        self.logits = np.asarray(self.logits, dtype=np.float32)
        self.image = np.asarray(self.image, dtype=np.float32)
        self.labels = np.asarray(self.labels, dtype=np.uint8)
        self.roi = np.asarray(self.roi, dtype=bool)
        shape = self.labels.shape
        if (
            self.logits.ndim != 4
            or self.logits.shape[:1] + self.logits.shape[2:] != shape
            or self.image.shape != shape
            or self.roi.shape != shape
        ):
            raise ValueError(
                f"SpatialItem needs logits (Z, K, h, w) and image/labels/roi (Z, h, w); got "
                f"{self.logits.shape}, {self.image.shape}, {shape}, {self.roi.shape}"
            )
        if self.tac is not None:
            self.tac = np.asarray(self.tac, dtype=np.float32).reshape(shape)
        for key in ("aug_mean", "aug_std"):
            if getattr(self, key) is not None:
                setattr(self, key, np.asarray(getattr(self, key), dtype=np.float32).reshape(self.logits.shape))

    @property
    def pixels(self) -> int:
        return int(self.roi.sum())


def crop_box(roi: np.ndarray, margin: int = CROP_MARGIN) -> Tuple[int, int, int, int, int, int]:
    """The box of :class:`SpatialItem` for a ``(Z, Y, X)`` ROI mask (which must not be empty)."""
    zz, yy, xx = np.nonzero(roi)
    if zz.size == 0:
        raise ValueError("empty ROI: nothing to crop")
    z, y, x = roi.shape
    return (
        int(zz.min()),
        int(zz.max()) + 1,
        max(int(yy.min()) - margin, 0),
        min(int(yy.max()) + 1 + margin, y),
        max(int(xx.min()) - margin, 0),
        min(int(xx.max()) + 1 + margin, x),
    )


def spatial_item(
    logits: np.ndarray,
    image: np.ndarray,
    labels: np.ndarray,
    roi: np.ndarray,
    tac: Optional[np.ndarray] = None,
    margin: int = CROP_MARGIN,
) -> SpatialItem:
    """Crop a volume's logits ``(Z, K, Y, X)``, image, labels, roi and tac ``(Z, Y, X)``."""
    box = crop_box(roi, margin)
    z0, z1, y0, y1, x0, x1 = box
    cut = (slice(z0, z1), slice(y0, y1), slice(x0, x1))
    return SpatialItem(
        box,
        np.asarray(logits)[cut[0], :, cut[1], cut[2]],
        np.asarray(image)[cut],
        np.asarray(labels)[cut],
        np.asarray(roi)[cut],
        None if tac is None else np.asarray(tac)[cut],
    )


# --------------------------------------------------------------------------------------------
# CalibNet's augmentation response


def calibnet_augmentation(img01: np.ndarray, j: int, rng: np.random.Generator) -> np.ndarray:
    """Augmentation ``j`` of a ``[0, 1]`` image or volume: kind ``AUGMENTATION_KINDS[j % 3]``
    (contrast or gamma factor drawn from ``[0.6, 1.5]``, or Gaussian noise of sigma 0.15)."""
    kind = AUGMENTATION_KINDS[j % len(AUGMENTATION_KINDS)]
    params = {"sigma": AUGMENTATION_NOISE_SIGMA} if kind == "noise" else perturbation_params(kind, rng)
    return apply_perturbation(img01, kind, params, rng)


def augmentation_stats(
    run_logits: Callable[[np.ndarray], np.ndarray],
    img01: np.ndarray,
    box: Sequence[int],
    n: int,
    rng: np.random.Generator,
) -> Tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation ``(Z', K, h, w)`` over ``n`` augmentations of the primary's
    terminal logits inside ``box``.

    img01: the volume's network input ``(Z, Y, X)`` (as it went into the trajectory); each
    augmentation acts on the whole volume (:func:`calibnet_augmentation`, parameters drawn from
    ``rng``), then ``run_logits`` runs the primary on the box's slices only
    (``(Z', Y, X)`` → logits ``(Z', K, Y, X)``).
    """
    z0, z1, y0, y1, x0, x1 = (int(v) for v in box)
    runs = []
    for j in range(int(n)):
        aug = calibnet_augmentation(img01, j, rng)[z0:z1]
        runs.append(np.asarray(run_logits(aug), dtype=np.float32)[:, :, y0:y1, x0:x1])
    stack = np.stack(runs)
    return stack.mean(axis=0), stack.std(axis=0)


def engine_primary_logits(
    bundle, spacing_xy, device="cpu", batch_size: int = 8, offset: Tuple[float, float] = (0.0, 0.0)
) -> Callable[[np.ndarray], np.ndarray]:
    """``slices01 (Z, Y, X)`` → the primary's terminal logits ``(Z, K, Y, X)`` (``uc``, no reference) on
    the network grid at ``offset`` (the clean run's: an augmented copy never chooses a grid of its own)."""
    from cardseg.base.progress import Progress
    from cardseg.segment import SegmentOptions, run_on_grid, slice_grid

    def run(slices01: np.ndarray) -> np.ndarray:
        s01 = np.ascontiguousarray(slices01, dtype=np.float32)
        traj = run_on_grid(
            slice_grid(s01.shape[1:], tuple(spacing_xy), bundle, offset),
            s01,
            bundle,
            SegmentOptions(method="uc", device=device, batch_size=batch_size, progress=Progress()),
        )
        return np.asarray(traj.logits)

    return run


# --------------------------------------------------------------------------------------------
# applying any calibrator to crops


def crop_inputs(cal: Calibrator, sp: SpatialItem) -> Dict[str, torch.Tensor]:
    """The extra inputs ``cal`` needs, as tensors, from a crop (``ValueError`` if it lacks them)."""
    out = {}
    for key in cal.needs_inputs:
        value = getattr(sp, key, None)
        if value is None:
            raise ValueError(
                f"the {cal.name} calibration needs {key} and these crops have none "
                f"(rebuild them with augmentations for CalibNet)"
            )
        if key.startswith("aug_") and sp.augmentations != getattr(cal, "augmentations", sp.augmentations):
            raise ValueError(
                f"{cal.name} was fitted with {cal.augmentations} augmentations, the crops hold {sp.augmentations}"
            )
        out[key] = torch.from_numpy(np.ascontiguousarray(value))
    return out


def crop_log_probs(cal: Calibrator, sp: SpatialItem) -> torch.Tensor:
    """``cal`` on a whole crop: log-probabilities ``(Z', K, h, w)`` float32 (any calibrator)."""
    z = torch.from_numpy(np.ascontiguousarray(sp.logits))
    tac = None
    if cal.needs_tac:
        if sp.tac is None:
            raise ValueError(f"the {cal.name} calibration needs the TAC and these crops have none")
        tac = torch.from_numpy(np.ascontiguousarray(sp.tac))
    with torch.no_grad():
        return cal.log_probs(z, tac, **crop_inputs(cal, sp)).float().cpu()


def crop_roi_probs(cal: Calibrator, sp: SpatialItem) -> np.ndarray:
    """Probabilities ``(n, K)`` of the crop's ROI pixels, in the pixel vectors' order."""
    lp = crop_log_probs(cal, sp)
    return lp.permute(1, 0, 2, 3)[:, torch.from_numpy(sp.roi)].T.exp().numpy()


def crop_nll(cal: Calibrator, items: Sequence[SpatialItem]) -> float:
    """Mean NLL over every ROI pixel of the crops (``log q`` floored at ``log 1e-12``)."""
    total, count = 0.0, 0
    for sp in items:
        lp = crop_log_probs(cal, sp).double()
        roi = torch.from_numpy(sp.roi)
        y = torch.from_numpy(sp.labels.astype(np.int64))[roi]
        picked = lp.permute(1, 0, 2, 3)[:, roi].T[torch.arange(y.numel()), y]
        total += float(-picked.clamp_min(LOG_FLOOR).sum())
        count += y.numel()
    if count == 0:
        raise ValueError("no ROI pixels in the crops")
    return total / count


# --------------------------------------------------------------------------------------------
# storage (npz arrays plus a JSON-able header, no pickles)

_ARRAYS = ("logits", "image", "labels", "roi", "tac", "aug_mean", "aug_std")


def spatial_arrays(sp: SpatialItem, suffix: str = "") -> Tuple[Dict[str, np.ndarray], dict]:
    """``({f"sp_{name}{suffix}": array}, meta)`` for an ``.npz`` and its JSON index."""
    arrays = {f"sp_{k}{suffix}": getattr(sp, k) for k in _ARRAYS if getattr(sp, k) is not None}
    return arrays, {"box": list(sp.box), "augmentations": sp.augmentations}


def spatial_from_arrays(f, meta: Optional[dict], suffix: str = "") -> Optional[SpatialItem]:
    """The inverse of :func:`spatial_arrays` (``f``: an open ``np.load`` file); None without meta."""
    if not meta:
        return None
    get = {k: (f[f"sp_{k}{suffix}"] if f"sp_{k}{suffix}" in f.files else None) for k in _ARRAYS}
    return SpatialItem(tuple(meta["box"]), augmentations=int(meta.get("augmentations", 0)), **get)
