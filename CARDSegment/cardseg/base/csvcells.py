"""CSV cells that a spreadsheet program never runs as a formula.

Spreadsheet programs (Excel, LibreOffice, Google Sheets) treat a cell whose text starts with
``=``, ``+``, ``-``, ``@`` (and, in some, a tab or a carriage return) as a formula, so a subject
name such as ``=HYPERLINK(...)`` written raw into a CSV runs when the table is opened. Every text
cell cardseg writes into a CSV goes through :func:`safe_cell`; :func:`read_cell` undoes it.
"""

from __future__ import annotations

import re

#: the first characters that make a spreadsheet read a cell as a formula
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$|^[+-]?(inf|nan)$", re.I)


def safe_cell(text: str) -> str:
    """``text`` with a ``'`` put in front when it starts with a formula character (or with ``'``, so
    that :func:`read_cell` can undo it exactly); plain numbers such as ``-1.5`` stay as they are.
    Guarantees: the result never starts with a character of :data:`FORMULA_START` unless it is a
    plain number, and ``read_cell(safe_cell(t)) == t`` for every ``t``."""
    if text.startswith(FORMULA_START) and not _NUMBER.match(text):
        return "'" + text
    if text.startswith("'"):
        return "'" + text
    return text


def read_cell(text: str) -> str:
    """The text :func:`safe_cell` was given (one leading ``'`` taken away)."""
    return text[1:] if text.startswith("'") else text
