"""JSON as RFC 8259 defines it, for text from outside (a client's request lines).

Python's ``json`` reads ``NaN``, ``Infinity`` and ``-Infinity`` by default, and a value read that
way is written back as the same invalid JSON (e.g. an echoed request id a client cannot parse).
"""

import json


def loads(text):
    """``json.loads`` that raises ``ValueError`` naming a ``NaN`` or infinity constant."""
    return json.loads(text, parse_constant=_refuse_constant)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")
