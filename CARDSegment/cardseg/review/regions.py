"""Flagged regions: where the disagreement asks a reader to look, ranked so the first few matter.

A region is a connected component of the review map above ``flag_threshold``; the review map is
the TAC (paper Eq. 7's map), or the TAC plus the flipped runs' disagreement (``map``, below),
smoothed in-plane by a Gaussian of ``smooth_px`` pixels when the bundle says so. The bundle's ``regions`` block (all chosen on the validation split, see
``cardseg fit-review``) says how:

* ``connectivity``: ``"slice"`` (2D components, each within one slice, 8-connected) or ``"3d"``
  (components that also join the same place on neighbouring slices);
* ``grow_threshold`` (hysteresis): components of ``map > grow_threshold`` that hold a voxel above
  ``flag_threshold``; ``null``: components of ``map > flag_threshold``;
* ``neighbourhood_px``: only voxels within this many pixels of the predicted heart (on the slice
  or a neighbouring one) are flagged; ``null``: anywhere;
* ``merge_px``: components closer than this many in-plane pixels are merged (the mask is
  dilated by a disk of that radius before labelling; the region keeps only its flagged voxels);
* ``max_ml``: a region larger than this keeps only its highest-map voxels up to this volume
  (so no region becomes a heart-wide shell); ``null``: no cap;
* ``min_voxels``: smaller components are dropped;
* ``map``: ``"tac"`` (the review map above), ``"tac_flips"`` (the TAC plus the disagreement of
  the primary's runs on the volume's flipped copies, :mod:`cardseg.method.flips`, smoothed the
  same way; thresholds on that sum's scale) or ``"error_probability"``: the voxel error
  probability of :mod:`cardseg.review.error_map` under the fitted ``voxel_model`` (thresholds
  are then probabilities); region features are measured on the map the regions are cut from
  (unsmoothed);
* ``fill_holes``: fill the holes of the flagged mask slice by slice (a ring around an error
  becomes a region holding it);
* ``ranking``: ``"p_error"``, ``"p_error_per_ml"`` (expected covered errors per reviewed ml) or
  ``"summed_map"`` (summed map inside the region: expected wrong voxels for the error map);
* ``max_regions``: at most this many regions per volume are reported.

Each region gets features (:data:`FEATURES`) and, from the bundle's fitted logistic model
(:class:`ErrorModel`), ``p_error``: the probability that it holds at least half of a
substantial segmentation error (:mod:`cardseg.review.coverage` defines both), recalibrated by a
fitted Platt step when the model holds one. Without a fitted model (``regions.model`` is
``null``) regions are ranked by summed disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
from scipy import ndimage

from cardseg.base.errors import CardsegError
from cardseg.metrics.segmentation import roi_mask
from cardseg.review.coverage import heart_neighbourhood
from cardseg.review.error_map import VOXEL_FEATURES, end_position, error_probability, smoothed

#: region features the error model reads, in this order
FEATURES = (
    "log_sum_tac",
    "max_tac",
    "mean_tac",
    "log_voxels",
    "slices",
    "foreground_fraction",
    "classes",
    "end_position",
    "fov_fraction",
)
DEFAULTS = {
    "connectivity": "3d",
    "merge_px": 0,
    "max_regions": None,
    "smooth_px": 0.0,
    "grow_threshold": None,
    "neighbourhood_px": None,
    "max_ml": None,
    "ranking": "p_error",
    "map": "tac",
    "fill_holes": False,
    "voxel_model": None,
}
RANKINGS = ("p_error", "p_error_per_ml", "summed_map")
MAPS = ("tac", "tac_flips", "error_probability")
#: the maps whose regions are cut from a disagreement (smoothed by ``smooth_px``), not from a fitted model
DISAGREEMENT_MAPS = ("tac", "tac_flips")


def describe_rule(block: dict) -> str:
    """One line for a reader (``cardseg info``): what a bundle's ``regions`` block cuts regions from
    and how, and what ``p_error`` is."""
    s = {**DEFAULTS, **block}
    smooth = f", smoothed {float(s['smooth_px']):g} px" if float(s.get("smooth_px") or 0) > 0 else ""
    what = {
        "error_probability": "the error-probability map",
        "tac_flips": f"the TAC + flip disagreement{_copies(block)}{smooth}",
    }.get(s["map"], f"the TAC{smooth}")
    grow = f", grown above {float(s['grow_threshold']):g}" if s.get("grow_threshold") is not None else ""
    cap = f", up to {float(s['max_ml']):g} ml each" if s.get("max_ml") is not None else ""
    most = f", at most {int(s['max_regions'])}" if s.get("max_regions") is not None else ""
    model = block.get("model")
    if not model:
        p_error = "no p_error model (ranked by the summed map)"
    else:
        p_error = "p_error from a fitted region model" + (" with a Platt step" if model.get("platt") else "")
    seeds = f"seeds above {float(s['flag_threshold']):g}" if s.get("flag_threshold") is not None else "seeds"
    return (
        f"cut from {what}: {seeds}{grow}, {s['connectivity']}{cap}{most}, "
        f"ranked by {_RANKING_WORDS.get(s['ranking'], s['ranking'])}; {p_error}"
    )


def _copies(block: dict) -> str:
    steps, names = block.get("flip_steps"), block.get("flip_copies")
    on = f" on steps {', '.join(str(int(t)) for t in steps)}" if steps else ""
    if names:
        return f" (the flipped copies: {', '.join(names)}{';' if on else ''}{on})"
    return f" (the flipped copies{on})" if on else ""


_RANKING_WORDS = {"p_error": "p_error", "p_error_per_ml": "p_error per ml", "summed_map": "summed map"}


def review_map(tac: np.ndarray, smooth_px: float = 0.0) -> np.ndarray:
    """The map regions are cut from: ``tac (Z, Y, X)`` (the TAC, or TAC + flips: :func:`feature_map`)
    smoothed in-plane by a Gaussian of ``smooth_px`` pixels (none at 0), float32 ``(Z, Y, X)``."""
    tac = np.asarray(tac, dtype=np.float32)
    return tac if smooth_px <= 0 else smoothed(tac, float(smooth_px))


def cap_regions(score: np.ndarray, lab: np.ndarray, n: int, cap_voxels: Optional[int]) -> np.ndarray:
    """``lab`` with every region over ``cap_voxels`` cut to its ``cap_voxels`` highest-``score``
    voxels (ties: scan order); ``lab`` and ``score`` ``(Z, Y, X)``. Labels are kept."""
    if cap_voxels is None or n == 0:
        return lab
    cap = max(int(cap_voxels), 1)
    sizes = np.bincount(lab.ravel(), minlength=n + 1)
    big = np.flatnonzero(sizes[1:] > cap) + 1
    if big.size == 0:
        return lab
    out = lab.copy()
    flat, values = out.reshape(-1), np.asarray(score).reshape(-1)
    for r in big.tolist():
        idx = np.flatnonzero(flat == r)
        flat[idx[np.argsort(-values[idx], kind="stable")[cap:]]] = 0
    return out


@dataclass(frozen=True)
class LabelRule:
    """How :func:`region_labels` cuts flagged components from a map.

    threshold: the flag threshold, voxels above it seed a region; min_voxels: components with fewer
    voxels (after the cap) are removed; connectivity: ``"3d"`` (components also join the same pixel
    on neighbouring slices) or ``"slice"`` (8-connected within one slice); merge_px: components
    closer than this many in-plane pixels are merged; grow_threshold: with a value (at most
    ``threshold``) a component is one of ``map > grow_threshold`` holding a voxel above ``threshold``
    (hysteresis), ``None``: components of ``map > threshold``; cap_voxels: regions over this many
    voxels keep their highest voxels (:func:`cap_regions`), ``None``: no cap; fill_holes: fill the
    mask's holes slice by slice before labelling."""

    threshold: float
    min_voxels: int
    connectivity: str = "3d"
    merge_px: int = 0
    grow_threshold: Optional[float] = None
    cap_voxels: Optional[int] = None
    fill_holes: bool = False


