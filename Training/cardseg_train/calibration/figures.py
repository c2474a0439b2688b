"""The qualitative figures of ``cardseg evaluate``: which case to draw, the paper's Fig. 4 panel
of one slice, and one slice under every condition. They show ACDC pixels: written beside the
tables, never committed (``panel_*.png``, ``conditions_*.png`` are git-ignored)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from cardseg.base.errors import CardsegError

from cardseg_train.calibration.harness import CaseResult, condition_volume
from cardseg_train.evaluation.segmentation import LabelledVolume


def choose_panel(results: Sequence[CaseResult]) -> CaseResult:
    """Default qualitative case: the (case, condition) with the lowest volume agreement."""
    scored = [r for r in results if r.agreement is not None]
    if not scored:
        raise CardsegError("no case with a ground-truth ROI to draw")
    return min(scored, key=lambda r: r.agreement)


def case_panel(
    bundle,
    item: LabelledVolume,
    condition: str,
    path: Path,
    seed: int = 0,
    device="cpu",
    batch_size: int = 8,
    slice_index: Optional[int] = None,
) -> Path:
    """Run one volume again with the reference's predictions kept and draw paper Fig. 4 for one
    slice (default: the slice with the largest ground-truth foreground)."""
    from cardseg.segment import SegmentOptions, normalized_slices, trajectory_on_slices

    from cardseg_train.calibration.report import plot_case_panel

    vol = condition_volume(item, condition, seed)
    slices01 = normalized_slices(vol.volume, bundle)
    traj = trajectory_on_slices(
        slices01,
        tuple(vol.volume.spacing[:2]),
        bundle,
        SegmentOptions(method="card", device=device, batch_size=batch_size),
        with_reference=True,
    )
    logits, tac, ref = traj.logits, traj.tac, traj.reference_logits
    z = int(np.argmax((item.labels > 0).sum(axis=(1, 2)))) if slice_index is None else int(slice_index)
    if not 0 <= z < item.labels.shape[0]:
        raise CardsegError(f"slice {z} outside 0..{item.labels.shape[0] - 1}")
    temperature = (
        bundle.calibrator.temperature(tac[z : z + 1], outside=~traj.fov)[0].numpy()
        if bundle.calibrator.needs_tac
        else None
    )
    return plot_case_panel(
        slices01[z],
        item.labels[z],
        logits[z].argmax(0).numpy(),
        ref[z].argmax(0).numpy(),
        tac[z].numpy(),
        Path(path),
        f"{item.case}, {condition}, slice {z}",
        temperature,
    )


def conditions_figure(
    bundle,
    item: LabelledVolume,
    conditions: Sequence[str],
    path: Path,
    seed: int = 0,
    slice_index: Optional[int] = None,
) -> Path:
    """The same slice under every condition, as the network sees it (normalised), with the
    ground-truth outline (default slice: the largest ground-truth foreground)."""
    from cardseg.segment import normalized_slices

    from cardseg_train.calibration.report import plot_conditions

    z = int(np.argmax((item.labels > 0).sum(axis=(1, 2)))) if slice_index is None else int(slice_index)
    images = {c: normalized_slices(condition_volume(item, c, seed).volume, bundle)[z] for c in conditions}
    return plot_conditions(images, item.labels[z], Path(path), f"{item.case}, slice {z}")
