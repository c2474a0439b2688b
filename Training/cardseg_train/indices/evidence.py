"""Calibration evidence for the cardiac-index intervals: the shipped engine's ``card`` outputs on
the validation volumes, clean and under the fit-calibration perturbations, and on the training
patients (in-sample), cached compactly under ``<cache>/<key>/`` (``--cache``, default
``indices/evidence`` in cardseg's cache folder, the one ``cardseg fit-indices`` reads).

Each cached volume (``<case>__<variant>.npz``) holds ``labels`` and ``truth`` uint8 ``(Z, Y, X)``,
``probs`` float16 ``(Z, Y, X, K)`` (calibrated, as ``cardseg segment`` writes them), ``disagreement``
float16 ``(Z, Y, X)`` and ``spacing`` (x, y, z) mm. Perturbations act on the engine-normalised
``[0, 1]`` slices (:mod:`cardseg_train.data.perturb`, generator seeded by case and variant),
exactly as the calibration pool does; ``clean`` is the engine's own input. Test patients are
refused here: this module only gathers evidence for fitting.

``python -m cardseg_train.indices.evidence --split val --variants clean,contrast,gamma,noise``
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    import torch

#: bump when what a cached volume holds, or how it is computed, changes
CACHE_VERSION = 1
#: ACDC HDF5 frame names -> cardiac phase (frame01 = ED, frame02 = ES)
PHASES = {"frame01": "ED", "frame02": "ES"}
#: the splits evidence may come from (never the test split)
EVIDENCE_SPLITS = ("val", "train")


@dataclass
class EvidenceVolume:
    """One segmented (possibly perturbed) volume; arrays as in the module docstring."""

    case: str
    patient: str
    phase: str
    variant: str
    spacing: tuple
    labels: np.ndarray
    probs: np.ndarray
    disagreement: np.ndarray
    truth: np.ndarray


@dataclass(frozen=True)
class EvidenceOptions:
    """How :func:`evidence_volumes` reads and segments the volumes.

    h5_spacing: the pixel size (mm) the ACDC HDF5 volumes are taken to have; seed: the
    perturbations' seed; device, batch_size: where the networks run and how many slices a call;
    patients: only these patients' volumes (``None``: every patient of the split)."""

    h5_spacing: float = 1.5
    seed: int = 0
    device: "torch.device | str" = "cpu"
    batch_size: int = 8
    patients: Optional[Sequence[str]] = None


def card_arrays(bundle, slices01: np.ndarray, spacing_xy, device="cpu", batch_size: int = 8):
    """``(labels (Z, Y, X) uint8, probs (Z, Y, X, K) float32, tac (Z, Y, X) float32)`` of the
    engine's ``card`` method on already normalised slices ``(Z, Y, X)`` (as ``segment_volume``)."""
    import torch

    from cardseg.method.calibration import temperature_scale
    from cardseg.segment import SegmentOptions, trajectory_on_slices

    traj = trajectory_on_slices(
        np.asarray(slices01, dtype=np.float32),
        tuple(spacing_xy),
        bundle,
        SegmentOptions(method="card", device=device, batch_size=batch_size),
    )
    cal = bundle.calibrator
    tau = cal.temperature(traj.tac, outside=~traj.fov)  # as the engine: tau_min outside the field of view
    probs = temperature_scale(traj.logits, tau).float().exp_().permute(0, 2, 3, 1).contiguous().numpy()
    return traj.logits.argmax(dim=1).to(torch.uint8).numpy(), probs, traj.tac.numpy().astype(np.float32)


