"""Options several training-tool subcommands share, declared once."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from cardseg.base.errors import CardsegError

DEFAULT_DATA = "../shared/data/acdc"


def add_bundle_and_data(
    p: argparse.ArgumentParser,
    data_help: str = "ACDC HDF5 folder",
    bundle_help: str = "bundle folder (default: $CARDSEG_BUNDLE or the shipped one)",
) -> None:
    """``--bundle`` and ``--data``."""
    p.add_argument("--bundle", metavar="PATH", help=bundle_help)
    p.add_argument("--data", default=DEFAULT_DATA, metavar="PATH", help=data_help)


def add_h5_spacing(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--h5-spacing",
        type=float,
        default=1.5,
        metavar="MM",
        help="pixel size assumed for the geometry-less HDF5 volumes (default 1.5, as in training)",
    )


def cache_default(name: str) -> str:
    """``<cardseg's cache folder>/<name>``, the default of a training tool's cache option: the
    engine's cache root (:func:`cardseg.bundle.onnx_cache.cache_dir`: ``$CARDSEG_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/cardseg``, else ``~/.cache/cardseg``), never the working folder."""
    from cardseg.bundle.onnx_cache import cache_dir

    return str(cache_dir() / name)


def add_cache(p: argparse.ArgumentParser, name: str, what: str, option: str = "--cache") -> None:
    """A cache folder option defaulting to :func:`cache_default` ``(name)``, shown resolved in --help."""
    default = cache_default(name)
    p.add_argument(
        option,
        default=default,
        metavar="DIR",
        help=f"{what} ('' for none; default {default.replace('%', '%%')}: under cardseg's cache folder, "
        "$CARDSEG_CACHE_DIR, else $XDG_CACHE_HOME/cardseg, else ~/.cache/cardseg)",
    )


def add_compute(p: argparse.ArgumentParser, quiet: bool = True) -> None:
    """``--device``, ``--batch-size``, ``--threads`` and (for commands with a progress bar) ``--quiet``."""
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    p.add_argument("--batch-size", type=int, default=8, help="slices per network batch (default 8)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch")
    if quiet:
        p.add_argument("--quiet", action="store_true", help="no progress bar")


def check_compute(a: argparse.Namespace, caches: Sequence[str] = ("cache",)) -> None:
    """The values of :func:`add_compute`'s and :func:`add_h5_spacing`'s options, the counts
    ``--max-cases``, ``--draws`` and ``--max-pixels`` (at least 1) where a command has them, and the cache
    folders ``caches`` (attribute names, e.g. ``review_cache`` for ``--review-cache``), checked before
    any work: one :class:`~cardseg.base.errors.CardsegError` line naming the option. The checks
    are the engine's (:func:`cardseg.base.options.check_run_options`, the bundle schema's pixel
    size range, as ``cardseg train`` checks ``--acdc-h5-spacing``), a cache as an output folder."""
    from cardseg.base.options import check_run_options
    from cardseg.bundle.fields import OptionWhere, integer_value, number_value
    from cardseg.bundle.schema import PIXEL_SPACING_MM

    if hasattr(a, "batch_size"):
        check_run_options(a.batch_size, a.threads, None)
    if getattr(a, "h5_spacing", None) is not None:
        number_value(OptionWhere(), "--h5-spacing", a.h5_spacing, low=PIXEL_SPACING_MM[0], high=PIXEL_SPACING_MM[1])
    for key in ("max_cases", "draws", "max_pixels"):
        if getattr(a, key, None) is not None:
            integer_value(OptionWhere(), "--" + key.replace("_", "-"), getattr(a, key), low=1)
    for key in caches:
        check_out_folder(getattr(a, key), "--" + key.replace("_", "-"))


