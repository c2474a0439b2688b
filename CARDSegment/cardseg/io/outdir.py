"""The output folder: who owns it, and how results land in it without ever losing a file.

Rules (the same for ``cardseg segment``, the batch path and the Slicer module's process):

* cardseg writes a stamp file (:data:`STAMP`) into every output folder it creates; the stamp
  lists the files it wrote there. ``--overwrite`` only ever replaces a folder that carries the
  stamp and holds nothing but the files the stamp lists. Any other non-empty folder is refused,
  with or without ``--overwrite``.
* The output folder must not be, contain or lie inside the input (a file or a DICOM folder).
* Results are written into a temporary folder on the output folder's own file system (beside a
  new output folder, inside an existing one: a mount point or a folder that cannot be renamed
  works the same) and moved into place by renames that never cross devices. A new folder: one
  rename. An existing folder: every new file is moved in first (the stamp meanwhile accepts the
  old and the new version of each file), then the old files the new run does not write are
  removed (only names the old stamp lists that lie directly inside the folder, never a path that
  leaves it), then the new stamp. While a run writes, it holds a lock on ``.<name>.cardseg.lock``
  beside the output folder; a second run for the same folder fails at once with one line.
  Whatever a killed run left (temporary folder, lock file) carries cardseg's names and marker
  (a stamp, or a lock file holding a process id) and is removed by the next run that writes
  into the same parent folder, once the lock shows that no live run holds it. (A process that
  writes many outputs into one folder, a batch's cases, looks through that whole folder at most
  once every :data:`CLEAN_INTERVAL_S`; each output's own leftovers go every time.)

Nothing here reads or computes images: :func:`check_output` validates the location before any
work (it writes nothing but a probe file that it removes at once), :class:`OutputWriter` does
the writing once the results exist. The stamp records each file's size and sha256, so a result
that someone edited and saved under the same name counts as theirs and is never replaced.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from cardseg.base.errors import CardsegError
from cardseg.base.files import FileLock  # noqa: F401 - part of this module's interface
from cardseg.base.files import PROBE_PREFIX, can_create_files, remove_stale_probes, write_atomic
from cardseg.base.strictjson import bounded_loads

#: the file that marks a folder as written by cardseg (JSON: tool, version, time, files)
STAMP = ".cardseg-output.json"
#: where :func:`cardseg.base.files.write_atomic` writes a stamp before renaming it to :data:`STAMP`
STAMP_PART = f".{STAMP}.tmp"
_TMP, _OLD, _LOCK = ".cardseg-tmp", ".cardseg-old", ".cardseg.lock"
#: the temporary folder inside an existing output folder
INNER_TMP = ".cardseg-tmp"
_LEFTOVER = re.compile(r"^\.(.+)(\.cardseg-tmp|\.cardseg-old|\.cardseg\.lock)$")
#: how often one process looks through a whole parent folder for what killed runs left there; in
#: between, a writer removes only its own output's leftovers, so that the cost of writing one more
#: output into a folder (a batch's case into OUTDIR) does not grow with the outputs already there
CLEAN_INTERVAL_S = 300.0
_last_clean: Dict[str, float] = {}


def _sibling(out: Path, suffix: str) -> Path:
    return out.with_name(f".{out.name}{suffix}")


def read_stamp(folder: Path) -> Optional[dict]:
    """The stamp of a cardseg output folder, or ``None`` if it has none (or an unreadable one)."""
    try:
        stamp = bounded_loads((folder / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("tool") != "cardseg" or not isinstance(stamp.get("files"), dict):
        return None
    return stamp


def file_digest(path: Path) -> dict:
    """What the stamp records of a file: its size and sha256."""
    from cardseg.base.files import sha256_file

    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def _accepted(stamp: dict, name: str) -> list:
    """The versions of ``name`` the stamp accepts as cardseg's: the recorded one and, in a folder
    whose replacement was cut short, the versions in ``replacing``."""
    versions = [stamp["files"][name]] if name in stamp["files"] else []
    pending = stamp.get("replacing")
    return versions + list(pending.get(name, [])) if isinstance(pending, dict) else versions


def file_changed(folder: Path, name: str, recorded) -> bool:
    """Whether ``folder/name`` is none of the versions cardseg wrote (size, then sha256)."""
    p = folder / name
    versions = [r for r in (recorded if isinstance(recorded, list) else [recorded]) if isinstance(r, dict)]
    if not versions or p.is_symlink() or not p.is_file():
        return True
    size = p.stat().st_size
    if all(size != r.get("size") for r in versions):
        return True
    digest = file_digest(p)["sha256"]
    return all(digest != r.get("sha256") for r in versions)


def inside_entry(folder: Path, name) -> bool:
    """Whether the stamp entry ``name`` is a plain file name directly inside ``folder``: no
    separator, no ``..``, not absolute, not a symbolic link (to be removed, never followed)."""
    if not isinstance(name, str) or name in ("", ".", "..", STAMP, INNER_TMP) or "/" in name or "\\" in name:
        return False
    if os.sep in name or (os.altsep and os.altsep in name) or os.path.isabs(name):
        return False
    p = folder / name
    return not p.is_symlink() and os.path.dirname(os.path.realpath(p)) == os.path.realpath(folder)


def own_leftover(p: Path) -> bool:
    """Whether ``p`` is a temporary folder cardseg made: a real folder, empty, with a stamp, or
    holding nothing but a stamp that a kill cut short (the first one, written into the new
    folder, or its temporary file): cardseg's names under cardseg's leftover name."""
    if not p.is_dir() or p.is_symlink():
        return False
    if read_stamp(p) is not None:
        return True
    return all(q.name in (STAMP, STAMP_PART) and q.is_file() and not q.is_symlink() for q in p.iterdir())


def _own_leftover_now(p: Path) -> bool:
    """:func:`own_leftover`, ``False`` for a folder that vanishes while it is looked at (another
    run, in another process, renamed its temporary folder into place meanwhile)."""
    try:
        return own_leftover(p)
    except OSError:
        return False


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

    Refuses (one-line :class:`CardsegError`): a name of the form of cardseg's own leftovers
    (``.NAME.cardseg-tmp``, ``.NAME.cardseg-old``, ``.NAME.cardseg.lock``, ``.cardseg-tmp``), which a
    later run would clean away; an output that is, contains or lies inside one of
    ``inputs``; a path whose parent is a file or cannot be written; an existing file; a non-empty
    folder without cardseg's stamp or with files the stamp does not list (even with
    ``overwrite``); a stamped non-empty folder without ``overwrite``.
    """
    out = Path(os.path.realpath(os.path.abspath(os.fspath(output))))
    check_not_leftover_name(out)
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
            check_writable(out, out)  # the results are made inside it (.cardseg-tmp), then moved: never probed
            # before the folder is known to be cardseg's or empty
        _check_siblings(out)
    except FileNotFoundError:  # another run, holding the lock, moved the folder while it was read
        raise CardsegError(
            f"{out}: another cardseg run is writing this folder now; wait for it to finish or choose another folder"
        ) from None
    return out


