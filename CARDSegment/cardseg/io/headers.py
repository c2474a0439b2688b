"""What an image file declares, checked against what it holds, without trusting ITK.

SimpleITK reads a truncated ``.nii.gz`` (or a header that declares more voxels than the file
holds) without an error, filling the missing bytes with zeros; its NIfTI reader turns a zero
``pixdim`` into 1.0 mm and NaN into 0. So for every format whose data we accept, this module
parses the header itself, counts the data bytes really present (decompressing as a stream, so
a corrupt or truncated compressed stream is noticed too) and, for floating-point data, checks
that every value is finite. Nothing here builds an image: :mod:`cardseg.io.inputs` does that.

Each ``inspect_*`` function reads the header only and returns ``(Declared, check)``, where
``check()`` reads the data stream (call it after the size limits passed); both raise
:class:`CardsegError` with one line naming the file and the problem.
"""

from __future__ import annotations

import bz2
import gzip
import io
import math
import os
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from cardseg.base.errors import CardsegError
from cardseg.base.filekind import require_regular_file
from cardseg.io.nifti_space import check_qform_agrees, check_sform

_CHUNK = 1 << 20


@dataclass
class Declared:
    """The header's account of an image: ``size`` per axis (i, j, k, ...), bytes per voxel
    (all components), and the spacing per spatial axis as written (``None`` where the format
    stores none, so that a reader's silent default of 1 mm cannot pass as a measurement)."""

    format: str
    size: Tuple[int, ...]
    bytes_per_voxel: int
    spacing: Optional[Tuple[float, ...]]
    #: the unit the header writes lengths in (NIfTI ``xyzt_units``); ``spacing`` is in mm whatever it is
    unit: str = "mm"
    mm_per_unit: float = 1.0

    @property
    def voxels(self) -> int:
        return math.prod(int(s) for s in self.size) if self.size else 0  # Python integers: no wrap-around


# ----------------------------------------------------------------------------- data streams


def _open_stream(path: Path, encoding: str):
    if encoding == "raw":
        return open(path, "rb")
    if encoding == "gzip":
        return gzip.open(path, "rb")
    if encoding == "bzip2":
        return bz2.open(path, "rb")
    raise AssertionError(encoding)


class _ZlibStream:
    """A file-like reader that inflates a zlib stream starting at ``offset`` (MetaImage)."""

    def __init__(self, path: Path, offset: int):
        self.f = open(path, "rb")
        self.f.seek(offset)
        self.z = zlib.decompressobj()
        self.done = False

    def read(self, n: int) -> bytes:
        out = b""
        while len(out) < n and not self.done:
            raw = self.f.read(_CHUNK)
            if not raw:
                if not self.z.eof:
                    raise EOFError("compressed data ended before the end of the stream")
                self.done = True
                break
            out += self.z.decompress(raw)
            if self.z.eof:
                self.done = True
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def check_data(path: Path, opener: Callable, skip: int, expected: int, dtype: Optional[np.dtype], what: str) -> None:
    """Read the data stream from ``opener()``: skip ``skip`` bytes, then require ``expected``
    bytes; for a floating-point ``dtype`` require every value to be finite. One-line errors."""
    have = 0
    carry = b""
    try:
        with opener() as f:
            raw = isinstance(f, io.BufferedReader)  # an uncompressed file: its size says what it holds
            if raw:
                _check_not_far_larger(path, os.fstat(f.fileno()).st_size, skip + expected)
            while skip > 0:
                got = f.read(min(skip, _CHUNK))
                if not got:
                    break
                skip -= len(got)
            if skip > 0:
                raise CardsegError(f"{path}: file is truncated (it ends inside the header)")
            while have < expected:
                chunk = f.read(min(_CHUNK, expected - have))
                if not chunk:
                    break
                have += len(chunk)
                if dtype is not None and dtype.kind == "f":
                    buf = carry + chunk
                    n = len(buf) - len(buf) % dtype.itemsize
                    values = np.frombuffer(buf[:n], dtype=dtype)
                    carry = buf[n:]
                    if not np.isfinite(values).all():
                        raise CardsegError(f"{path}: image contains NaN or infinite values")
            while not raw and f.read(_CHUNK):  # to the end: a corrupt compressed tail fails its checksum
                pass
    except (EOFError, OSError, zlib.error, ValueError) as exc:
        raise CardsegError(f"{path}: {what} data are corrupt or truncated ({_short(exc)})") from None
    if have < expected:
        raise CardsegError(
            f"{path}: file is truncated: the header declares {expected:,d} bytes of image data, "
            f"the file holds {have:,d}"
        )


