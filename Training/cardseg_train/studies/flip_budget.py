"""Cheaper flipped copies: what each way of running fewer of them keeps of the review, on validation.

A ``tac_flips`` rule cuts its regions from the TAC plus the disagreement of the primary's runs on
flipped copies of the volume; the copies cost more primary calls than the trajectory's own. Each
candidate (:data:`CANDIDATES`: which copies, ``regions.flip_copies``, and on which diffusion steps,
``regions.flip_steps``) runs on the same plain trajectory of every clean volume of the split
(validation; the test split only once a release has frozen its choices), and the region rule is
fitted on its maps exactly as ``cardseg fit-review --rule tac-flips`` fits it (the same two-pass
search, ``p_error`` cross-fitted leave one patient out), within fit-review's burden budget and
within the shipped rule's own held-out burden (``--max-burden``). Reported per candidate: the primary calls
a batch, the copies' seconds over all volumes on this machine, and the held-out figures of its
best rule (the first three regions' covered share, their median burden, all regions' cover).

Writes ``flip_budget.json`` and ``.md``::

    python -m cardseg_train.studies.flip_budget --split val --out DIR
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

from cardseg_train.studies.common import study_main


@dataclass(frozen=True)
class Candidate:
    """One way of running the copies: the copies (names of :data:`cardseg.method.flips.COPY_NAMES`)
    and the diffusion steps each runs on."""

    copies: Tuple[str, ...]
    steps: Tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{'+'.join(self.copies)} on {', '.join(str(t) for t in self.steps)}"

    @property
    def calls(self) -> int:
        """Primary calls per batch of slices."""
        return len(self.copies) * len(self.steps)


ALL = ("rows", "columns", "both")
#: the candidates, the shipped rule's first (all three copies on steps 49 and 0)
CANDIDATES = (
    Candidate(ALL, (49, 0)),
    Candidate(ALL, (49,)),
    Candidate(("rows", "columns"), (49, 0)),
    Candidate(("rows", "columns"), (49,)),
    Candidate(("both",), (49, 0)),
    Candidate(("both",), (49,)),
    Candidate(("rows",), (49,)),
    Candidate(("columns",), (49,)),
)


def with_candidate(bundle, c: Candidate):
    """``bundle`` whose flipped copies run as ``c`` says (its plain run unchanged)."""
    from cardseg.method.flips import with_flip_copies, with_flip_steps

    return replace(bundle, config=with_flip_copies(with_flip_steps(bundle.config, c.steps), c.copies))


def plain_maps(bundle, item):
    """The plain card run of one labelled volume: its normalised slices, trajectory and
    :class:`~cardseg_train.review.data.VolumeMaps` (no flips yet)."""
    import numpy as np

    from cardseg.base import arrays
    from cardseg.segment import SegmentOptions, normalized_slices, trajectory_on_slices

    from cardseg_train.review.data import VolumeMaps

    slices01 = normalized_slices(item.volume, bundle)
    traj = trajectory_on_slices(slices01, tuple(item.volume.spacing[:2]), bundle, SegmentOptions("card"))
    logits = arrays.to_numpy(traj.logits)
    maps = VolumeMaps(
        item.case,
        "clean",
        logits.argmax(axis=1).astype(np.uint8),
        item.labels.astype(np.uint8),
        arrays.to_numpy(traj.tac).astype(np.float32),
        tuple(float(s) for s in item.volume.spacing),
        None,
        fov=np.asarray(traj.fov, bool),
    )
    return slices01, traj, maps


def candidate_maps(bundle, cases, candidates: Sequence[Candidate], log=print) -> Tuple[Dict[str, list], dict]:
    """Per candidate, every volume's maps with its copies' disagreement, and the copies' seconds."""
    from cardseg.segment import flip_disagreement_map

    maps: Dict[str, list] = {c.name: [] for c in candidates}
    seconds = {c.name: 0.0 for c in candidates}
    for item in cases:
        slices01, traj, plain = plain_maps(bundle, item)
        for c in candidates:
            t0 = time.perf_counter()
            flips = flip_disagreement_map(slices01, tuple(item.volume.spacing[:2]), with_candidate(bundle, c), traj)
            seconds[c.name] += time.perf_counter() - t0
            maps[c.name].append(replace(plain, flips=flips))
        log(f"{item.case}: done")
    return maps, seconds


def shipped_burden(bundle) -> float:
    """The held-out median burden of the bundle's own rule (its fit record)."""
    return float(bundle.config["regions"]["fit"]["validation"]["cross_validated"]["median_burden_top3"])


def run_study(bundle, cases, candidates: Sequence[Candidate] = CANDIDATES, log=print) -> dict:
    """Per candidate: its cost and the held-out figures of the tac-flips rule fitted on its maps,
    within fit-review's burden budget and within the shipped rule's own burden."""
    from cardseg_train.review.fit import MAX_BURDEN
    from cardseg_train.review.report import choose_rule

    maps, seconds = candidate_maps(bundle, list(cases), candidates, log)
    budgets = {"budget": MAX_BURDEN, "shipped_burden": shipped_burden(bundle)}
    out = {}
    for c in candidates:
        out[c.name] = {
            "copies": list(c.copies),
            "steps": list(c.steps),
            "primary_calls_per_batch": c.calls,
            "seconds": seconds[c.name],
        }
        for key, burden in budgets.items():
            fit = choose_rule(maps[c.name], "tac-flips", max_burden=burden)
            out[c.name][key] = {"held_out": fit["validation"]["cross_validated"], "settings": dict(fit["settings"])}
        held = out[c.name]["budget"]["held_out"]
        log(f"{c.name}: top3 {held['covered_top3']:.3f} at {held['median_burden_top3']:.3f}")
    return {"volumes": len(maps[candidates[0].name]), "burdens": budgets, "candidates": out}


def markdown(result: dict) -> str:
    first = next(iter(result["candidates"].values()))
    lines = [
        f"# Cheaper flipped copies: {result['bundle']}, {result['split']} split",
        "",
        f"{result['volumes']} clean volumes; the plain trajectory is the same for every row. Each row's "
        "copies run on the steps it names; the tac-flips rule is fitted on its maps as `cardseg fit-review "
        "--rule tac-flips` fits it (two-pass search, p_error left out by patient). Seconds: the copies "
        "alone, all volumes, this machine (other work was running: compare the calls).",
        "",
        f"Within fit-review's budget (median burden at most {result['burdens']['budget']:.1%}) and within "
        f"the shipped rule's own held-out burden ({result['burdens']['shipped_burden']:.1%}):",
        "",
        "| copies on steps | primary calls a batch | seconds | share of the first row's | first 3 regions "
        "cover | median burden | all regions cover | regions per volume | chosen flag | within the shipped "
        "burden: cover | its burden |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["candidates"].items():
        h, s = r["budget"]["held_out"], r["shipped_burden"]["held_out"]
        share = r["seconds"] / first["seconds"] if first["seconds"] else float("nan")
        lines.append(
            f"| {name} | {r['primary_calls_per_batch']} | {r['seconds']:.1f} | {share:.2f} | "
            f"{h['covered_top3']:.3f} | {h['median_burden_top3']:.3f} | {h['covered_all']:.3f} | "
            f"{h['regions_per_volume']:.1f} | {r['budget']['settings']['flag_threshold']:g} | "
            f"{s['covered_top3']:.3f} | {s['median_burden_top3']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    def compute(bundle, cases, a) -> dict:
        return run_study(bundle, cases, log=lambda text: print(text, file=sys.stderr, flush=True))

    return study_main(argv, "python -m cardseg_train.studies.flip_budget", __doc__, "flip_budget", compute, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
