"""What every validation study shares: its options and its whole ``main``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Optional

from cardseg.base.errors import CardsegError

from cardseg_train.base.cli_options import DEFAULT_DATA, add_overwrite, out_record, write_json_and_markdown


def add_study_options(p: argparse.ArgumentParser, files: str) -> None:
    """The options every validation study (``python -m cardseg_train.<study>``) takes: ``--bundle``,
    ``--data``, ``--split`` (val; test only after a release's freeze), ``--out`` (for ``files``) and
    ``--overwrite``."""
    p.add_argument("--bundle", default=None, help="bundle folder (default: the package's bundle)")
    p.add_argument("--data", default=DEFAULT_DATA, help=f"ACDC HDF5 folder (default {DEFAULT_DATA})")
    p.add_argument("--split", default="val", choices=["val", "test"], help="default val (test: after a freeze only)")
    p.add_argument("--out", required=True, help=f"folder for {files}")
    add_overwrite(p)


def study_main(
    argv,
    prog: str,
    doc: str,
    stem: str,
    compute: Callable,
    markdown: Callable[[dict], str],
    options: Optional[Callable] = None,
    check: Optional[Callable] = None,
) -> int:
    """The whole ``main`` of a validation study (``python -m cardseg_train.<study>``): the parser
    (:func:`add_study_options`, then ``options(parser)``), the ``--out`` record, ``check(args)`` (a
    :class:`CardsegError` for a bad value, before any data are read), the bundle and the split's
    labelled volumes, ``compute(bundle, cases, args)`` → the result's own keys (beside ``bundle``
    and ``split``), and ``<stem>.json``/``.md`` written through :func:`write_json_and_markdown`.
    Returns 0, or 2 after one line ``<study>: error: ...``."""
    from cardseg.base.argparsing import CommandLineParser

    name = prog.rsplit(".", 1)[-1]
    p = CommandLineParser(prog=prog, description=doc.split("\n")[0])
    add_study_options(p, f"{stem}.json and .md")
    if options is not None:
        options(p)
    a = p.parse_args(argv)
    try:
        record = out_record(a.out, prog, (f"{stem}.json", f"{stem}.md"), a.overwrite)
        if check is not None:
            check(a)
        from cardseg.bundle.loading import load_bundle

        from cardseg_train.evaluation.segmentation import acdc_h5_volumes

        bundle = load_bundle(a.bundle)
        result = {"bundle": bundle.ident, "split": a.split, **compute(bundle, acdc_h5_volumes(a.data, a.split), a)}
    except CardsegError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    return write_json_and_markdown(record, name, Path(a.out), stem, result, markdown(result))
