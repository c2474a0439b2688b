"""The flipped copies on fewer diffusion steps: what the TAC + flips review map loses, on validation.

A bundle whose regions are cut from the TAC plus the flipped copies' disagreement (``tac_flips``)
runs the primary three more times a volume; ``regions.flip_steps`` lets the copies call it on
fewer of the diffusion steps than the plain run (their terminal prediction is the one at the last
step they run). For every clean volume of the split (validation; the test split only once a
release has frozen its choices) the engine's own plain run and its copies on each candidate list
of steps (:data:`CANDIDATES`, the bundle's sampled steps first) are compared, nothing fitted: the
seconds the copies took, and the quality of the smoothed TAC + flips map (2 px, as the rules')
against the substantial errors (:func:`cardseg_train.studies.reference_maps.map_quality`: voxel AUROC and
AUPRC, errors covered by the map's highest voxels at 5, 10 and 20 % of the predicted heart).

Writes ``flip_steps.json`` and ``.md``::

    python -m cardseg_train.studies.flip_steps --bundle B --split val --out DIR
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from cardseg_train.studies.common import study_main

#: the copies' step lists compared (each a subset of the shipped bundles' [49, 37, 24, 12, 0]),
#: besides the bundle's own sampled steps
CANDIDATES = ((49, 24, 0), (49, 0), (49,))


def with_copies_on(bundle, steps: Sequence[int]):
    """``bundle`` whose flipped copies run on ``steps`` (its plain run unchanged)."""
    from cardseg.method.flips import with_flip_steps

    return replace(bundle, config=with_flip_steps(bundle.config, steps))


def label(steps: Sequence[int]) -> str:
    return ", ".join(str(int(t)) for t in steps)


def run_study(bundle, cases, candidates: Sequence[Sequence[int]] = CANDIDATES, log=print) -> dict:
    """Per candidate (the bundle's sampled steps first): the copies' seconds over all volumes and
    the map quality of the smoothed TAC + their disagreement."""
    import numpy as np

    from cardseg.base import arrays
    from cardseg.review.error_map import smoothed
    from cardseg.segment import SegmentOptions, flip_disagreement_map, normalized_slices, trajectory_on_slices

    from cardseg_train.studies.reference_maps import SMOOTH_PX, map_quality

    lists = [list(bundle.sampled_steps)] + [list(c) for c in candidates if list(c) != list(bundle.sampled_steps)]
    preds, truths = [], []
    maps: Dict[str, List[np.ndarray]] = {label(s): [] for s in lists}
    seconds = {label(s): 0.0 for s in lists}
    for item in cases:
        slices01 = normalized_slices(item.volume, bundle)
        spacing_xy = tuple(item.volume.spacing[:2])
        traj = trajectory_on_slices(slices01, spacing_xy, bundle, SegmentOptions("card"))
        preds.append(arrays.to_numpy(traj.logits).argmax(axis=1).astype(np.uint8))
        truths.append(item.labels.astype(np.uint8))
        tac = arrays.to_numpy(traj.tac).astype(np.float32)
        for steps in lists:
            t0 = time.perf_counter()
            flips = flip_disagreement_map(slices01, spacing_xy, with_copies_on(bundle, steps), traj)
            seconds[label(steps)] += time.perf_counter() - t0
            maps[label(steps)].append(smoothed(tac + flips, SMOOTH_PX))
        log(f"{item.case}: done")
    out = {}
    for steps in lists:
        q = map_quality(preds, truths, maps[label(steps)])
        out[label(steps)] = {
            "steps": steps,
            "network_calls_per_batch": 3 * len(steps),
            "seconds": seconds[label(steps)],
            **q,
        }
    return {"volumes": len(preds), "sampled_steps": lists[0], "candidates": out}


def markdown(result: dict) -> str:
    base = result["candidates"][label(result["sampled_steps"])]
    lines = [
        f"# The flipped copies on fewer diffusion steps: {result['bundle']}, {result['split']} split",
        "",
        f"{result['volumes']} clean volumes. The plain run (the bundle's steps {label(result['sampled_steps'])}) "
        "and its TAC are the same throughout; the three flipped copies run on the steps of each row. Map: "
        "TAC + the copies' disagreement, smoothed 2 px, against the plain run's substantial errors. Nothing "
        "fitted; seconds on this machine, all volumes.",
        "",
        "| copies' steps | primary calls a batch | seconds | share of the bundle's | AUROC | AUPRC | "
        "covered at 5% | at 10% | at 20% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["candidates"].items():
        c = r["covered"]
        share = r["seconds"] / base["seconds"] if base["seconds"] else float("nan")
        lines.append(
            f"| {name} | {r['network_calls_per_batch']} | {r['seconds']:.1f} | {share:.2f} | "
            f"{r['auroc']:.3f} | {r['auprc']:.3f} | {c['0.05']:.3f} | {c['0.1']:.3f} | {c['0.2']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    def compute(bundle, cases, a) -> dict:
        return run_study(bundle, cases, log=lambda text: print(text, file=sys.stderr, flush=True))

    return study_main(argv, "python -m cardseg_train.studies.flip_steps", __doc__, "flip_steps", compute, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
