"""What a path is, decided from ``stat`` alone (nothing is opened, so a FIFO or a device never blocks)."""

from __future__ import annotations

import os
import stat

from cardseg.base.errors import CardsegError

_SPECIAL = (
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


#: the single-file volume formats the engine reads (what a folder of images is recognised by)
VOLUME_SUFFIXES = (".nii.gz", ".nii", ".nrrd", ".nhdr", ".mha", ".mhd", ".hdr")

#: how :func:`kind_of` starts a path that ``stat`` cannot answer for (then the reason in brackets)
UNREADABLE = "path that cannot be read"


def kind_of(path: os.PathLike) -> str:
    """``"file"`` (regular), ``"folder"``, ``"missing"``, or what else ``path`` is (``"FIFO"``,
    ``"character device"``, ``"block device"``, ``"socket"``, ``"special file"``, ``"path that
    cannot be read (...)"``), following symbolic links; never opens ``path``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:  # a symbolic link loop, a name too long, no permission
        return f"{UNREADABLE} ({exc.strerror or exc})"
    except ValueError:  # a NUL, or a lone surrogate the file system cannot encode
        return f"{UNREADABLE} (its name holds a character no file name can)"
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


def check_file_or_folder(path: os.PathLike, kind: str, not_what: str) -> None:
    """``kind`` (:func:`kind_of`'s answer for ``path``) is a regular file or a folder, else a
    one-line :class:`CardsegError`: missing, cannot be read (the reason), or what else it is (a
    FIFO or a device would block or never end when read), then ``not_what``."""
    if kind == "missing":
        raise CardsegError(f"{path}: no such file or folder")
    if kind.startswith(UNREADABLE):
        raise CardsegError(f"{path}: cannot be read {kind[len(UNREADABLE) :].strip()}")
    if kind not in ("file", "folder"):
        raise CardsegError(f"{path}: is a {kind}, {not_what}")
