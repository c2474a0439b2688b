"""Flipped copies of each volume through the CARD trajectory: what they would add, on validation.

The primary was trained with row and column flips, so a flipped slice is an input it knows. For
every clean volume of the split (validation; the test split only once a release has frozen its
choices) the shipped engine's dual trajectory (:func:`cardseg.segment.trajectory_on_slices`,
``card``) runs on the volume and on its flips along rows, columns and both, and each output is
flipped back (:data:`FLIPS`). Compared, nothing fitted:

* **segmentation**: the plain run's labels (what the engine ships) against the argmax of the four
  runs' mean softmax (``flip mean``): Dice, and per subject the LVEF and RVEF errors with the
  volumes corrected as the bundle's index block says (:func:`cardseg.cohort.indices.frame_volumes`);
* **review maps**, each against the substantial errors of the segmentation it serves
  (:func:`cardseg_train.studies.reference_maps.map_quality`: voxel AUROC/AUPRC, errors covered by the
  map's highest voxels at 5, 10 and 20 % of the predicted heart), smoothed as the review rules'
  map (2 px): the TAC (shipped), the flips' disagreement (:func:`flip_disagreement`) and their sum
  for the plain labels; the four runs' mean TAC, and it plus the flips' disagreement, for the
  flip-mean labels.

Writes ``flip_study.json`` and ``.md``::

    python -m cardseg_train.studies.flip --bundle B --split val --out DIR
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from cardseg.base import arrays
from cardseg.method.flips import FLIPS, flip_disagreement, unflip

from cardseg_train.studies.common import study_main
from cardseg_train.studies.field_of_view import dice_per_class, mean_dice

#: the maps the region rule is fitted on (fit-review's search, plain segmentation): name -> what it sums
REGION_MAPS = {"TAC (shipped)": ("tac",), "TAC + flip disagreement": ("tac", "flip_js")}
#: their flag-threshold grids: fit-review's own for the TAC, a larger scale for the sum
REGION_FLAGS = {"TAC (shipped)": (0.04, 0.06, 0.08, 0.1), "TAC + flip disagreement": (0.1, 0.2, 0.3, 0.4, 0.5)}
#: the review maps compared: name -> (segmentation it serves, what it sums)
MAPS = {
    "TAC (shipped)": ("plain", ("tac",)),
    "flip disagreement": ("plain", ("flip_js",)),
    "TAC + flip disagreement": ("plain", ("tac", "flip_js")),
    "mean TAC": ("flip mean", ("mean_tac",)),
    "mean TAC + flip disagreement": ("flip mean", ("mean_tac", "flip_js")),
}


def softmax(logits: np.ndarray, axis: int = 1) -> np.ndarray:
    """Float32 softmax of ``logits`` along ``axis``."""
    return arrays.softmax(np.asarray(logits, dtype=np.float32), axis)


def flipped_runs(bundle, slices01: np.ndarray, spacing_xy, device="cpu", batch_size: int = 8):
    """``(logits (F, Z, K, Y, X), tac (F, Z, Y, X))`` of the engine's ``card`` trajectory on each of
    :data:`FLIPS` of ``slices01`` ``(Z, Y, X)``, flipped back onto the volume."""
    from cardseg.segment import SegmentOptions, trajectory_on_slices

    logits, tac = [], []
    for flip in FLIPS:
        s = np.ascontiguousarray(unflip(slices01, flip, (0, 1, 2)))
        traj = trajectory_on_slices(
            s, tuple(spacing_xy), bundle, SegmentOptions(method="card", device=device, batch_size=batch_size)
        )
        logits.append(unflip(np.asarray(traj.logits, dtype=np.float32), flip, (0, 2, 3)))
        tac.append(unflip(np.asarray(traj.tac, dtype=np.float32), flip, (0, 1, 2)))
    return np.stack(logits), np.stack(tac)


def volume_maps(logits: np.ndarray, tac: np.ndarray) -> Dict[str, np.ndarray]:
    """The two segmentations and the maps' parts from :func:`flipped_runs`' arrays (run 0 is the plain one)."""
    probs = softmax(logits, axis=2)
    return {
        "plain": logits[0].argmax(axis=1).astype(np.uint8),
        "flip mean": probs.mean(axis=0).argmax(axis=1).astype(np.uint8),
        "tac": tac[0],
        "mean_tac": tac.mean(axis=0),
        "flip_js": flip_disagreement(probs),
    }


def subject_errors(frames: Dict[str, dict], block: dict, class_names: Sequence[str], spacing_of) -> Dict[str, dict]:
    """Per segmentation, the LVEF and RVEF errors (points, value - label) of the subjects with both
    frames: ``frames`` ``{case: {"plain", "flip mean", "truth"}}``, ``spacing_of(case)`` (x, y, z) mm."""
    from cardseg.cohort.indices import cardiac_indices, frame_volumes

    correct = block.get("volumes", {})
    out: Dict[str, dict] = {"plain": {}, "flip mean": {}}
    for case, f in sorted(frames.items()):
        patient, frame = case.rsplit("_", 1)
        if frame != "frame01" or f"{patient}_frame02" not in frames:
            continue
        es = frames[f"{patient}_frame02"]
        truth = cardiac_indices(
            frame_volumes(f["truth"], spacing_of(case), class_names, {}),
            frame_volumes(es["truth"], spacing_of(f"{patient}_frame02"), class_names, {}),
        )
        for seg in out:
            got = cardiac_indices(
                frame_volumes(f[seg], spacing_of(case), class_names, correct),
                frame_volumes(es[seg], spacing_of(f"{patient}_frame02"), class_names, correct),
            )
            out[seg][patient] = {n: float(got[n] - truth[n]) for n in ("LVEF", "RVEF")}
    return out


def summary(dice: Dict[str, List[float]], errors: Dict[str, dict], maps: Dict[str, dict]) -> dict:
    def stats(e):
        e = np.asarray(e, dtype=float)
        if e.size == 0:
            return {"mae": None, "mean": None, "sd": None}
        return {
            "mae": float(np.abs(e).mean()),
            "mean": float(e.mean()),
            "sd": float(e.std(ddof=1)) if e.size > 1 else None,
        }

    segs = {
        s: {
            "mean_dice": float(np.mean(dice[s])),
            "subjects": len(errors[s]),
            **{n: stats([v[n] for v in errors[s].values()]) for n in ("LVEF", "RVEF")},
        }
        for s in dice
    }
    return {"segmentations": segs, "maps": maps}


def markdown(result: dict) -> str:
    segs, maps = result["summary"]["segmentations"], result["summary"]["maps"]
    lines = [
        f"# Flipped copies through the CARD trajectory: {result['bundle']}, {result['split']} split",
        "",
        f"{result['volumes']} clean volumes, each run plain and flipped along rows, columns and both (flipped "
        "back). Nothing fitted. Errors: value - label-derived index, points; volumes corrected as the bundle's "
        "index block says.",
        "",
        "| segmentation | mean Dice | LVEF MAE | LVEF error sd | RVEF MAE | RVEF error sd | subjects |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in segs.items():
        cells = [s[n][k] for n in ("LVEF", "RVEF") for k in ("mae", "sd")]
        lines.append(
            f"| {name} | {s['mean_dice']:.4f} | "
            + " | ".join("-" if c is None else f"{c:.2f}" for c in cells)
            + f" | {s['subjects']} |"
        )
    lines += [
        "",
        "Review maps (smoothed 2 px) against the substantial errors of the segmentation each serves:",
        "",
        "| map | segmentation | errors | AUROC | AUPRC | covered at 5% | at 10% | at 20% |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in maps.items():
        c = m["covered"]
        lines.append(
            f"| {name} | {m['segmentation']} | {m['errors']} | {m['auroc']:.3f} | {m['auprc']:.3f} | "
            f"{c['0.05']:.3f} | {c['0.1']:.3f} | {c['0.2']:.3f} |"
        )
    rules = result["summary"].get("regions")
    if rules:
        lines += [
            "",
            "The region rule fitted on each map as `fit-review` fits the TAC family (two passes, p_error "
            "leave one patient out; plain segmentation), held-out figures:",
            "",
            "| map | flag grid | chosen setting | first 3 regions cover | median burden | all regions cover | "
            "regions per volume | p_error ECE |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, r in rules.items():
            h, st = r["held_out"], r["settings"]
            lines.append(
                f"| {name} | {', '.join(f'{f:g}' for f in r['flag_grid'])} | flag {st['flag_threshold']:g}, "
                f"{st['connectivity']}, smooth {st['smooth_px']:g} px, cap {st['max_ml']} ml, {st['ranking']} | "
                f"{h['covered_top3']:.3f} | {h['median_burden_top3']:.4f} | {h['covered_all']:.3f} | "
                f"{h['regions_per_volume']:.1f} | {h['region_ece']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def run_study(bundle, cases, log=print, regions: bool = True) -> dict:
    """The study on labelled volumes ``cases`` (:func:`cardseg_train.evaluation.segmentation.acdc_h5_volumes`)."""
    from cardseg.review.error_map import smoothed
    from cardseg.segment import normalized_slices

    from cardseg_train.studies.reference_maps import SMOOTH_PX, map_quality

    from cardseg_train.review.data import VolumeMaps

    dice: Dict[str, List[float]] = {"plain": [], "flip mean": []}
    frames, spacing, parts = {}, {}, {name: ([], [], []) for name in MAPS}
    review = {name: [] for name in REGION_MAPS}
    for item in cases:
        logits, tac = flipped_runs(bundle, normalized_slices(item.volume, bundle), item.volume.spacing[:2])
        v = volume_maps(logits, tac)
        for seg in dice:
            dice[seg].append(mean_dice(dice_per_class(v[seg], item.labels, bundle.num_classes)))
        frames[item.case] = {"plain": v["plain"], "flip mean": v["flip mean"], "truth": item.labels}
        spacing[item.case] = tuple(float(s) for s in item.volume.spacing)
        for name, (seg, terms) in MAPS.items():
            parts[name][0].append(v[seg])
            parts[name][1].append(item.labels)
            parts[name][2].append(smoothed(sum(v[t] for t in terms), SMOOTH_PX))
        for name, terms in REGION_MAPS.items():
            review[name].append(
                VolumeMaps(item.case, "clean", v["plain"], item.labels, sum(v[t] for t in terms), spacing[item.case])
            )
        log(f"{item.case}: Dice plain {dice['plain'][-1]:.3f}, flip mean {dice['flip mean'][-1]:.3f}")
    maps = {name: {"segmentation": MAPS[name][0], **map_quality(*parts[name])} for name in MAPS}
    errors = subject_errors(frames, bundle.config.get("indices", {}), bundle.class_names, spacing.__getitem__)
    out = {"volumes": len(frames), "summary": summary(dice, errors, maps), "subjects": errors}
    if regions:
        out["summary"]["regions"] = {name: region_rule(review[name], REGION_FLAGS[name]) for name in REGION_MAPS}
    return out


def region_rule(maps: Sequence, flags: Sequence[float]) -> dict:
    """fit-review's TAC-family search (:func:`cardseg_train.review.fit.two_pass`, leave one patient
    out) on ``maps`` whose ``tac`` holds the map to cut regions from, with flag thresholds ``flags``
    (the combined map runs on a larger scale than the TAC): the chosen setting and its held-out figures."""
    from cardseg_train.review import fit as rf

    res = rf.two_pass(maps, first=rf.select_settings(maps, grid={**rf.GRID, "flag_threshold": tuple(flags)}))
    v = res["validation"]["cross_validated"]
    return {
        "settings": {
            k: res["settings"][k] for k in ("smooth_px", "connectivity", "flag_threshold", "max_ml", "ranking")
        },
        "flag_grid": [float(f) for f in flags],
        "held_out": {
            k: v.get(k)
            for k in ("covered_top3", "median_burden_top3", "covered_all", "regions_per_volume", "region_ece")
        },
    }


def main(argv: Optional[List[str]] = None) -> int:
    def compute(bundle, cases, a) -> dict:
        return {
            "flips": [list(f) for f in FLIPS],
            **run_study(bundle, cases, log=lambda text: print(text, file=sys.stderr, flush=True)),
        }

    return study_main(argv, "python -m cardseg_train.studies.flip", __doc__, "flip_study", compute, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
