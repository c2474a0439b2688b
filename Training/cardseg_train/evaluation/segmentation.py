"""Segmentation quality of a bundle on labelled volumes, at each volume's own grid.

Dice is computed per class per 3D volume on the volume's native grid (the engine resamples the
primary's logits back to it), then averaged over volumes. The calibration harness (ECE, SCE,
ACE, NLL per method and corruption) builds on the same volume loading.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from cardseg.bundle.loading import Bundle
from cardseg.base.errors import CardsegError
from cardseg.base.progress import Progress
from cardseg.segment import SegmentOptions, segment_volume
from cardseg.io.volume import Volume

from cardseg_train.data.datasets import ACDC_H5_SPACING_MM, acdc_h5_records, group_by_case, split_lists

#: slice thickness assumed for the geometry-less HDF5 volumes (does not affect 2D Dice)
ACDC_H5_THICKNESS_MM = 10.0


@dataclass
class LabelledVolume:
    case: str
    patient: str
    volume: Volume
    labels: np.ndarray  # (Z, Y, X) uint8


def acdc_h5_volumes(root: str, split: str, spacing_mm: float = ACDC_H5_SPACING_MM) -> List[LabelledVolume]:
    """The validation or test volumes of the ACDC HDF5 layout (test: for reporting only)."""
    lists = split_lists(root)
    if split not in lists:
        raise CardsegError(f"{root}: no {split}_patients.txt")
    records = acdc_h5_records(root, lists[split], spacing_mm)
    out = []
    for case, idx in group_by_case(records).items():
        img = np.stack([records[i].image for i in idx]).astype(np.float32)
        lab = np.stack([records[i].label for i in idx]).astype(np.uint8)
        vol = Volume(
            array=img,
            spacing=(spacing_mm, spacing_mm, ACDC_H5_THICKNESS_MM),
            origin=(0.0, 0.0, 0.0),
            direction=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0),
        )
        out.append(LabelledVolume(case, records[idx[0]].patient, vol, lab))
    return out


def dice_score(pred: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Dice of class ``k`` between two label maps; NaN when the class is absent from both."""
    p, g = pred == k, truth == k
    denom = int(p.sum()) + int(g.sum())
    if denom == 0:
        return float("nan")
    return 2.0 * int((p & g).sum()) / denom


def evaluate_dice(
    bundle: Bundle,
    cases: Sequence[LabelledVolume],
    device="cpu",
    batch_size: int = 8,
    progress: Optional[Progress] = None,
) -> List[Dict[str, object]]:
    """One row per volume: case, patient, and Dice per foreground class (primary only, ``uc``)."""
    progress = progress or Progress()
    names = bundle.class_names
    rows = []
    progress.stage("volumes", len(cases))
    for c in cases:
        res = segment_volume(c.volume, bundle, SegmentOptions(method="uc", device=device, batch_size=batch_size))
        row: Dict[str, object] = {"case": c.case, "patient": c.patient}
        for k, name in enumerate(names):
            if k:
                row[name] = dice_score(res.labels, c.labels, k)
        row["mean"] = float(np.nanmean([row[n] for n in names[1:]]))
        rows.append(row)
        progress.advance(1)
    return rows


def summarize(rows: Sequence[Dict[str, object]], class_names: Sequence[str]) -> Dict[str, float]:
    """Mean over volumes of each class's Dice and of the per-volume mean."""
    keys = [n for n in class_names[1:]] + ["mean"]
    return {k: float(np.nanmean([float(r[k]) for r in rows])) for k in keys}


def write_dice_table(rows: Sequence[Dict[str, object]], class_names: Sequence[str], out: Path, title: str) -> dict:
    """Write ``dice.csv``, ``dice.json`` and ``dice.md`` into ``out`` (each atomically, noted in
    the running ``--out`` record: :func:`cardseg_train.base.report_files.atomic_write`); returns the summary."""
    from cardseg_train.base.report_files import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    keys = ["case", "patient"] + list(class_names[1:]) + ["mean"]
    table = io.StringIO(newline="")
    w = csv.DictWriter(table, fieldnames=keys)
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{r[k]:.4f}" if isinstance(r[k], float) else r[k]) for k in keys})
    atomic_write(out / "dice.csv", table.getvalue().encode())
    summary = summarize(rows, class_names)
    atomic_write(
        out / "dice.json", json.dumps({"title": title, "summary": summary, "volumes": list(rows)}, indent=2).encode()
    )
    head = "| " + " | ".join(list(class_names[1:]) + ["mean"]) + " |"
    line = "| " + " | ".join(f"{summary[k]:.3f}" for k in list(class_names[1:]) + ["mean"]) + " |"
    atomic_write(
        out / "dice.md",
        (
            f"{title} ({len(rows)} volumes, Dice per 3D volume at its own grid)\n\n"
            f"{head}\n|{'---|' * (len(class_names))}\n{line}\n"
        ).encode(),
    )
    return summary
