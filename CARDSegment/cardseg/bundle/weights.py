"""A bundle's weight files: checksum first, then the safetensors header, then the values
(nothing unpickled).

:func:`verify_weights` checks each role's file against the sha256 in ``bundle.json``, reads the
8-byte header length and the JSON header (:func:`read_safetensors_header` checks that every
tensor's byte range lies inside the file and matches its dtype and shape), and refuses a file
whose tensors are not stored in the dtype ``bundle.json`` declares (:func:`dtype_problem`) or
whose floating-point tensors hold a NaN or an infinity (:func:`non_finite_problem`, bit patterns
read with the standard library alone: no numpy, no torch). A network with such a weight computes
NaN logits, which would give an all-background segmentation with exit status 0.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from cardseg.base.errors import CardsegError, show
from cardseg.bundle.fields import is_int
from cardseg.bundle.schema import ROLES

#: safetensors: an 8-byte little-endian header length, then a JSON header of at most 100 MB
SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024
SAFETENSORS_ITEMSIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
#: floating-point dtypes: (width in bytes, exponent mask); a value is NaN or infinite exactly when
#: all its exponent bits are set, infinite when its mantissa is zero besides (F8_E4M3 has no
#: infinity: its only non-finite pattern, S.1111.111, is NaN)
FLOAT_BITS = {
    "F16": (2, 0x7C00),
    "BF16": (2, 0x7F80),
    "F32": (4, 0x7F800000),
    "F64": (8, 0x7FF0000000000000),
    "F8_E5M2": (1, 0x7C),
    "F8_E4M3": (1, 0x7F),
}


@dataclass(frozen=True)
class WeightFile:
    """A verified weight file: its path, sha256 and safetensors header (tensor name → entry),
    and the bytes that were verified (loading uses these, so a file changed after the check is
    never what runs)."""

    path: Path
    sha256: str
    tensors: Dict[str, dict]
    data: Optional[bytes] = field(default=None, repr=False, compare=False)

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        return {name: tuple(entry["shape"]) for name, entry in self.tensors.items()}


def verify_weights(root: os.PathLike, config: dict) -> Dict[str, WeightFile]:
    """Check each role's weight file (config already validated): checksum first, then the header.

    Returns ``{role: WeightFile}``. Nothing but the header's JSON is interpreted; the tensor
    data are only read as bit patterns, and a file with a NaN or infinite value is refused
    (one line naming the first such tensor and the count), so no backend ever runs it. The
    file is read once for both the checksum and the values.
    """
    out = {}
    for role in ROLES:
        spec = config["networks"][role]
        path = Path(root) / spec["file"]
        data = _read_regular(path)
        digest = hashlib.sha256(data).hexdigest()
        if digest != spec["sha256"]:
            raise CardsegError(f"{path}: checksum mismatch (file is truncated, altered or not this bundle's)")
        tensors = read_safetensors_header(path)
        problem = dtype_problem(tensors, spec.get("dtype")) or non_finite_problem(data, tensors)
        if problem:
            raise CardsegError(f"{path}: {problem}; the weights are broken (train or export the bundle again)")
        out[role] = WeightFile(path=path, sha256=digest, tensors=tensors, data=data)
    return out


#: bundle.json's ``dtype`` -> the safetensors dtype of every tensor of such a file
DECLARED_DTYPES = {"float16": "F16", "float32": "F32", "bfloat16": "BF16"}


def dtype_problem(tensors: Dict[str, dict], declared: Optional[str]) -> Optional[str]:
    """``None`` when every tensor is stored in the ``dtype`` bundle.json declares (any floating
    dtype when it declares none), else one phrase naming the first tensor that is not. A weight
    stored as integers would be cast silently on loading and compute garbage."""
    allowed = {DECLARED_DTYPES[declared]} if declared in DECLARED_DTYPES else set(DECLARED_DTYPES.values()) | {"F64"}
    for name, entry in tensors.items():
        if entry["dtype"] not in allowed:
            want = f"bundle.json's dtype {declared}" if declared else "a floating-point dtype"
            return f"tensor {show(name)} is stored as {entry['dtype']}, not as {want}"
    return None


def _read_regular(path: Path) -> bytes:
    """The bytes of the regular file ``path`` (the schema has checked that it is one)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CardsegError(f"{path}: unreadable weight file ({exc.strerror or type(exc).__name__})") from None


