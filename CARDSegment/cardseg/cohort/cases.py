"""The cases of a batch: from a manifest CSV or from INPUT files, folders and patterns, each with a
name that can be a folder name (``OUTDIR/<case>/``), and the subjects they pair into (ED and ES)."""

from __future__ import annotations

import csv
import io
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from cardseg.base.errors import CardsegError, one_line
from cardseg.cohort.layout import OWN_FILES
from cardseg.base.filekind import VOLUME_SUFFIXES as _VOLUMES, kind_of
from cardseg.cohort.walk import bounded_glob, inside, require_file_or_folder

#: the manifest's columns; only the first two are required
MANIFEST_COLUMNS = ("case", "path", "frame", "phase", "subject")
MANIFEST_REQUIRED = ("case", "path")
PHASES = ("ED", "ES")

#: what a case name may look like (it becomes a folder name)
CASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
#: image files a folder given as INPUT is searched for (besides DICOM series sub-folders)
VOLUME_SUFFIXES = _VOLUMES
_STRIP_SUFFIXES = VOLUME_SUFFIXES + (
    ".img.gz",
    ".img",
    ".dcm",
    ".dicom",
    ".ima",
    ".png",
    ".jpg",
    ".jpeg",
    ".bmp",
    ".tif",
    ".tiff",
)
_DICOM_SUFFIXES = (".dcm", ".dicom", ".ima")
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclass
class Case:
    """One input to segment: ``OUTDIR/<name>/`` gets its outputs."""

    name: str
    path: str  # absolute
    frame: Optional[int] = None
    phase: Optional[str] = None  # "ED", "ES" or None
    subject: Optional[str] = None
    line: Optional[int] = None  # manifest line, for messages


def read_manifest(
    manifest: os.PathLike, default_frame: Optional[int] = None, outdir: Optional[os.PathLike] = None
) -> List[Case]:
    """Cases from a CSV with the header ``case,path,frame,phase,subject`` (only ``case`` and
    ``path`` required, columns in any order). Relative paths are taken from the manifest's
    folder; an empty ``frame`` falls back to ``default_frame``. Refuses (one line) a missing or
    unknown column, an empty case or path, a bad frame or phase, a case name that cannot be a
    folder name, duplicate cases, and a subject with two ED or two ES cases. A path that does
    not exist is not refused here: that case fails alone in the table. A path inside ``outdir``
    (the batch's OUTDIR: its own outputs) is refused, and so is a manifest that is not a regular file.
    """
    mpath = Path(manifest)
    header, header_line, body = _manifest_header(list(csv.reader(io.StringIO(_manifest_text(mpath)))), mpath)
    col = {c: header.index(c) for c in header}
    base = Path(os.path.abspath(mpath)).parent  # the manifest's own folder, as the help says
    cases: List[Case] = []
    for lineno, row in enumerate(body, start=header_line + 1):
        if not any(c.strip() for c in row):
            continue
        if len(row) > len(header):
            raise CardsegError(f"{mpath}, line {lineno}: {len(row)} fields, the header has {len(header)}")
        get = {c: (row[i].strip() if i < len(row) else "") for c, i in col.items()}
        cases.append(_manifest_case(get, f"{mpath}, line {lineno}", lineno, base, default_frame, outdir))
    if not cases:
        raise CardsegError(f"{mpath}: the manifest lists no case")
    check_unique(cases, f"{mpath}: ")
    _check_subject_phases(cases, mpath)
    return cases


def _manifest_text(mpath: Path) -> str:
    """The manifest's text; one-line :class:`CardsegError` when it is missing, not a regular file or unreadable."""
    kind = kind_of(mpath)
    if kind == "missing":
        raise CardsegError(f"{mpath}: no such manifest")
    if kind != "file":
        raise CardsegError(f"{mpath}: the manifest is a {kind}, not a regular file")
    try:
        return mpath.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise CardsegError(f"{mpath}: no such manifest") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CardsegError(f"{mpath}: cannot read the manifest ({one_line(exc)})") from None


