"""End-diastole and end-systole from a cine's LV volume curve, and the curve's plausibility (pure).

**The ED/ES rule** (:func:`choose_phases`). Input: the LV volume (ml) of every segmented frame.

* A frame the manifest or the user fixed is kept as it is (``fixed``).
* ED is otherwise the frame of the largest LV volume (``largest LV``; ties: the earlier frame).
  Where the data say which frame follows the R wave (DICOM ``TriggerTime`` known for every
  frame), that frame, the one with the smallest trigger time, is ED instead (``R-wave
  frame``) when its LV volume is within :data:`RWAVE_SHARE` of the largest one: a cine
  triggered on the R wave starts at end-diastole, and a frame that holds much less blood than
  the largest is not end-diastole whatever its trigger time says.
* ES is otherwise the frame of the smallest LV volume among the frames other than ED
  (``smallest LV``; ties: the earlier frame).

This is the rule of the Slicer module's ``pick_ed_es`` (set frames kept, ED largest, ES
smallest, the other phase chosen among the remaining frames), with the trigger-time choice added.

**Plausibility** (:func:`check_curve`), each reason a sentence of :class:`CurveCheck`:

* the ES volume is not below the ED volume (no ejection: swapped phases or a failed segmentation);
* the curve has more than one minimum at least :data:`MIN_DEPTH_SHARE` of its range deep
  (the curve taken as one cardiac cycle, its last frame next to its first; a minimum's depth
  is its prominence: how far it lies below the lower of the two maxima around it);
* a frame's LV volume jumps away from both of its neighbours, in the same direction, by more
  than :data:`JUMP_SHARE` of the largest LV volume (a single frame segmented wrongly).

Curves are ``{frame: ml}`` mappings (the segmented frames need not be every frame); they are
taken in frame order.
"""

from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

#: the R-wave frame is ED when its LV volume is at least (1 - RWAVE_SHARE) x the largest LV volume
RWAVE_SHARE = 0.05
#: a minimum counts towards "several minima" when its prominence is at least this share of the curve's range
MIN_DEPTH_SHARE = 0.15
#: a frame that differs from both neighbours (same direction) by more than this share of the largest LV jumps
JUMP_SHARE = 0.20

FIXED, LARGEST, RWAVE, SMALLEST = "fixed", "largest LV", "R-wave frame", "smallest LV"


class PhaseChoice(NamedTuple):
    """The chosen frames and how each was chosen (:data:`FIXED`, :data:`LARGEST`, :data:`RWAVE`, :data:`SMALLEST`)."""

    ed: int
    es: int
    ed_rule: str
    es_rule: str


class CurveCheck(NamedTuple):
    """Whether a volume curve reads as one heart beat's; ``reasons``: one sentence per problem (empty when plausible)."""

    plausible: bool
    reasons: Tuple[str, ...]


def _curve(lv_volumes: Mapping[int, float]) -> Tuple[list, np.ndarray]:
    frames = sorted(int(f) for f in lv_volumes)
    if len(frames) < 2:
        raise ValueError("finding ED and ES needs at least two segmented frames")
    values = np.array([float(lv_volumes[f]) for f in frames], dtype=float)
    if not np.isfinite(values).all():
        raise ValueError("the LV volume curve holds a value that is not a finite number")
    return frames, values


def rwave_frame(trigger_ms: Optional[Mapping[int, float]], frames: Sequence[int]) -> Optional[int]:
    """The frame with the smallest trigger time, where every one of ``frames`` has a finite one; else ``None``."""
    if not trigger_ms:
        return None
    times = [trigger_ms.get(f) for f in frames]
    if any(t is None or not math.isfinite(float(t)) for t in times):
        return None
    return min(frames, key=lambda f: (float(trigger_ms[f]), f))


def choose_phases(
    lv_volumes: Mapping[int, float],
    ed: Optional[int] = None,
    es: Optional[int] = None,
    trigger_ms: Optional[Mapping[int, float]] = None,
    rwave_share: float = RWAVE_SHARE,
) -> PhaseChoice:
    """ED and ES by the rule of the module docstring.

    lv_volumes: ``{frame: LV ml}`` of the segmented frames (at least two); ed, es: frames fixed
    by the manifest or the user (kept even where they are not in the curve); trigger_ms:
    ``{frame: trigger time in ms}`` (DICOM ``TriggerTime``), ``None`` where unknown.
    Raises ``ValueError`` for fewer than two frames or a non-finite volume."""
    frames, values = _curve(lv_volumes)
    lv = dict(zip(frames, values))
    ed_rule = es_rule = FIXED
    if ed is None:
        ed = max((f for f in frames if f != es), key=lambda f: (lv[f], -f))
        ed_rule = LARGEST
        r = rwave_frame(trigger_ms, frames)
        if r is not None and r != es and r != ed and lv[r] >= (1.0 - rwave_share) * lv[ed]:
            ed, ed_rule = r, RWAVE
        elif r is not None and r == ed:
            ed_rule = RWAVE
    if es is None:
        es = min((f for f in frames if f != ed), key=lambda f: (lv[f], f))
        es_rule = SMALLEST
    return PhaseChoice(int(ed), int(es), ed_rule, es_rule)


def _minima(values: np.ndarray, depth: float) -> list:
    """Indices of the minima of the cyclic curve ``values`` ``(T,)`` whose prominence is at least ``depth``."""
    from scipy.signal import find_peaks

    n = len(values)
    tiled = -np.concatenate([values, values, values])
    peaks, _ = find_peaks(tiled, prominence=depth)
    return sorted({int(p) - n for p in peaks if n <= p < 2 * n})


def check_curve(
    lv_volumes: Mapping[int, float],
    ed: int,
    es: int,
    depth_share: float = MIN_DEPTH_SHARE,
    jump_share: float = JUMP_SHARE,
) -> CurveCheck:
    """The plausibility checks of the module docstring on ``{frame: LV ml}`` with the chosen ``ed`` and ``es``."""
    frames, values = _curve(lv_volumes)
    lv = dict(zip(frames, values))
    reasons = []
    if ed in lv and es in lv and lv[es] >= lv[ed]:
        reasons.append(f"LV volume at ES (frame {es}, {lv[es]:.1f} ml) is not below ED (frame {ed}, {lv[ed]:.1f} ml)")
    span = float(values.max() - values.min())
    if span > 0 and len(values) >= 3:
        lows = _minima(values, depth_share * span)
        if len(lows) > 1:
            reasons.append(
                f"{len(lows)} minima at least {100 * depth_share:g}% of the curve's range deep "
                f"(frames {', '.join(str(frames[i]) for i in lows)})"
            )
    top = float(values.max())
    if top > 0 and len(values) >= 3:
        before, after = values - np.roll(values, 1), values - np.roll(values, -1)
        limit = jump_share * top
        jumps = [
            i for i in range(len(values)) if before[i] * after[i] > 0 and min(abs(before[i]), abs(after[i])) > limit
        ]
        for i in jumps:
            reasons.append(
                f"frame {frames[i]} ({values[i]:.1f} ml) differs from both neighbours by more than "
                f"{100 * jump_share:g}% of the largest LV volume"
            )
    return CurveCheck(not reasons, tuple(reasons))