def non_finite_problem(data: bytes, tensors: Dict[str, dict]) -> Optional[str]:
    """``None`` when every floating-point tensor of the safetensors file ``data`` (its whole
    bytes; ``tensors`` from :func:`read_safetensors_header`) is finite, else one phrase naming
    the first tensor with a NaN or an infinity, its counts, and how many tensors are affected.

    Integer tensors are skipped. Standard library only: each byte lane of a tensor is mapped
    through a 256-entry table and the lanes are combined as big integers (C speed, a few
    milliseconds per million values).
    """
    start = 8 + int.from_bytes(data[:8], "little")
    bad = []
    for name, entry in tensors.items():
        bits = FLOAT_BITS.get(entry["dtype"])
        begin, end = entry["data_offsets"]
        if bits is None or end == begin:
            continue
        width, mask = bits
        span = (start + begin, start + end, width)
        count = _count_matching(data, span, mask, mask)
        if count:
            magnitude = (1 << (8 * width - 1)) - 1  # every bit but the sign
            inf = 0 if entry["dtype"] == "F8_E4M3" else _count_matching(data, span, magnitude, mask)
            bad.append((name, count - inf, inf, (end - begin) // width))
    if not bad:
        return None
    name, nan, inf, size = bad[0]
    counts = " and ".join(part for part in (f"{nan} NaN" if nan else "", f"{inf} infinite" if inf else "") if part)
    more = f" ({len(bad)} tensors affected in all)" if len(bad) > 1 else ""
    return f"tensor {show(name)} holds {counts} value{'s' if nan + inf > 1 else ''} of {size}{more}"


def _count_matching(data: bytes, span: Sequence[int], mask: int, value: int) -> int:
    """How many little-endian ``width``-byte words ``w`` of ``data[begin:end]`` (``span`` =
    ``(begin, end, width)``) have ``w & mask == value``."""
    begin, end, width = span
    masks, values = mask.to_bytes(width, "little"), value.to_bytes(width, "little")
    hits = -1  # all ones: every word matches until a byte lane says otherwise
    for lane in range(width):
        m, v = masks[lane], values[lane]
        if m == 0:
            continue
        table = bytes(1 if (b & m) == v else 0 for b in range(256))
        hits &= int.from_bytes(data[begin + lane : end : width].translate(table), "little")
    if hits == -1:
        return (end - begin) // width
    return hits.bit_count()


def read_safetensors_header(path: os.PathLike) -> Dict[str, dict]:
    """The tensor entries of a safetensors file's header: ``{name: {dtype, shape, data_offsets}}``.

    Reads the 8-byte little-endian header length and the JSON header only, and checks that
    every tensor's byte range lies within the file and matches its dtype and shape. Anything
    else (a pickle, a zip archive, a truncated file) is refused as "not a safetensors file".
    """
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= length <= min(SAFETENSORS_MAX_HEADER, size - 8):
            raise _not_safetensors(p, "no valid header length")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _not_safetensors(p, "its header is not JSON") from None
    if not isinstance(header, dict):
        raise _not_safetensors(p, "its header is not a JSON object")
    data_size = size - 8 - length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        problem = _tensor_entry_problem(entry, data_size)
        if problem:
            raise _not_safetensors(p, f"tensor {show(name)}: {problem}")
        tensors[name] = entry
    return tensors


def _tensor_entry_problem(entry: Any, data_size: int) -> Optional[str]:
    """Why a safetensors header entry is malformed, or ``None`` when it is sound."""
    if not isinstance(entry, dict):
        return "entry is not an object"
    itemsize = SAFETENSORS_ITEMSIZE.get(entry.get("dtype"))
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if itemsize is None:
        return f"unknown dtype {show(entry.get('dtype'))}"
    if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
        return "bad shape"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) for o in offsets)):
        return "bad data_offsets"
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        return "data lie outside the file"
    if end - begin != math.prod(shape) * itemsize:
        return "data size does not match dtype and shape"
    return None


def _not_safetensors(path: Path, why: str) -> CardsegError:
    return CardsegError(f"{path}: not a safetensors file ({why}); bundles hold safetensors weights only")


def kept_file_problem(path: os.PathLike, shapes: Dict[str, Tuple[int, ...]], dtype: str) -> Optional[str]:
    """Why the safetensors file ``path`` cannot stand for a network whose state has these tensor
    ``shapes`` (name -> shape) in ``dtype`` (``"F16"``/``"F32"``), or None: same names, shapes and dtype."""
    header = read_safetensors_header(path)
    if set(header) != set(shapes):
        return f"its tensors differ from the network's ({len(set(header) ^ set(shapes))} names)"
    for name, shape in shapes.items():
        if tuple(header[name]["shape"]) != tuple(shape) or header[name]["dtype"] != dtype:
            return (
                f"tensor {name} is {header[name]['dtype']} {header[name]['shape']}, the network's {dtype} {list(shape)}"
            )
    return None
