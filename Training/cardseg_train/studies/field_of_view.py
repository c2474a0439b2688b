"""Does moving the network grid onto the heart help? Centred against moved grids on a split.

For every volume of the split (validation by default; the test split only once a release has
frozen its choices) the trajectory runs on the centred grid; where the engine's check fires
(:func:`cardseg.io.field_of_view.recentre_offset`, the bundle's margin, else 15 mm, or ``--margin-mm``) it runs again
on the moved grid, and both runs' Dice against the labels and agreement scores are recorded, with
the run the engine keeps (the higher agreement). Writes ``field_of_view.json`` and ``.md``::

    python -m cardseg_train.studies.field_of_view --bundle B --split val --out DIR
"""

from __future__ import annotations

import sys
from typing import List, Optional

import numpy as np

from cardseg.base.errors import CardsegError

from cardseg_train.studies.common import study_main


def dice_per_class(pred: np.ndarray, truth: np.ndarray, classes: int) -> List[Optional[float]]:
    """Dice of each foreground class ``1..classes-1`` (``None`` where both are empty)."""
    out = []
    for c in range(1, classes):
        a, b = pred == c, truth == c
        total = int(a.sum() + b.sum())
        out.append(None if total == 0 else 2.0 * float((a & b).sum()) / total)
    return out


def mean_dice(values: List[Optional[float]]) -> Optional[float]:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def study_volume(bundle, item, margin_mm: Optional[float] = None) -> dict:
    """One labelled volume: the centred run, and the moved run where the engine's check fires, with the
    engine's own choice between them (:func:`cardseg.io.field_of_view.keep_moved`)."""
    from cardseg.io.field_of_view import keep_moved, offset_mm, recentre_margin, recentre_offset
    from cardseg.segment import SegmentOptions, normalized_slices, run_agreement, run_on_grid, slice_grid

    margin = recentre_margin(bundle.config, True) if margin_mm is None else margin_mm
    s01 = normalized_slices(item.volume, bundle)
    spacing = tuple(item.volume.spacing[:2])

    def run(offset=(0.0, 0.0)):
        traj = run_on_grid(
            slice_grid(s01.shape[1:], spacing, bundle, offset),
            s01,
            bundle,
            SegmentOptions(method="card", device="cpu", batch_size=8, progress=_quiet()),
        )
        labels = np.asarray(traj.logits).argmax(axis=1)
        dice = dice_per_class(labels, item.labels, bundle.num_classes)
        return labels, traj.fov, {"dice": dice, "mean_dice": mean_dice(dice), "agreement": run_agreement(traj, bundle)}

    labels, fov, centred = run()
    row = {"case": item.case, "centred": centred, "fired": False}
    offset = recentre_offset(labels, fov, spacing, margin_mm=margin)
    if offset is not None:
        _, _, moved = run(offset)
        keep = "moved" if keep_moved(centred["agreement"], moved["agreement"]) else "centred"
        row.update({"fired": True, "offset_mm": offset_mm(offset, spacing), "moved": moved, "kept": keep})
    return row


def _quiet():
    from cardseg.base.progress import Progress

    return Progress()


def summary(rows: List[dict]) -> dict:
    """Mean Dice without and with the engine's choice, and how often the kept run had the higher Dice."""
    fired = [r for r in rows if r["fired"]]
    with_choice = [r[r["kept"]]["mean_dice"] if r["fired"] else r["centred"]["mean_dice"] for r in rows]
    better_kept = sum(
        1 for r in fired if r[r["kept"]]["mean_dice"] >= max(r["centred"]["mean_dice"], r["moved"]["mean_dice"])
    )
    return {
        "volumes": len(rows),
        "fired": len(fired),
        "kept_moved": sum(1 for r in fired if r["kept"] == "moved"),
        "kept_the_higher_dice": better_kept,
        "mean_dice_centred": float(np.mean([r["centred"]["mean_dice"] for r in rows])) if rows else None,
        "mean_dice_with_recentring": float(np.mean(with_choice)) if rows else None,
        "mean_dice_always_moved": float(
            np.mean([r["moved"]["mean_dice"] if r["fired"] else r["centred"]["mean_dice"] for r in rows])
        )
        if rows
        else None,
    }


def markdown(result: dict) -> str:
    s = result["summary"]
    lines = [
        f"# Moving the network grid onto the heart: {result['bundle']}, {result['split']} split",
        "",
        f"Margin {result['margin_mm']:g} mm; the engine keeps the run with the higher agreement. "
        f"The check fired on {s['fired']} of {s['volumes']} volumes; the moved grid was kept on "
        f"{s['kept_moved']}; the kept run had the higher mean Dice on {s['kept_the_higher_dice']} of {s['fired']}.",
        "",
        f"Mean Dice over all volumes (RV, MYO, LV): centred {s['mean_dice_centred']:.4f}, with recentring "
        f"{s['mean_dice_with_recentring']:.4f}, always moving when the check fires "
        f"{s['mean_dice_always_moved']:.4f}.",
        "",
        "| volume | offset (mm, i, j) | centred Dice | centred agreement | moved Dice | moved agreement | kept |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if r["fired"]:
            c, m = r["centred"], r["moved"]
            lines.append(
                f"| {r['case']} | {r['offset_mm'][0]:+.1f}, {r['offset_mm'][1]:+.1f} | {c['mean_dice']:.3f} | "
                f"{c['agreement']:.4f} | {m['mean_dice']:.3f} | {m['agreement']:.4f} | {r['kept']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    def options(p) -> None:
        p.add_argument(
            "--margin-mm", type=float, default=None, help="the check's margin (default: the engine's, 15 mm)"
        )

    def check(a) -> None:
        if a.margin_mm is not None and not 0.0 < a.margin_mm <= 100.0:
            raise CardsegError(f"--margin-mm must be in (0, 100] (got {a.margin_mm:g})")

    def compute(bundle, cases, a) -> dict:
        from cardseg.io.field_of_view import recentre_margin

        rows = []
        for item in cases:
            rows.append(study_volume(bundle, item, a.margin_mm))
            print(f"{item.case}: {'fired' if rows[-1]['fired'] else '-'}", file=sys.stderr, flush=True)
        margin = recentre_margin(bundle.config, True) if a.margin_mm is None else a.margin_mm
        return {"margin_mm": margin, "rows": rows, "summary": summary(rows)}

    return study_main(
        argv,
        "python -m cardseg_train.studies.field_of_view",
        __doc__,
        "field_of_view",
        compute,
        markdown,
        options,
        check,
    )


if __name__ == "__main__":
    sys.exit(main())