def check_not_leftover_name(out: Path) -> None:
    """Refuse an output named as cardseg names its own leftovers (a later run would clean it away)."""
    if _LEFTOVER.match(out.name) or out.name == INNER_TMP:
        raise CardsegError(f"{out}: the name has the form of cardseg's own temporary files; choose another name")


def check_writable(folder: Path, out: Path) -> None:
    """Whether files can be created in ``folder`` (a probe file, removed at once: permissions,
    read-only file systems and special folders such as /proc all answer the same way)."""
    if not (os.access(folder, os.W_OK | os.X_OK) and can_create_files(folder)):
        raise CardsegError(f"{out}: cannot write there ({folder} is not writable)")


#: files an operating system drops into folders by itself: never a reason to refuse
SYSTEM_FILES = (".DS_Store", "Thumbs.db", "desktop.ini")


def _check_replaceable(out: Path, overwrite: bool) -> None:
    present = sorted(
        p.name
        for p in out.iterdir()
        if p.name not in SYSTEM_FILES
        and not (p.name == INNER_TMP and own_leftover(p))
        and not p.name.startswith(PROBE_PREFIX)
    )
    if not present:
        return
    stamp = read_stamp(out)
    if stamp is None:
        raise CardsegError(
            f"{out}: folder is not empty and was not written by cardseg; it is never replaced, "
            "choose a new or empty folder"
        )
    foreign = [n for n in present if n != STAMP and not _accepted(stamp, n)]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise CardsegError(
            f"{out}: holds files cardseg did not write ({', '.join(foreign[:3])}{more}); "
            "it is never replaced, move them or choose another folder"
        )
    edited = [n for n in present if n != STAMP and file_changed(out, n, _accepted(stamp, n))]
    if edited:
        raise CardsegError(
            f"{out}: {', '.join(edited[:3])} changed after cardseg wrote it; the folder is never "
            "replaced, move the file or choose another folder"
        )
    if not overwrite:
        if stamp.get("replacing"):  # the stamp a replacement leaves until its last step
            raise CardsegError(
                f"{out}: holds the partial results of a cardseg run that was interrupted while it "
                "replaced them (use --overwrite to write them again)"
            )
        raise CardsegError(f"{out}: holds the results of an earlier cardseg run (use --overwrite to replace them)")


