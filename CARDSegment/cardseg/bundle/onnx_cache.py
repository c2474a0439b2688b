"""The files of the model cache (ONNX models, :mod:`cardseg.bundle.onnx_backend`, and prepared
torch programs, :mod:`cardseg.bundle.script_backend`): where it lies, how an entry is read and
written, and the temporaries an interrupted export leaves.

* :func:`cache_dir`: ``$CARDSEG_CACHE_DIR``, else ``$XDG_CACHE_HOME/cardseg``, else
  ``~/.cache/cardseg``; never inside the installed package. Models lie in its ``models`` folder.
* :func:`read_entry` reads regular files only, opened without blocking and bounded in size: a
  FIFO, a device, a folder or an oversized file at an entry's name is a cache miss, never a hang.
* :func:`write_entry` writes through a temporary in the same folder and renames it over the
  entry (a FIFO or other non-folder there is replaced; a folder there makes it fail, and the
  caller then keeps the model in memory).
* Every temporary is named ``cardseg-onnx-tmp-<pid>-<random><suffix>``, in the models folder
  or, when that cannot be written, in the system's temporary folder. :func:`clean_stale_temporaries`
  (run by every bundle load, whatever the backend) removes such regular files whose process has
  ended (and which are older than :data:`DEAD_GRACE_S`) or which are older than :data:`STALE_S`,
  so an export killed half way leaves nothing behind for longer than the next run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

from cardseg.base.errors import CardsegError

CACHE_ENV = "CARDSEG_CACHE_DIR"
#: name prefix of every temporary file the cache writes
TEMP_PREFIX = "cardseg-onnx-tmp-"
TEMP_RE = re.compile(re.escape(TEMP_PREFIX) + r"(\d+)-[A-Za-z0-9_]+(\.onnx|\.json|\.pt)")
#: a temporary is stale when older than this (seconds), whoever wrote it
STALE_S = 3600.0
#: ... or when its process has ended and it is older than this (another host sharing the folder
#: may hold the same pid for a running export; a few seconds covers a rename in flight)
DEAD_GRACE_S = 10.0
#: at most this many folder entries are looked at per cleanup (a bounded walk)
MAX_SCAN = 100_000
#: the largest model file read (ONNX protobufs stop at 2 GiB) and the largest record
MAX_MODEL_BYTES = 2 << 30
MAX_RECORD_BYTES = 1 << 20


def cache_dir() -> Path:
    """The user's cardseg cache folder (see the module docstring); never inside the package."""
    base = os.environ.get(CACHE_ENV)
    if base:
        root = Path(base).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "cardseg"
    package = Path(__file__).resolve().parent.parent  # the cardseg package folder
    resolved = root.resolve()
    if resolved == package or package in resolved.parents:
        raise CardsegError(f"{root}: the model cache may not lie inside the installed cardseg package")
    return root


def models_dir() -> Path:
    return cache_dir() / "models"


def read_entry(path: Path, limit: int) -> Optional[bytes]:
    """The bytes of ``path`` when it is a regular file (symlinks followed) of at most ``limit``
    bytes, else ``None``. Never blocks: the file is opened with ``O_NONBLOCK`` and checked with
    ``fstat`` before anything is read."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return data if len(data) <= limit else None


def read_recorded(model: Path, record: Path, key: str, digest_field: str) -> Optional[bytes]:
    """The bytes of the cache entry ``model`` when its ``record`` (JSON) names ``key`` and, under
    ``digest_field``, the sha256 of exactly these bytes; else ``None`` (a miss). Only regular
    files are read (:func:`read_entry`). The caller still checks the key held inside the model."""
    raw, data = read_entry(record, MAX_RECORD_BYTES), read_entry(model, MAX_MODEL_BYTES)
    if raw is None or data is None:
        return None
    try:
        rec = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("key") != key or rec.get(digest_field) != hashlib.sha256(data).hexdigest():
        return None
    return data


def temp_file(folder: Optional[Path], suffix: str) -> Path:
    """A new, empty temporary file named as the module docstring says, in ``folder`` (created
    when missing) or, when that fails or ``folder`` is ``None``, in the system's temporary folder."""
    prefix = f"{TEMP_PREFIX}{os.getpid()}-"
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
            os.close(fd)
            return Path(name)
        except OSError:
            pass
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix)
    os.close(fd)
    return Path(name)


def write_entry(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a temporary beside it, then a rename), with the
    usual mode under the umask. ``OSError`` when the folder cannot be written; no temporary is
    left behind then."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _process_ended(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: it runs, as another user
        return False
    return False


def _entries(folder: Path) -> Iterator[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            for i, entry in enumerate(it):
                if i >= MAX_SCAN:
                    return
                yield entry
    except OSError:
        return


def clean_stale_temporaries(now: Optional[float] = None) -> int:
    """Remove the cache's stale temporaries (see the module docstring) from the models folder
    and the system's temporary folder; returns how many were removed. Only regular files whose
    name matches :data:`TEMP_RE` are touched (never a symlink, a folder or anything else); any
    error is ignored (a cache that cannot be cleaned is no reason to refuse a run)."""
    now = time.time() if now is None else now
    try:
        folders = [models_dir()]
    except CardsegError:
        folders = []
    folders.append(Path(tempfile.gettempdir()))
    removed = 0
    for folder in folders:
        for entry in _entries(folder):
            match = TEMP_RE.fullmatch(entry.name)
            if not match:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode):
                    continue
                age = now - info.st_mtime
                if age > STALE_S or (age > DEAD_GRACE_S and _process_ended(int(match.group(1)))):
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                continue
    return removed