def region_labels(tac: np.ndarray, rule: LabelRule, allowed: Optional[np.ndarray] = None) -> Tuple[np.ndarray, int]:
    """Label the flagged components of the map ``tac (Z, Y, X)`` as ``rule`` says: int32 map
    (0 none, 1..n) and ``n``.

    ``allowed`` (bool ``(Z, Y, X)``) limits the flagged voxels (holes are filled inside it only).
    Labels are numbered in scan order. An unknown ``rule.connectivity`` is a one-line
    :class:`CardsegError`.
    """
    if rule.connectivity not in ("3d", "slice"):
        raise CardsegError(f"regions.connectivity must be '3d' or 'slice' (got {rule.connectivity!r})")
    tac = np.asarray(tac)
    seeds = tac > rule.threshold
    mask = seeds if rule.grow_threshold is None else tac > min(float(rule.grow_threshold), float(rule.threshold))
    if allowed is not None:
        mask = mask & np.asarray(allowed, bool)
        seeds = seeds & mask
    if rule.fill_holes:
        mask = np.stack([ndimage.binary_fill_holes(m) for m in mask]) if mask.size else mask
        if allowed is not None:
            mask &= np.asarray(allowed, bool)
    grown = roi_mask(mask, rule.merge_px)  # per slice, no growth across slices
    structure = np.zeros((3, 3, 3), bool)
    structure[1] = True  # 8-connected in-plane ...
    if rule.connectivity == "3d":
        structure[0, 1, 1] = structure[2, 1, 1] = True  # ... and the same pixel on the neighbouring slices
    lab, n = ndimage.label(grown, structure=structure)
    lab = np.where(mask, lab, 0).astype(np.int32)
    if n == 0:
        return lab, 0
    if rule.grow_threshold is not None:  # hysteresis: only components that reach the flag threshold
        lab = np.where(np.isin(lab, np.unique(lab[seeds])), lab, 0).astype(np.int32)
    lab = cap_regions(tac, lab, n, rule.cap_voxels)
    sizes = np.bincount(lab.ravel(), minlength=n + 1)
    keep = np.flatnonzero(sizes >= max(int(rule.min_voxels), 1))
    keep = keep[keep > 0]
    remap = np.zeros(n + 1, np.int32)
    remap[keep] = np.arange(1, keep.size + 1, dtype=np.int32)
    return remap[lab], int(keep.size)


