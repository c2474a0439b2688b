"""Entry point for the ``cardseg`` subcommands that live in the training package."""

from __future__ import annotations

import sys
from typing import List

from cardseg.errors import CardsegError

PLANNED = {
    "train": "training on ACDC (issue: training folder)",
    "fit-calibration": "calibration fitting (issue: calibration and evaluation harness)",
    "evaluate": "the evaluation harness (issue: calibration and evaluation harness)",
}


def main(argv: List[str]) -> int:
    command = argv[0] if argv else ""
    if command in PLANNED:
        raise CardsegError(f"'cardseg {command}' is not available in this version yet: {PLANNED[command]}")
    raise CardsegError(f"unknown training command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
