"""Writing image files that are proven complete: nothing truncated is ever committed.

SimpleITK's NIfTI writer, when the disk fills up or a file-size limit (``ulimit -f``) cuts a
write, prints ``** ERROR: NWAD: wrote only 0 of N bytes`` on the process's stderr and returns as
if all went well. :func:`write_image` therefore mutes that line and reads every file back
before it returns: the whole file (the bytes it compressed itself, their length and CRC-32; a
file SimpleITK compressed, its whole gzip stream, decompressed), the header's size, number of
components and pixel type, and the amount of voxel data. Any shortfall raises
:class:`IncompleteWrite`, an :class:`OSError` (the command line's exit 1) that names the file.
"""

from __future__ import annotations

import collections
import errno
import gzip
import os
import re
import struct
import sys
import threading
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, NamedTuple, Optional

from cardseg.base.fd2 import FD2_LOCK

#: what the file system did when a file came out short
INCOMPLETE = "could not be written completely (disk full or file size limit?)"


class IncompleteWrite(OSError):
    """A file that was written short or cannot be read back as what was meant to be written."""

    def __init__(self, path: os.PathLike, why: str = INCOMPLETE):
        super().__init__(errno.EIO, why, os.fspath(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


@contextmanager
def muted_native_stderr() -> Iterator[List[str]]:
    """Catch what native code prints on file descriptor 2 meanwhile; yields the list that receives
    its lines once the block ends. The pipe's write end never blocks: past 64 KiB it drops. One
    capture at a time in the process (other threads wait)."""
    with FD2_LOCK:  # fd 2 is the process's: one redirection at a time (cardseg.base.fd2)
        with _muted() as lines:
            yield lines


@contextmanager
def _muted() -> Iterator[List[str]]:
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    lines: List[str] = []
    r, w = os.pipe()
    saved = os.dup(2)
    try:
        os.set_blocking(w, False)
        os.dup2(w, 2)
        os.close(w)
        yield lines
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.set_blocking(r, False)
        data = b""
        try:
            while True:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                data += chunk
        except BlockingIOError:
            pass
        os.close(r)
        lines.extend(data.decode("utf-8", "replace").splitlines())


def _pass_on(lines: List[str]) -> None:
    """Print the captured lines again, all but the NIfTI library's short-write complaints (the
    one-line error that follows says it): in one write, under the fd-2 lock, so that no other
    thread's progress line is cut into them."""
    text = "".join(line + "\n" for line in lines if "NWAD" not in line and line.strip())
    if text:
        with FD2_LOCK:
            sys.stderr.write(text)
            sys.stderr.flush()


#: gzip level of the written volumes: 1 gives about the size of 6 on float maps (1 % more), sooner
GZIP_LEVEL = 1
#: suffix of the uncompressed NIfTI written beside the target before it is compressed
RAW_SUFFIX = ".raw.nii"


def write_image(image, path: os.PathLike) -> None:
    """Write ``image`` (SimpleITK) to ``path`` (``.nii.gz``, compressed) and prove the file holds
    it all; raises :class:`IncompleteWrite` otherwise (the file is then left for the caller's
    clean-up, never reported as written).

    SimpleITK writes the NIfTI uncompressed beside ``path`` (quick; fd 2 muted meanwhile, which
    holds the process-wide lock), then Python's zlib compresses it into ``path`` (outside that
    lock, without Python's lock: several volumes, and several pieces of one volume, compress at
    once on several threads, :func:`_gzip_file`) and the uncompressed file is removed. Where the uncompressed file does not fit (disk, quota, ``ulimit
    -f``), SimpleITK writes the compressed file itself, as before. The file is an ordinary
    gzip-compressed NIfTI."""
    path = Path(path)
    raw = path.with_name(path.name + RAW_SUFFIX)
    written: Optional[GzipWritten] = None
    try:
        _sitk_write(image, raw, path, compressed=False)
        written = _gzip_file(raw, path)
    except IncompleteWrite:
        # no room for the uncompressed file (disk, quota, ``ulimit -f``): SimpleITK compresses as
        # it writes, needing room for the compressed file only
        _remove(raw)
        _sitk_write(image, path, path, compressed=True)
    finally:
        _remove(raw)
    verify_image(image, path, written)


def _sitk_write(image, target: Path, name: Path, compressed: bool) -> None:
    """SimpleITK writes ``image`` to ``target`` (fd 2 muted meanwhile); a short write raises
    :class:`IncompleteWrite` naming ``name``."""
    import SimpleITK as sitk

    with muted_native_stderr() as lines:
        try:
            sitk.WriteImage(image, str(target), useCompression=compressed)
        except RuntimeError:
            failed = True
        else:
            failed = False
    _pass_on(lines)
    if failed or any("NWAD" in line for line in lines):
        raise IncompleteWrite(name)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


#: the bytes of a NIfTI file that hold its header (NIfTI-2's size; NIfTI-1's is 348)
HEADER_BYTES = 540


class GzipWritten(NamedTuple):
    """What :func:`_gzip_file` wrote: the uncompressed bytes' count and first :data:`HEADER_BYTES`
    (the NIfTI header), and the compressed file's own length and CRC-32 (what it must read back as)."""

    raw_size: int
    head: bytes
    size: int
    crc: int


def _gzip_file(src: Path, dst: Path, level: int = GZIP_LEVEL) -> GzipWritten:
    """``src`` gzip-compressed into ``dst``: one ordinary gzip member (no file name, time 0), its
    deflate stream made of :data:`PIECE_BYTES` pieces compressed on several threads at once
    (:func:`_deflate_pieces`); an ``OSError`` of the file system (full disk, size limit) goes up as
    :class:`IncompleteWrite`. Returns what it wrote (:class:`GzipWritten`)."""
    # magic, deflate, no flags, time 0, "fastest" (level 1) or no extra flag, OS unknown
    magic = b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + (b"\x04" if level == 1 else b"\x00") + b"\xff"
    try:
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            out = _Counted(fout)
            out.write(magic)
            crc, size, head = 0, 0, b""
            for raw, packed in _deflate_pieces(fin, level):
                crc = zlib.crc32(raw, crc)
                head = head if len(head) >= HEADER_BYTES else head + raw[: HEADER_BYTES - len(head)]
                size += len(raw)
                out.write(packed)
            out.write(struct.pack("<II", crc & 0xFFFFFFFF, size & 0xFFFFFFFF))
    except OSError:
        raise IncompleteWrite(dst) from None
    return GzipWritten(size, head, out.size, out.crc)


class _Counted:
    """A binary file being written, with the length and CRC-32 of what was written to it."""

    def __init__(self, f):
        self.f, self.size, self.crc = f, 0, 0

    def write(self, data: bytes) -> None:
        self.f.write(data)
        self.size += len(data)
        self.crc = zlib.crc32(data, self.crc)


#: a file is compressed in pieces of this many bytes, several at once (pigz's way: each piece
#: primed with the 32 KiB before it, so the file is as small as compressed in one go, nearly)
PIECE_BYTES = 1 << 21
#: at most this many pieces of one file are read ahead of the one being written (memory: 16 MiB)
MAX_AHEAD = 8
_WINDOW = 1 << 15
_pieces = {"pool": None, "workers": 0, "wanted": 0}
_pieces_lock = threading.Lock()


def set_threads(n: Optional[int]) -> None:
    """The threads that compress pieces in this process: a run's ``--threads`` (or its share of
    the CPUs among a batch's workers); the pool is made again, at the next file, when it changes.
    ``None`` (and unset): one per usable CPU."""
    _pieces["wanted"] = 0 if n is None else max(1, int(n))


def _pool():
    """The pool that compresses pieces, shared by every file being written (zlib runs without
    Python's lock, so pieces compress in parallel): ``(executor, its threads)``."""
    with _pieces_lock:
        wanted = _pieces["wanted"]
        if not wanted:
            from cardseg.base.cpus import usable_cpus

            wanted = max(1, usable_cpus())
        if _pieces["pool"] is None or _pieces["workers"] != wanted:
            from concurrent.futures import ThreadPoolExecutor

            if _pieces["pool"] is not None:
                _pieces["pool"].shutdown(wait=False)  # its queued pieces still run; new ones go to the new pool
            _pieces["pool"] = ThreadPoolExecutor(max_workers=wanted, thread_name_prefix="cardseg-gzip")
            _pieces["workers"] = wanted
        return _pieces["pool"], wanted


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's pool threads (the pool would wait for ever) and may
    have been forked while another thread held the lock: both start afresh."""
    global _pieces_lock
    _pieces_lock = threading.Lock()
    _pieces["pool"], _pieces["workers"] = None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _deflate(data: bytes, primer: bytes, level: int, last: bool) -> bytes:
    """``data`` as raw deflate blocks that continue a stream whose last 32 KiB were ``primer``; a
    non-final piece ends on a byte boundary (sync flush) so the next piece's blocks can follow."""
    c = (
        zlib.compressobj(level, zlib.DEFLATED, -15, zdict=primer)
        if primer
        else zlib.compressobj(level, zlib.DEFLATED, -15)
    )
    return c.compress(data) + c.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)


def _deflate_pieces(fin, level: int) -> Iterator[tuple]:
    """``(raw piece, its deflate blocks)`` in file order; at most twice the pool's threads (and
    :data:`MAX_AHEAD`) pieces are read ahead, so memory stays bounded for any file size. Pieces
    still queued when the caller stops early (a failed write, an interrupt) are cancelled."""
    pool, workers = _pool()
    ahead = max(1, min(2 * workers, MAX_AHEAD))
    pending: "collections.deque" = collections.deque()
    primer = b""
    piece = fin.read(PIECE_BYTES)
    try:
        while True:
            following = fin.read(PIECE_BYTES) if piece else b""
            last = not following
            pending.append((piece, pool.submit(_deflate, piece, primer, level, last)))
            primer = piece[-_WINDOW:]
            piece = following
            while pending and (last or len(pending) >= ahead):
                raw, future = pending.popleft()
                yield raw, future.result()
            if last:
                return
    finally:
        for _, future in pending:
            future.cancel()


def verify_image(image, path: Path, written: Optional[GzipWritten] = None) -> None:
    """Raise :class:`IncompleteWrite` unless ``path`` (a gzip-compressed NIfTI) reads back as
    ``image``: same size, components and pixel type in the header, and exactly the header's offset
    plus the voxel bytes once decompressed. The file is read whole: with ``written`` (what
    :func:`_gzip_file` wrote), it must hold those very bytes (length and CRC-32), whose
    uncompressed length and header ``written`` gives; without, its gzip stream must decompress
    whole with a valid CRC."""
    import SimpleITK as sitk

    per_voxel = image.GetNumberOfComponentsPerPixel() * sitk.GetArrayViewFromImage(image).itemsize
    expected = image.GetNumberOfPixels() * per_voxel
    try:
        total, head = _gunzip_length(path) if written is None else _written_length(path, written)
        offset = _vox_offset(head)
        reader = sitk.ImageFileReader()
        reader.SetFileName(str(path))
        with muted_native_stderr() as lines:
            reader.ReadImageInformation()
        _pass_on(lines)
    except (OSError, EOFError, ValueError, RuntimeError, zlib.error, struct.error):
        raise IncompleteWrite(path) from None
    # ITK reads a one-slice vector image back as 2D: trailing axes of size 1 do not count
    same = (
        _trimmed(reader.GetSize()) == _trimmed(image.GetSize())
        and reader.GetNumberOfComponents() == image.GetNumberOfComponentsPerPixel()
        and reader.GetPixelID() in (image.GetPixelID(), sitk.sitkUnknown)
    )
    if not same or total != offset + expected:
        raise IncompleteWrite(path)


def _gunzip_length(path: Path) -> tuple:
    """The decompressed length of a whole gzip file and its first 540 bytes (the CRC and length
    in the trailer are checked by :mod:`gzip`; a cut stream raises ``EOFError``)."""
    total, head = 0, b""
    with gzip.open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            if len(head) < HEADER_BYTES:
                head += chunk[: HEADER_BYTES - len(head)]
            total += len(chunk)
    return total, head


def _written_length(path: Path, written: GzipWritten) -> tuple:
    """``written``'s uncompressed length and header, once ``path`` reads back as the very bytes
    :func:`_gzip_file` wrote (their length and CRC-32); raises ``EOFError`` otherwise."""
    size, crc = 0, 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            size += len(chunk)
            crc = zlib.crc32(chunk, crc)
    if (size, crc) != (written.size, written.crc):
        raise EOFError(f"{path} does not hold the bytes written")
    return written.raw_size, written.head


def _vox_offset(head: bytes) -> int:
    """Where the voxel data of a NIfTI-1 or NIfTI-2 file starts (either byte order)."""
    for order in ("<", ">"):
        size = struct.unpack(order + "i", head[:4])[0]
        if size == 348:
            return int(struct.unpack(order + "f", head[108:112])[0])
        if size == 540:
            return int(struct.unpack(order + "q", head[168:176])[0])
    raise ValueError("not a NIfTI header")


def verify_seg_nrrd(path: os.PathLike, shape_ijk: tuple) -> None:
    """Raise :class:`IncompleteWrite` unless ``path`` reads back whole (header and every voxel)
    with the label grid ``shape_ijk`` in its last three axes."""
    import nrrd

    try:
        data, _ = nrrd.read(os.fspath(path))
    except Exception:  # noqa: BLE001 - pynrrd raises its own errors, zlib's and numpy's
        raise IncompleteWrite(path) from None
    if tuple(data.shape[-3:]) != tuple(shape_ijk) and tuple(data.shape[:3]) != tuple(shape_ijk):
        raise IncompleteWrite(path)


def write_seg_nrrd(path: os.PathLike, labels, volume, classes: list) -> None:
    """A Slicer ``.seg.nrrd`` with one segment per foreground class (names and colours): labels
    ``(Z, Y, X)`` integers on ``volume``'s grid (:class:`cardseg.io.volume.Volume`), classes as in
    a bundle's ``classes``. The caller proves it complete with :func:`verify_seg_nrrd`."""
    import numpy as np
    import slicerio

    ijk = np.ascontiguousarray(labels.transpose(2, 1, 0))  # (Z, Y, X) → (i, j, k)
    seg = slicerio.create_segmentation(ijk.shape, volume.ijk_to_lps())
    for value, cls in enumerate(classes):
        if value == 0:
            continue
        segment = {
            "id": f"Segment_{value}",
            "name": cls["name"],
            "color": [float(c) for c in cls.get("color", [1, 0, 0])],
        }
        if cls.get("terminology"):
            segment["terminology"] = cls["terminology"]
        slicerio.add_segment(seg, ijk == value, segment)
    slicerio.write_segmentation(str(path), seg)
    drop_write_date(path)


#: the comment pynrrd writes into every header: the time of writing (the one byte difference between two runs)
_DATE_COMMENT = re.compile(rb"^# on [^\n]*\n", re.MULTILINE)


def drop_write_date(path: os.PathLike) -> None:
    """Remove the ``# on <date>`` comment pynrrd puts in a NRRD header (only in the header: up to
    its first empty line), so that the same labels give the same bytes on every run; a file
    without it is left alone."""
    with open(path, "rb") as f:
        data = f.read()
    end = data.find(b"\n\n")
    head = data[: end + 1] if end >= 0 else b""
    new_head = _DATE_COMMENT.sub(b"", head, count=1)
    if new_head != head:
        with open(path, "wb") as f:
            f.write(new_head + data[len(head) :])


def write_text(path: os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) and check that the file holds every byte of it."""
    data = text.encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
    if os.path.getsize(path) != len(data):
        raise IncompleteWrite(path)


def _trimmed(size) -> tuple:
    """``size`` without its trailing axes of length 1."""
    size = tuple(int(s) for s in size)
    while len(size) > 1 and size[-1] == 1:
        size = size[:-1]
    return size