def region_settings(settings: dict) -> dict:
    """The bundle's ``regions`` block with defaults filled in, checked: one-line
    :class:`CardsegError` naming the bad key."""
    s = {**DEFAULTS, **settings}
    if s["map"] not in MAPS:
        raise CardsegError(f"regions.map must be one of {', '.join(MAPS)} (got {s['map']!r})")
    if s["map"] == "error_probability" and not s["voxel_model"]:
        raise CardsegError("regions.map 'error_probability' needs a fitted regions.voxel_model (cardseg fit-review)")
    if s["ranking"] not in RANKINGS:
        raise CardsegError(f"regions.ranking must be one of {', '.join(RANKINGS)} (got {s['ranking']!r})")
    for key in ("smooth_px", "grow_threshold", "neighbourhood_px", "max_ml"):
        value = s[key]
        if value is None and key != "smooth_px":
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not np.isfinite(value)
            or value < 0
            or (key == "max_ml" and value == 0)
        ):
            raise CardsegError(
                f"regions.{key} must be a {'positive' if key == 'max_ml' else 'non-negative'} "
                f"number{'' if key == 'smooth_px' else ' or null'} (got {value!r})"
            )
    if s["grow_threshold"] is not None and s["grow_threshold"] > s["flag_threshold"]:
        raise CardsegError(
            f"regions.grow_threshold ({s['grow_threshold']}) must not exceed regions.flag_threshold "
            f"({s['flag_threshold']})"
        )
    return s


def cap_voxels_of(max_ml: Optional[float], spacing: tuple) -> Optional[int]:
    """A volume cap in ml as a voxel count for voxels of ``spacing`` (x, y, z) mm (``None``: no cap)."""
    if max_ml is None:
        return None
    return max(int(np.floor(float(max_ml) * 1000.0 / float(np.prod(spacing)))), 1)


