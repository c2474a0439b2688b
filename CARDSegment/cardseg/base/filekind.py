"""What a path is, decided from ``stat`` alone (nothing is opened, so a FIFO or a device never blocks)."""

from __future__ import annotations

import os
import stat

from cardseg.base.errors import CardsegError

_SPECIAL = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
            (stat.S_ISSOCK, "socket"))


def kind_of(path: os.PathLike) -> str:
    """``"file"`` (regular), ``"folder"``, ``"missing"``, or what else ``path`` is (``"FIFO"``,
    ``"character device"``, ``"block device"``, ``"socket"``, ``"special file"``, ``"path that
    cannot be read (...)"``), following symbolic links; never opens ``path``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:  # a symbolic link loop, a name too long, no permission
        return f"path that cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    return next((name for test, name in _SPECIAL if test(mode)), "special file")


def require_regular_file(path: os.PathLike, what: str) -> None:
    """``path`` is a regular file, else a one-line :class:`CardsegError` that starts with ``what``
    and says whether it is missing or what else it is (a device is never called missing)."""
    kind = kind_of(path)
    if kind == "missing":
        raise CardsegError(f"{what} is missing")
    if kind != "file":
        raise CardsegError(f"{what} is a {kind}, not a regular file")
