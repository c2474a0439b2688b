"""Heart rate and cardiac output from a cine's temporal resolution and the stroke volume (pure).

The cycle length (ms) comes from, in this order:

1. the R-R interval the scanner recorded (DICOM ``NominalInterval``, 0018,1062), ``source``
   ``"R-R interval"``;
2. the trigger times (DICOM ``TriggerTime``, 0018,1060): frames x their median step, the cine
   taken as one whole cycle (retrospective gating), ``"trigger times"``;
3. the frame interval of the file (NIfTI ``pixdim[4]`` with a time unit in ``xyzt_units``, a
   NRRD time axis): frames x interval, the cine taken as one whole cycle, ``"frame interval"``.

Heart rate (beats/min) = 60000 / cycle (ms); cardiac output (l/min) = stroke volume (ml) x
heart rate / 1000. Without any of them, or with a heart rate outside :data:`HEART_RATE_BPM`
(a unit read wrongly, a cine of part of a cycle), both are empty and ``note`` says why.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence

import numpy as np

from cardseg.io.cine_info import positive

#: the heart rates (beats/min) taken as a measurement; outside them the rates are left empty
HEART_RATE_BPM = (20.0, 300.0)


class Rates(NamedTuple):
    """heart_rate_bpm, cardiac_output_l_min and cycle_ms (``None`` where unknown); source: where the
    cycle length came from (``""`` where unknown); note: why the rates are empty (``""`` when known)."""

    heart_rate_bpm: Optional[float]
    cardiac_output_l_min: Optional[float]
    cycle_ms: Optional[float]
    source: str
    note: str


def trigger_step_ms(trigger_ms: Optional[Sequence[float]]) -> Optional[float]:
    """The median step (ms) between sorted trigger times ``(T,)``; ``None`` for fewer than two or no positive step."""
    if trigger_ms is None or len(trigger_ms) < 2:
        return None
    t = np.sort(np.asarray([float(v) for v in trigger_ms], dtype=float))
    if not np.isfinite(t).all():
        return None
    return positive(np.median(np.diff(t)))


def cycle_length(
    frames: int,
    frame_ms: Optional[float] = None,
    trigger_ms: Optional[Sequence[float]] = None,
    rr_ms: Optional[float] = None,
) -> tuple:
    """``(cycle ms or None, source)`` by the order of the module docstring; ``frames``: how many the cine holds."""
    rr = positive(rr_ms)
    if rr is not None:
        return rr, "R-R interval"
    step = trigger_step_ms(trigger_ms)
    if step is not None and frames > 1:
        return frames * step, "trigger times"
    interval = positive(frame_ms)
    if interval is not None and frames > 1:
        return frames * interval, "frame interval"
    return None, ""


def frame_times_ms(frames: int, frame_ms: Optional[float] = None, trigger_ms: Optional[Sequence[float]] = None) -> list:
    """Each frame's time (ms, ``(T,)``): the trigger times where known, else frame x interval, else ``None`` each."""
    if trigger_ms is not None and len(trigger_ms) == frames and all(math.isfinite(float(t)) for t in trigger_ms):
        return [float(t) for t in trigger_ms]
    interval = positive(frame_ms)
    return [k * interval if interval is not None else None for k in range(frames)]


def cardiac_rates(
    stroke_ml: Optional[float],
    frames: int,
    frame_ms: Optional[float] = None,
    trigger_ms: Optional[Sequence[float]] = None,
    rr_ms: Optional[float] = None,
) -> Rates:
    """Heart rate and cardiac output (:class:`Rates`) of a cine of ``frames`` frames with stroke volume ``stroke_ml``."""
    cycle, source = cycle_length(frames, frame_ms, trigger_ms, rr_ms)
    if cycle is None:
        return Rates(
            None, None, None, "", "temporal resolution unknown (no R-R interval, trigger times or frame interval)"
        )
    hr = 60000.0 / cycle
    lo, hi = HEART_RATE_BPM
    if not lo <= hr <= hi:
        return Rates(
            None,
            None,
            cycle,
            source,
            f"heart rate {hr:.3g} beats/min from the {source} is outside {lo:g}-{hi:g}: not a whole cycle, or a wrong unit",
        )
    sv = None if stroke_ml is None else float(stroke_ml)
    if sv is None or not math.isfinite(sv):
        return Rates(hr, None, cycle, source, "no stroke volume: no cardiac output")
    return Rates(hr, sv * hr / 1000.0, cycle, source, "")