def allowed_of(pred: np.ndarray, s: dict) -> Optional[np.ndarray]:
    """Where regions may lie under the checked settings ``s`` (``None``: anywhere)."""
    return None if s["neighbourhood_px"] is None else heart_neighbourhood(pred, int(s["neighbourhood_px"]))


def feature_map(tac: np.ndarray, pred: np.ndarray, settings: dict, flips: Optional[np.ndarray] = None) -> np.ndarray:
    """The map region features are measured on: the raw TAC for ``map = "tac"``, TAC + ``flips``
    (the flipped runs' disagreement, :func:`cardseg.method.flips.flip_map`, ``(Z, Y, X)``)
    for ``"tac_flips"``, the voxel error probability
    (:func:`cardseg.review.error_map.error_probability`) otherwise; ``(Z, Y, X)`` float32."""
    s = region_settings(settings)
    if s["map"] == "tac":
        return np.asarray(tac, dtype=np.float32)
    if s["map"] == "tac_flips":
        if flips is None:
            raise ValueError("regions.map 'tac_flips' needs the flipped runs' disagreement")
        return np.asarray(tac, dtype=np.float32) + np.asarray(flips, dtype=np.float32)
    model = ErrorModel.from_dict(s["voxel_model"], VOXEL_FEATURES, "regions.voxel_model")
    return error_probability(tac, pred, model, allowed_of(pred, s))


def form_regions(
    tac: np.ndarray,
    pred: np.ndarray,
    settings: dict,
    spacing: tuple,
    score: Optional[np.ndarray] = None,
    flips: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, int]:
    """Regions of one volume as the (checked) ``settings`` say: ``(labels (Z, Y, X) int32, n)``.

    tac, pred ``(Z, Y, X)``; spacing (x, y, z) mm (for the ``max_ml`` cap); ``score`` the
    :func:`feature_map` when already computed (not computed twice); ``flips`` as :func:`feature_map`.
    """
    s = region_settings(settings)
    allowed = allowed_of(pred, s)
    score = feature_map(tac, pred, s, flips) if score is None else np.asarray(score)
    if s["map"] in DISAGREEMENT_MAPS:
        cut = review_map(score, float(s["smooth_px"]))
    else:
        cut = score
    rule = LabelRule(
        threshold=float(s["flag_threshold"]),
        min_voxels=int(s["min_voxels"]),
        connectivity=s["connectivity"],
        merge_px=int(s["merge_px"]),
        grow_threshold=s["grow_threshold"],
        cap_voxels=cap_voxels_of(s["max_ml"], spacing),
        fill_holes=bool(s["fill_holes"]),
    )
    return region_labels(cut, rule, allowed)


def region_features(
    tac: np.ndarray, pred: np.ndarray, lab: np.ndarray, n: int, fov: Optional[np.ndarray] = None
) -> np.ndarray:
    """Features of regions ``1..n`` of ``lab``: ``(n, len(FEATURES))`` float64.

    tac ``(Z, Y, X)`` disagreement, pred ``(Z, Y, X)`` predicted labels, fov ``(Y, X)`` bool
    field of view (all True if ``None``). See :data:`FEATURES`: log summed and max/mean TAC, log
    size, slices spanned, fraction predicted foreground, distinct predicted classes inside,
    position of the centroid slice from the middle (0) to the first/last slice (1; 0 for a single
    slice), fraction of the region inside the field of view (1 wherever the engine zeroes the TAC
    outside it, as it does today: kept so that a model stays valid if that changes).
    """
    if n == 0:
        return np.zeros((0, len(FEATURES)))
    tac = np.asarray(tac, dtype=np.float64)
    idx = np.arange(1, n + 1)
    # every statistic over the regions' own voxels only (a small share of the volume: SciPy's
    # per-label maximum sorts all the values it is given)
    inside = lab > 0
    lab_in, tac_in = lab[inside], tac[inside]
    vox = ndimage.sum_labels(np.ones_like(tac_in), lab_in, idx)
    s = ndimage.sum_labels(tac_in, lab_in, idx)
    mx = ndimage.maximum(tac_in, lab_in, idx)
    fg = ndimage.sum_labels((np.asarray(pred)[inside] > 0).astype(np.float64), lab_in, idx)
    z = lab.shape[0]
    zc = ndimage.sum_labels(np.nonzero(inside)[0].astype(np.float64), lab_in, idx) / vox  # centroid slice
    fov3 = np.ones(lab.shape[1:], bool) if fov is None else np.asarray(fov, bool)
    infov = ndimage.sum_labels(np.broadcast_to(fov3, lab.shape)[inside].astype(np.float64), lab_in, idx)
    out = np.zeros((n, len(FEATURES)))
    objects = ndimage.find_objects(lab)
    for i in range(n):
        sl = objects[i]
        sub = lab[sl] == i + 1
        slices = int(sub.any(axis=(1, 2)).sum())
        classes = np.unique(np.asarray(pred)[sl][sub]).size
        pos = float(end_position(zc[i], z))
        out[i] = (
            np.log1p(s[i]),
            mx[i],
            s[i] / vox[i],
            np.log(vox[i]),
            slices,
            fg[i] / vox[i],
            classes,
            pos,
            infov[i] / vox[i],
        )
    return out


