"""Checks of option values (``segment``, ``batch``, ``synth``), judged before anything is read or written."""

import os
from typing import Optional, Tuple

from cardseg.base.errors import CardsegError
from cardseg.base.files import can_create_files


#: the most CPU threads a run may ask for: far above any CPU's, below what exhausts a machine
#: (100,000 threads took 17 GB and never finished)
MAX_THREADS = 1024


def check_run_options(batch_size: int, threads: Optional[int], frame: Optional[int]) -> None:
    """Option values of ``segment`` and ``batch`` that can be judged alone, before anything is read."""
    if batch_size < 1:
        raise CardsegError(f"--batch-size must be at least 1, got {batch_size}")
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise CardsegError(f"--threads must be 1 to {MAX_THREADS}, got {threads}")
    if frame is not None and frame < 0:
        raise CardsegError(f"--frame must be 0 or more, got {frame}")


def check_new_file(path: str, overwrite: bool, what: str, suffixes: Tuple[str, ...]) -> None:
    """A file the program is about to create at ``path``: its name ends in one of ``suffixes``
    (case-insensitive), its folder exists, and nothing is there unless ``overwrite`` is given, in
    which case only a regular file (never a folder, link target or device) may be replaced, and
    files can be made in its folder (a probe file, removed at once: permissions, read-only file
    systems). Refusals are one-line :class:`CardsegError`; nothing else is read or written here."""
    if not any(path.lower().endswith(s) for s in suffixes):
        raise CardsegError(f"{path}: {what} must end in {', '.join(suffixes)}")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise CardsegError(f"{path}: the folder {parent} does not exist")
    if os.path.lexists(path):
        if os.path.isdir(path) or not os.path.isfile(path) or os.path.islink(path):
            raise CardsegError(f"{path}: exists and is not a regular file; {what} must be a file name")
        if not overwrite:
            raise CardsegError(f"{path}: exists; use --overwrite to replace it")
    if not can_create_files(parent):
        raise CardsegError(f"{path}: cannot write there ({parent} is not writable)")


def check_int_range(option: str, value: int, low: int, high: int) -> None:
    """``low <= value <= high`` for an integer option, else a one-line :class:`CardsegError`."""
    if not low <= value <= high:
        raise CardsegError(f"{option} must be between {low} and {high}, got {value}")