def _check_siblings(out: Path) -> None:
    """The temporary and replaced-folder names beside ``out`` must be free or cardseg's own leftovers."""
    for suffix in (_TMP, _OLD):
        p = _sibling(out, suffix)
        if p.exists() or p.is_symlink():
            if not own_leftover(p):
                raise CardsegError(f"{out}: {p.name} beside it was not made by cardseg; move it away first")


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
    if own_leftover(folder):
        _remove_own(folder)


def _stale_lock(p: Path) -> bool:
    """Whether ``p`` looks like a lock file cardseg wrote (a process id on one line)."""
    try:
        return (
            p.is_file()
            and not p.is_symlink()
            and p.stat().st_size < 32
            and re.fullmatch(r"\d*\n?", p.read_text(encoding="ascii", errors="replace")) is not None
        )
    except OSError:
        return False


def clean_leftovers(folder: os.PathLike, skip: str = "") -> List[str]:
    """Remove what killed cardseg runs left in ``folder``: ``.X.cardseg-tmp`` and ``.X.cardseg-old``
    folders that carry cardseg's stamp (or are empty) and ``.X.cardseg.lock`` files that hold a
    process id, each only while its lock can be taken (no live run holds it); a replaced result
    whose folder ``X`` is missing is put back instead. Best effort (an error leaves the entry);
    returns the names removed. ``skip``: an output name whose leftovers the caller handles."""
    removed: List[str] = []
    _last_clean[os.path.abspath(os.fspath(folder))] = time.monotonic()
    remove_stale_probes(folder)
    try:
        entries = sorted(os.listdir(folder))
    except OSError:
        return removed
    names = {m.group(1) for m in map(_LEFTOVER.match, entries) if m and m.group(1) != skip}
    for name in sorted(names):
        out = Path(folder) / name
        tmp, old, lock_path = _sibling(out, _TMP), _sibling(out, _OLD), _sibling(out, _LOCK)
        if not any(_own_leftover_now(p) for p in (tmp, old)) and not _stale_lock(lock_path):
            continue
        if lock_path.exists() and not _stale_lock(lock_path):
            continue  # a file of someone else's under that name: never written to
        lock = FileLock(lock_path)
        try:
            if not lock.acquire():
                continue  # a live run
            if _own_leftover_now(old) and read_stamp(old) is not None and not out.exists() and not out.is_symlink():
                os.replace(old, out)
            for p in (tmp, old):
                if _own_leftover_now(p):
                    _remove_own(p)
                    removed.append(p.name)
        except OSError:
            pass
        finally:
            lock.release()
    return removed


def _cleaned_lately(folder: Path) -> bool:
    """Whether this process looked through ``folder`` for leftovers in the last :data:`CLEAN_INTERVAL_S`."""
    last = _last_clean.get(os.path.abspath(os.fspath(folder)))
    return last is not None and time.monotonic() - last < CLEAN_INTERVAL_S


