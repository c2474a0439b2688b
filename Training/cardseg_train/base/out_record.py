"""The record of what a training command wrote into its ``--out`` folder, and the check that keeps
it from replacing there a file that cardseg did not write.

The record is the engine's stamp (:data:`cardseg.io.outdir.STAMP`, ``{"tool": "cardseg",
"files": {path: {size, sha256, by}}}``). It is kept exact: each file is recorded as soon as it is
written (:func:`note_written`, which :func:`cardseg_train.base.report_files.atomic_write` calls), so
that a run killed half way leaves a record listing exactly the files it finished.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

from cardseg.base.errors import CardsegError

#: the records whose :meth:`OutRecord.writing` block is running, innermost last
_ACTIVE: ContextVar[Tuple["OutRecord", ...]] = ContextVar("cardseg_train_out_records", default=())


def note_written(path: os.PathLike) -> None:
    """Record ``path``, just written, in the innermost running :meth:`OutRecord.writing` block
    whose folder holds it (nothing when none does: a cache, a file outside every ``--out``)."""
    for record in reversed(_ACTIVE.get()):
        if record.relative(path) is not None:
            record.wrote(path)
            return


class OutRecord:
    """The files one training command writes into an ``--out`` folder that may hold other files.

    ``patterns``: what the command writes, paths relative to the folder (globs allowed). A file
    there that matches one may be replaced only when the record lists it and it is unchanged since
    cardseg wrote it (size and sha256): a user's file of the same name, or a result edited since,
    is refused (:meth:`check`), also after a run that was stopped half way (its record lists what
    it finished, nothing else). ``overwrite``: replace such files all the same (a folder written
    before the record existed); a folder, or a symbolic link, under a name the command writes is
    refused even then.

    Use: :meth:`check` before any work, then ``with record.writing(): ...write the files...``,
    each written through :func:`cardseg_train.base.report_files.atomic_write` (or followed by
    :meth:`wrote`).
    """

    def __init__(self, folder: os.PathLike, command: str, patterns, option: str = "--out", overwrite: bool = False):
        self.folder = Path(folder)
        self.command, self.patterns, self.option, self.overwrite = command, list(patterns), option, overwrite
        self._files: Optional[Dict[str, dict]] = None  # while writing: the record's files
        self._keep: dict = {}
        self._wrote_any = False

    def targets(self) -> Dict[str, Path]:
        """``{relative path: path}`` of what is there now under the names the command writes."""
        found: Dict[str, Path] = {}
        if self.folder.is_dir():
            for pattern in self.patterns:
                for p in self.folder.glob(pattern):
                    found[p.relative_to(self.folder).as_posix()] = p
        return dict(sorted(found.items()))

    def relative(self, path: os.PathLike) -> Optional[str]:
        """``path`` relative to the folder (``/``-separated), or ``None`` when it lies outside."""
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(self.folder))
        if rel == "." or rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
            return None
        return Path(rel).as_posix()

    def _stamp(self) -> Optional[dict]:
        """The folder's record, ``None`` when it has none; a file of its name that is not one is refused."""
        from cardseg.io.outdir import STAMP, read_stamp

        path = self.folder / STAMP
        if not os.path.lexists(path):
            return None
        stamp = read_stamp(self.folder)
        if stamp is None or path.is_symlink():
            raise CardsegError(
                f"{self.option} {self.folder}: holds a {STAMP} that is not cardseg's record of the "
                "files it wrote; move it away"
            )
        return stamp

    def check(self) -> None:
        """Refuse (one line) a folder holding a file the command would write that is not cardseg's."""
        from cardseg.io.outdir import STAMP, file_changed

        stamp = self._stamp()
        files = stamp["files"] if stamp else {}
        for sub in sorted({pattern.rsplit("/", 1)[0] for pattern in self.patterns if "/" in pattern}):
            p = self.folder / sub
            if os.path.lexists(p) and (p.is_symlink() or not p.is_dir()):
                raise CardsegError(
                    f"{self.option} {self.folder}: {sub} there is not a folder, and {self.command} "
                    "writes into a folder of that name; move it away"
                )
        for rel, p in self.targets().items():
            if p.is_symlink() or not p.is_file():
                raise CardsegError(
                    f"{self.option} {self.folder}: {rel} there is not a plain file, and {self.command} "
                    "writes a file of that name; move it away"
                )
            if self.overwrite:
                continue
            if rel not in files:
                why = f"which cardseg did not write there (its record, {STAMP}, does not list it)"
            elif file_changed(self.folder, rel, files[rel]):
                why = "which changed after cardseg wrote it"
            else:
                continue
            stopped = (
                " (a run was stopped half way there: the record lists only the files it finished)"
                if stamp and stamp.get("writing")
                else ""
            )
            raise CardsegError(
                f"{self.option} {self.folder}: holds {rel}, {why}, and {self.command} writes a file "
                f"of that name{stopped}; move it away, or pass --overwrite to replace it"
            )

    @contextmanager
    def writing(self) -> Iterator["OutRecord"]:
        """Check again, mark the record as being written, and let the caller write: each file
        written is recorded at once (:meth:`wrote`). At the end the mark goes. An exception leaves
        the mark and the files recorded so far, or, when the block wrote nothing, the folder as it
        was."""
        from cardseg.base.files import make_parents, remove_folders, write_atomic
        from cardseg.io.outdir import STAMP

        self.check()
        stamp = self._stamp()
        made = make_parents(self.folder / STAMP)
        old = (self.folder / STAMP).read_bytes() if stamp else None
        self._files = dict(stamp["files"]) if stamp else {}
        self._keep = {k: v for k, v in (stamp or {}).items() if k not in ("tool", "version", "files", "writing")}
        self._wrote_any = False
        self._write(writing=True)
        token = _ACTIVE.set(_ACTIVE.get() + (self,))
        try:
            yield self
        except BaseException:
            if not self._wrote_any:  # as before
                if old is None:
                    (self.folder / STAMP).unlink()
                    remove_folders(made)
                else:
                    write_atomic(self.folder / STAMP, old)
            raise
        finally:
            _ACTIVE.reset(token)
        self._files = {rel: d for rel, d in self._files.items() if (self.folder / rel).is_file()}
        self._write(writing=False)
        self._files = None

    def wrote(self, path: os.PathLike) -> None:
        """Record the file ``path`` (inside the folder) as written now by this command."""
        from cardseg.io.outdir import file_digest

        rel = self.relative(path)
        if self._files is None or rel is None:
            raise ValueError(f"{path}: not written inside a running {self.folder} record")
        self._files[rel] = {**file_digest(Path(path)), "by": self.command}
        self._wrote_any = True
        self._write(writing=True)

    def _write(self, writing: bool) -> None:
        """The record: the files, what another cardseg command recorded there beside its files
        (e.g. ``cardseg segment``'s time, kept as it was) and, while a run writes, its mark."""
        from cardseg import __version__
        from cardseg.base.files import write_atomic
        from cardseg.io.outdir import STAMP

        mark = {"writing": {"command": self.command}} if writing else {}
        stamp = {
            **self._keep,
            **mark,
            "tool": "cardseg",
            "version": __version__,
            "files": dict(sorted((self._files or {}).items())),
        }
        write_atomic(self.folder / STAMP, (json.dumps(stamp, indent=1) + "\n").encode("utf-8"))
