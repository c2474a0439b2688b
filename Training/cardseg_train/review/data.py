"""Whole-volume maps for the review study: prediction, ground truth and TAC per (case, condition).

The calibration harness keeps ROI pixels only; judging flagged regions needs every voxel of
the volume (regions may lie anywhere). One compact ``.npz`` per (case, condition) under
``<cache>/<key>/`` (``--cache``/``--review-cache``, default ``review`` in cardseg's cache folder):
predicted labels and ground truth as uint8, TAC and the primary's terminal logits as float16, the
slice spacing; beside it, when asked (a ``tac_flips`` review rule), ``<case>__<condition>__flips.npz``
with the flipped runs' disagreement (:func:`cardseg.segment.flip_disagreement_map`, float16).
Written atomically, read without pickles, so an interrupted collection resumes. The two entropy
maps the review study compares the TAC with (the primary's softmax and CARD's calibrated
probabilities) are derived from the logits when the maps are read, with the bundle's current
calibrator (:func:`entropy_maps`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

import numpy as np

from cardseg.base.progress import Progress

from cardseg_train.calibration.harness import condition_volume
from cardseg_train.evaluation.segmentation import LabelledVolume

if TYPE_CHECKING:
    import torch

#: bump when what a cached map holds, or how it is computed, changes
CACHE_VERSION = 3  # 3: the networks' field of view kept (CARD's entropy map: tau_min outside it)


@dataclass
class VolumeMaps:
    """One volume under one condition: ``pred``, ``truth`` uint8 and ``tac`` float32, all
    ``(Z, Y, X)`` on the volume's own grid; ``spacing`` (x, y, z) mm; ``logits`` the primary's
    terminal logits ``(Z, K, Y, X)`` (float16, may be ``None`` in tests); ``entropy_uc`` and
    ``entropy_card`` ``(Z, Y, X)`` float32 (nats) once :func:`entropy_maps` filled them."""

    case: str
    condition: str
    pred: np.ndarray
    truth: np.ndarray
    tac: np.ndarray
    spacing: tuple
    logits: Optional[np.ndarray] = None
    entropy_uc: Optional[np.ndarray] = None
    entropy_card: Optional[np.ndarray] = None
    #: ``(Y, X)`` bool, the networks' field of view (None: everywhere)
    fov: Optional[np.ndarray] = None
    #: ``(Z, Y, X)`` float32, the flipped runs' disagreement (None: not collected)
    flips: Optional[np.ndarray] = None

    @property
    def tac_flips(self) -> Optional[np.ndarray]:
        """``(Z, Y, X)`` TAC + the flipped runs' disagreement (what a ``tac_flips`` rule cuts its
        regions from, unsmoothed); ``None`` without flips."""
        return None if self.flips is None else np.asarray(self.tac, np.float32) + np.asarray(self.flips, np.float32)


def rule_map(maps: VolumeMaps, settings: dict) -> VolumeMaps:
    """``maps`` holding, as ``tac``, the map a rule of ``settings["map"]`` cuts its regions from:
    the TAC itself, or for ``tac_flips`` the TAC plus the flipped runs' disagreement (as the engine
    sums them). Refused (``ValueError``) without the flipped runs, or for another map."""
    from dataclasses import replace

    name = settings.get("map", "tac")
    if name == "tac_flips":
        if maps.flips is None:
            raise ValueError(f"{maps.case} ({maps.condition}): the tac_flips rule needs the flipped runs' disagreement")
        return replace(maps, tac=maps.tac_flips)
    if name != "tac":
        raise ValueError(f"regions are cut here for the tac and tac_flips rules only, not {name!r}")
    return maps


def entropy_maps(maps: VolumeMaps, calibrator) -> VolumeMaps:
    """Fill ``entropy_uc`` (softmax of the primary) and ``entropy_card`` (the logits divided by
    CARD's temperature of the TAC, paper Eq. 4; ``tau_min`` outside the networks' field of view, as the
    engine) from ``maps.logits``; returns ``maps``."""
    import torch

    from cardseg.method.calibration import temperature_scale

    logits = torch.from_numpy(np.asarray(maps.logits, dtype=np.float32))
    tac = torch.from_numpy(np.asarray(maps.tac, dtype=np.float32))
    out = []
    outside = None if maps.fov is None else ~np.asarray(maps.fov, bool)
    for logp in (torch.log_softmax(logits, dim=1), temperature_scale(logits, calibrator.temperature(tac, outside))):
        out.append((-(logp.exp() * logp).sum(dim=1)).clamp_min(0.0).numpy().astype(np.float32))
    maps.entropy_uc, maps.entropy_card = out
    return maps


def cache_key(bundle, split: str, seed: int = 0) -> str:
    """The cache folder name: everything of the bundle that shapes the maps
    (:func:`~cardseg_train.base.cache_identity.maps_identity`), the split and the corruption seed."""
    from cardseg_train.base.cache_identity import maps_identity

    blob = json.dumps(
        {**maps_identity(bundle), "version": CACHE_VERSION, "split": split, "seed": seed}, sort_keys=True
    ).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def compute_maps(
    bundle, item: LabelledVolume, condition: str, seed: int = 0, device="cpu", batch_size: int = 8, flips: bool = False
) -> VolumeMaps:
    """Corrupt (if asked), normalise as the engine does, run the dual trajectory, keep the maps
    (and, with ``flips``, the flipped runs' disagreement, as the engine computes it). ``condition``:
    an ACDC-C condition, or ``pool:contrast``, ``pool:gamma``, ``pool:noise``: the calibration
    pool's label-preserving perturbation of the normalised slices, drawn as that pool draws it
    (:mod:`cardseg_train.data.perturb`; not the test conditions' artifacts)."""
    from cardseg.base import arrays
    from cardseg.segment import SegmentOptions, flip_disagreement_map, normalized_slices, trajectory_on_slices

    kind = condition.split(":", 1)[1] if condition.startswith("pool:") else None
    vol = item if kind else condition_volume(item, condition, seed)
    slices01 = normalized_slices(vol.volume, bundle)
    if kind:
        from cardseg_train.data.perturb import PERTURBATIONS, perturb_image
        from cardseg_train.data.corruptions import corruption_rng

        if kind not in PERTURBATIONS:
            raise ValueError(f"unknown pool perturbation {kind!r} (choose from {', '.join(PERTURBATIONS)})")
        slices01 = perturb_image(slices01, kind, corruption_rng(item.case, f"pool:{kind}", seed))
    spacing_xy = tuple(vol.volume.spacing[:2])
    traj = trajectory_on_slices(
        slices01, spacing_xy, bundle, SegmentOptions(method="card", device=device, batch_size=batch_size)
    )
    logits = arrays.to_numpy(traj.logits)
    return VolumeMaps(
        item.case,
        condition,
        logits.argmax(axis=1).astype(np.uint8),
        item.labels.astype(np.uint8),
        arrays.to_numpy(traj.tac).astype(np.float32),
        tuple(float(s) for s in vol.volume.spacing),
        logits.astype(np.float16),
        fov=np.asarray(traj.fov, bool),
        flips=flip_disagreement_map(
            slices01, spacing_xy, bundle, traj, SegmentOptions(device=device, batch_size=batch_size)
        )
        if flips
        else None,
    )


@dataclass(frozen=True)
class MapOptions:
    """How :func:`collect_maps` computes the maps its cache lacks.

    seed: the corruption seed (per case and condition); device, batch_size: where the networks run
    and how many slices a call; flips: whether the flipped runs' disagreement is collected too
    (three more primary runs a volume)."""

    seed: int = 0
    device: "torch.device | str" = "cpu"
    batch_size: int = 8
    flips: bool = False


def collect_maps(
    bundle,
    cases: Sequence[LabelledVolume],
    conditions: Sequence[str],
    cache_dir: Optional[Path],
    options: MapOptions = MapOptions(),
    progress: Optional[Progress] = None,
    calibrator=None,
) -> List[VolumeMaps]:
    """Every (case, condition), from ``cache_dir`` where already there (resumable per case). With a
    ``calibrator`` (CARD's) the entropy maps are filled and the logits dropped (memory); with
    ``options.flips`` the flipped runs' disagreement is collected too."""
    progress = progress or Progress()
    progress.stage("review maps", len(cases) * len(conditions))
    out = []
    for item in cases:
        for cond in conditions:
            path = None if cache_dir is None else Path(cache_dir) / f"{item.case}__{cond.replace(':', '-')}.npz"
            maps = _load(path)
            if maps is not None and not np.allclose(maps.spacing, item.volume.spacing):
                maps = None  # made with another pixel-size assumption: compute again
            if maps is not None and options.flips:
                maps.flips = _load_flips(path, maps)
            if maps is None or (options.flips and maps.flips is None):
                maps = compute_maps(bundle, item, cond, options.seed, options.device, options.batch_size, options.flips)
                _save(path, maps)
            if calibrator is not None:
                entropy_maps(maps, calibrator).logits = None
            out.append(maps)
            progress.advance(1)
    return out


def _load(path: Optional[Path]) -> Optional[VolumeMaps]:
    if path is None or not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as f:
        meta = json.loads(bytes(f["meta"]).decode())
        return VolumeMaps(
            meta["case"],
            meta["condition"],
            f["pred"],
            f["truth"],
            f["tac"].astype(np.float32),
            tuple(meta["spacing"]),
            f["logits"],
            fov=f["fov"].astype(bool) if "fov" in f.files else None,
        )


def _flips_path(path: Path) -> Path:
    return path.with_name(path.stem + "__flips.npz")


def _load_flips(path: Optional[Path], maps: VolumeMaps) -> Optional[np.ndarray]:
    """The cached flipped runs' disagreement beside ``path``, or ``None`` (absent, another shape)."""
    if path is None or not _flips_path(path).is_file():
        return None
    with np.load(_flips_path(path), allow_pickle=False) as f:
        flips = f["flips"].astype(np.float32)
    return flips if flips.shape == maps.tac.shape else None


def _save(path: Optional[Path], m: VolumeMaps) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if m.flips is not None:
        tmp = _flips_path(path).with_name(path.stem + "__flips.tmp.npz")
        np.savez_compressed(tmp, flips=np.asarray(m.flips, dtype=np.float16))
        tmp.replace(_flips_path(path))
    else:  # maps made afresh without flips: flips of the earlier maps must not pair with them
        _flips_path(path).unlink(missing_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    meta = np.frombuffer(
        json.dumps({"case": m.case, "condition": m.condition, "spacing": list(m.spacing)}).encode(), dtype=np.uint8
    )
    extra = {} if m.fov is None else {"fov": np.asarray(m.fov, bool)}
    np.savez_compressed(
        tmp,
        pred=m.pred,
        truth=m.truth,
        tac=m.tac.astype(np.float16),
        logits=np.asarray(m.logits, dtype=np.float16),
        meta=meta,
        **extra,
    )
    tmp.replace(path)
