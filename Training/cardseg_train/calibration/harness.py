"""The calibration harness behind ``cardseg evaluate``: methods x conditions, as the paper's Table I.

For every labelled volume of a split and every condition (``clean`` and the four ACDC-C
corruptions of :mod:`cardseg_train.data.corruptions`), the bundle's dual trajectory runs once
(:func:`run_case`) and what the metrics need is kept in a :class:`CaseResult`: the terminal
primary logits, the TAC map and the labels of the ROI pixels, Dice per class, the LCC ratio,
and per slice the agreement and Dice. Each result is cached on disk as soon as it exists, so an
interrupted evaluation resumes where it stopped (:class:`CaseCache`).

Every calibrator (UC, TS, ETS, HTS and, when fitted and asked for, PTS, LTS and CalibNet from
``bundle.json``'s fitted ``baselines``, and CARD) is then applied to the same cached logits
(:func:`calibration_table`): one interface, backbone-matched baselines. LTS and CalibNet read the
image and each pixel's neighbourhood, which the ROI pixel vectors lack: for them each result
also keeps its ROI box (:class:`~cardseg_train.calibration.spatial.SpatialItem`, with CalibNet's
augmentation statistics when asked), their probabilities are computed on the box and read at the
same ROI pixels, in the same order. Definitions used everywhere (fitting, evaluation, tests):

* ROI: the ground-truth foreground dilated per slice by a disk of radius 10 px, on the volume's
  own grid (:func:`cardseg.metrics.segmentation.roi_mask`), the default (``disk10``); the literal
  "10-pixel kernel" reading, a 10 x 10 square (``square10``, a subset of it), is kept beside as a
  mask over the same pixels (:data:`ROIS`).
* ECE (top-label), SCE, ACE with 10 bins and NLL, pooled over all ROI pixels of all volumes of a
  condition (:class:`cardseg.metrics.calibration.CalibrationAccumulator`); per-volume means are
  reported beside them.
* ACDC-C block NLL of a method (the paper's): the mean over *all* conditions, clean included, of
  its pooled NLL, each condition weighing the same (``mean_nll``); the artifacts-only mean
  (clean left out) is reported beside it as ``artifacts_only_nll``.
* LCC ratio (paper Fig. 2a) per 2D slice, averaged over the slices with predicted foreground,
  for the primary's and the reference's terminal predictions.
* Agreement (paper Eq. 5) over the same ROI, per volume and per slice; agreement versus Dice is
  per slice, skipping slices without ground-truth foreground, with Pearson r (paper Fig. 2b).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from cardseg.method.calibration import Calibrator, calibrator_from_dict, method_label
from cardseg.metrics.calibration import CalibrationAccumulator, calibration_metrics
from cardseg.base.errors import CardsegError
from cardseg.method.agreement import agreement_score
from cardseg.metrics.segmentation import mean_slice_lcc_ratio, roi_mask, roi_mask_square
from cardseg.base.progress import Progress

from cardseg_train.calibration.spatial import (
    SpatialItem,
    augmentation_stats,
    crop_roi_probs,
    engine_primary_logits,
    spatial_arrays,
    spatial_from_arrays,
    spatial_item,
)
from cardseg_train.data.corruptions import corrupt_labelled_volume, corruption_rng
from cardseg_train.base.stats import mean_finite as _mean
from cardseg_train.base.stats import pearson_r
from cardseg_train.evaluation.segmentation import LabelledVolume, dice_score

#: condition name -> corruption kind (None: the volume as it is)
CONDITIONS: Dict[str, Optional[str]] = {
    "clean": None,
    "bias": "bias_field",
    "motion": "motion",
    "ghost": "ghosting",
    "spike": "spike",
}
#: every condition ``--conditions`` may name: the defaults above (the ``inplane`` corruption
#: protocol) and the same four corruptions under the ``tio3d`` protocol (TorchIO's default 3D
#: transforms, the paper's literal reading: :mod:`cardseg_train.data.corruptions`), as ``tio3d:<name>``
ALL_CONDITIONS: Dict[str, Optional[str]] = {**CONDITIONS, **{f"tio3d:{k}": v for k, v in CONDITIONS.items() if v}}
#: the calibrators compared by default, in table order
METHODS = ("uc", "ts", "ets", "hts", "card")
#: every calibrator ``--methods`` can name (the network ones once fit-calibration fitted them)
ALL_METHODS = METHODS + ("pts", "lts", "calibnet")
#: the post-hoc baselines CARD is compared against (``card_vs_best_post_hoc``)
POST_HOC = ("ts", "ets", "hts", "pts", "lts", "calibnet")
#: ROI radius of the metrics, pixels of the volume's own grid
ROI_RADIUS = 10
#: the ROIs a table can be computed over: the default disk of radius 10, and the 10 x 10 square
ROIS = ("disk10", "square10")
#: bump when what a cached case holds, or how it is computed, changes
CACHE_VERSION = 5  # 5: ROI pixels outside the field of view recorded (CARD: tau_min there)


@dataclass
class CaseResult:
    """What the metrics need from one volume under one condition.

    logits ``(K, n)`` float32, tac ``(n,)`` float32 and labels ``(n,)`` uint8 are the ROI pixels
    (ROI as in the module docstring); dice: per foreground class name (NaN when the class is
    absent from both); slice_agreement / slice_dice: per slice with ground-truth foreground
    (Eq. 5 over that slice's ROI; mean Dice over the classes present in it or the prediction);
    spatial: the ROI box for LTS and CalibNet, when asked for.
    """

    case: str
    patient: str
    condition: str
    logits: np.ndarray
    tac: np.ndarray
    labels: np.ndarray
    dice: Dict[str, float] = field(default_factory=dict)
    lcc: Optional[float] = None
    lcc_reference: Optional[float] = None
    agreement: Optional[float] = None
    slice_index: List[int] = field(default_factory=list)
    slice_agreement: List[float] = field(default_factory=list)
    slice_dice: List[float] = field(default_factory=list)
    spatial: Optional[SpatialItem] = None
    #: each sampled step's JS map at the ROI pixels ``(S, n)`` float16, rows in ``js_steps`` order
    #: (the TAC over any step subset, for the TAC-last / TAC-mid ablations, without a new run)
    step_js: Optional[np.ndarray] = None
    js_steps: List[int] = field(default_factory=list)
    #: ``(n,)`` bool: which ROI pixels also lie in the 10 x 10 square-kernel ROI (``square10``)
    roi_square: Optional[np.ndarray] = None
    #: ``(n,)`` bool: the ROI pixels outside the networks' field of view (CARD gives them ``tau_min``,
    #: as the engine does); None when there are none
    outside_view: Optional[np.ndarray] = None

    def roi_pixels(self, roi: str = "disk10") -> Optional[np.ndarray]:
        """Selector of the ROI pixels of ``roi`` among the cached ones (None: all of them)."""
        if roi == "disk10":
            return None
        if roi == "square10" and self.roi_square is not None:
            return self.roi_square
        raise CardsegError(f"{self.case} {self.condition}: no {roi!r} ROI cached (choose from {', '.join(ROIS)})")

    def tac_over(self, steps: Optional[Sequence[int]]) -> np.ndarray:
        """The TAC (Eq. 7) over ``steps`` at the ROI pixels ``(n,)``; None: the cached TAC."""
        if steps is None:
            return self.tac
        if self.step_js is None:
            raise CardsegError(f"{self.case} {self.condition}: no per-step JS cached (rerun evaluate)")
        rows = [self.js_steps.index(int(t)) for t in steps]
        return self.step_js[rows].astype(np.float32).mean(axis=0)

    def has_crops(self, augmentations: int = 0) -> bool:
        """Whether the result holds the ROI box (with that many augmentations) or needs none."""
        if self.labels.size == 0:
            return True
        return self.spatial is not None and (not augmentations or self.spatial.augmentations == augmentations)

    def meta(self) -> dict:
        return {
            "case": self.case,
            "patient": self.patient,
            "condition": self.condition,
            "dice": self.dice,
            "lcc": self.lcc,
            "lcc_reference": self.lcc_reference,
            "agreement": self.agreement,
            "slice_index": self.slice_index,
            "slice_agreement": self.slice_agreement,
            "slice_dice": self.slice_dice,
            "js_steps": self.js_steps,
        }


def condition_volume(item: LabelledVolume, condition: str, seed: int = 0) -> LabelledVolume:
    """The volume under ``condition`` (corruptions seeded per case, labels untouched)."""
    if condition not in ALL_CONDITIONS:
        raise CardsegError(f"unknown condition {condition!r} (choose from {', '.join(ALL_CONDITIONS)})")
    kind = ALL_CONDITIONS[condition]
    protocol = "tio3d" if condition.startswith("tio3d:") else "inplane"
    return item if kind is None else corrupt_labelled_volume(item, kind, seed, protocol)


def slice_dice(pred: np.ndarray, truth: np.ndarray, num_classes: int) -> float:
    """Mean Dice over foreground classes present in either 2D map (NaN when none is)."""
    scores = [dice_score(pred, truth, k) for k in range(1, num_classes)]
    scores = [s for s in scores if not math.isnan(s)]
    return float(np.mean(scores)) if scores else float("nan")


class CaseMaps(NamedTuple):
    """One volume's trajectory outputs on its own grid: the primary's terminal logits ``(Z, K, Y, X)``,
    the TAC ``(Z, Y, X)``, the reference's terminal logits ``(Z, K, Y, X)`` (``None``: not kept) and
    the networks' field of view ``(Y, X)`` bool (``None``: everywhere)."""

    logits: np.ndarray
    tac: np.ndarray
    reference_logits: Optional[np.ndarray] = None
    field_of_view: Optional[np.ndarray] = None


def summarize_case(
    case: str,
    patient: str,
    condition: str,
    maps: CaseMaps,
    labels: np.ndarray,
    class_names: Sequence[str],
    roi_radius: int = ROI_RADIUS,
) -> CaseResult:
    """Reduce one volume's trajectory outputs ``maps`` to a :class:`CaseResult`; labels
    ``(Z, Y, X)`` on the volume's own grid, as the maps."""
    logits, tac, reference_logits, field_of_view = maps
    k = len(class_names)
    if logits.shape[1] != k or logits.shape[:1] + logits.shape[2:] != labels.shape or tac.shape != labels.shape:
        raise ValueError(f"shapes disagree: logits {logits.shape}, tac {tac.shape}, labels {labels.shape}")
    pred = logits.argmax(axis=1)
    roi = roi_mask(labels > 0, roi_radius)
    z_roi = np.moveaxis(logits, 1, 0)[:, roi].astype(np.float32)
    res = CaseResult(case, patient, condition, z_roi, tac[roi].astype(np.float32), labels[roi].astype(np.uint8))
    res.roi_square = roi_mask_square(labels > 0, roi_radius)[roi]
    if field_of_view is not None and not np.asarray(field_of_view, bool).all():
        outside = np.broadcast_to(~np.asarray(field_of_view, bool), labels.shape)[roi]
        res.outside_view = outside if outside.any() else None
    res.dice = {name: dice_score(pred, labels, i) for i, name in enumerate(class_names) if i}
    res.lcc = mean_slice_lcc_ratio(pred > 0)
    if reference_logits is not None:
        res.lcc_reference = mean_slice_lcc_ratio(reference_logits.argmax(axis=1) > 0)
    res.agreement = agreement_score(tac, roi)
    for zi in range(labels.shape[0]):
        if not (labels[zi] > 0).any():
            continue
        res.slice_index.append(zi)
        res.slice_agreement.append(float(agreement_score(tac[zi], roi[zi])))
        res.slice_dice.append(slice_dice(pred[zi], labels[zi], k))
    return res


@dataclass(frozen=True)
class CaseRunOptions:
    """How :func:`run_case` runs one volume under one condition.

    seed: seeds the corruption and the augmentations; device / batch_size: where the networks run
    and how many slices per call; roi_radius: the ROI's dilation of the ground-truth foreground,
    pixels; spatial: also keep the ROI box (LTS, CalibNet); augmentations: with CalibNet's logit
    statistics over that many augmentations; mode: ``card`` (the dual trajectory) or ``logit-mix``
    (the paper's Logit Mix ablation)."""

    seed: int = 0
    device: "torch.device | str" = "cpu"
    batch_size: int = 8
    roi_radius: int = ROI_RADIUS
    spatial: bool = False
    augmentations: int = 0
    mode: str = "card"


def run_case(bundle, item: LabelledVolume, condition: str, options: CaseRunOptions = CaseRunOptions()) -> CaseResult:
    """Corrupt (if asked), normalise as the engine does, run the dual trajectory, summarise.

    ``options.mode`` ``logit-mix`` runs the paper's Logit Mix ablation instead (the mixed logits, TAC 0).

    ``options.spatial``: also keep the ROI box (LTS, CalibNet); ``options.augmentations``: with
    CalibNet's logit statistics over that many augmentations (seeded by ``(seed, case,
    "calibnet-aug:" condition)``).
    """
    from cardseg.segment import SegmentOptions, normalized_slices, trajectory_on_slices

    vol = condition_volume(item, condition, options.seed)
    slices01 = normalized_slices(vol.volume, bundle)
    spacing = tuple(vol.volume.spacing[:2])
    if options.mode == "logit-mix":
        return _logit_mix_case(bundle, item, condition, slices01, spacing, options)
    if options.mode != "card":
        raise ValueError(f"run_case mode must be card or logit-mix, not {options.mode!r}")
    traj = trajectory_on_slices(
        slices01,
        spacing,
        bundle,
        SegmentOptions(method="card", device=options.device, batch_size=options.batch_size),
        with_reference=True,
        keep_step_js=True,
    )
    logits, tac = traj.logits.numpy(), traj.tac.numpy()
    maps = CaseMaps(logits, tac, traj.reference_logits.numpy(), traj.fov)
    res = summarize_case(item.case, item.patient, condition, maps, item.labels, bundle.class_names, options.roi_radius)
    roi = roi_mask(item.labels > 0, options.roi_radius)
    res.js_steps = [int(t) for t in traj.step_js]
    res.step_js = np.stack([traj.step_js[t].numpy()[roi] for t in res.js_steps]).astype(np.float16)
    if (options.spatial or options.augmentations) and roi.any():
        res.spatial = spatial_item(logits, slices01, item.labels, roi, tac)
        if options.augmentations:
            _add_augmentation_stats(res, bundle, slices01, spacing, traj.offset, options)
    return res


def _logit_mix_case(
    bundle, item: LabelledVolume, condition: str, slices01: np.ndarray, spacing: tuple, options: CaseRunOptions
) -> CaseResult:
    """:func:`run_case` in ``logit-mix`` mode: the mixed logits of the normalised slices
    ``slices01`` ``(Z, Y, X)`` summarised with a TAC of 0."""
    from cardseg.segment import SegmentOptions, trajectory_on_slices

    traj = trajectory_on_slices(
        slices01,
        spacing,
        bundle,
        SegmentOptions(method="logit-mix", device=options.device, batch_size=options.batch_size),
    )
    maps = CaseMaps(traj.logits.numpy(), np.zeros(item.labels.shape, np.float32))
    return summarize_case(item.case, item.patient, condition, maps, item.labels, bundle.class_names, options.roi_radius)


def _add_augmentation_stats(
    res: CaseResult, bundle, slices01: np.ndarray, spacing: tuple, offset: tuple, options: CaseRunOptions
) -> None:
    """Fill the result's ROI box with CalibNet's statistics: the mean and standard deviation of the
    primary's logits over ``options.augmentations`` augmentations of ``slices01`` ``(Z, Y, X)``, run
    on the trajectory's grid (``spacing``, ``offset``)."""
    res.spatial.aug_mean, res.spatial.aug_std = augmentation_stats(
        engine_primary_logits(bundle, spacing, options.device, options.batch_size, offset),
        slices01,
        res.spatial.box,
        options.augmentations,
        corruption_rng(res.case, f"calibnet-aug:{res.condition}", options.seed),
    )
    res.spatial.augmentations = int(options.augmentations)


def evaluation_settings(data: str, split: str, seed: int, h5_spacing: float, bundle) -> dict:
    """What keys the per-case cache beside the bundle's weights (``evaluate`` and ``ablate`` alike):
    the data and everything of the bundle that shapes the maps (:mod:`cardseg_train.base.cache_identity`)."""
    from cardseg_train.base.cache_identity import maps_identity

    return {
        "data": str(Path(data).resolve()),
        "split": split,
        "seed": seed,
        "h5_spacing": h5_spacing,
        **maps_identity(bundle),
    }


class CaseCache:
    """One ``.npz`` per (case, condition) under ``root/<key>/``; arrays plus a JSON header, no
    pickles; written atomically so an interrupted run never leaves a half file behind."""

    def __init__(self, root: Optional[Path], key: str):
        self.dir = None if root is None else Path(root) / key

    @staticmethod
    def make_key(checksums: Dict[str, str], settings: dict) -> str:
        blob = json.dumps({"weights": checksums, "version": CACHE_VERSION, **settings}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def path(self, case: str, condition: str) -> Optional[Path]:
        return None if self.dir is None else self.dir / f"{case}__{condition.replace(':', '-')}.npz"

    def load(self, case: str, condition: str) -> Optional[CaseResult]:
        p = self.path(case, condition)
        if p is None or not p.is_file():
            return None
        with np.load(p, allow_pickle=False) as f:
            meta = json.loads(bytes(f["meta"]).decode())
            res = CaseResult(logits=f["logits"], tac=f["tac"], labels=f["labels"], **meta)
            if "step_js" in f.files:
                res.step_js = f["step_js"]
            if "roi_square" in f.files:
                res.roi_square = f["roi_square"].astype(bool)
            if "outside_view" in f.files:
                res.outside_view = f["outside_view"].astype(bool)
            if "spatial_meta" in f.files:
                res.spatial = spatial_from_arrays(f, json.loads(bytes(f["spatial_meta"]).decode()))
            return res

    def save(self, res: CaseResult) -> None:
        p = self.path(res.case, res.condition)
        if p is None:
            return
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.stem + ".tmp.npz")
        meta = np.frombuffer(json.dumps(res.meta()).encode(), dtype=np.uint8)
        extra = {}
        if res.spatial is not None:
            extra, sp_meta = spatial_arrays(res.spatial)
            extra["spatial_meta"] = np.frombuffer(json.dumps(sp_meta).encode(), dtype=np.uint8)
        if res.step_js is not None:
            extra["step_js"] = res.step_js
        if res.roi_square is not None:
            extra["roi_square"] = res.roi_square
        if res.outside_view is not None:
            extra["outside_view"] = res.outside_view
        np.savez_compressed(tmp, logits=res.logits, tac=res.tac, labels=res.labels, meta=meta, **extra)
        tmp.replace(p)


def run_cases(
    bundle,
    cases: Sequence[LabelledVolume],
    conditions: Sequence[str],
    cache: CaseCache,
    options: CaseRunOptions = CaseRunOptions(),
    progress: Optional[Progress] = None,
) -> List[CaseResult]:
    """Every (case, condition), from the cache where it is already there (resumable per case), else
    run with ``options`` (:func:`run_case`).

    ``options.spatial`` / ``options.augmentations`` (see :func:`crop_needs`): a cached result without
    the ROI box (or with another number of augmentations) is run again, and cached with it."""
    spatial, augmentations = options.spatial, options.augmentations
    progress = progress or Progress()
    progress.stage("cases x conditions", len(cases) * len(conditions))
    out = []
    for item in cases:
        for condition in conditions:
            res = cache.load(item.case, condition)
            if res is None or ((spatial or augmentations) and not res.has_crops(augmentations)):
                res = run_case(bundle, item, condition, options)
                cache.save(res)
            out.append(res)
            progress.advance(1)
    return out


def bundle_calibrators(bundle, methods: Sequence[str] = METHODS) -> Dict[str, Calibrator]:
    """The fitted calibrators of a bundle: CARD from ``calibration``, the rest from ``baselines``."""
    baselines = bundle.config.get("baselines") or {}
    out = {}
    for m in methods:
        if m == "card":
            if not bundle.config.get("calibration", {}).get("fitted"):
                raise CardsegError(f"{bundle.path}: CARD is not fitted (run cardseg fit-calibration first)")
            out[m] = bundle.calibrator
        elif m == "uc":
            out[m] = calibrator_from_dict({"method": "uc"})
        elif m in baselines:
            out[m] = calibrator_from_dict(baselines[m])
        else:
            raise CardsegError(
                f"{bundle.path}: bundle.json has no fitted {m!r} baseline (run cardseg fit-calibration first)"
            )
    return out


def crop_needs(calibrators: Iterable[Calibrator]) -> Tuple[bool, int]:
    """``(spatial, augmentations)`` the results must hold for these calibrators: the ROI box for
    any spatial one, and CalibNet's number of augmentations (one number for all)."""
    cals = list(calibrators)
    counts = {int(c.augmentations) for c in cals if "aug_mean" in c.needs_inputs}
    if len(counts) > 1:
        raise CardsegError(f"calibrators fitted with different numbers of augmentations: {sorted(counts)}")
    return any(c.spatial for c in cals), (counts.pop() if counts else 0)


def calibrated_probs(cal: Calibrator, res: CaseResult, tac: Optional[np.ndarray] = None) -> np.ndarray:
    """``(n, K)`` probabilities of one case's ROI pixels under ``cal`` (a spatial calibrator runs on
    the result's ROI box and is read at the same pixels); ``tac`` ``(n,)`` replaces the cached TAC
    (e.g. :meth:`CaseResult.tac_over` another step set). CARD gives the pixels outside the networks'
    field of view ``tau_min``, as the engine does."""
    if cal.spatial or cal.needs_inputs:
        if res.labels.size == 0:
            return np.zeros((0, res.logits.shape[0]), dtype=np.float32)
        if res.spatial is None:
            raise CardsegError(
                f"{res.case} {res.condition}: no ROI box cached for {cal.name} (run_cases with CaseRunOptions(spatial=True))"
            )
        return crop_roi_probs(cal, res.spatial)
    z = torch.from_numpy(np.ascontiguousarray(res.logits, dtype=np.float32))[None]
    d = torch.from_numpy(np.ascontiguousarray(res.tac if tac is None else tac, dtype=np.float32))[None]
    if cal.needs_tac and res.outside_view is not None:
        return cal.probabilities(z, d, outside=res.outside_view)[0].T.numpy()
    return cal.probabilities(z, d if cal.needs_tac else None)[0].T.numpy()


class MethodMetrics(NamedTuple):
    """One calibrator's metrics over the results of one condition (see the module docstring):
    ``pooled`` over all ROI pixels, ``per_volume_mean`` (ECE, SCE, ACE, NLL averaged over volumes),
    ``volume_sums`` (per volume: case, patient, pixel count and NLL sum), ``reliability`` (the
    pooled reliability diagram) and ``confidence_histogram`` (its counts per bin)."""

    pooled: dict
    per_volume_mean: Dict[str, float]
    volume_sums: List[dict]
    reliability: dict
    confidence_histogram: list


def method_metrics(cal: Calibrator, results: Sequence[CaseResult], num_classes: int, roi: str) -> MethodMetrics:
    """``cal``'s metrics over the ROI ``roi`` (one of :data:`ROIS`) pixels of ``results``."""
    acc = CalibrationAccumulator(num_classes)
    vols, sums = [], []
    for r in results:
        sel = r.roi_pixels(roi)
        p, lab = calibrated_probs(cal, r), r.labels
        if sel is not None:
            p, lab = p[sel], lab[sel]
        acc.add(p, lab)
        vols.append(calibration_metrics(p, lab))
        sums.append(
            {
                "case": r.case,
                "patient": r.patient,
                "n": int(lab.size),
                "nll_sum": float(vols[-1]["nll"]) * int(lab.size) if lab.size else 0.0,
            }
        )
    pooled = acc.result()
    per_volume = {key: float(np.mean([v[key] for v in vols])) for key in ("ece", "sce", "ace", "nll")}
    diag = acc.reliability()
    return MethodMetrics(pooled, per_volume, sums, diag.to_dict(), diag.count.tolist())


def segmentation_summary(results: Sequence[CaseResult], class_names: Sequence[str]) -> dict:
    """Mean Dice per foreground class and overall, LCC ratios and agreement over ``results``."""
    dice = {name: _mean(r.dice[name] for r in results) for name in class_names[1:]}
    dice["mean"] = _mean(_mean(r.dice.values()) for r in results)
    return {
        "dice": dice,
        "lcc": _mean(r.lcc for r in results),
        "lcc_reference": _mean(r.lcc_reference for r in results),
        "agreement": _mean(r.agreement for r in results),
        "volumes": len(results),
    }


def agreement_scatter(results: Sequence[CaseResult]) -> dict:
    """Per-slice agreement against Dice over ``results``, with their Pearson r."""
    xs = [a for r in results for a in r.slice_agreement]
    ys = [d for r in results for d in r.slice_dice]
    return {"agreement": xs, "dice": ys, "r": pearson_r(xs, ys)}


def block_nll(
    pooled: Dict[str, Dict[str, dict]], conditions: Sequence[str], methods: Sequence[str]
) -> Tuple[Dict[str, float], Optional[Dict[str, float]], Optional[dict]]:
    """``(block NLL per method, artifacts-only NLL per method or None without corruptions, CARD's
    ratio to the best post-hoc baseline or None)`` from the pooled NLL per condition and method."""
    mean_nll = {m: float(np.mean([pooled[c][m]["nll"] for c in conditions])) for m in methods}
    corrupted = [c for c in conditions if c != "clean"]
    artifacts_nll = (
        {m: float(np.mean([pooled[c][m]["nll"] for c in corrupted])) for m in methods} if corrupted else None
    )
    post_hoc = [m for m in POST_HOC if m in methods]
    ratio = None
    if "card" in methods and post_hoc:
        best = min(post_hoc, key=lambda m: mean_nll[m])
        ratio = {"best_baseline": best, "card_over_best": mean_nll["card"] / mean_nll[best]}
    return mean_nll, artifacts_nll, ratio


def calibration_table(
    results: Sequence[CaseResult],
    calibrators: Dict[str, Calibrator],
    class_names: Sequence[str],
    conditions: Optional[Sequence[str]] = None,
    segmentor: str = "diffusion",
    roi: str = "disk10",
) -> dict:
    """Every metric of the report, JSON-able (see the module docstring for the definitions).

    ``segmentor``: what made the logits (a bundle's ``segmentor.kind``; ``diffusion`` for a CARD
    bundle), which decides how the methods are named (:func:`cardseg.method.calibration.method_label`);
    ``roi``: one of :data:`ROIS`. Per volume, each method's NLL sum and pixel count are kept
    (``per_volume``) and give the paired patient bootstrap of the block NLL (``bootstrap``)."""
    from cardseg_train.base.stats import bootstrap_block_nll

    conditions = list(conditions or dict.fromkeys(r.condition for r in results))
    methods = list(calibrators)
    metrics: Dict[str, Dict[str, MethodMetrics]] = {}
    segmentation: Dict[str, dict] = {}
    scatter: Dict[str, dict] = {}
    for cond in conditions:
        rs = [r for r in results if r.condition == cond]
        if not rs:
            raise CardsegError(f"no results for condition {cond!r}")
        metrics[cond] = {m: method_metrics(cal, rs, len(class_names), roi) for m, cal in calibrators.items()}
        segmentation[cond] = segmentation_summary(rs, class_names)
        scatter[cond] = agreement_scatter(rs)

    def per_condition(field_name: str) -> Dict[str, Dict[str, object]]:
        return {c: {m: getattr(mm, field_name) for m, mm in metrics[c].items()} for c in conditions}

    pooled, volume_sums = per_condition("pooled"), per_condition("volume_sums")
    mean_nll, artifacts_nll, ratio = block_nll(pooled, conditions, methods)
    all_x = [a for c in conditions for a in scatter[c]["agreement"]]
    all_y = [d for c in conditions for d in scatter[c]["dice"]]
    return {
        "conditions": conditions,
        "methods": methods,
        "classes": list(class_names),
        "segmentor": segmentor,
        "labels": {m: method_label(m, on_primary=segmentor == "diffusion") for m in methods},
        "volumes": len({r.case for r in results}),
        "roi": roi,
        "pooled": pooled,
        "per_volume_mean": per_condition("per_volume_mean"),
        "per_volume": volume_sums,
        "bootstrap": bootstrap_block_nll(volume_sums, conditions, methods),
        "mean_nll": mean_nll,
        "artifacts_only_nll": artifacts_nll,
        "lowest_mean_nll": min(methods, key=lambda m: mean_nll[m]),
        "card_vs_best_post_hoc": ratio,
        "segmentation": segmentation,
        "agreement_vs_dice": {"r_all": pearson_r(all_x, all_y), "per_condition": scatter},
        "reliability": per_condition("reliability"),
        "confidence_histogram": per_condition("confidence_histogram"),
        "calibrators": {m: cal.summary() for m, cal in calibrators.items()},
    }
