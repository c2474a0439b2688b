"""The one exception type the command line turns into a one-line error and exit code 2, and how
problems are worded on one line."""

import json
from typing import Any


class CardsegError(Exception):
    """A problem with the user's input, bundle or options, described in one line."""


def one_line(exc: BaseException, limit: int = 500) -> str:
    """The first non-empty line of an exception's message, at most ``limit`` characters."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show(value: Any, limit: int = 60) -> str:
    """A value as JSON on one line, shortened to ``limit`` characters."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
