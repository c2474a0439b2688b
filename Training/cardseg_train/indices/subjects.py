"""The subjects of ``cardseg fit-indices``: one segmented volume's arrays and their cache, the
split of volumes by patient and phase, and each subject's indices against the truth
(:class:`Subject`), from which :mod:`cardseg_train.indices.fit` fits and measures the intervals."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from cardseg.base.errors import CardsegError

#: bump when what a cached volume holds, or how it is computed, changes
CACHE_VERSION = 1
#: ACDC HDF5 frame names → cardiac phase (the data README: frame01 = ED, frame02 = ES)
PHASES = {"frame01": "ED", "frame02": "ES"}
#: the fewest validation subjects a fit takes (the pivot needs 2 errors, their shape 3 without a pool)
MIN_FIT_SUBJECTS = 3


@dataclass
class VolumeArrays:
    """One segmented volume: ``labels``/``truth`` uint8 ``(Z, Y, X)``, ``probs`` float32
    ``(Z, Y, X, K)`` (calibrated), ``disagreement`` float32 ``(Z, Y, X)``, spacing (x, y, z) mm."""

    case: str
    patient: str
    phase: str
    spacing: tuple
    labels: np.ndarray
    probs: np.ndarray
    disagreement: np.ndarray
    truth: np.ndarray


def cache_key(bundle, settings: dict) -> str:
    """Weights, calibration (parameters and TAC steps) and every setting that shapes the arrays."""
    from cardseg_train.base.cache_identity import calibrated_identity

    blob = json.dumps({**calibrated_identity(bundle), "version": CACHE_VERSION, **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _load(path: Path, case: str, patient: str, phase: str) -> VolumeArrays:
    with np.load(path, allow_pickle=False) as f:
        return VolumeArrays(
            case,
            patient,
            phase,
            tuple(float(s) for s in f["spacing"]),
            f["labels"],
            f["probs"],
            f["disagreement"],
            f["truth"],
        )


def _save(path: Path, v: VolumeArrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez_compressed(
        tmp,
        spacing=np.asarray(v.spacing, dtype=float),
        labels=v.labels,
        probs=v.probs,
        disagreement=v.disagreement,
        truth=v.truth,
    )
    tmp.replace(path)


def split_volumes(
    bundle,
    data: str,
    split: str,
    h5_spacing: float,
    cache_dir: Optional[str],
    device="cpu",
    batch_size: int = 8,
    log: Callable[[str], None] = print,
):
    """Yield :class:`VolumeArrays` for every volume of ``split``, from the cache when it is there.

    Volumes are the ACDC HDF5 ones as ``cardseg evaluate`` reads them (pixels ``h5_spacing`` mm,
    slices :data:`~cardseg_train.evaluation.segmentation.ACDC_H5_THICKNESS_MM` apart).
    """
    from cardseg.segment import SegmentOptions, segment_volume

    from cardseg_train.evaluation.segmentation import ACDC_H5_THICKNESS_MM, acdc_h5_volumes

    settings = {
        "data": str(Path(data).resolve()),
        "split": split,
        "h5_spacing": float(h5_spacing),
        "thickness": ACDC_H5_THICKNESS_MM,
    }
    root = Path(cache_dir) / cache_key(bundle, settings) if cache_dir else None
    for item in acdc_h5_volumes(data, split, h5_spacing):
        frame = item.case.rsplit("_", 1)[-1]
        if frame not in PHASES:
            continue
        phase = PHASES[frame]
        path = root / f"{item.case}.npz" if root is not None else None
        if path is not None and path.is_file():
            yield _load(path, item.case, item.patient, phase)
            continue
        t0 = time.perf_counter()
        res = segment_volume(item.volume, bundle, SegmentOptions(method="card", device=device, batch_size=batch_size))
        v = VolumeArrays(
            item.case,
            item.patient,
            phase,
            tuple(float(s) for s in item.volume.spacing),
            res.labels,
            res.probabilities,
            res.disagreement,
            item.labels,
        )
        if path is not None:
            _save(path, v)
        log(f"{item.case}: segmented in {time.perf_counter() - t0:.1f} s")
        yield v


# --------------------------------------------------------------------------------------------
# per-subject statistics
# --------------------------------------------------------------------------------------------
@dataclass
class Subject:
    """One patient (one variant): index values from the corrected segmentation, from the labels,
    and CARD's unscaled spreads (a diagnostic)."""

    patient: str
    values: Dict[str, float]
    truth: Dict[str, float]
    spreads: Dict[str, float]
    group: str = "val"


def subjects_of(
    volumes,
    class_names: Sequence[str],
    flag_threshold: float,
    correct: Optional[dict] = None,
    group: Optional[str] = None,
    minimum: int = 0,
    warn: Optional[Callable[[str], None]] = None,
) -> List[Subject]:
    """Pair each patient's ED and ES volumes into :class:`Subject` rows (per variant when the
    volumes carry one). One volume in memory at a time. A patient without both frames is left
    out and named: in one warning line (``warn``, default stderr), or, when fewer than ``minimum``
    subjects are left, in the :class:`CardsegError` that refuses them.

    correct: the volume corrections (:func:`cardseg.cohort.index_volumes.corrected_volumes`;
    ``None`` both, ``{}`` none); group: the rows' group (default: ``val``/``train`` + variant).
    """
    from cardseg.cohort import indices as ix

    frames: Dict[tuple, Dict[str, tuple]] = {}
    k = len(class_names)
    for v in volumes:
        vols = ix.frame_volumes(v.labels, v.spacing, class_names, correct)
        _, sds = ix.frame_statistics(v.labels, v.probs, v.disagreement, v.spacing, class_names, flag_threshold)
        truth = ix.structure_volumes(ix.class_volumes(v.truth, v.spacing, k), class_names)
        variant = getattr(v, "variant", "clean")
        frames.setdefault((v.patient, variant), {})[v.phase] = (vols, sds, truth)
    out, missing = [], {}
    for (patient, variant), f in frames.items():
        if "ED" not in f or "ES" not in f:
            phase = "ES" if "ED" in f else "ED"
            frame = next(n for n, ph in PHASES.items() if ph == phase)
            missing[f"{patient} (no {phase} frame, {frame})"] = variant
            continue
        (ev, esd, et), (sv, ssd, st) = f["ED"], f["ES"]
        out.append(
            Subject(
                patient,
                ix.cardiac_indices(ev, sv),
                ix.cardiac_indices(et, st),
                ix.index_spreads(ev, sv, esd, ssd),
                group or variant,
            )
        )
    if missing:
        names = ", ".join(missing)
        if len(out) < minimum:
            raise CardsegError(
                f"only {len(out)} subjects have both the ED and the ES frame, {minimum} needed; "
                f"missing a frame: {names}"
            )
        (warn or _warn)(f"left out {len(missing)} patient(s) missing a frame: {names}")
    return out


def _warn(text: str) -> None:
    import sys

    print(f"cardseg: warning: {text}", file=sys.stderr, flush=True)


def errors_of(subjects: Sequence[Subject], name: str) -> np.ndarray:
    """The modelled errors of index ``name`` (:func:`cardseg.cohort.indices.index_error`): ``(n,)``."""
    from cardseg.cohort import indices as ix

    return np.array([ix.index_error(name, s.values[name], s.truth[name]) for s in subjects], dtype=float)
