"""The engine's stages on the panel's progress bar: how much of the bar each fills, what the
status line says, and the overall fraction a progress line puts the run at.

Nothing here imports Qt or Slicer (:mod:`CARDSegmentLib.runs.process` and :mod:`CARDSegmentLib.runs.engine`
feed it the engine's ``--progress json`` lines).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

Spans = Dict[str, Tuple[float, float]]

#: how much of the progress bar each engine stage fills (the rest is unknown stages)
STAGE_SPANS: Spans = {
    "export-onnx": (0.0, 0.03),
    "prepare-torch": (0.0, 0.03),
    "read": (0.0, 0.05),
    # the shipped bundle's flipped copies (two diffusion steps each) take ~1.1x the trajectory (flip_cost.json)
    "trajectory": (0.05, 0.46),
    "trajectory-moved": (0.46, 0.46),
    "flips": (0.46, 0.92),  # moved grid: holds
    "write": (0.92, 1.0),
    "hashing": (0.0, 0.02),
    "cases": (0.02, 1.0),  # cardseg batch (a cine sequence's frames) counts frames
}
#: a run that skips the flipped copies (``--method uc``, or a review map other than ``tac_flips``):
#: the trajectory fills what they would have
NO_FLIP_SPANS: Spans = {
    **STAGE_SPANS,
    "trajectory": (0.05, 0.92),
    "trajectory-moved": (0.92, 0.92),
    "flips": (0.92, 0.92),
}
#: the review maps whose rule runs the flipped copies (cardseg.method.flips.needs_flips)
FLIP_MAPS = ("tac_flips",)
STAGE_TEXT = {
    "export-onnx": "Preparing the fast CPU models (first run with this bundle only)",
    "prepare-torch": "Preparing the networks (first run with this bundle and device only)",
    "read": "Reading the volume and the model bundle",
    "trajectory": "Reverse diffusion (primary and reference)",
    "trajectory-moved": "Reverse diffusion again, the field of view moved onto the heart",
    "flips": "Reverse diffusion on the flipped copies (primary only, for the flagged regions)",
    "write": "Writing results",
    "hashing": "Reading the frames",
    "cases": "Segmenting frames",
    "indices": "Cardiac indices of the ED and ES frames",
    "loading": "Loading the results",
}


def stage_spans(method: str = "card", review_map: Optional[str] = None) -> Spans:
    """The spans of a run of ``method`` with the review map ``review_map`` (None: the bundle's own,
    taken to be the shipped one's, which runs the flipped copies)."""
    flips = method == "card" and (review_map is None or review_map in FLIP_MAPS)
    return STAGE_SPANS if flips else NO_FLIP_SPANS


@dataclass
class Progress:
    """The latest progress line: stage name, steps done and total, and the overall fraction."""

    stage: str = ""
    done: int = 0
    total: int = 0
    fraction: float = 0.0

    @property
    def text(self) -> str:
        if not self.stage:
            return "Starting"
        label = STAGE_TEXT.get(self.stage, self.stage)
        return f"{label} ({self.done}/{self.total})" if self.total > 1 else label


def overall_fraction(stage: str, done: int, total: int, previous: float = 0.0, spans: Optional[Spans] = None) -> float:
    """Where a stage's ``done/total`` puts the whole run on [0, 1] (``spans``: :func:`stage_spans`,
    default :data:`STAGE_SPANS`); never moves backwards."""
    span = (STAGE_SPANS if spans is None else spans).get(stage)
    if span is None:
        return previous
    lo, hi = span
    part = min(max(done / total, 0.0), 1.0) if total > 0 else 0.0
    return max(previous, lo + (hi - lo) * part)
