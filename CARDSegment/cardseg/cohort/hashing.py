"""Content hashes and resume keys: a case is recomputed only when what its result depends on
(the input's content, its frame and spacing, the method and the bundle) changed."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import List, Optional, Sequence

from cardseg.base.errors import CardsegError
from cardseg.base.files import sha256_file
from cardseg.cohort.cases import Case, case_stem
from cardseg.cohort.walk import require_file_or_folder


def _companions(path: Path) -> List[Path]:
    """The detached data file(s) of a header-only format (``.hdr``, ``.mhd``, ``.nhdr``)."""
    name = path.name.lower()
    found: List[Path] = []
    if name.endswith(".hdr"):
        found = [path.with_name(path.name[:-4] + s) for s in (".img", ".img.gz", ".IMG")]
    elif name.endswith(".mhd"):
        from cardseg.io.headers import metaimage_data_files

        found = metaimage_data_files(path) or []
    elif name.endswith(".nhdr"):
        try:
            with open(path, "rb") as f:
                head = f.read(65536).decode("latin-1")
        except OSError:
            head = ""
        m = re.search(r"(?im)^data ?file\s*:\s*(.+)$", head)
        if m:
            value = m.group(1).strip()
            if value.upper() not in ("LOCAL",) and not value.upper().startswith("LIST") and "%" not in value:
                found = [path.parent / value]
        if not found:  # a list or a pattern: every sibling with the same stem
            stem = case_stem(path)
            found = sorted(p for p in path.parent.iterdir() if p != path and p.name.startswith(stem + "."))
    return [p for p in found if p.is_file()]


def content_hash(path: os.PathLike) -> str:
    """sha256 over what the case's result depends on: the file and its detached data file, or
    every (non-hidden) file inside a DICOM folder and its sub-folders (a study of one series per
    slice location), each with its name (``sub-folder/name`` below the folder). Anything but a
    regular file or a folder (a FIFO, a device) is refused in one line without being opened."""
    p = Path(path)
    kind = require_file_or_folder(p)
    h = hashlib.sha256()
    if kind == "folder":
        files = sorted(e for e in p.iterdir() if e.is_file() and not e.name.startswith("."))
        subs = sorted(e for e in p.iterdir() if e.is_dir() and not e.name.startswith("."))
        files += [f for d in subs for f in sorted(d.iterdir()) if f.is_file() and not f.name.startswith(".")]
    else:
        files = [p] + _companions(p)
    try:
        for f in files:
            name = f.name if f.parent == p else f"{f.parent.name}/{f.name}"  # a study's series sub-folders
            h.update(name.encode("utf-8", "surrogateescape") + b"\0" + sha256_file(f).encode() + b"\n")
    except OSError as exc:
        raise CardsegError(f"{p}: cannot read it ({exc.strerror or exc})") from None
    return h.hexdigest()


def bundle_settings(config: dict, method: str) -> dict:
    """What, besides the input, a result depends on: the method and the bundle."""
    weights = {spec["file"]: spec["sha256"] for spec in config["networks"].values()}
    ident = config.get("id", {})
    return {
        "method": method,
        "bundle": {
            "id": f"{ident.get('name', '?')}-{ident.get('version', '?')}",
            "checksums": weights,
            "config_sha256": json_sha256(config),
        },
    }


def case_key(input_sha256: str, case: Case, spacing: Optional[Sequence[float]], settings: dict) -> str:
    return json_sha256(
        {
            "input": input_sha256,
            "frame": case.frame,
            "spacing": [float(s) for s in spacing] if spacing else None,
            "settings": settings,
        }
    )


def json_sha256(obj) -> str:
    """sha256 of ``obj`` as canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
