"""One grid for a subject's two frames? Recentring decided per volume or per subject, on the indices.

The engine decides the field-of-view move (:mod:`cardseg.io.field_of_view`) for each volume on its own,
so the end-diastolic (ED) and end-systolic (ES) frames of one subject can be segmented on different
grids, and their volume difference (the ejection fraction) then mixes two segmentations. This study
compares three policies on a split's subjects (validation by default; the test split only once a
release has frozen its choices):

* ``centred``: both frames on the centred grid (the releases before 2.3.0);
* ``per-volume``: the engine's rule on each frame (2.3.0);
* ``per-subject``: when the check fires on either frame, both frames run on one moved grid (the ED
  frame's move when it fired, else the ES frame's), and both keep it when their summed agreement
  is higher than on the centred grid.

For each subject and policy it records the LVEF and RVEF (after the shipped bundle's volume
corrections) against the label-derived ones, and Dice; writes ``field_of_view_subjects.json`` and
``.md``::

    python -m cardseg_train.studies.field_of_view_subjects --bundle B --split val --out DIR
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from cardseg.base.errors import CardsegError

from cardseg_train.studies.common import study_main
from cardseg_train.studies.field_of_view import dice_per_class

POLICIES = ("centred", "per-volume", "per-subject")
PHASES = {"frame01": "ED", "frame02": "ES"}


def subject_offset(offsets: Dict[str, Optional[tuple]]) -> Optional[tuple]:
    """The one move of a subject: the ED frame's when its check fired, else the ES frame's (``None``: neither)."""
    return offsets.get("ED") if offsets.get("ED") is not None else offsets.get("ES")


def keep_subject_move(centred: Dict[str, Optional[float]], moved: Dict[str, Optional[float]]) -> bool:
    """Whether both frames keep the moved grid: their summed agreement is higher there (a frame
    without a predicted heart on either grid decides nothing)."""
    pairs = [(centred[ph], moved[ph]) for ph in centred if centred[ph] is not None and moved.get(ph) is not None]
    return bool(pairs) and sum(m for _, m in pairs) > sum(c for c, _ in pairs)


def ef_errors(rows: Sequence[dict], policy: str) -> Dict[str, dict]:
    """Mean absolute error, mean and sd of (value - truth) for LVEF and RVEF under ``policy``."""
    out = {}
    for name in ("LVEF", "RVEF"):
        err = np.array([r[policy][name] - r["truth"][name] for r in rows], dtype=float)
        out[name] = {
            "mae": float(np.abs(err).mean()),
            "mean_error": float(err.mean()),
            "sd": float(err.std(ddof=1)) if len(err) > 1 else None,
        }
    out["mean_dice"] = float(np.mean([d for r in rows for d in r[policy]["dice"]]))
    return out


def study_subject(bundle, ed, es, margin: float) -> dict:
    """Both frames of one subject under the three policies."""
    from cardseg.base.progress import Progress
    from cardseg.cohort import indices as ix
    from cardseg.io.field_of_view import keep_moved, recentre_offset
    from cardseg.segment import SegmentOptions, normalized_slices, run_agreement, run_on_grid, slice_grid

    names, correct = bundle.class_names, bundle.config.get("indices", {}).get("volumes", {})
    items = {"ED": ed, "ES": es}
    cache: Dict[tuple, dict] = {}

    def run(ph: str, offset=(0.0, 0.0)) -> dict:
        key = (ph, tuple(float(o) for o in offset))
        if key not in cache:
            item = items[ph]
            s01 = normalized_slices(item.volume, bundle)
            traj = run_on_grid(
                slice_grid(s01.shape[1:], tuple(item.volume.spacing[:2]), bundle, offset),
                s01,
                bundle,
                SegmentOptions(method="card", device="cpu", batch_size=8, progress=Progress()),
            )
            labels = np.asarray(traj.logits).argmax(axis=1).astype(np.uint8)
            cache[key] = {
                "labels": labels,
                "fov": traj.fov,
                "agreement": run_agreement(traj, bundle),
                "dice": [d for d in dice_per_class(labels, item.labels, bundle.num_classes) if d is not None],
            }
        return cache[key]

    centred = {ph: run(ph) for ph in items}
    offsets = {
        ph: recentre_offset(
            centred[ph]["labels"], centred[ph]["fov"], tuple(items[ph].volume.spacing[:2]), margin_mm=margin
        )
        for ph in items
    }
    chosen = {"centred": dict(centred)}
    chosen["per-volume"] = {
        ph: (
            run(ph, offsets[ph])
            if offsets[ph] is not None and keep_moved(centred[ph]["agreement"], run(ph, offsets[ph])["agreement"])
            else centred[ph]
        )
        for ph in items
    }
    move = subject_offset(offsets) if ed.volume.array.shape[1:] == es.volume.array.shape[1:] else None
    if move is None:
        chosen["per-subject"] = dict(chosen["per-volume"])
    else:
        moved = {ph: run(ph, move) for ph in items}
        keep = keep_subject_move(
            {ph: centred[ph]["agreement"] for ph in items}, {ph: moved[ph]["agreement"] for ph in items}
        )
        chosen["per-subject"] = moved if keep else dict(centred)

    def indices(labels: Dict[str, np.ndarray], corrections) -> Dict[str, float]:
        vols = {ph: ix.frame_volumes(labels[ph], items[ph].volume.spacing, names, corrections) for ph in items}
        return ix.cardiac_indices(vols["ED"], vols["ES"])

    row = {
        "patient": ed.patient,
        "fired": {ph: offsets[ph] is not None for ph in items},
        "truth": indices({ph: items[ph].labels for ph in items}, {}),
    }
    for policy, runs in chosen.items():
        values = indices({ph: runs[ph]["labels"] for ph in items}, correct)
        row[policy] = {
            "LVEF": values["LVEF"],
            "RVEF": values["RVEF"],
            "moved": {ph: runs[ph] is not centred[ph] for ph in items},
            "dice": [d for ph in items for d in runs[ph]["dice"]],
        }
    return row


def markdown(result: dict) -> str:
    lines = [
        f"# One grid per subject? {result['bundle']}, {result['split']} split",
        "",
        f"Margin {result['margin_mm']:g} mm. LVEF and RVEF in points (value - label-derived); Dice: mean over "
        "both frames' RV, MYO, LV.",
        "",
        "| policy | LVEF MAE | LVEF error mean / sd | RVEF MAE | RVEF error mean / sd | mean Dice |",
        "|---|---|---|---|---|---|",
    ]
    for policy in POLICIES:
        s = result["summary"][policy]
        lines.append(
            f"| {policy} | {s['LVEF']['mae']:.2f} | {s['LVEF']['mean_error']:+.2f} / {s['LVEF']['sd']:.2f} | "
            f"{s['RVEF']['mae']:.2f} | {s['RVEF']['mean_error']:+.2f} / {s['RVEF']['sd']:.2f} | "
            f"{s['mean_dice']:.4f} |"
        )
    lines += [
        "",
        "Subjects where the check fired on a frame (moved: which frames each policy ran on a moved grid):",
        "",
        "| patient | fired (ED, ES) | policy | moved (ED, ES) | LVEF | RVEF | label LVEF | label RVEF |",
        "|---|---|---|---|---|---|---|---|",
    ]
    yes = {True: "yes", False: "no"}
    for r in result["rows"]:
        if not any(r["fired"].values()):
            continue
        for policy in POLICIES:
            p = r[policy]
            lines.append(
                f"| {r['patient']} | {yes[r['fired']['ED']]}, {yes[r['fired']['ES']]} | {policy} | "
                f"{yes[p['moved']['ED']]}, {yes[p['moved']['ES']]} | {p['LVEF']:.1f} | {p['RVEF']:.1f} | "
                f"{r['truth']['LVEF']:.1f} | {r['truth']['RVEF']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    def compute(bundle, cases, a) -> dict:
        from cardseg.io.field_of_view import recentre_margin

        margin = recentre_margin(bundle.config, True)
        frames: Dict[str, dict] = {}
        for item in cases:
            phase = PHASES.get(item.case.rsplit("_", 1)[-1])
            if phase:
                frames.setdefault(item.patient, {})[phase] = item
        rows = []
        for patient, f in sorted(frames.items()):
            if set(f) != {"ED", "ES"}:
                raise CardsegError(f"{patient}: both frame01 (ED) and frame02 (ES) are needed")
            rows.append(study_subject(bundle, f["ED"], f["ES"], margin))
            print(f"{patient}: fired {rows[-1]['fired']}", file=sys.stderr, flush=True)
        return {"margin_mm": margin, "rows": rows, "summary": {policy: ef_errors(rows, policy) for policy in POLICIES}}

    return study_main(
        argv,
        "python -m cardseg_train.studies.field_of_view_subjects",
        __doc__,
        "field_of_view_subjects",
        compute,
        markdown,
    )


if __name__ == "__main__":
    sys.exit(main())
