"""The output folder: who owns it, and how results land in it without ever losing a file.

Rules (the same for ``cardseg segment``, the batch path and the Slicer module's process):

* cardseg writes a stamp file (:data:`STAMP`) into every output folder it creates; the stamp
  lists the files it wrote there. ``--overwrite`` only ever replaces a folder that carries the
  stamp and holds nothing but the files the stamp lists. Any other non-empty folder is refused,
  with or without ``--overwrite``.
* The output folder must not be, contain or lie inside the input (a file or a DICOM folder).
* Results are written into a sibling temporary folder and moved into place by renames (a new
  folder: one; an earlier result: two, the first undone if the second fails).
  While a run writes, it holds a lock on ``.<name>.cardseg.lock`` beside the output folder; a
  second run for the same folder fails at once with one line. Whatever a killed run left beside
  the folder (temporary folder, replaced folder, lock file) carries cardseg's names and is
  cleaned up by the next run that takes the lock.

Nothing here reads or computes images: :func:`check_output` validates the location before any
work (it writes nothing but a probe file that it removes at once), :class:`OutputWriter` does
the writing once the results exist. The stamp records each file's size and sha256, so a result
that someone edited and saved under the same name counts as theirs and is never replaced.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, List, Optional

from cardseg.base.errors import CardsegError

#: the file that marks a folder as written by cardseg (JSON: tool, version, time, files)
STAMP = ".cardseg-output.json"
_TMP, _OLD, _LOCK = ".cardseg-tmp", ".cardseg-old", ".cardseg.lock"


def _sibling(out: Path, suffix: str) -> Path:
    return out.with_name(f".{out.name}{suffix}")


def read_stamp(folder: Path) -> Optional[dict]:
    """The stamp of a cardseg output folder, or ``None`` if it has none (or an unreadable one)."""
    try:
        stamp = json.loads((folder / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("tool") != "cardseg" or not isinstance(stamp.get("files"), dict):
        return None
    return stamp


def file_digest(path: Path) -> dict:
    """What the stamp records of a file: its size and sha256."""
    from cardseg.base.files import sha256_file

    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def _changed(folder: Path, name: str, recorded) -> bool:
    """Whether ``folder/name`` is no longer the file cardseg wrote (size, then sha256)."""
    p = folder / name
    if not isinstance(recorded, dict) or not p.is_file():
        return True
    if p.stat().st_size != recorded.get("size"):
        return True
    return file_digest(p)["sha256"] != recorded.get("sha256")


def _is_within(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
        return True
    except ValueError:
        return False


def nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output(output: os.PathLike, overwrite: bool = False, inputs: Iterable[os.PathLike] = ()) -> Path:
    """Validate the output location before any work; return its absolute path. Writes nothing
    (but a probe file, removed at once, to learn whether the folder is writable).

    Refuses (one-line :class:`CardsegError`): an output that is, contains or lies inside one of
    ``inputs``; a path whose parent is a file or cannot be written; an existing file; a non-empty
    folder without cardseg's stamp or with files the stamp does not list (even with
    ``overwrite``); a stamped non-empty folder without ``overwrite``.
    """
    out = Path(os.path.realpath(os.path.abspath(os.fspath(output))))
    for inp in inputs:
        src = Path(os.path.realpath(os.path.abspath(os.fspath(inp))))
        if out == src or _is_within(src, out):
            raise CardsegError(f"{out}: the output folder would hold the input {src}; choose another folder")
        if src.is_dir() and _is_within(out, src):
            raise CardsegError(f"{out}: the output folder lies inside the input {src}; choose another folder")
    if out.exists() and not out.is_dir():
        raise CardsegError(f"{out}: exists and is not a folder")
    base = nearest_existing(out.parent if not out.exists() else out)
    if not base.is_dir():
        raise CardsegError(f"{out}: cannot create it, {base} is a file")
    check_writable(out.parent if out.exists() else base, out)
    try:
        if out.is_dir():
            if not os.access(out, os.R_OK | os.X_OK):
                raise CardsegError(f"{out}: folder cannot be read")
            _check_replaceable(out, overwrite)
        _check_siblings(out)
    except FileNotFoundError:  # another run, holding the lock, moved the folder while it was read
        raise CardsegError(f"{out}: another cardseg run is writing this folder now; "
                           "wait for it to finish or choose another folder") from None
    return out


def check_writable(folder: Path, out: Path) -> None:
    """Whether files can be created in ``folder`` (a probe file, removed at once: permissions,
    read-only file systems and special folders such as /proc all answer the same way)."""
    if os.access(folder, os.W_OK | os.X_OK):
        try:
            fd, probe = tempfile.mkstemp(prefix=".cardseg-probe-", dir=folder)
            os.close(fd)
            os.unlink(probe)
            return
        except OSError:
            pass
    raise CardsegError(f"{out}: cannot write there ({folder} is not writable)")


#: files an operating system drops into folders by itself: never a reason to refuse
SYSTEM_FILES = (".DS_Store", "Thumbs.db", "desktop.ini")


def _check_replaceable(out: Path, overwrite: bool) -> None:
    present = sorted(p.name for p in out.iterdir() if p.name not in SYSTEM_FILES)
    if not present:
        return
    stamp = read_stamp(out)
    if stamp is None:
        raise CardsegError(f"{out}: folder is not empty and was not written by cardseg; it is never replaced, "
                           "choose a new or empty folder")
    foreign = [n for n in present if n != STAMP and n not in stamp["files"]]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise CardsegError(f"{out}: holds files cardseg did not write ({', '.join(foreign[:3])}{more}); "
                           "it is never replaced, move them or choose another folder")
    edited = [n for n in present if n != STAMP and _changed(out, n, stamp["files"][n])]
    if edited:
        raise CardsegError(f"{out}: {', '.join(edited[:3])} changed after cardseg wrote it; the folder is never "
                           "replaced, move the file or choose another folder")
    if not overwrite:
        raise CardsegError(f"{out}: holds the results of an earlier cardseg run (use --overwrite to replace them)")


def _check_siblings(out: Path) -> None:
    """The temporary and replaced-folder names beside ``out`` must be free or cardseg's own leftovers."""
    for suffix in (_TMP, _OLD):
        p = _sibling(out, suffix)
        if p.exists() or p.is_symlink():
            if p.is_symlink() or not p.is_dir() or (read_stamp(p) is None and any(p.iterdir())):
                raise CardsegError(f"{out}: {p.name} beside it was not made by cardseg; move it away first")


