"""LVEF categories and what an interval implies for them (pure; no I/O).

Categories (the universal definition of heart failure, Bozkurt et al. 2021, and the ESC 2021
guideline): **reduced** LVEF <= 40 %, **mildly reduced** 41-49 %, **preserved** >= 50 %. The
thresholds are stated on whole percent, as reports give LVEF. A measured or interval LVEF is
therefore first rounded to whole percent, half up (:func:`whole_percent`: 40.49 -> 40, 40.5 ->
41, 49.5 -> 50), then placed: on the continuous scale, values below 40.5 are reduced, from 40.5
to below 49.5 mildly reduced, from 49.5 on preserved. The labels always print the rounded bounds,
so a label never shows a number the category contradicts.

An interval ``[low, high]`` implies every category its rounded bounds span
(:func:`interval_categories`); it **straddles** a threshold when that is more than one
(:func:`straddles`).
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

#: (name, lowest whole percent, highest whole percent) in order of increasing LVEF
LVEF_CATEGORIES: Tuple[Tuple[str, int, int], ...] = (
    ("reduced", 0, 40),
    ("mildly reduced", 41, 49),
    ("preserved", 50, 100),
)


def whole_percent(x: float) -> int:
    """``x`` rounded to whole percent, half up (not Python's half-to-even); clipped to [0, 100]."""
    if not math.isfinite(float(x)):
        raise ValueError(f"LVEF must be finite, got {x}")
    return int(min(100, max(0, math.floor(float(x) + 0.5))))


def lvef_category(x: float) -> str:
    """The category of one LVEF value (percent)."""
    w = whole_percent(x)
    for name, lo, hi in LVEF_CATEGORIES:
        if lo <= w <= hi:
            return name
    raise AssertionError(w)  # pragma: no cover - the categories cover 0..100


def interval_categories(low: float, high: float) -> List[str]:
    """The categories of an LVEF interval, lowest first: those of every whole percent from
    ``round(low)`` to ``round(high)``."""
    a, b = whole_percent(min(low, high)), whole_percent(max(low, high))
    return [name for name, lo, hi in LVEF_CATEGORIES if lo <= b and a <= hi]


def straddles(low: float, high: float) -> bool:
    """Whether the interval spans a category threshold (implies more than one category)."""
    return len(interval_categories(low, high)) > 1


def join_words(words: List[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def category_label(low: Optional[float], high: Optional[float], index: str = "LVEF") -> str:
    """E.g. ``"LVEF 38-46%: reduced or mildly reduced"``; empty when a bound is missing or not finite."""
    if low is None or high is None or not (math.isfinite(float(low)) and math.isfinite(float(high))):
        return ""
    a, b = whole_percent(min(low, high)), whole_percent(max(low, high))
    span = f"{a}%" if a == b else f"{a}-{b}%"
    return f"{index} {span}: {join_words(interval_categories(low, high))}"
