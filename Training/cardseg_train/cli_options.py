"""Options several training-tool subcommands share, declared once."""

from __future__ import annotations

import argparse
from typing import List, Sequence

from cardseg.base.errors import CardsegError

DEFAULT_DATA = "../shared/data/acdc"


def add_bundle_and_data(p: argparse.ArgumentParser, data_help: str = "ACDC HDF5 folder",
                        bundle_help: str = "bundle folder (default: $CARDSEG_BUNDLE or the shipped one)") -> None:
    """``--bundle`` and ``--data``."""
    p.add_argument("--bundle", metavar="PATH", help=bundle_help)
    p.add_argument("--data", default=DEFAULT_DATA, metavar="PATH", help=data_help)


def add_h5_spacing(p: argparse.ArgumentParser) -> None:
    p.add_argument("--h5-spacing", type=float, default=1.5, metavar="MM",
                   help="pixel size assumed for the geometry-less HDF5 volumes (default 1.5, as in training)")


def add_compute(p: argparse.ArgumentParser, quiet: bool = True) -> None:
    """``--device``, ``--batch-size``, ``--threads`` and (for commands with a progress bar) ``--quiet``."""
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    p.add_argument("--batch-size", type=int, default=8, help="slices per network batch (default 8)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch")
    if quiet:
        p.add_argument("--quiet", action="store_true", help="no progress bar")


def comma_names(text: str, allowed: Sequence[str], what: str) -> List[str]:
    """The names of a comma-separated option value, each one of ``allowed`` (a one-line
    :class:`~cardseg.base.errors.CardsegError` naming the unknown ones otherwise)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise CardsegError(f"unknown {what} {', '.join(bad) or repr(text)} (choose from {', '.join(allowed)})")
    return names