class OutputWriter:
    """Write one run's files into a temporary folder on the output's file system, then move them
    into ``out`` (see the module's rules).

    Use as a context manager after :func:`check_output`::

        with OutputWriter(out, overwrite) as w:
            write_file(w.path("report.json"))
            w.commit()

    On entry the lock is taken (or one-line refusal), parents are created, leftovers of killed
    runs for ``out`` are removed (in the whole parent folder too, unless this process looked
    through it lately: :data:`CLEAN_INTERVAL_S`) and the stamp is written into the temporary
    folder first (the marker that makes it recognisable as cardseg's). Without ``commit()`` (an
    exception), the temporary folder goes and so do the parent folders this writer created; the
    output folder is untouched.
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
        try:  # from the lock on: an interrupt anywhere leaves nothing behind (the lock's own rule)
            try:
                held = self._lock.acquire()
            except OSError as exc:
                raise CardsegError(f"{self.out}: cannot write there ({exc.strerror})") from None
            if not held:
                raise CardsegError(
                    f"{self.out}: another cardseg run is writing this folder now; "
                    "wait for it to finish or choose another folder"
                )
            old = _sibling(self.out, _OLD)
            if not self.out.exists() and old.is_dir() and read_stamp(old) is not None:
                os.replace(old, self.out)  # a run stopped between its two renames: put the result back
            _remove_leftover(self.tmp)
            _remove_leftover(old)
            if not _cleaned_lately(self.out.parent):  # its own leftovers went just above
                clean_leftovers(self.out.parent, skip=self.out.name)
            if self.out.exists():
                _remove_leftover(self.out / INNER_TMP)
                check_output(self.out, self.overwrite)  # again, now under the lock
                self.tmp = self.out / INNER_TMP  # on the folder's own file system (a mount point too)
            os.mkdir(self.tmp)  # the user's umask applies, as for any other tool
            self._write_stamp(self.tmp)
        except BaseException:
            self._abort()
            raise
        return self

    def path(self, name: str) -> Path:
        """Where to write the file ``name`` (recorded in the stamp)."""
        if not inside_entry(self.tmp, name):
            raise ValueError(f"not a plain file name: {name!r}")
        if name not in self.files:
            self.files.append(name)
        return self.tmp / name

    def commit(self) -> Path:
        """Put the finished files into place.

        A new output: the temporary folder is renamed to it. An existing folder (empty, a mount
        point, an earlier result): filled in place, see :meth:`_fill_in_place`.
        """
        self._write_stamp(self.tmp)
        if not self.out.exists() and self.tmp.parent == self.out.parent:
            os.replace(self.tmp, self.out)
        else:
            check_output(self.out, self.overwrite)  # something may have appeared there meanwhile
            self._fill_in_place(read_stamp(self.out))
        self._committed = True
        return self.out

    def _fill_in_place(self, stamp: Optional[dict]) -> None:
        """Move the new files into the existing folder ``out``, then remove the earlier files
        ``stamp`` lists that the new run did not write, then write the new stamp.

        Nothing is removed before every new file is in place. Meanwhile the folder's stamp lists
        no finished result but accepts each file's old and new version, so a run killed half way
        leaves a folder that the next run with ``--overwrite`` replaces. Only entries that are
        plain names directly inside ``out``, unchanged since cardseg wrote them, are removed.
        """
        new = bounded_loads((self.tmp / STAMP).read_text(encoding="utf-8"))["files"]
        listed = set(stamp["files"]) | set(stamp.get("replacing") or {}) if stamp else set()
        old = {n: _accepted(stamp, n) for n in listed if inside_entry(self.out, n)}
        replacing = {n: list(v) for n, v in old.items()}
        for n, d in new.items():
            replacing.setdefault(n, []).append(d)
        interim = {"tool": "cardseg", "version": self.version, "files": {}, "replacing": replacing}
        staged = self.tmp / ".cardseg-interim.json"
        staged.write_text(json.dumps(interim, indent=1) + "\n", encoding="utf-8")
        os.replace(staged, self.out / STAMP)
        for name in self.files:
            os.replace(self.tmp / name, self.out / name)
        for name, versions in old.items():
            if name not in new and not file_changed(self.out, name, versions):
                (self.out / name).unlink()
        os.replace(self.tmp / STAMP, self.out / STAMP)
        self.tmp.rmdir()

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._committed:
            self._abort()
        else:
            self._lock.release()

    def _write_stamp(self, folder: Path) -> None:
        files = {n: file_digest(folder / n) for n in self.files if (folder / n).is_file()}
        stamp = {
            "tool": "cardseg",
            "version": self.version,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": files,
        }
        write_atomic(folder / STAMP, (json.dumps(stamp, indent=1) + "\n").encode())  # a kill leaves no half stamp

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
        if self._lock.fd is not None:  # the temporary folder is ours only while we hold the lock
            shutil.rmtree(self.tmp, ignore_errors=True)
            self._lock.release()
        self._remove_parents()
