"""Whole-volume maps for the review study: prediction, ground truth and TAC per (case, condition).

The calibration harness keeps ROI pixels only; judging flagged regions needs every voxel of
the volume (regions may lie anywhere). One compact ``.npz`` per (case, condition) under
``cache/review/<key>/``: predicted labels and ground truth as uint8, TAC as float16, the slice
spacing. Written atomically, read without pickles, so an interrupted collection resumes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from cardseg.base.progress import Progress

from .calibration_eval import condition_volume
from .evaluation import LabelledVolume

#: bump when what a cached map holds, or how it is computed, changes
CACHE_VERSION = 1


@dataclass
class VolumeMaps:
    """One volume under one condition: ``pred``, ``truth`` uint8 and ``tac`` float32, all
    ``(Z, Y, X)`` on the volume's own grid; ``spacing`` (x, y, z) mm."""

    case: str
    condition: str
    pred: np.ndarray
    truth: np.ndarray
    tac: np.ndarray
    spacing: tuple


def cache_key(bundle, split: str, seed: int = 0) -> str:
    """The cache folder name: the weights and everything of the bundle that shapes the maps (grid,
    preprocessing, sampled and averaged steps), the split and the corruption seed."""
    c = bundle.config
    blob = json.dumps({"weights": bundle.checksums, "version": CACHE_VERSION, "split": split, "seed": seed,
                       "grid": [c["input_size"], c["pixel_spacing_mm"]], "preprocessing": c["preprocessing"],
                       "sampled_steps": bundle.sampled_steps, "tac_steps": bundle.tac_steps},
                      sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def compute_maps(bundle, item: LabelledVolume, condition: str, seed: int = 0, device="cpu",
                 batch_size: int = 8) -> VolumeMaps:
    """Corrupt (if asked), normalise as the engine does, run the dual trajectory, keep the maps."""
    from cardseg.segment import normalized_slices, trajectory_on_slices

    vol = condition_volume(item, condition, seed)
    slices01 = normalized_slices(vol.volume, bundle)
    traj = trajectory_on_slices(slices01, tuple(vol.volume.spacing[:2]), bundle, "card", device, batch_size)
    return VolumeMaps(item.case, condition, traj.logits.argmax(dim=1).numpy().astype(np.uint8),
                      item.labels.astype(np.uint8), traj.tac.numpy().astype(np.float32),
                      tuple(float(s) for s in vol.volume.spacing))


def collect_maps(bundle, cases: Sequence[LabelledVolume], conditions: Sequence[str], cache_dir: Optional[Path],
                 seed: int = 0, device="cpu", batch_size: int = 8,
                 progress: Optional[Progress] = None) -> List[VolumeMaps]:
    """Every (case, condition), from ``cache_dir`` where already there (resumable per case)."""
    progress = progress or Progress()
    progress.stage("review maps", len(cases) * len(conditions))
    out = []
    for item in cases:
        for cond in conditions:
            path = None if cache_dir is None else Path(cache_dir) / f"{item.case}__{cond}.npz"
            maps = _load(path)
            if maps is not None and not np.allclose(maps.spacing, item.volume.spacing):
                maps = None  # made with another pixel-size assumption: compute again
            if maps is None:
                maps = compute_maps(bundle, item, cond, seed, device, batch_size)
                _save(path, maps)
            out.append(maps)
            progress.advance(1)
    return out


def _load(path: Optional[Path]) -> Optional[VolumeMaps]:
    if path is None or not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as f:
        meta = json.loads(bytes(f["meta"]).decode())
        return VolumeMaps(meta["case"], meta["condition"], f["pred"], f["truth"], f["tac"].astype(np.float32),
                          tuple(meta["spacing"]))


def _save(path: Optional[Path], m: VolumeMaps) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    meta = np.frombuffer(json.dumps({"case": m.case, "condition": m.condition, "spacing": list(m.spacing)}).encode(),
                         dtype=np.uint8)
    np.savez_compressed(tmp, pred=m.pred, truth=m.truth, tac=m.tac.astype(np.float16), meta=meta)
    tmp.replace(path)