#: a raw data file may hold this many bytes beyond twice what its header declares (padding, a
#: trailer); a far larger one (a sparse file of gigabytes behind a small header) is refused unread
SLACK_BYTES = 1 << 20


def _check_not_far_larger(path: Path, size: int, declared: int) -> None:
    if size > 2 * declared + SLACK_BYTES:
        raise CardsegError(
            f"{path}: the data file holds {size:,d} bytes, far more than the {declared:,d} its header declares"
        )


def _short(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:120]


# ----------------------------------------------------------------------------- NIfTI

#: NIfTI ``xyzt_units & 7`` → (name, mm per unit), converted as ITK does (unknown: mm)
_NIFTI_UNITS = {0: ("mm", 1.0), 1: ("m", 1000.0), 2: ("mm", 1.0), 3: ("micrometre", 1e-3)}
_NIFTI_DTYPES = {
    2: "u1",
    4: "i2",
    8: "i4",
    16: "f4",
    64: "f8",
    256: "i1",
    512: "u2",
    768: "u4",
    1024: "i8",
    1280: "u8",
    32: "c8",
    1792: "c16",
    128: "u1",
    2304: "u1",
}


class NiftiHead(NamedTuple):
    """The start of a NIfTI file as :func:`read_nifti_head` read it."""

    raw: bytes  #: up to 540 bytes (decompressed for ``.gz``)
    order: Optional[str]  #: ``"<"`` or ``">"``: ``sizeof_hdr`` reads 348 or 540 so; ``None``: it does not start so
    fault: str  #: why the stream ended before 540 bytes could be read ('' where it did not)


def read_nifti_head(path: Path) -> NiftiHead:
    """Read the start of a (gzipped, for ``.gz``) NIfTI file once: ``sizeof_hdr`` first, then the rest of the
    header. A stream that is junk or corrupt from its start has no ``order``, never an exception."""
    raw, order = b"", None
    try:
        with gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb") as f:
            raw = f.read(4)
            order = next((e for e in "<>" if len(raw) == 4 and struct.unpack(e + "i", raw)[0] in (348, 540)), None)
            raw += f.read(536)
    except (OSError, EOFError, zlib.error) as exc:
        return NiftiHead(raw, order, _short(exc))
    return NiftiHead(raw, order, "")