def _manifest_header(rows: List[List[str]], mpath: Path) -> Tuple[List[str], int, List[List[str]]]:
    """``(header, its line number, the rows after it)`` of the manifest's CSV rows (blank lines
    before the header skipped, and counted); refuses (one line) no header, a missing or unknown
    column and a column given twice."""
    header_line = 1
    while rows and not any(c.strip() for c in rows[0]):
        rows.pop(0)
        header_line += 1
    if not rows:
        raise CardsegError(f"{mpath}: empty manifest; its first line must be the header {','.join(MANIFEST_COLUMNS)}")
    header = [c.strip() for c in rows[0]]
    unknown = [c for c in header if c not in MANIFEST_COLUMNS]
    missing = [c for c in MANIFEST_REQUIRED if c not in header]
    also = f" (unknown column(s): {', '.join(repr(c) for c in unknown)})" if unknown else ""
    if missing:
        raise CardsegError(
            f"{mpath}, line {header_line}: the manifest has no {' and no '.join(missing)} column{also}; "
            f"its header must "
            f"hold case,path (and optionally frame,phase,subject)"
        )
    if unknown:
        raise CardsegError(
            f"{mpath}, line {header_line}: unknown manifest column(s) "
            f"{', '.join(repr(c) for c in unknown)}; the header "
            f"may hold {','.join(MANIFEST_COLUMNS)} (case and path required)"
        )
    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise CardsegError(
            f"{mpath}, line {header_line}: manifest column(s) {', '.join(dup)} appear more than once in the header"
        )
    return header, header_line, rows[1:]


def _manifest_case(
    get: Dict[str, str],
    where: str,
    lineno: int,
    base: Path,
    default_frame: Optional[int],
    outdir: Optional[os.PathLike],
) -> Case:
    """The case of one manifest line (``get``: its cells by column, stripped; ``where``: the file
    and line, for messages); refuses (one line) what :func:`read_manifest` says it refuses in a line."""
    if not get["case"]:
        raise CardsegError(f"{where}: empty case")
    if not get["path"]:
        raise CardsegError(f"{where}: case {get['case']}: empty path")
    check_case_name(get["case"], where)
    frame = _manifest_frame(get, where, default_frame)
    phase = _manifest_phase(get, where)
    if "\x00" in get["path"]:
        raise CardsegError(f"{where}: case {get['case']}: the path holds a NUL character")
    path = Path(os.path.expanduser(get["path"]))
    path = path if path.is_absolute() else base / path
    if inside(path, outdir):
        raise CardsegError(
            f"{where}: {path} is inside the batch's OUTDIR {outdir}; a batch never takes its "
            "inputs from its own outputs"
        )
    return Case(get["case"], os.path.abspath(path), frame, phase, get.get("subject") or None, lineno)


def _manifest_frame(get: Dict[str, str], where: str, default_frame: Optional[int]) -> Optional[int]:
    """A line's frame: its ``frame`` cell, a whole number >= 0, or ``default_frame`` when empty."""
    frame = default_frame
    if get.get("frame"):
        try:
            frame = int(get["frame"])
        except ValueError:
            frame = -1
        if frame < 0:
            raise CardsegError(f"{where}: frame {get['frame']!r} is not a whole number >= 0")
    return frame


def _manifest_phase(get: Dict[str, str], where: str) -> Optional[str]:
    """A line's phase: ``ED``, ``ES`` (any case) or ``None`` when empty; a phase needs a subject."""
    phase = get.get("phase") or None
    if phase is not None:
        if phase.upper() not in PHASES:
            raise CardsegError(f"{where}: phase {phase!r} must be ED or ES (or empty)")
        phase = phase.upper()
        if not get.get("subject"):
            raise CardsegError(
                f"{where}: phase {phase} without a subject; the cardiac indices pair a subject's "
                "ED and ES cases: fill the subject column or leave phase empty"
            )
    return phase


def check_case_name(name: str, where: str = "") -> None:
    prefix = f"{where}: " if where else ""
    if not CASE_NAME.match(name):
        raise CardsegError(
            f"{prefix}case name {name!r} cannot be a folder name (letters, digits, '.', '_', '-'; "
            "starting with a letter or digit)"
        )
    if name in OWN_FILES:
        raise CardsegError(f"{prefix}case name {name!r} is reserved (a file cardseg batch writes)")


