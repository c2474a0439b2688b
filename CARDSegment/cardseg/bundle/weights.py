"""A bundle's weight files: checksum first, then the safetensors header (nothing unpickled).

:func:`verify_weights` checks each role's file against the sha256 in ``bundle.json`` and reads
only the 8-byte header length and the JSON header; :func:`read_safetensors_header` checks that
every tensor's byte range lies inside the file and matches its dtype and shape.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from cardseg.base.errors import CardsegError, show
from cardseg.base.files import sha256_file
from cardseg.bundle.fields import is_int
from cardseg.bundle.schema import ROLES

#: safetensors: an 8-byte little-endian header length, then a JSON header of at most 100 MB
SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024
SAFETENSORS_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                        "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


@dataclass(frozen=True)
class WeightFile:
    """A verified weight file: its path, sha256 and safetensors header (tensor name → entry)."""

    path: Path
    sha256: str
    tensors: Dict[str, dict]

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        return {name: tuple(entry["shape"]) for name, entry in self.tensors.items()}


def verify_weights(root: os.PathLike, config: dict) -> Dict[str, WeightFile]:
    """Check each role's weight file (config already validated): checksum first, then the header.

    Returns ``{role: WeightFile}``. Nothing but the header's JSON is interpreted.
    """
    out = {}
    for role in ROLES:
        spec = config["networks"][role]
        path = Path(root) / spec["file"]
        digest = sha256_file(path)
        if digest != spec["sha256"]:
            raise CardsegError(f"{path}: checksum mismatch (file is truncated, altered or not this bundle's)")
        out[role] = WeightFile(path=path, sha256=digest, tensors=read_safetensors_header(path))
    return out


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
