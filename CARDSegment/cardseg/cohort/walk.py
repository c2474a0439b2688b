"""Bounded file-system walks for ``cardseg batch``: glob patterns (``**`` allowed) that never loop
over symbolic links and never grow without bound, and the check that an input is a regular file
or a folder (never a FIFO or a device, which would block or never end when read)."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import List, Optional, Sequence, Set, Tuple

from cardseg.base.errors import CardsegError
from cardseg.base.filekind import check_file_or_folder, kind_of

#: the most directory levels a pattern's walk descends below its fixed base folder
MAX_DEPTH = 40
#: the most directory entries one pattern's walk looks at before it is refused
MAX_ENTRIES = 200_000


def require_file_or_folder(path: os.PathLike) -> str:
    """``"file"`` or ``"folder"``; a one-line :class:`CardsegError` for anything else (a FIFO, a
    device, a socket, a missing path), decided from ``stat`` alone: nothing is opened."""
    kind = kind_of(path)
    check_file_or_folder(path, kind, "not a regular file or a folder; an input must be an image file or a folder")
    return kind


def _split(pattern: str) -> Tuple[str, List[str]]:
    """``(base folder, pattern parts below it)``: the base is the leading parts without glob characters."""
    parts = list(Path(pattern).parts)
    fixed: List[str] = []
    while parts and not any(ch in parts[0] for ch in "*?["):
        fixed.append(parts.pop(0))
    base = os.path.join(*fixed) if fixed else "."
    return base, parts


def _part_ok(pat: str, name: str) -> bool:
    if name.startswith(".") and not pat.startswith("."):  # like glob: wildcards skip hidden names
        return False
    return fnmatch.fnmatchcase(name, pat)


def _match(pat: Sequence[str], path: Sequence[str], prefix: bool) -> bool:
    """Whether ``path`` matches ``pat`` (or, with ``prefix``, can still lead to a match below it)."""
    if not path:
        return prefix or all(p == "**" for p in pat)
    if not pat:
        return False
    if pat[0] == "**":
        return _match(pat[1:], path, prefix) or (_part_ok("*", path[0]) and _match(pat, path[1:], prefix))
    return _part_ok(pat[0], path[0]) and _match(pat[1:], path[1:], prefix)


def bounded_glob(pattern: str) -> List[str]:
    """The paths matching ``pattern`` (``*``, ``?``, ``[...]``, ``**`` for any number of folders),
    sorted, as :func:`glob.glob` with ``recursive=True`` gives them, but walked so that it always
    ends: each real folder is entered once (symbolic links to folders are followed, a link back to
    a folder already seen is not), at most :data:`MAX_DEPTH` levels deep; a walk that meets more
    than :data:`MAX_ENTRIES` entries is refused in one line."""
    base, pat = _split(os.path.expanduser(pattern))
    found: List[str] = []
    if not pat:
        return [base] if os.path.lexists(base) else []
    seen: Set[Tuple[int, int]] = set()
    count = 0

    def visit(folder: str, rel: List[str]) -> None:
        nonlocal count
        try:
            st = os.stat(folder)
        except OSError:
            return
        ident = (st.st_dev, st.st_ino)
        if ident in seen or len(rel) > MAX_DEPTH:
            return
        seen.add(ident)
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            count += 1
            if count > MAX_ENTRIES:
                raise CardsegError(
                    f"{pattern}: the pattern walks more than {MAX_ENTRIES} files and folders; give a "
                    "narrower pattern or a --manifest"
                )
            sub = rel + [e.name]
            if _match(pat, sub, prefix=False):
                found.append(os.path.join(folder, e.name) if folder != "." else e.name)
            try:
                is_dir = e.is_dir()  # follows a link; a loop is caught by the inode check
            except OSError:
                is_dir = False
            if is_dir and _match(pat, sub, prefix=True):
                visit(os.path.join(folder, e.name), sub)

    if _match(pat, [], prefix=False) and os.path.isdir(base):
        found.append(base)
    if os.path.isdir(base):
        visit(base, [])
    return sorted(dict.fromkeys(found))


def inside(path: os.PathLike, folder: Optional[os.PathLike]) -> bool:
    """Whether ``path`` is ``folder`` or lies below it (both resolved, links followed)."""
    if folder is None:
        return False
    p, f = os.path.realpath(path), os.path.realpath(folder)
    return p == f or p.startswith(f.rstrip(os.sep) + os.sep)