def check_unique(cases: Sequence[Case], prefix: str = "") -> None:
    """One-line :class:`CardsegError` when two cases share a name (compared ignoring case: folder names)."""
    seen: Dict[str, Case] = {}
    for c in cases:
        key = c.name.lower()  # case-insensitive file systems would put both into one folder
        if key in seen:
            a, b = seen[key], c
            where = f" (lines {a.line} and {b.line})" if a.line and b.line else ""
            raise CardsegError(f"{prefix}case {c.name!r} is listed twice{where}; case names must be unique")
        seen[key] = c


def _check_subject_phases(cases: Sequence[Case], mpath: Path) -> None:
    held: Dict[Tuple[str, str], Case] = {}
    for c in cases:
        if c.subject and c.phase:
            other = held.get((c.subject, c.phase))
            if other is not None:
                raise CardsegError(
                    f"{mpath}: subject {c.subject!r} has two {c.phase} cases ({other.name} on line "
                    f"{other.line}, {c.name} on line {c.line})"
                )
            held[(c.subject, c.phase)] = c
    for (subject, phase), ed in held.items():
        es = held.get((subject, "ES"))
        if (
            phase == "ED"
            and es is not None
            and ed.frame == es.frame
            and os.path.realpath(ed.path) == os.path.realpath(es.path)
            and not (ed.frame is None and _is_cine(ed.path))  # both frames found from the cine's curve
        ):
            frame = "" if ed.frame is None else f", frame {ed.frame}"
            raise CardsegError(
                f"{mpath}: subject {subject!r}: ED ({ed.name}, line {ed.line}) and ES ({es.name}, line "
                f"{es.line}) are the same image ({ed.path}{frame}); the indices need two phases"
            )


def _is_cine(path: str) -> bool:
    """Whether ``path`` holds more than one frame by its headers (:mod:`cardseg.io.cine_info`)."""
    from cardseg.io.cine_info import read_cine_info

    return os.path.exists(path) and read_cine_info(path).frames > 1


def cases_from_inputs(
    inputs: Sequence[str], default_frame: Optional[int] = None, outdir: Optional[os.PathLike] = None
) -> List[Case]:
    """Cases from INPUT arguments: files, folders and glob patterns (``**`` allowed).

    A file is one case. A folder that holds DICOM files is one case (a DICOM series), and so is a
    study folder of one series per slice location in sub-folders (:func:`_is_study`); any other
    folder contributes its image files (:data:`VOLUME_SUFFIXES`) and its sub-folders that hold
    DICOM files, sorted by name (not recursively). A case is named after its file without the
    image suffix (``p001_ED.nii.gz`` -> ``p001_ED``) or its folder; names that clash get their
    parent folders' names put in front (``p001_sa``, ``p002_sa``). Refuses (one line) an INPUT
    that does not exist, a pattern that matches nothing, a folder with no image in it, and an
    INPUT or pattern match that is not a regular file or a folder (a FIFO, a device: decided
    without opening it). Patterns are walked with a bound (:func:`cardseg.cohort.walk.bounded_glob`).
    Nothing inside ``outdir`` (the batch's OUTDIR) is ever taken: an INPUT given there by name is
    refused, what a pattern or a folder finds there is left out.
    """
    paths: List[Path] = []
    for text in inputs:
        p = Path(os.path.expanduser(text))
        if os.path.lexists(p) and kind_of(p) != "missing":
            require_file_or_folder(p)
            if inside(p, outdir):
                raise CardsegError(
                    f"{text}: is inside the batch's OUTDIR {outdir}; a batch never takes its inputs "
                    "from its own outputs"
                )
            found = [p]
        elif _GLOB_CHARS.search(text):
            found = [Path(m) for m in bounded_glob(text)]
            found = [f for f in found if not inside(f, outdir)]
            if not found:
                raise CardsegError(
                    f"{text}: the pattern matches no file or folder" + (" outside OUTDIR" if outdir is not None else "")
                )
            for f in found:
                require_file_or_folder(f)
        else:
            require_file_or_folder(p)  # a dangling link or a loop says so; else 'no such file or folder'
        for f in found:
            if f.is_dir() and not _holds_dicom(f) and not _is_study(f):
                inner = [e for e in _folder_cases(f) if not inside(e, outdir)]
                if not inner and not _GLOB_CHARS.search(text):
                    raise CardsegError(
                        f"{f}: folder holds no image ({', '.join(VOLUME_SUFFIXES)}) and no DICOM "
                        "series folder" + (" outside OUTDIR" if outdir is not None and inside(outdir, f) else "")
                    )
                paths.extend(inner)
            else:
                paths.append(f)
    unique: List[Path] = []
    seen = set()
    for p in paths:
        real = os.path.realpath(p)
        if real not in seen:
            seen.add(real)
            unique.append(Path(os.path.abspath(p)))
    if not unique:
        raise CardsegError("no case to run: the INPUTs hold no image")
    names = _case_names(unique)
    return [Case(n, str(p), default_frame) for n, p in zip(names, unique)]