@dataclass
class ErrorModel:
    """Logistic model of ``P(region holds a substantial error | features)``.

    ``p = sigmoid(a (((f - mean) / scale) @ coef + intercept) + b)`` over ``features`` (the
    region :data:`FEATURES`, or :data:`cardseg.review.error_map.VOXEL_FEATURES` for the voxel
    model), with the Platt step ``platt = (a, b)`` (``None``: a = 1, b = 0) fitted on held-out
    predictions; fitted on the validation split (``cardseg fit-review``) and stored in
    ``bundle.json`` ``regions.model`` / ``regions.voxel_model``.
    """

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    features: Tuple[str, ...] = FEATURES
    platt: Optional[Tuple[float, float]] = None

    def logit(self, features: np.ndarray) -> np.ndarray:
        """``(n, F)`` features → ``(n,)`` logits before the Platt step."""
        return ((np.asarray(features, dtype=np.float64) - self.mean) / self.scale) @ self.coef + self.intercept

    def probability(self, features: np.ndarray) -> np.ndarray:
        """``(n, F)`` features → ``(n,)`` probabilities."""
        z = self.logit(features)
        if self.platt is not None:
            z = self.platt[0] * z + self.platt[1]
        return 1.0 / (1.0 + np.exp(-np.clip(z, -50, 50)))

    def to_dict(self) -> dict:
        d = {
            "kind": "logistic",
            "features": list(self.features),
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "coef": self.coef.tolist(),
            "intercept": float(self.intercept),
        }
        if self.platt is not None:
            d["platt"] = [float(v) for v in self.platt]
        return d

    @classmethod
    def from_dict(cls, d: dict, features: Sequence[str] = FEATURES, key: str = "regions.model") -> "ErrorModel":
        """Refuses (one line naming ``key``) a model that is incomplete or was fitted on other features."""
        try:
            if d.get("kind") != "logistic" or list(d["features"]) != list(features):
                raise ValueError("features")
            arrays = [np.asarray(d[k], dtype=np.float64) for k in ("mean", "scale", "coef")]
            intercept = float(d["intercept"])
            platt = None if d.get("platt") is None else tuple(float(v) for v in d["platt"])
            if platt is not None and (len(platt) != 2 or not np.isfinite(platt).all()):
                raise ValueError("platt")
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CardsegError(
                f"bundle.json {key} is not a fitted error model for these features (refit it: cardseg fit-review)"
            ) from None
        if any(a.shape != (len(features),) or not np.isfinite(a).all() for a in arrays) or (arrays[1] <= 0).any():
            raise CardsegError(f"bundle.json {key} has malformed mean/scale/coef (refit it: cardseg fit-review)")
        return cls(arrays[0], arrays[1], arrays[2], intercept, tuple(features), platt)