def inspect_nifti(path: Path, start: Optional[NiftiHead] = None) -> Tuple[Declared, Callable[[], None]]:
    """NIfTI-1 (``.nii``, ``.nii.gz``, ``.hdr`` + ``.img``): dims, datatype, pixdim (in mm, converted from
    ``xyzt_units`` as ITK does), sform against pixdim and qform, data. NIfTI-2 is refused (ITK cannot read it).
    ``start``: the file's start where the caller has read it already (:func:`read_nifti_head`)."""
    low = path.name.lower()
    if low.endswith(".img") or low.endswith(".img.gz"):  # the data half of a pair: read its header
        stem = path.name[: -len(".img.gz")] if low.endswith(".img.gz") else path.name[: -len(".img")]
        header = next(
            (
                path.with_name(stem + e)
                for e in (".hdr", ".hdr.gz", ".HDR")
                if os.path.lexists(path.with_name(stem + e))
            ),
            path.with_name(stem + ".hdr"),
        )
        require_regular_file(header, f"{path}: the header file {header.name} of this NIfTI/Analyze pair")
        return inspect_nifti(header)
    head, end, fault = read_nifti_head(path) if start is None else start
    if fault:
        raise CardsegError(f"{path}: NIfTI header is corrupt or truncated ({fault})")
    if len(head) < 348:
        raise CardsegError(f"{path}: file is truncated (it ends inside the NIfTI header)")
    if end is None:
        raise CardsegError(f"{path}: not a NIfTI file (header size field {struct.unpack('<i', head[:4])[0]})")
    n1 = struct.unpack(end + "i", head[:4])[0]
    if n1 == 540:
        raise CardsegError(
            f"{path}: NIfTI-2 files are not supported (ITK cannot read them); convert it to NIfTI-1, "
            "e.g. with nibabel: nib.save(nib.Nifti1Image(img.dataobj, img.affine), 'image.nii.gz')"
        )
    dim = struct.unpack(end + "8h", head[40:56])
    datatype, bitpix = struct.unpack(end + "2h", head[70:74])
    pixdim = struct.unpack(end + "8f", head[76:108])
    vox_offset = int(struct.unpack(end + "f", head[108:112])[0])
    unit, mm_per_unit = _NIFTI_UNITS.get(head[123] & 7, ("mm", 1.0))
    qform_code, sform_code = struct.unpack(end + "2h", head[252:256])
    quatern = struct.unpack(end + "6f", head[256:280])
    srow = struct.unpack(end + "12f", head[280:328])
    is_nifti = head[344:348] in (b"n+1\0", b"ni1\0")
    ndim = int(dim[0])
    if not 1 <= ndim <= 7 or any(int(d) < 1 for d in dim[1 : ndim + 1]):
        raise CardsegError(f"{path}: NIfTI header declares an invalid size {list(dim[1 : max(ndim, 1) + 1])}")
    size = tuple(int(d) for d in dim[1 : ndim + 1])
    if datatype not in _NIFTI_DTYPES or bitpix <= 0 or bitpix % 8:
        raise CardsegError(f"{path}: NIfTI datatype {datatype} is not supported")
    dtype = np.dtype(end + _NIFTI_DTYPES[datatype])
    bpv = bitpix // 8
    spacing = tuple(float(p) * mm_per_unit for p in pixdim[1 : min(ndim, 3) + 1])
    decl = Declared("NIfTI", size, bpv, spacing, unit, mm_per_unit)
    if is_nifti and sform_code > 0:
        check_sform(path, srow, pixdim, min(ndim, 3), (unit, mm_per_unit))
        if qform_code > 0:
            check_qform_agrees(path, srow, quatern, pixdim[0], min(ndim, 3), mm_per_unit)
    data_path, skip = path, vox_offset
    if not (low.endswith(".hdr") or low.endswith(".hdr.gz")) and vox_offset < n1 + 4:
        raise CardsegError(
            f"{path}: NIfTI vox_offset is {vox_offset}, inside the {n1}-byte header (the image data "
            f"of a .nii file start at byte {n1 + 4} or later); the image would be read shifted"
        )
    if low.endswith(".hdr") or low.endswith(".hdr.gz"):
        stem = path.name[: -len(".hdr.gz")] if low.endswith(".hdr.gz") else path.name[: -len(".hdr")]
        cands = [path.with_name(stem + ext) for ext in (".img", ".img.gz", ".IMG")]
        data_path = next((c for c in cands if os.path.lexists(c)), cands[0])
        require_regular_file(data_path, f"{path}: the data file {data_path.name}")
        skip = max(vox_offset, 0)
    return decl, lambda: check_data(
        data_path,
        lambda: _open_stream(data_path, "gzip" if data_path.name.lower().endswith(".gz") else "raw"),
        skip,
        decl.voxels * bpv,
        dtype,
        "NIfTI",
    )


# ----------------------------------------------------------------------------- NRRD

_NRRD_TYPES = {
    "int8": "i1",
    "signed char": "i1",
    "int8_t": "i1",
    "uchar": "u1",
    "unsigned char": "u1",
    "uint8": "u1",
    "uint8_t": "u1",
    "short": "i2",
    "short int": "i2",
    "signed short": "i2",
    "signed short int": "i2",
    "int16": "i2",
    "int16_t": "i2",
    "ushort": "u2",
    "unsigned short": "u2",
    "unsigned short int": "u2",
    "uint16": "u2",
    "uint16_t": "u2",
    "int": "i4",
    "signed int": "i4",
    "int32": "i4",
    "int32_t": "i4",
    "uint": "u4",
    "unsigned int": "u4",
    "uint32": "u4",
    "uint32_t": "u4",
    "longlong": "i8",
    "long long": "i8",
    "long long int": "i8",
    "signed long long": "i8",
    "signed long long int": "i8",
    "int64": "i8",
    "int64_t": "i8",
    "ulonglong": "u8",
    "unsigned long long": "u8",
    "unsigned long long int": "u8",
    "uint64": "u8",
    "uint64_t": "u8",
    "float": "f4",
    "double": "f8",
}