class FileLock:
    """An exclusive, non-blocking lock on a file (``flock`` on POSIX, ``msvcrt`` on Windows)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: Optional[int] = None

    def acquire(self) -> bool:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            if not _try_lock(fd):
                os.close(fd)
                return False
            try:  # the file we locked may have been unlinked by the run that just finished
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                os.write(fd, f"{os.getpid()}\n".encode())
                return True
            os.close(fd)

    def release(self) -> None:
        if self.fd is None:
            return
        if sys.platform == "win32":  # pragma: no cover - an open file cannot be removed there
            os.close(self.fd)
        try:
            os.unlink(self.path)
        except OSError:
            pass
        if sys.platform != "win32":
            os.close(self.fd)  # closing drops the lock
        self.fd = None


def _try_lock(fd: int) -> bool:
    if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def _remove_own(folder: Path) -> None:
    """Remove a folder cardseg made, its stamp last: if the removal stops half way, the folder
    still carries the stamp and the next run can finish the job."""
    for p in folder.iterdir():
        if p.name == STAMP:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    (folder / STAMP).unlink(missing_ok=True)
    folder.rmdir()


def _remove_leftover(folder: Path) -> None:
    """Remove a temporary or replaced folder a killed run left, if it is cardseg's own."""
    if folder.is_dir() and not folder.is_symlink() and (read_stamp(folder) is not None or not any(folder.iterdir())):
        _remove_own(folder)