def evidence_key(bundle, settings: dict) -> str:
    """Weights, calibration and every setting that shapes the arrays."""
    from cardseg_train.base.cache_identity import calibrated_identity

    blob = json.dumps({**calibrated_identity(bundle), "version": CACHE_VERSION, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _load(path: Path, case: str, patient: str, phase: str, variant: str) -> EvidenceVolume:
    with np.load(path, allow_pickle=False) as f:
        return EvidenceVolume(
            case,
            patient,
            phase,
            variant,
            tuple(float(s) for s in f["spacing"]),
            f["labels"],
            f["probs"].astype(np.float32),
            f["disagreement"].astype(np.float32),
            f["truth"],
        )


def _save(path: Path, v: EvidenceVolume) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez_compressed(
        tmp,
        spacing=np.asarray(v.spacing, dtype=float),
        labels=v.labels,
        probs=v.probs.astype(np.float16),
        disagreement=v.disagreement.astype(np.float16),
        truth=v.truth,
    )
    tmp.replace(path)


def evidence_volumes(
    bundle,
    data: str,
    split: str,
    variants: Sequence[str],
    cache_root: Optional[Path],
    options: EvidenceOptions = EvidenceOptions(),
    log: Callable[[str], None] = print,
) -> Iterator[EvidenceVolume]:
    """Yield every ED/ES volume of ``split`` (``val`` or ``train``) under each variant, cached."""
    from cardseg.base.errors import CardsegError
    from cardseg.segment import normalized_slices

    from cardseg_train.data.perturb import POOL_VARIANTS, perturb_image
    from cardseg_train.data.corruptions import corruption_rng
    from cardseg_train.evaluation.segmentation import ACDC_H5_THICKNESS_MM, acdc_h5_volumes

    if split not in EVIDENCE_SPLITS:
        raise CardsegError(f"evidence comes from {' or '.join(EVIDENCE_SPLITS)} only, not {split!r}")
    bad = [v for v in variants if v not in POOL_VARIANTS]
    if bad:
        raise CardsegError(f"unknown variant {bad[0]!r} (choose from {', '.join(POOL_VARIANTS)})")
    settings = {
        "data": str(Path(data).resolve()),
        "split": split,
        "h5_spacing": float(options.h5_spacing),
        "thickness": ACDC_H5_THICKNESS_MM,
        "seed": int(options.seed),
    }
    root = Path(cache_root) / evidence_key(bundle, settings) if cache_root is not None else None
    for item in acdc_h5_volumes(data, split, options.h5_spacing):
        frame = item.case.rsplit("_", 1)[-1]
        if frame not in PHASES or (options.patients is not None and item.patient not in options.patients):
            continue
        norm = None
        for variant in variants:
            path = root / f"{item.case}__{variant}.npz" if root is not None else None
            if path is not None and path.is_file():
                yield _load(path, item.case, item.patient, PHASES[frame], variant)
                continue
            t0 = time.perf_counter()
            norm = normalized_slices(item.volume, bundle) if norm is None else norm
            img = (
                norm
                if variant == "clean"
                else perturb_image(norm, variant, corruption_rng(item.case, f"indices:{variant}", options.seed))
            )
            labels, probs, tac = card_arrays(bundle, img, item.volume.spacing[:2], options.device, options.batch_size)
            v = EvidenceVolume(
                item.case,
                item.patient,
                PHASES[frame],
                variant,
                tuple(float(s) for s in item.volume.spacing),
                labels,
                probs,
                tac,
                item.labels,
            )
            if path is not None:
                _save(path, v)
            log(f"{item.case} {variant}: {time.perf_counter() - t0:.1f} s")
            yield v


def main(argv: Optional[Sequence[str]] = None) -> int:
    from cardseg.base.errors import CardsegError
    from cardseg.bundle.loading import load_bundle

    from cardseg_train.base.cli_options import add_cache

    from cardseg.base.argparsing import CommandLineParser

    ap = CommandLineParser(prog="python -m cardseg_train.indices.evidence", description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--data", default="../shared/data/acdc")
    ap.add_argument("--split", default="val", choices=EVIDENCE_SPLITS)
    ap.add_argument("--variants", default="clean")
    add_cache(ap, "indices/evidence", "evidence cache folder (fit-indices' own)")
    ap.add_argument("--h5-spacing", type=float, default=1.5)
    args = ap.parse_args(argv)
    try:
        bundle = load_bundle(args.bundle, device="cpu")
        n = 0
        for _ in evidence_volumes(
            bundle,
            args.data,
            args.split,
            args.variants.split(","),
            Path(args.cache) if args.cache else None,
            EvidenceOptions(h5_spacing=args.h5_spacing),
            log=lambda s: print(s, flush=True),
        ):
            n += 1
    except CardsegError as exc:
        print(f"indices_evidence: error: {exc}", file=sys.stderr)
        return 2
    print(f"{n} volumes ready", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