def nrrd_field(line: str) -> Optional[Tuple[str, str]]:
    """A NRRD header line's field as ``(name in lower case, value)``; ``None`` for a ``#`` comment, a
    ``key:=value`` pair (whatever its key) or a line without a colon."""
    key, sep, value = line.partition(":")
    return None if not sep or line.startswith("#") or value.startswith("=") else (key.strip().lower(), value.strip())


def read_nrrd_header(path: Path, limit: int = 1 << 16) -> Tuple[List[str], Dict[str, str], int]:
    """A NRRD header: its lines (the magic ``NRRD000x`` first) up to the first empty line, its fields
    (:func:`nrrd_field`), and the byte offset after the empty line (-1: none within ``limit`` bytes, as in a
    detached header, which ends with its file). Not a NRRD: :class:`CardsegError`."""
    with open(path, "rb") as f:
        raw = f.read(limit)
    lines, pos, offset = [], 0, -1
    while (nl := raw.find(b"\n", pos)) >= 0:
        line, pos = raw[pos:nl].rstrip(b"\r"), nl + 1
        if not line:
            offset = pos
            break
        lines.append(line.decode("latin-1"))
    if not lines or not lines[0].startswith("NRRD"):
        raise CardsegError(f"{path}: not a NRRD file")
    return lines, dict(f for f in map(nrrd_field, lines[1:]) if f), offset


def inspect_nrrd(path: Path) -> Tuple[Declared, Callable[[], None]]:
    """NRRD (``.nrrd`` with attached data, ``.nhdr`` with a data file): raw, gzip or bzip2."""
    _, fields, offset = read_nrrd_header(path)
    try:
        sizes = tuple(int(s) for s in fields["sizes"].split())
        dtype = np.dtype(_NRRD_TYPES[fields["type"].lower()])
    except (KeyError, ValueError) as exc:
        raise CardsegError(f"{path}: NRRD header lacks a valid {_short(exc)} field") from None
    if not sizes or any(s < 1 for s in sizes):
        raise CardsegError(f"{path}: NRRD header declares an invalid size {list(sizes)}")
    if fields.get("endian", "little") == "big":
        dtype = dtype.newbyteorder(">")
    encoding = {"raw": "raw", "gzip": "gzip", "gz": "gzip", "bzip2": "bzip2", "bz2": "bzip2"}.get(
        fields.get("encoding", "raw").lower()
    )
    spacing = _nrrd_spacing(fields, len(sizes), path)
    decl = Declared("NRRD", sizes, dtype.itemsize, spacing)
    if encoding is None:  # ascii / hex: ITK parses the text and fails itself on short data
        return decl, lambda: None
    datafile = fields.get("data file") or fields.get("datafile")
    if datafile:
        if datafile.startswith("LIST") or "%" in datafile:
            return decl, lambda: None  # several data files: left to the reader
        data_path = path.parent / datafile
        require_regular_file(data_path, f"{path}: the data file {data_path.name}")
        skip = int(fields.get("byte skip", "0") or 0)
    else:
        if offset < 0:
            raise CardsegError(f"{path}: NRRD header has no end (file truncated?)")
        data_path, skip = path, offset + max(int(fields.get("byte skip", "0") or 0), 0)
    if encoding != "raw":
        off = skip if not datafile else 0

        def opener():
            return _OffsetStream(data_path, off, encoding)

        skip = 0 if not datafile else skip
    else:

        def opener():
            return _open_stream(data_path, "raw")

    return decl, lambda: check_data(data_path, opener, skip, decl.voxels * dtype.itemsize, dtype, "NRRD")


