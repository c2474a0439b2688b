"""JSON as RFC 8259 defines it, for text exchanged with other programs (a client's request lines
and the engine's answers).

Python's ``json`` reads ``NaN``, ``Infinity`` and ``-Infinity`` by default, turns a number too
large for a float (``1e999``) into an infinity, and writes any of them back as the same invalid
JSON (e.g. an echoed request id a client cannot parse). :func:`loads` refuses them all;
:func:`dumps` writes a non-finite number as ``null``.
"""

import json
import math


def loads(text):
    """``json.loads`` that raises ``ValueError`` naming a ``NaN``/infinity constant or a number
    out of a float's range."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def dumps(value) -> str:
    """``value`` as one line of JSON, every non-finite float written as ``null``."""
    return json.dumps(finite(value), allow_nan=False)


def finite(value):
    """``value`` (dicts, lists, tuples, numbers, text) with each non-finite float made ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value