def rank_regions(
    features: np.ndarray,
    model: Optional[ErrorModel],
    max_regions: Optional[int] = None,
    ranking: str = "p_error",
    volumes_ml: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Order of regions to review (indices into ``features``) and their ``p_error``.

    By ``p_error`` (descending) when a model is given, or by ``p_error`` over the region's volume
    (``ranking="p_error_per_ml"``, ``volumes_ml`` ``(n,)``: expected covered errors per reviewed
    ml), or by the summed map (``ranking="summed_map"``, or without a model); ties keep scan
    order. At most ``max_regions`` are kept.
    """
    n = features.shape[0]
    p = model.probability(features) if model is not None and n else None
    key = p if p is not None and ranking != "summed_map" else features[:, 0] if n else np.zeros(0)
    if p is not None and ranking == "p_error_per_ml":
        if volumes_ml is None:
            raise ValueError("ranking by p_error per ml needs the regions' volumes")
        key = p / np.maximum(np.asarray(volumes_ml, dtype=np.float64), 1e-9)
    order = np.lexsort((np.arange(n), -key)) if n else np.zeros(0, int)
    if max_regions is not None:
        order = order[: int(max_regions)]
    return order, p


def flagged_regions(
    tac: np.ndarray,
    labels: np.ndarray,
    settings: dict,
    ijk_to_lps: np.ndarray,
    spacing: tuple,
    class_names: Sequence[str],
    fov: Optional[np.ndarray] = None,
    flips: Optional[np.ndarray] = None,
) -> Tuple[List[dict], np.ndarray]:
    """Regions of a volume, most likely error first, and their rank map.

    tac, labels: ``(Z, Y, X)``; ``flips`` ``(Z, Y, X)`` the flipped runs' disagreement (needed when
    the review map is ``"tac_flips"``); settings: the bundle's ``regions`` block; ``ijk_to_lps`` the
    volume's 4x4 index-to-LPS matrix, ``spacing`` its (x, y, z) voxel size in mm. Returns the
    region dicts (id = rank, 1 = review first; voxels, volume_mm3, centroid_ijk/lps, bbox_ijk
    ``[[i0, i1], [j0, j1], [k0, k1]]`` inclusive, mean/max/summed disagreement, the predicted
    classes inside, p_error or ``None``) and a uint16 map ``(Z, Y, X)`` of those ranks (0: none).
    """
    s = region_settings(settings)
    score = feature_map(tac, labels, s, flips)
    lab, n = form_regions(tac, labels, s, spacing, score)
    feats = region_features(score, labels, lab, n, fov)
    model = ErrorModel.from_dict(s["model"]) if s.get("model") else None
    voxel_ml = float(np.prod(spacing)) / 1000.0
    order, p = rank_regions(
        feats, model, s.get("max_regions"), s["ranking"], np.bincount(lab.ravel(), minlength=n + 1)[1:] * voxel_ml
    )
    dtype = np.uint16 if order.size < 65535 else np.uint32
    rank_of = np.zeros(n + 1, dtype)
    rank_of[order + 1] = np.arange(1, order.size + 1, dtype=dtype)
    rank_map = rank_of[lab]
    voxel_mm3 = float(np.prod(spacing))
    objects = ndimage.find_objects(lab)
    tac = np.asarray(tac)
    regions = []
    for rank, i in enumerate(order.tolist(), start=1):
        sl = objects[i]
        sub = lab[sl] == i + 1
        zz, yy, xx = np.nonzero(sub)
        k, j, ii = zz + sl[0].start, yy + sl[1].start, xx + sl[2].start
        values = tac[sl][sub]
        centroid_ijk = [float(ii.mean()), float(j.mean()), float(k.mean())]
        lps = (np.asarray(ijk_to_lps) @ np.array(centroid_ijk + [1.0]))[:3]
        present = np.unique(np.asarray(labels)[sl][sub])
        regions.append(
            {
                "id": rank,
                "voxels": int(sub.sum()),
                "volume_mm3": float(sub.sum() * voxel_mm3),
                "centroid_ijk": centroid_ijk,
                "centroid_lps": [float(v) for v in lps],
                "bbox_ijk": [
                    [int(ii.min()), int(ii.max())],
                    [int(j.min()), int(j.max())],
                    [int(k.min()), int(k.max())],
                ],
                "mean_disagreement": float(values.mean()),
                "max_disagreement": float(values.max()),
                "summed_disagreement": float(values.sum()),
                "classes": [class_names[c] for c in present.tolist()],
                "p_error": None if p is None else float(p[i]),
            }
        )
    return regions, rank_map