def comma_names(text: str, allowed: Sequence[str], what: str) -> List[str]:
    """The names of a comma-separated option value, each one of ``allowed`` (a one-line
    :class:`~cardseg.base.errors.CardsegError` naming the unknown ones otherwise)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise CardsegError(f"unknown {what} {', '.join(bad) or repr(text)} (choose from {', '.join(allowed)})")
    return names


def check_out_folder(path: Optional[str], option: str = "--out") -> None:
    """An output folder a command will make or write into: refused in one line (before any work)
    when it is a file, lies below a file, or cannot be written; ``None`` (not given) passes."""
    from cardseg.base.files import can_create_files
    from cardseg.io.outdir import nearest_existing

    if not path:
        return
    here = os.path.abspath(path)
    if os.path.lexists(here) and not os.path.isdir(here):
        raise CardsegError(f"{option} {path}: exists and is not a folder")
    above = nearest_existing(Path(here))
    if not above.is_dir():
        raise CardsegError(f"{option} {path}: cannot be made, {above} is not a folder")
    if not can_create_files(above):
        raise CardsegError(f"{option} {path}: cannot write there ({above} is not writable)")


def bundle_to_rewrite(path: Optional[str], command: str, writes: bool = True) -> Optional[str]:
    """The bundle a fit command will rewrite in place (``--bundle`` as given). Refused in one line,
    before any work, when neither ``--bundle`` nor ``$CARDSEG_BUNDLE`` names one and the command
    would write: the default is the bundle shipped inside the installed package, which a fit must
    not replace unasked (name it with ``--bundle`` to fit it in place). ``writes`` False (a dry run,
    a measurement only) lets the default through, since nothing is written."""
    from cardseg.bundle.folder import ENV_VAR, resolve_bundle_path

    if writes and path is None and not os.environ.get(ENV_VAR):
        raise CardsegError(
            f"{command} writes its fit into bundle.json: name the bundle to rewrite with --bundle PATH "
            f"(the shipped one, {resolve_bundle_path(None)}, only when named; or --dry-run)"
        )
    return path


def add_overwrite(p: argparse.ArgumentParser, option: str = "--out") -> None:
    """``--overwrite``: replace files the command writes that its record in ``option`` does not list."""
    p.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace files of the names this command writes in {option} even where the folder's record "
        "of what cardseg wrote there (.cardseg-output.json) does not list them or they changed "
        "since: needed once for a result folder written before the record existed. Without it such "
        "a file is refused before any work (exit 2); other files there are never touched",
    )


def out_record(
    path: Optional[str], command: str, patterns: Sequence[str], overwrite: bool = False, option: str = "--out"
):
    """:func:`check_out_folder`, then the folder's :class:`~cardseg_train.base.out_record.OutRecord`
    for ``patterns`` (what ``command`` writes there), checked: refused in one line, before any
    work and writing nothing, when the folder holds such a file that cardseg did not write.
    ``None`` when ``path`` is not given."""
    from cardseg_train.base.out_record import OutRecord

    check_out_folder(path, option)
    if not path:
        return None
    record = OutRecord(path, command, patterns, option=option, overwrite=overwrite)
    record.check()
    return record


def write_recorded(record, prog: str, write: Callable[[], None]) -> int:
    """The ending of a ``python -m`` tool that writes into an :func:`out_record` folder: ``write()``
    inside ``record``'s :meth:`~cardseg_train.base.out_record.OutRecord.writing` block. Returns 0, or
    2 after one line on stderr, ``<prog>: error: <why>``, when a
    :class:`~cardseg.base.errors.CardsegError` stops it (most often the folder, checked again as
    the writing starts, now holds a file of a name the tool writes that cardseg did not write)."""
    try:
        with record.writing():
            write()
    except CardsegError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def write_json_and_markdown(record, prog: str, out: Path, stem: str, result: dict, markdown: str) -> int:
    """:func:`write_recorded` for a study's two files: ``<stem>.json`` (``result``) and ``<stem>.md``
    (``markdown``), each written atomically into ``out``."""
    import json

    from cardseg_train.base.report_files import atomic_write

    def write() -> None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / f"{stem}.json", (json.dumps(result, indent=1) + "\n").encode("utf-8"))
        atomic_write(out / f"{stem}.md", markdown.encode("utf-8"))

    return write_recorded(record, prog, write)