class OutputWriter:
    """Write one run's files into a temporary folder and move it to ``out`` in one step.

    Use as a context manager after :func:`check_output`::

        with OutputWriter(out, overwrite) as w:
            write_file(w.path("report.json"))
            w.commit()

    On entry the lock is taken (or one-line refusal), parents are created, leftovers of killed
    runs are removed and the stamp is written into the temporary folder first. Without
    ``commit()`` (an exception), the temporary folder goes and so do the parent folders this
    writer created; the output folder is untouched.
    """

    def __init__(self, out: os.PathLike, overwrite: bool = False, version: str = ""):
        self.out = Path(out)
        self.overwrite = overwrite
        self.version = version
        self.tmp = _sibling(self.out, _TMP)
        self.files: List[str] = []
        self._lock = FileLock(_sibling(self.out, _LOCK))
        self._made_parents: List[Path] = []
        self._committed = False

    def __enter__(self) -> "OutputWriter":
        self._make_parents()
        try:
            if not self._lock.acquire():
                raise CardsegError(f"{self.out}: another cardseg run is writing this folder now; "
                                   "wait for it to finish or choose another folder")
        except OSError as exc:
            self._remove_parents()
            raise CardsegError(f"{self.out}: cannot write there ({exc.strerror})") from None
        try:
            old = _sibling(self.out, _OLD)
            if not self.out.exists() and old.is_dir() and read_stamp(old) is not None:
                os.replace(old, self.out)  # a run stopped between its two renames: put the result back
            _remove_leftover(self.tmp)
            _remove_leftover(old)
            if self.out.exists():
                check_output(self.out, self.overwrite)  # again, now under the lock
            os.mkdir(self.tmp)  # the user's umask applies, as for any other tool
            self._write_stamp(self.tmp)
        except BaseException:
            self._abort()
            raise
        return self

    def path(self, name: str) -> Path:
        """Where to write the file ``name`` (recorded in the stamp)."""
        if name not in self.files:
            self.files.append(name)
        return self.tmp / name

    def commit(self) -> Path:
        """Move the finished folder into place, replacing an earlier cardseg result.

        A new output: one rename. An existing empty folder (perhaps a mount point or the shell's
        current folder) is filled file by file, the stamp last. An earlier result: renamed aside,
        the new folder renamed in (the first rename undone if the second fails), the old removed.
        """
        self._write_stamp(self.tmp)
        old = _sibling(self.out, _OLD)
        if not self.out.exists():
            os.replace(self.tmp, self.out)
        else:
            check_output(self.out, self.overwrite)  # something may have appeared there meanwhile
            stamp = read_stamp(self.out)
            try:
                if stamp is None:
                    raise OSError("empty folder: fill it in place")
                os.replace(self.out, old)
            except OSError:
                self._fill_in_place(stamp)
            else:
                try:
                    os.replace(self.tmp, self.out)
                except BaseException:
                    os.replace(old, self.out)
                    raise
                _remove_own(old)
        self._committed = True
        return self.out

    def _fill_in_place(self, stamp: Optional[dict]) -> None:
        """Replace the contents of the existing folder ``out`` (its earlier cardseg files, listed in
        ``stamp``, and nothing else) by the new files, the stamp last."""
        for name in (stamp or {}).get("files", {}):
            if name not in self.files:
                (self.out / name).unlink(missing_ok=True)
        for name in self.files:
            os.replace(self.tmp / name, self.out / name)
        os.replace(self.tmp / STAMP, self.out / STAMP)
        self.tmp.rmdir()

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._committed:
            self._abort()
        else:
            self._lock.release()

    def _write_stamp(self, folder: Path) -> None:
        files = {n: file_digest(folder / n) for n in self.files if (folder / n).is_file()}
        stamp = {"tool": "cardseg", "version": self.version, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                 "files": files}
        (folder / STAMP).write_text(json.dumps(stamp, indent=1) + "\n", encoding="utf-8")

    def _make_parents(self) -> None:
        missing = []
        p = self.out.parent
        while not p.exists():
            missing.append(p)
            p = p.parent
        for p in reversed(missing):
            try:
                os.mkdir(p)
            except FileExistsError:
                continue
            except OSError as exc:
                self._remove_parents()
                raise CardsegError(f"{self.out}: cannot create {p} ({exc.strerror})") from None
            self._made_parents.append(p)

    def _remove_parents(self) -> None:
        for p in reversed(self._made_parents):
            try:
                p.rmdir()
            except OSError:
                break
        self._made_parents = []

    def _abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._lock.release()
        self._remove_parents()
