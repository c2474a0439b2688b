"""The files of the model cache (ONNX models, :mod:`cardseg.bundle.onnx_backend`, and prepared
torch programs, :mod:`cardseg.bundle.script_backend`): where it lies, how an entry is read and
written, and the temporaries an interrupted export leaves.

* :func:`cache_dir`: ``$CARDSEG_CACHE_DIR``, else ``$XDG_CACHE_HOME/cardseg``, else
  ``~/.cache/cardseg``; never inside the installed package. Models lie in its ``models`` folder.
* Every entry's record carries :func:`seal`, a keyed digest under a secret only this user can
  read (``seal.key``, mode 0600): an entry edited by anyone, its record's sha256 updated to
  match, is a miss and prepared again, never run.
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
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

from cardseg.base.errors import CardsegError
from cardseg.base.strictjson import bounded_loads

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


#: the cache's secret (:func:`seal`), beside the models, readable by its owner alone
KEY_FILE = "seal.key"
#: the record field holding :func:`seal` of the entry's bytes
SEAL_FIELD = "seal"


def _seal_key() -> Optional[bytes]:
    """The cache's secret key, made on first use (32 random bytes, mode 0600, never through a
    link); ``None`` when it cannot be made or read, or the file there is not this user's private
    file (another user's, a link, group or other permissions): nothing cached is trusted then."""
    import secrets

    try:
        path = cache_dir() / KEY_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
        info = os.lstat(path)
        owner = getattr(os, "geteuid", None)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or (owner is not None and info.st_uid != owner()):
            return None
        key = read_entry(path, 64)
    except (OSError, CardsegError):
        return None
    return key if key is not None and len(key) == 32 else None


def seal(data: bytes) -> Optional[str]:
    """The keyed digest (HMAC-SHA256 under the cache's secret, :func:`_seal_key`) that proves an
    entry was written by this user's cardseg: a sha256 alone is recomputed by anyone who edits
    the entry. ``None`` when the cache has no usable key."""
    import hmac

    key = _seal_key()
    return None if key is None else hmac.new(key, data, hashlib.sha256).hexdigest()


def read_recorded(model: Path, record: Path, key: str, digest_field: str) -> Optional[bytes]:
    """The bytes of the cache entry ``model`` when its ``record`` (JSON) names ``key``, under
    ``digest_field`` the sha256 of exactly these bytes, and under :data:`SEAL_FIELD` their
    :func:`seal`; else ``None`` (a miss: the caller prepares the model again and writes it over).
    Only regular files are read (:func:`read_entry`). The caller still checks the key held inside
    the model."""
    import hmac

    raw, data = read_entry(record, MAX_RECORD_BYTES), read_entry(model, MAX_MODEL_BYTES)
    if raw is None or data is None:
        return None
    try:
        rec = bounded_loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("key") != key or rec.get(digest_field) != hashlib.sha256(data).hexdigest():
        return None
    sealed, expected = rec.get(SEAL_FIELD), seal(data)
    if not isinstance(sealed, str) or expected is None or not hmac.compare_digest(sealed, expected):
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
