"""File helpers every layer may use: a file's checksum, an atomic write, a folder swapped in whole,
an exclusive lock."""

import errno
import hashlib
import os
import shutil
import sys
from pathlib import Path
from typing import Optional


def sha256_file(path: os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: the name prefix of :func:`can_create_files`'s probe files (removed at once; never a user's file)
PROBE_PREFIX = ".cardseg-probe-"
#: a probe file older than this was left by a run killed between making and removing it
PROBE_STALE_S = 60.0


def remove_stale_probes(folder: os.PathLike) -> int:
    """Remove the probe files (:data:`PROBE_PREFIX`) in ``folder`` older than :data:`PROBE_STALE_S`
    (a live probe lives microseconds); best effort. Returns how many were removed."""
    import time

    removed = 0
    try:
        names = [n for n in os.listdir(folder) if n.startswith(PROBE_PREFIX)]
    except OSError:
        return 0
    for name in names:
        path = os.path.join(folder, name)
        try:
            if time.time() - os.lstat(path).st_mtime > PROBE_STALE_S and os.path.isfile(path):
                os.unlink(path)
                removed += 1
        except OSError:
            pass
    return removed


def can_create_files(folder: os.PathLike) -> bool:
    """Whether a file can be made in ``folder``: a probe file, created and removed at once
    (permissions, read-only file systems and special folders such as /proc all answer the same way,
    also for root, who may write where the permission bits say no)."""
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def _nofollow() -> int:
    """``O_NOFOLLOW`` where the platform has it (opening a symbolic link then fails), else 0."""
    return getattr(os, "O_NOFOLLOW", 0)


def _own_plain_file(st: os.stat_result) -> bool:
    """Whether ``st`` is a regular file with one name, owned by this process's user: a file this
    program may have left (a hard link to another file, or another user's file, is not)."""
    import stat

    owner = getattr(os, "geteuid", None)
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and (owner is None or st.st_uid == owner())


def open_new_file(path: Path) -> int:
    """A descriptor of ``path`` made new (``O_EXCL``, never through a symbolic link), for writing.

    A file already there that this program may have left (:func:`_own_plain_file`: a run killed
    while writing it) is removed first; anything else in the way (a link, another user's file, a
    hard link to some other file) is left alone and refused with an :class:`OSError`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _nofollow() | getattr(os, "O_BINARY", 0)
    try:
        return os.open(path, flags, 0o666)
    except FileExistsError:
        st = os.lstat(path)
        if not _own_plain_file(st):
            raise OSError(errno.EEXIST, "something this program did not make is in the way", str(path)) from None
        os.unlink(path)
        return os.open(path, flags, 0o666)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``.<name>.tmp`` beside ``path`` (made new, never through a link:
    :func:`open_new_file`), sync it, check that the file holds every byte, then rename it over
    ``path``. On any failure (a full disk, a file size limit) ``path`` is untouched and the
    temporary file is removed; the error (an :class:`OSError`) propagates."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = open_new_file(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            if os.fstat(f.fileno()).st_size != len(data):
                raise OSError(errno.EIO, "could not be written completely (disk full or file size limit?)", str(path))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def make_readable(path: Path, directory: bool = False) -> None:
    """Give a file or folder made by ``tempfile`` (mode 0600/0700) the usual mode under the umask,
    so that what one user writes (e.g. an installer's bundle) the others can read."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


def replace_dir(src: Path, dest: Path) -> None:
    """Move the finished folder ``src`` to ``dest``; what was at ``dest`` is replaced only at the end."""
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
        os.replace(src, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dest)


def make_parents(path: Path) -> list:
    """Create the missing folders above ``path``; returns those created, deepest first, so a
    caller that fails afterwards can remove them (:func:`remove_folders`) and leave no trace."""
    missing = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    path.parent.mkdir(parents=True, exist_ok=True)
    return missing


def remove_folders(folders: list) -> None:
    """Remove each of ``folders`` (deepest first) that is still empty; others are left alone."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


class FileLock:
    """An exclusive, non-blocking lock on a file (``flock`` on POSIX, ``msvcrt`` on Windows)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: Optional[int] = None

    def acquire(self) -> bool:
        """Take the lock; False when another process holds it. Ctrl-C or SIGTERM during the call
        waits until the lock is taken and its file records this process, then is raised with
        the lock released again: the lock is held exactly when this returned True."""
        from cardseg.base.interrupt import signals_deferred

        try:
            with signals_deferred():
                return self._take()
        except BaseException:
            self.release()
            raise

    def _take(self) -> bool:
        while True:
            fd = self._open()
            if not _try_lock(fd):
                os.close(fd)
                return False
            try:  # the file we locked may have been unlinked by the run that just finished
                same = os.path.samestat(os.fstat(fd), os.lstat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                return True
            os.close(fd)

    def _open(self) -> int:
        """The lock file's descriptor, never through a symbolic link; a file there that this
        program cannot have made (another user's, a hard link to another file, not a regular
        file) is refused with an :class:`OSError` and left as it is."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _nofollow(), 0o666)
        except OSError as exc:
            if exc.errno == errno.ELOOP or os.path.islink(self.path):
                raise OSError(errno.ELOOP, "its lock file is a symbolic link, not a lock", str(self.path)) from None
            raise
        if not _own_plain_file(os.fstat(fd)):
            os.close(fd)
            raise OSError(errno.EEXIST, "its lock file is a file this program did not make", str(self.path))
        return fd

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
