"""The small value checks every block of ``bundle.json`` is made of.

Each check takes a :class:`Where` (the file named in messages) and raises the one-line
:class:`~cardseg.base.errors.CardsegError` ``<file>: <key> <problem>`` at the first bad value.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn, Optional, Sequence

from cardseg.base.errors import CardsegError, show


class Where:
    """Names the checked file in every message; ``fail`` raises the one-line refusal."""

    def __init__(self, label: str):
        self.label = label

    def fail(self, key: str, problem: str) -> NoReturn:
        raise CardsegError(f"{self.label}: {key} {problem}")


class OptionWhere(Where):
    """Like :class:`Where`, but the refusal names a command-line option (the ``key``), not a file:
    the same checks serve the bundle's fields and the options that become them."""

    def __init__(self):
        super().__init__("")

    def fail(self, key: str, problem: str) -> NoReturn:
        raise CardsegError(f"{key} {problem}")


def required_value(where: Where, block: dict, key: str, prefix: str = "") -> Any:
    if key not in block:
        where.fail(f"{prefix}{key}", "is missing")
    return block[key]


def required_object(where: Where, block: dict, key: str, prefix: str = "") -> dict:
    value = required_value(where, block, key, prefix)
    if not isinstance(value, dict):
        where.fail(f"{prefix}{key}", f"must be an object (got {show(value)})")
    return value


def text_value(where: Where, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        where.fail(key, f"must be a non-empty string (got {show(value)})")
    return value


def choice_value(where: Where, key: str, value: Any, allowed: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        where.fail(key, f"must be one of {', '.join(allowed)} (got {show(value)})")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer_value(where: Where, key: str, value: Any, low: Optional[int] = None, high: Optional[int] = None) -> int:
    if not is_int(value):
        where.fail(key, f"must be an integer (got {show(value)})")
    _in_range(where, key, value, low, high, low_open=False)
    return value


def number_value(
    where: Where,
    key: str,
    value: Any,
    low: Optional[float] = None,
    high: Optional[float] = None,
    low_open: bool = False,
) -> float:
    """A finite JSON number (not a boolean), optionally within ``[low, high]`` (``(low, high]``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        where.fail(key, f"must be a number (got {show(value)})")
    if isinstance(value, float) and not math.isfinite(value):
        where.fail(key, f"must be finite (got {show(value)})")
    _in_range(where, key, value, low, high, low_open)
    return float(value)


def _in_range(where: Where, key: str, value, low, high, low_open: bool) -> None:
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and value > high
    if not (too_low or too_high):
        return
    lo = None if low is None else f"{'(' if low_open else '['}{_num(low)}"
    if lo is not None and high is not None:
        where.fail(key, f"must be in {lo}, {_num(high)}] (got {show(value)})")
    if lo is not None:
        where.fail(key, f"must be {'>' if low_open else '>='} {_num(low)} (got {show(value)})")
    where.fail(key, f"must be <= {_num(high)} (got {show(value)})")


def _num(x) -> str:
    """``1`` for 1.0, ``0.1`` for 0.1: bounds as a reader writes them."""
    return f"{x:g}"
