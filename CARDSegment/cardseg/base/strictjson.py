"""JSON as RFC 8259 defines it, for text exchanged with other programs (a client's request lines
and the engine's answers), and a bounded reader for the program's own files.

Python's ``json`` reads ``NaN``, ``Infinity`` and ``-Infinity`` by default, turns a number too
large for a float (``1e999``) into an infinity, and writes any of them back as the same invalid
JSON (e.g. an echoed request id a client cannot parse). :func:`loads` refuses them all;
:func:`dumps` writes a non-finite number as ``null``. :func:`bounded_loads` reads what the
program wrote (stamps, records, reports, ``bundle.json``) as ``json`` does, but refuses nesting
that would exhaust the parser's stack, with a ``ValueError`` its readers already handle.
"""

import json
import math
import re

#: the deepest nesting of arrays and objects :func:`bounded_loads` reads (the program's own files
#: nest a few levels; Python's parser fails with a ``RecursionError`` near a thousand)
MAX_DEPTH = 64
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")


def loads(text):
    """``json.loads`` that raises ``ValueError`` naming a ``NaN``/infinity constant, a number
    out of a float's range, or nesting deeper than :data:`MAX_DEPTH`."""
    if nesting_depth(text) > MAX_DEPTH:
        raise ValueError(f"JSON nested more than {MAX_DEPTH} levels deep")
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def nesting_depth(text: str) -> int:
    """How deeply ``text``'s arrays and objects nest (brackets inside strings aside)."""
    depth = deepest = 0
    for m in _BRACKETS.finditer(_STRINGS.sub("", text)):
        depth += 1 if m.group() in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def bounded_loads(text: str, max_depth: int = MAX_DEPTH):
    """``json.loads`` (Python's reading of numbers) for the program's own files: text nested
    deeper than ``max_depth`` raises ``ValueError`` (one line) instead of exhausting the stack."""
    if nesting_depth(text) > max_depth:
        raise ValueError(f"JSON nested more than {max_depth} levels deep")
    return json.loads(text)


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