class _OffsetStream:
    """A gzip/bzip2 stream that starts ``offset`` bytes into a file (NRRD's attached data)."""

    def __init__(self, path: Path, offset: int, encoding: str):
        self.f = open(path, "rb")
        self.f.seek(offset)
        self.s = gzip.GzipFile(fileobj=self.f, mode="rb") if encoding == "gzip" else bz2.BZ2File(self.f, "rb")

    def read(self, n: int) -> bytes:
        return self.s.read(n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.s.close()
        self.f.close()


def _nrrd_spacing(fields: Dict[str, str], ndim: int, path: Path) -> Optional[Tuple[float, ...]]:
    """The spacing of the spatial axes from ``space directions`` or ``spacings``. An axis may go
    without one only when the header says it is not spatial: ``none`` in ``space directions``, a
    non-spatial ``kinds`` entry (``vector``, ``list``, ``time``...), or, without ``kinds``, the one
    extra axis of a 4-D image. A spatial axis without a finite spacing is refused, never read as 1 mm."""
    if "space directions" in fields:
        vectors = re.findall(r"\(([^)]*)\)|none", fields["space directions"])
        vals = [float(np.linalg.norm([float(x) for x in v.split(",")])) for v in vectors if v]
        if any(not math.isfinite(v) for v in vals):
            raise CardsegError(f"{path}: NRRD space directions hold a non-finite vector")
        return tuple(vals) if vals else None
    if "spacings" not in fields:
        return None
    vals = [float(x) for x in fields["spacings"].split()]
    kinds = fields.get("kinds", "").split()
    if len(kinds) == len(vals):
        spatial = [k.lower() in ("domain", "space") for k in kinds]
    else:
        spatial = [True] * len(vals)
        if ndim > 3 and sum(not math.isfinite(v) for v in vals) <= ndim - 3:
            spatial = [math.isfinite(v) for v in vals]
    missing = [i for i, v in enumerate(vals) if spatial[i] and not math.isfinite(v)]
    if missing and any(math.isfinite(v) for v in vals):
        raise CardsegError(
            f"{path}: NRRD spacings give no finite spacing on spatial axis {missing[0]} ({fields['spacings'].strip()})"
        )
    finite = tuple(v for v, sp in zip(vals, spatial) if sp and math.isfinite(v))
    return finite or None


# ----------------------------------------------------------------------------- MetaImage

_MET_TYPES = {
    "MET_CHAR": "i1",
    "MET_UCHAR": "u1",
    "MET_SHORT": "i2",
    "MET_USHORT": "u2",
    "MET_INT": "i4",
    "MET_UINT": "u4",
    "MET_LONG": "i4",
    "MET_ULONG": "u4",
    "MET_LONG_LONG": "i8",
    "MET_ULONG_LONG": "u8",
    "MET_FLOAT": "f4",
    "MET_DOUBLE": "f8",
}


def inspect_metaimage(path: Path) -> Tuple[Declared, Callable[[], None]]:
    """MetaImage (``.mha`` with local data, ``.mhd`` with a data file), raw or zlib-compressed."""
    with open(path, "rb") as f:
        raw = f.read(1 << 16)
    fields: Dict[str, str] = {}
    offset = -1
    pos = 0
    while True:
        nl = raw.find(b"\n", pos)
        if nl < 0:
            break
        line = raw[pos:nl].decode("latin-1").strip()
        pos = nl + 1
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
            if key.strip() == "ElementDataFile":
                offset = pos
                break
    try:
        size = tuple(int(s) for s in fields["DimSize"].split())
        dtype = np.dtype(_MET_TYPES[fields["ElementType"]])
        channels = int(fields.get("ElementNumberOfChannels", "1"))
    except (KeyError, ValueError) as exc:
        raise CardsegError(f"{path}: MetaImage header lacks a valid {_short(exc)} field") from None
    if not size or any(s < 1 for s in size) or channels < 1:
        raise CardsegError(f"{path}: MetaImage header declares an invalid size {list(size)}")
    if fields.get("BinaryDataByteOrderMSB", fields.get("ElementByteOrderMSB", "False")).lower() == "true":
        dtype = dtype.newbyteorder(">")
    spacing = None
    for key in ("ElementSpacing", "ElementSize"):
        if key in fields:
            spacing = tuple(float(x) for x in fields[key].split())
            break
    decl = Declared("MetaImage", size, dtype.itemsize * channels, spacing)
    datafile = fields.get("ElementDataFile", "")
    if not datafile:
        raise CardsegError(f"{path}: MetaImage header has no ElementDataFile")
    if datafile == "LOCAL":
        data_path, start = path, offset
    elif datafile.startswith("LIST") or "%" in datafile:
        files = _metaimage_list(path, datafile, raw[offset:] if offset >= 0 else b"")
        if fields.get("CompressedData", "False").lower() == "true":
            return decl, lambda: None  # compressed slabs: their sizes say nothing, left to the reader
        return decl, lambda: _check_slabs(path, files, decl.voxels * decl.bytes_per_voxel, dtype)
    else:
        data_path, start = path.parent / datafile, 0
        require_regular_file(data_path, f"{path}: the data file {datafile}")
        header_size = int(fields.get("HeaderSize", "0"))
        if header_size < 0:  # -1: the data are the last bytes of the file
            header_size = max(data_path.stat().st_size - decl.voxels * decl.bytes_per_voxel, 0)
        start += header_size
    expected = decl.voxels * decl.bytes_per_voxel
    if fields.get("CompressedData", "False").lower() == "true":

        def opener():
            return _ZlibStream(data_path, start)

        skip = 0
    else:

        def opener():
            return _open_stream(data_path, "raw")

        skip = start
    return decl, lambda: check_data(data_path, opener, skip, expected, dtype, "MetaImage")


def _metaimage_list(path: Path, datafile: str, rest: bytes) -> List[Path]:
    """The data files of a MetaImage whose ``ElementDataFile`` is ``LIST`` (the names follow the
    header, one or more per line) or a ``printf`` pattern with its first, last and step numbers."""
    if datafile.startswith("LIST"):
        names = rest.decode("latin-1").split()
    else:
        pattern, *numbers = datafile.split()
        try:
            if len(numbers) not in (2, 3):
                raise ValueError(datafile)
            first, last, step = [int(n) for n in numbers] + [1] * (3 - len(numbers))
            if step < 1 or last < first:
                raise ValueError(datafile)
            names = [pattern % i for i in range(first, last + 1, step)]
        except (TypeError, ValueError):
            raise CardsegError(f"{path}: MetaImage ElementDataFile pattern {datafile!r} is not valid") from None
    if not names:
        raise CardsegError(f"{path}: MetaImage ElementDataFile {datafile.split()[0]} names no data file")
    return [path.parent / n for n in names]


def metaimage_data_files(path: Path) -> Optional[List[Path]]:
    """Every data file a ``.mhd`` header names (one, a ``LIST`` or a pattern), or ``None`` when the
    header cannot be read or holds its data itself (``LOCAL``)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 16)
    except OSError:
        return None
    m = re.search(rb"(?m)^\s*ElementDataFile\s*=\s*(.*?)\s*$", raw)
    if not m:
        return None
    datafile = m.group(1).decode("latin-1")
    if datafile == "LOCAL":
        return None
    if datafile.startswith("LIST") or "%" in datafile:
        try:
            return _metaimage_list(path, datafile, raw[m.end() :])
        except CardsegError:
            return None
    return [path.parent / datafile]


def _check_slabs(path: Path, files: List[Path], expected: int, dtype: np.dtype) -> None:
    """Each listed data file holds its equal share of the ``expected`` bytes (ITK fills a short one
    with zeros without a word)."""
    share, extra = divmod(expected, len(files))
    if extra:
        raise CardsegError(f"{path}: {len(files)} data files cannot hold equal parts of the image")
    for f in files:
        require_regular_file(f, f"{path}: the data file {f.name}")
        check_data(f, lambda f=f: _open_stream(f, "raw"), 0, share, dtype, "MetaImage")


#: ITK ImageIO name → header inspector
INSPECTORS = {"NiftiImageIO": inspect_nifti, "NrrdImageIO": inspect_nrrd, "MetaImageIO": inspect_metaimage}
