"""Checks of option values that ``segment`` and ``batch`` share, judged before anything is read."""

from typing import Optional

from cardseg.base.errors import CardsegError


def check_run_options(batch_size: int, threads: Optional[int], frame: Optional[int]) -> None:
    """Option values of ``segment`` and ``batch`` that can be judged alone, before anything is read."""
    if batch_size < 1:
        raise CardsegError(f"--batch-size must be at least 1, got {batch_size}")
    if threads is not None and threads < 1:
        raise CardsegError(f"--threads must be at least 1, got {threads}")
    if frame is not None and frame < 0:
        raise CardsegError(f"--frame must be 0 or more, got {frame}")