def _holds_dicom(folder: Path) -> bool:
    try:
        entries = [e for e in folder.iterdir() if e.is_file() and not e.name.startswith(".")]
    except OSError:
        return False
    return any(_looks_like_dicom(e) for e in entries)


def _is_study(folder: Path) -> bool:
    """Whether ``folder`` is a DICOM study of one series per slice location in sub-folders (one case, a
    cine: :func:`cardseg.io.dicom_study.is_study_folder`); ``False`` where this cardseg reads no studies."""
    try:
        from cardseg.io.dicom_study import is_study_folder
    except ImportError:
        return False
    return is_study_folder(folder)


def _looks_like_dicom(path: Path) -> bool:
    from cardseg.io.dicom import looks_like_dicom

    if any(path.name.lower().endswith(s) for s in _STRIP_SUFFIXES):
        return path.suffix.lower() in _DICOM_SUFFIXES
    return looks_like_dicom(path)


def _folder_cases(folder: Path) -> List[Path]:
    out = []
    for e in sorted(folder.iterdir(), key=lambda e: e.name):
        if e.name.startswith("."):
            continue
        if e.is_file() and e.name.lower().endswith(VOLUME_SUFFIXES):
            out.append(e)
        elif e.is_dir() and (_holds_dicom(e) or _is_study(e)):
            out.append(e)
    return out


def case_stem(p: Path) -> str:
    name = p.name
    for s in _STRIP_SUFFIXES:
        if name.lower().endswith(s) and len(name) > len(s):
            name = name[: -len(s)]
            break
    return name


def _sanitize(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    name = re.sub(r"^[^A-Za-z0-9]+", "", name)[:200]
    return name or "case"


def _case_names(paths: Sequence[Path]) -> List[str]:
    """File or folder stems, with parent folder names put in front of the ones that clash."""
    depth = [0] * len(paths)

    def name(i: int) -> str:
        parts = [case_stem(paths[i])]
        parent = paths[i].parent
        for _ in range(depth[i]):
            parts.insert(0, parent.name)
            parent = parent.parent
        cand = _sanitize("_".join(p for p in parts if p))
        return cand if cand not in OWN_FILES else f"case_{cand}"

    for _ in range(8):
        names = [name(i) for i in range(len(paths))]
        lower = [n.lower() for n in names]
        seen = Counter(lower)
        clash = [i for i, n in enumerate(lower) if seen[n] > 1]
        if not clash:
            return names
        for i in clash:
            depth[i] += 1
    dup = sorted({names[i] for i in clash})
    raise CardsegError(
        f"cannot give the inputs distinct case names ({', '.join(dup[:3])}); name them yourself with --manifest"
    )


def subject_pairs(cases: Sequence[Case]) -> Dict[str, Dict[str, Case]]:
    subjects: Dict[str, Dict[str, Case]] = {}
    for c in cases:
        if c.subject:
            subjects.setdefault(c.subject, {})
            if c.phase:
                subjects[c.subject][c.phase] = c
    return subjects
