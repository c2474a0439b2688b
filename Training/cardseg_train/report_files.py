"""Writing the training tools' report files: values formatted for tables, files written
atomically (to a temporary name, then renamed), matplotlib figures saved as PNG.

Shared by the calibration, review and indices reports; nothing here knows what a report holds.
:class:`OutRecord` keeps a command from replacing, in its ``--out`` folder, a file that cardseg
did not write there.
"""

from __future__ import annotations

import io
import json
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

from cardseg.base.errors import CardsegError


def format_value(v: Optional[float], scale: float = 1.0, digits: int = 3) -> str:
    """``v * scale`` with ``digits`` decimals; ``n/a`` for a missing or non-finite value."""
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v * scale:.{digits}f}"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` beside ``path`` and rename it into place (never a half-written file;
    :func:`cardseg.base.files.write_atomic`)."""
    from cardseg.base.files import write_atomic

    write_atomic(Path(path), data)


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Save ``fig`` as PNG (110 dpi) atomically and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    pyplot().close(fig)
    atomic_write(path, buf.getvalue())
    return path


def save_titled(fig, path: Path, title: str = "") -> Path:
    """Optional figure title, tight layout, parent folder made, saved atomically."""
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)


class OutRecord:
    """The files one training command writes into an ``--out`` folder that may hold other files,
    and the record of what cardseg wrote there: the engine's stamp (:data:`cardseg.io.outdir.STAMP`,
    ``{"tool": "cardseg", "files": {path: {size, sha256, by}}}``, written atomically).

    ``patterns``: what the command writes, paths relative to the folder (globs allowed, e.g.
    ``panel_*.png``). A file there that matches one may be replaced only when the record lists it
    and it is unchanged since (size and sha256): a user's file of the same name, or a result edited
    since, is refused (:meth:`check`). While a run writes, the record says so (``writing``); a run
    killed half way thus leaves a folder whose listed files, and the files made after the record
    was written, are accepted as cardseg's by the next run. ``overwrite``: replace such files even
    where the record does not list them or they changed (a folder written before the record
    existed); a folder, or a symbolic link, under a name the command writes is refused all the same.

    Use: :meth:`check` before any work, then ``with record.writing(): ...write the files...``.
    """

    def __init__(self, folder: os.PathLike, command: str, patterns, option: str = "--out", overwrite: bool = False):
        self.folder = Path(folder)
        self.command, self.patterns, self.option, self.overwrite = command, list(patterns), option, overwrite

    def targets(self) -> Dict[str, Path]:
        """``{relative path: path}`` of what is there now under the names the command writes."""
        found: Dict[str, Path] = {}
        if self.folder.is_dir():
            for pattern in self.patterns:
                for p in self.folder.glob(pattern):
                    found[p.relative_to(self.folder).as_posix()] = p
        return dict(sorted(found.items()))

    def _stamp(self) -> Tuple[Optional[dict], Optional[int]]:
        """``(record or None, modification time of a record that says a run was writing, or None)``."""
        from cardseg.io.outdir import STAMP, read_stamp

        path = self.folder / STAMP
        if not os.path.lexists(path):
            return None, None
        stamp = read_stamp(self.folder)
        if stamp is None or path.is_symlink():
            raise CardsegError(f"{self.option} {self.folder}: holds a {STAMP} that is not cardseg's record of the "
                               "files it wrote; move it away")
        return stamp, (path.stat().st_mtime_ns if stamp.get("writing") else None)

    def check(self) -> None:
        """Refuse (one line) a folder holding a file the command would write that is not cardseg's."""
        from cardseg.io.outdir import STAMP

        stamp, since = self._stamp()
        files = stamp["files"] if stamp else {}
        for sub in sorted({pattern.rsplit("/", 1)[0] for pattern in self.patterns if "/" in pattern}):
            p = self.folder / sub
            if os.path.lexists(p) and (p.is_symlink() or not p.is_dir()):
                raise CardsegError(f"{self.option} {self.folder}: {sub} there is not a folder, and {self.command} "
                                   "writes into a folder of that name; move it away")
        for rel, p in self.targets().items():
            if p.is_symlink() or not p.is_file():
                raise CardsegError(f"{self.option} {self.folder}: {rel} there is not a plain file, and {self.command} "
                                   "writes a file of that name; move it away")
            if since is not None and (rel in files or p.stat().st_mtime_ns >= since):
                continue  # written by a run that was stopped half way
            if self.overwrite:
                continue
            if rel not in files:
                why = f"which cardseg did not write there (its record, {STAMP}, does not list it)"
            elif _changed(p, files[rel]):
                why = "which changed after cardseg wrote it"
            else:
                continue
            raise CardsegError(f"{self.option} {self.folder}: holds {rel}, {why}, and {self.command} writes a file "
                               "of that name; move it away, or pass --overwrite to replace it")

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Check again, mark the record as being written, let the caller write, then record every
        file the block made or changed under the command's names. An exception leaves the mark (the
        files written so far stay cardseg's), or, when the block wrote nothing, the folder as it was."""
        from cardseg.base.files import make_parents, remove_folders, write_atomic
        from cardseg.io.outdir import STAMP, file_digest

        self.check()
        stamp, since = self._stamp()
        files = dict(stamp["files"]) if stamp else {}
        before = self.targets()
        if since is not None:  # adopt what a stopped run wrote
            for rel, p in before.items():
                if rel in files or p.stat().st_mtime_ns >= since:
                    by = files[rel].get("by") if isinstance(files.get(rel), dict) else None
                    files[rel] = {**file_digest(p), "by": by or self.command}
        seen = {rel: _stat_key(p) for rel, p in before.items()}
        made = make_parents(self.folder / STAMP)
        old = (self.folder / STAMP).read_bytes() if stamp else None
        keep = {k: v for k, v in (stamp or {}).items() if k not in ("tool", "version", "files", "writing")}
        self._write(files, {**keep, "writing": {"command": self.command}})
        try:
            yield
        except BaseException:
            if {rel: _stat_key(p) for rel, p in self.targets().items()} == seen:  # nothing written: as before
                if old is None:
                    (self.folder / STAMP).unlink()
                    remove_folders(made)
                else:
                    write_atomic(self.folder / STAMP, old)
            raise
        for rel, p in self.targets().items():
            if p.is_file() and not p.is_symlink() and seen.get(rel) != _stat_key(p):
                files[rel] = {**file_digest(p), "by": self.command}
        self._write({rel: d for rel, d in files.items() if (self.folder / rel).is_file()}, keep)

    def _write(self, files: dict, more: dict) -> None:
        """The record: ``files``, and ``more`` (the writing mark; what another cardseg command
        recorded there beside its files, e.g. ``cardseg segment``'s time, kept as it was)."""
        from cardseg import __version__
        from cardseg.base.files import write_atomic
        from cardseg.io.outdir import STAMP

        stamp = {**more, "tool": "cardseg", "version": __version__, "files": dict(sorted(files.items()))}
        write_atomic(self.folder / STAMP, (json.dumps(stamp, indent=1) + "\n").encode("utf-8"))


def _stat_key(p: Path) -> tuple:
    st = p.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def _changed(p: Path, recorded) -> bool:
    """Whether the file ``p`` differs from the version the record lists (size, then sha256)."""
    from cardseg.base.files import sha256_file

    if not isinstance(recorded, dict) or p.stat().st_size != recorded.get("size"):
        return True
    return sha256_file(p) != recorded.get("sha256")
