"""``cardseg batch``: many cases through the engine's one path, a cohort table, resume, a triage report.

Every case goes through :func:`cardseg.segment.segment_file` (the same checks, pipeline and
atomic writing as ``cardseg segment``) into ``OUTDIR/<case>/``. This module only decides which
cases to run, runs them with a model loaded once per worker (here, or on Ray workers through
:mod:`cardseg.cluster`, imported only for ``--ray``), and writes what describes the cohort:

``OUTDIR/``
    ``<case>/``                  each case's ``cardseg segment`` outputs (its own stamp)
    ``cohort.csv``               one row per case (:data:`COHORT_COLUMNS`, class volumes, timings)
    ``cohort.parquet``           the same table, when pyarrow is importable
    ``subjects.csv``             cardiac indices with intervals, one row per subject with ED and ES
    ``triage.html``              the triage report (:mod:`cardseg.triage`)
    ``.cardseg-batch.json``      the stamp: this folder is a batch's output, and its settings
    ``.cardseg-batch-state.jsonl`` one line per finished case: its resume key
    ``.cardseg-batch.lock``      held while a batch runs: a second batch into OUTDIR is refused

**Resume.** A case's key is the sha256 of the input's content (the file, its detached data file
for ``.hdr``/``.mhd``/``.nhdr``, or every file of a DICOM folder), its frame and spacing, the
method and the bundle (weight checksums and ``bundle.json``). A case whose key is in the state
file and whose folder still holds cardseg's outputs is not recomputed; its row is rebuilt from
its ``report.json``. A case whose input changed is recomputed and its folder replaced (only if
it still holds nothing but cardseg's files). Failed cases are retried on every run.

**Ownership.** OUTDIR may be new, empty, or an earlier batch's output (stamp present, nothing in
it but what batches and ``segment`` write). Anything else is refused, and so is an earlier batch
made with another bundle or method unless ``--overwrite`` is given. Nothing that cardseg did not
write is ever deleted; case folders of cases no longer listed are left alone.
"""

from __future__ import annotations

import concurrent.futures
import csv
import glob
import hashlib
import io
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from cardseg.base.errors import CardsegError

#: the manifest's columns; only the first two are required
MANIFEST_COLUMNS = ("case", "path", "frame", "phase", "subject")
MANIFEST_REQUIRED = ("case", "path")
PHASES = ("ED", "ES")

BATCH_STAMP = ".cardseg-batch.json"
STATE_FILE = ".cardseg-batch-state.jsonl"
LOCK_FILE = ".cardseg-batch.lock"
COHORT_CSV = "cohort.csv"
COHORT_PARQUET = "cohort.parquet"
SUBJECTS_CSV = "subjects.csv"
TRIAGE_HTML = "triage.html"
#: every file a batch writes at OUTDIR's top level (each may also exist as ``.<name>.tmp`` while written)
OWN_FILES = (BATCH_STAMP, STATE_FILE, LOCK_FILE, COHORT_CSV, COHORT_PARQUET, SUBJECTS_CSV, TRIAGE_HTML)

#: the cohort table's fixed columns; then ``volume_<class>_ml`` per foreground class, then
#: ``time_<stage>_s`` per timing in the reports (``total`` first)
COHORT_COLUMNS = ("case", "subject", "phase", "frame", "input", "input_sha256", "status", "error", "reused",
                  "output", "method", "slices", "agreement", "out_of_domain", "flagged_regions",
                  "flagged_volume_ml")

#: what a case name may look like (it becomes a folder name)
CASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
#: files ``segment`` leaves beside a case folder while it writes or after a kill (its own names)
SEGMENT_LEFTOVER = re.compile(r"^\..+\.cardseg(-tmp|-old|\.lock)$")
#: image files a folder given as INPUT is searched for (besides DICOM series sub-folders)
VOLUME_SUFFIXES = (".nii.gz", ".nii", ".nrrd", ".nhdr", ".mha", ".mhd", ".hdr")
_STRIP_SUFFIXES = VOLUME_SUFFIXES + (".img.gz", ".img", ".dcm", ".dicom", ".ima", ".png", ".jpg", ".jpeg", ".bmp",
                                     ".tif", ".tiff")
_DICOM_SUFFIXES = (".dcm", ".dicom", ".ima")
_GLOB_CHARS = re.compile(r"[*?\[]")


# --------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One input to segment: ``OUTDIR/<name>/`` gets its outputs."""

    name: str
    path: str  # absolute
    frame: Optional[int] = None
    phase: Optional[str] = None  # "ED", "ES" or None
    subject: Optional[str] = None
    line: Optional[int] = None  # manifest line, for messages


def read_manifest(manifest: os.PathLike, default_frame: Optional[int] = None) -> List[Case]:
    """Cases from a CSV with the header ``case,path,frame,phase,subject`` (only ``case`` and
    ``path`` required, columns in any order). Relative paths are taken from the manifest's
    folder; an empty ``frame`` falls back to ``default_frame``. Refuses (one line) a missing or
    unknown column, an empty case or path, a bad frame or phase, a case name that cannot be a
    folder name, duplicate cases, and a subject with two ED or two ES cases. A path that does
    not exist is not refused here: that case fails alone in the table.
    """
    mpath = Path(manifest)
    try:
        text = mpath.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise CardsegError(f"{mpath}: no such manifest") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CardsegError(f"{mpath}: cannot read the manifest ({_one_line(exc)})") from None
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(c.strip() for c in rows[0]):
        rows.pop(0)
    if not rows:
        raise CardsegError(f"{mpath}: empty manifest; its first line must be the header "
                           f"{','.join(MANIFEST_COLUMNS)}")
    header = [c.strip() for c in rows[0]]
    unknown = [c for c in header if c not in MANIFEST_COLUMNS]
    missing = [c for c in MANIFEST_REQUIRED if c not in header]
    also = f" (unknown column(s): {', '.join(repr(c) for c in unknown)})" if unknown else ""
    if missing:
        raise CardsegError(f"{mpath}: the manifest has no {' and no '.join(missing)} column{also}; its header must "
                           f"hold case,path (and optionally frame,phase,subject)")
    if unknown:
        raise CardsegError(f"{mpath}: unknown manifest column(s) {', '.join(repr(c) for c in unknown)}; the header "
                           f"may hold {','.join(MANIFEST_COLUMNS)} (case and path required)")
    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise CardsegError(f"{mpath}: manifest column(s) {', '.join(dup)} appear more than once in the header")
    col = {c: header.index(c) for c in header}
    base = mpath.resolve().parent
    cases: List[Case] = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) > len(header):
            raise CardsegError(f"{mpath}, line {lineno}: {len(row)} fields, the header has {len(header)}")
        get = {c: (row[i].strip() if i < len(row) else "") for c, i in col.items()}
        where = f"{mpath}, line {lineno}"
        if not get["case"]:
            raise CardsegError(f"{where}: empty case")
        if not get["path"]:
            raise CardsegError(f"{where}: case {get['case']}: empty path")
        check_case_name(get["case"], where)
        frame = default_frame
        if get.get("frame"):
            try:
                frame = int(get["frame"])
            except ValueError:
                frame = -1
            if frame < 0:
                raise CardsegError(f"{where}: frame {get['frame']!r} is not a whole number >= 0")
        phase = get.get("phase") or None
        if phase is not None:
            if phase.upper() not in PHASES:
                raise CardsegError(f"{where}: phase {phase!r} must be ED or ES (or empty)")
            phase = phase.upper()
        path = Path(os.path.expanduser(get["path"]))
        path = path if path.is_absolute() else base / path
        cases.append(Case(get["case"], os.path.abspath(path), frame, phase, get.get("subject") or None, lineno))
    if not cases:
        raise CardsegError(f"{mpath}: the manifest lists no case")
    _check_unique(cases, f"{mpath}: ")
    _check_subject_phases(cases, mpath)
    return cases


def check_case_name(name: str, where: str = "") -> None:
    prefix = f"{where}: " if where else ""
    if not CASE_NAME.match(name):
        raise CardsegError(f"{prefix}case name {name!r} cannot be a folder name (letters, digits, '.', '_', '-'; "
                           "starting with a letter or digit)")
    if name in OWN_FILES:
        raise CardsegError(f"{prefix}case name {name!r} is reserved (a file cardseg batch writes)")


def _check_unique(cases: Sequence[Case], prefix: str = "") -> None:
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
                raise CardsegError(f"{mpath}: subject {c.subject!r} has two {c.phase} cases ({other.name} on line "
                                   f"{other.line}, {c.name} on line {c.line})")
            held[(c.subject, c.phase)] = c


def cases_from_inputs(inputs: Sequence[str], default_frame: Optional[int] = None) -> List[Case]:
    """Cases from INPUT arguments: files, folders and glob patterns (``**`` allowed).

    A file is one case. A folder that holds DICOM files is one case (a DICOM series); any other
    folder contributes its image files (:data:`VOLUME_SUFFIXES`) and its sub-folders that hold
    DICOM files, sorted by name (not recursively). A case is named after its file without the
    image suffix (``p001_ED.nii.gz`` -> ``p001_ED``) or its folder; names that clash get their
    parent folders' names put in front (``p001_sa``, ``p002_sa``). Refuses (one line) an INPUT
    that does not exist, a pattern that matches nothing, a folder with no image in it.
    """
    paths: List[Path] = []
    for text in inputs:
        p = Path(os.path.expanduser(text))
        if p.exists():
            found = [p]
        elif _GLOB_CHARS.search(text):
            found = [Path(m) for m in sorted(glob.glob(os.path.expanduser(text), recursive=True))]
            if not found:
                raise CardsegError(f"{text}: the pattern matches no file or folder")
        else:
            raise CardsegError(f"{text}: no such file or folder")
        for f in found:
            if f.is_dir() and not _holds_dicom(f):
                inner = _folder_cases(f)
                if not inner and not _GLOB_CHARS.search(text):
                    raise CardsegError(f"{f}: folder holds no image ({', '.join(VOLUME_SUFFIXES)}) and no DICOM "
                                       "series folder")
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
        elif e.is_dir() and _holds_dicom(e):
            out.append(e)
    return out


def _stem(p: Path) -> str:
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
        parts = [_stem(paths[i])]
        parent = paths[i].parent
        for _ in range(depth[i]):
            parts.insert(0, parent.name)
            parent = parent.parent
        cand = _sanitize("_".join(p for p in parts if p))
        return cand if cand not in OWN_FILES else f"case_{cand}"

    for _ in range(8):
        names = [name(i) for i in range(len(paths))]
        lower = [n.lower() for n in names]
        clash = [i for i, n in enumerate(lower) if lower.count(n) > 1]
        if not clash:
            return names
        for i in clash:
            depth[i] += 1
    dup = sorted({names[i] for i in clash})
    raise CardsegError(f"cannot give the inputs distinct case names ({', '.join(dup[:3])}); "
                       "name them yourself with --manifest")


def _check_subject_pairs(cases: Sequence[Case]) -> Dict[str, Dict[str, Case]]:
    subjects: Dict[str, Dict[str, Case]] = {}
    for c in cases:
        if c.subject:
            subjects.setdefault(c.subject, {})
            if c.phase:
                subjects[c.subject][c.phase] = c
    return subjects


# --------------------------------------------------------------------------------------------
# content hashes and resume keys
# --------------------------------------------------------------------------------------------
def _file_sha256(path: Path) -> str:
    from cardseg.base.files import sha256_file

    return sha256_file(path)


def _companions(path: Path) -> List[Path]:
    """The detached data file(s) of a header-only format (``.hdr``, ``.mhd``, ``.nhdr``)."""
    name = path.name.lower()
    found: List[Path] = []
    if name.endswith(".hdr"):
        found = [path.with_name(path.name[:-4] + s) for s in (".img", ".img.gz", ".IMG")]
    elif name.endswith((".mhd", ".nhdr")):
        try:
            head = path.read_bytes()[:65536].decode("latin-1")
        except OSError:
            head = ""
        key = r"ElementDataFile\s*=\s*(.+)" if name.endswith(".mhd") else r"data ?file\s*:\s*(.+)"
        m = re.search(r"(?im)^" + key + r"$", head)
        if m:
            value = m.group(1).strip()
            if value.upper() not in ("LOCAL",) and not value.upper().startswith("LIST") and "%" not in value:
                found = [path.parent / value]
        if not found:  # a list or a pattern: every sibling with the same stem
            stem = _stem(path)
            found = sorted(p for p in path.parent.iterdir() if p != path and p.name.startswith(stem + "."))
    return [p for p in found if p.is_file()]


def content_hash(path: os.PathLike) -> str:
    """sha256 over what the case's result depends on: the file and its detached data file, or
    every (non-hidden) file directly inside a DICOM folder, each with its name."""
    p = Path(path)
    if not p.exists():
        raise CardsegError(f"{p}: no such file or folder")
    h = hashlib.sha256()
    if p.is_dir():
        files = sorted(e for e in p.iterdir() if e.is_file() and not e.name.startswith("."))
    else:
        files = [p] + _companions(p)
    try:
        for f in files:
            h.update(f.name.encode("utf-8", "surrogateescape") + b"\0" + _file_sha256(f).encode() + b"\n")
    except OSError as exc:
        raise CardsegError(f"{p}: cannot read it ({exc.strerror or exc})") from None
    return h.hexdigest()


def bundle_settings(config: dict, method: str) -> dict:
    """What, besides the input, a result depends on: the method and the bundle."""
    weights = {spec["file"]: spec["sha256"] for spec in config["networks"].values()}
    ident = config.get("id", {})
    return {"method": method, "bundle": {"id": f"{ident.get('name', '?')}-{ident.get('version', '?')}",
                                         "checksums": weights,
                                         "config_sha256": _json_sha256(config)}}


def case_key(input_sha256: str, case: Case, spacing: Optional[Sequence[float]], settings: dict) -> str:
    return _json_sha256({"input": input_sha256, "frame": case.frame,
                         "spacing": [float(s) for s in spacing] if spacing else None, "settings": settings})


def _json_sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# OUTDIR
# --------------------------------------------------------------------------------------------
def read_batch_stamp(outdir: Path) -> Optional[dict]:
    try:
        stamp = json.loads((outdir / BATCH_STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("tool") != "cardseg-batch":
        return None
    return stamp


def check_batch_outdir(output: os.PathLike, settings: dict, overwrite: bool) -> Tuple[Path, Optional[dict]]:
    """Validate OUTDIR before any work; writes nothing. Returns ``(absolute path, earlier stamp)``."""
    from cardseg.io.outdir import STAMP, check_writable, nearest_existing, read_stamp

    out = Path(os.path.realpath(os.path.abspath(os.fspath(output))))
    if out.exists() and not out.is_dir():
        raise CardsegError(f"{out}: exists and is not a folder")
    base = nearest_existing(out)
    if not base.is_dir():
        raise CardsegError(f"{out}: cannot create it, {base} is a file")
    check_writable(base if not out.exists() else out, out)
    if not out.exists():
        return out, None
    present = sorted(e.name for e in out.iterdir())
    if not present:
        return out, None
    stamp = read_batch_stamp(out)
    if stamp is None:
        what = "an output folder of cardseg segment" if read_stamp(out) is not None else "not written by cardseg batch"
        raise CardsegError(f"{out}: folder is not empty and {what}; it is never used as a batch's OUTDIR, "
                           "choose a new or empty folder")
    own = set(OWN_FILES) | {f".{n}.tmp" for n in OWN_FILES}
    foreign = [n for n in present if n not in own and not SEGMENT_LEFTOVER.match(n)
               and not ((out / n).is_dir() and (out / n / STAMP).is_file())]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise CardsegError(f"{out}: holds files cardseg did not write ({', '.join(foreign[:3])}{more}); "
                           "move them or choose another folder")
    if stamp.get("settings") != settings and not overwrite:
        old = stamp.get("settings") or {}
        raise CardsegError(f"{out}: holds a batch made with method {old.get('method')} and bundle "
                           f"{(old.get('bundle') or {}).get('id')} (other settings than now); use --overwrite to "
                           "recompute its cases, or choose another folder")
    return out, stamp


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_stamp(out: Path, settings: dict, created: Optional[str]) -> None:
    from cardseg import __version__

    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    stamp = {"tool": "cardseg-batch", "version": __version__, "created": created or now, "updated": now,
             "settings": settings, "files": list(OWN_FILES)}
    _write_atomic(out / BATCH_STAMP, (json.dumps(stamp, indent=1) + "\n").encode())


def read_state(out: Path) -> Dict[str, dict]:
    """``{case: record}`` from the state file, the last line per case winning; a line cut short
    by a kill is ignored."""
    state: Dict[str, dict] = {}
    try:
        lines = (out / STATE_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return state
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("case"), str):
            state[rec["case"]] = rec
    return state


def _append_state(out: Path, record: dict) -> None:
    with open(out / STATE_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _finished_report(folder: Path) -> Optional[dict]:
    """The report of a case folder that still holds a complete cardseg output, else ``None``."""
    from cardseg.io.outdir import read_stamp

    stamp = read_stamp(folder)
    if stamp is None or "report.json" not in stamp["files"]:
        return None
    if any(not (folder / n).is_file() for n in stamp["files"]):
        return None
    try:
        report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


# --------------------------------------------------------------------------------------------
# the worker: the bundle loaded once, then one case after another through segment_file
# --------------------------------------------------------------------------------------------
@dataclass
class Job:
    """What a worker needs for one case (plain data: it travels to Ray workers)."""

    case: str
    path: str
    out: str
    frame: Optional[int] = None
    spacing: Optional[Tuple[float, ...]] = None
    overwrite: bool = False


class CaseWorker:
    """Runs cases one after another; the bundle is loaded at the first case and kept."""

    def __init__(self, bundle_root: os.PathLike, method: str = "card", device: str = "auto", batch_size: int = 8,
                 threads: Optional[int] = None, backend: str = "torch"):
        self.bundle_root = Path(bundle_root)
        self.method, self.device_name, self.batch_size, self.threads = method, device, batch_size, threads
        self.backend = backend  # torch, onnx or auto (cardseg.bundle.load_bundle)
        self.bundle = None
        self.device = None
        self.loads = 0  # how often the bundle was loaded (once)

    def load(self, progress=None) -> None:
        """Load the bundle onto the device (once); one-line :class:`CardsegError` if it cannot.
        ``progress`` (a :class:`cardseg.progress.Progress`) shows a first run's ONNX export."""
        if self.bundle is not None:
            return
        import torch

        from cardseg.bundle.loading import load_bundle
        from cardseg.segment import resolve_device

        if self.threads:
            torch.set_num_threads(int(self.threads))
        self.device = resolve_device(self.device_name)
        self.bundle = load_bundle(self.bundle_root, device=self.device, backend=self.backend,
                                  progress=progress)
        self.loads += 1

    def run(self, job: Job) -> dict:
        """``{"case", "status": "ok"|"error", "error", "report", "seconds"}``; never raises for a
        bad case (KeyboardInterrupt and SystemExit pass)."""
        t0 = time.perf_counter()
        try:
            self.load()
            from cardseg.base.progress import Progress
            from cardseg.segment import segment_file

            report = segment_file(job.path, job.out, self.bundle, method=self.method, device=self.device,
                                  batch_size=self.batch_size, frame=job.frame, spacing=job.spacing,
                                  overwrite=job.overwrite, progress=Progress())
            return {"case": job.case, "status": "ok", "error": "", "report": report,
                    "seconds": time.perf_counter() - t0}
        except CardsegError as exc:
            msg = _one_line(exc)
        except MemoryError:
            msg = "out of memory"
        except Exception as exc:  # one bad case never stops the batch
            msg = f"{type(exc).__name__}: {_one_line(exc)}"
        return {"case": job.case, "status": "error", "error": msg, "report": None,
                "seconds": time.perf_counter() - t0}


def _one_line(exc: BaseException, limit: int = 500) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------------
def cohort_row(case: Case, status: str, error: str = "", report: Optional[dict] = None, reused: bool = False,
               input_sha256: str = "") -> dict:
    """One row of the cohort table; ``report`` is the case's ``report.json`` (``None`` if it failed)."""
    row = {"case": case.name, "subject": case.subject or "", "phase": case.phase or "",
           "frame": "" if case.frame is None else case.frame, "input": case.path, "input_sha256": input_sha256,
           "status": status, "error": error, "reused": reused, "output": f"{case.name}/" if report else "",
           "method": "", "slices": "", "agreement": None, "out_of_domain": None, "flagged_regions": None,
           "flagged_volume_ml": None}
    if report:
        regions = report.get("regions") or []
        measured = report.get("method") == "card"
        row.update({"method": report.get("method", ""), "slices": report.get("slices", ""),
                    "agreement": report.get("agreement"), "out_of_domain": report.get("out_of_domain"),
                    "flagged_regions": len(regions) if measured else None,
                    "flagged_volume_ml": (sum(float(r.get("volume_mm3", 0.0)) for r in regions) / 1000.0
                                          if measured else None)})
        for name, ml in (report.get("class_volumes_ml") or {}).items():
            row[f"volume_{name}_ml"] = ml
        for stage, sec in (report.get("timings_s") or {}).items():
            row[f"time_{stage}_s"] = sec
    return row


def table_columns(rows: Sequence[dict], class_names: Sequence[str] = ()) -> List[str]:
    cols = list(COHORT_COLUMNS)
    vols = [f"volume_{n}_ml" for n in class_names]
    times: List[str] = ["time_total_s"]
    for r in rows:
        for k in r:
            if k.startswith("volume_") and k not in vols:
                vols.append(k)
            elif k.startswith("time_") and k not in times:
                times.append(k)
    return cols + vols + times


def _csv_value(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def write_table(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([_csv_value(r.get(c)) for c in columns])
    _write_atomic(path, buf.getvalue().encode("utf-8"))


def write_parquet(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> bool:
    """The table as Parquet when pyarrow is importable (typed columns); False otherwise."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return False
    types = {"frame": pa.int64(), "reused": pa.bool_(), "slices": pa.int64(), "agreement": pa.float64(),
             "out_of_domain": pa.bool_(), "flagged_regions": pa.int64(), "flagged_volume_ml": pa.float64()}
    arrays, fields = [], []
    for c in columns:
        t = types.get(c) or (pa.float64() if c.startswith(("volume_", "time_")) else pa.string())
        vals = [r.get(c) for r in rows]
        vals = [None if v == "" and t != pa.string() else v for v in vals]
        if t == pa.string():
            vals = [None if v is None else str(v) for v in vals]
        arrays.append(pa.array(vals, type=t))
        fields.append(pa.field(c, t))
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_arrays(arrays, schema=pa.schema(fields)), str(tmp))
    os.replace(tmp, path)
    return True


def read_table(path: os.PathLike) -> List[dict]:
    """``cohort.csv`` (or ``subjects.csv``) as a list of ``{column: text}``."""
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------------------------
# subjects: cardiac indices with intervals
# --------------------------------------------------------------------------------------------
def _indices_function() -> Optional[Callable]:
    """``cardseg.indices.indices_from_folders`` when that module is there, else ``None``."""
    try:
        from cardseg.cohort.indices import indices_from_folders
    except ImportError:
        return None
    return indices_from_folders


def subject_rows(out: Path, cases: Sequence[Case], status: Dict[str, str], config: dict,
                 compute: Callable) -> Tuple[List[dict], List[str]]:
    """One row per subject: ``subject, ed_case, es_case, nominal, <index>, <index>_low,
    <index>_high, ..., error``; the columns follow the order the indices come in."""
    rows, names = [], []
    for subject, phases in _check_subject_pairs(cases).items():
        row = {"subject": subject, "ed_case": phases["ED"].name if "ED" in phases else "",
               "es_case": phases["ES"].name if "ES" in phases else "", "nominal": None, "error": ""}
        missing = [p for p in PHASES if p not in phases]
        failed = [phases[p].name for p in PHASES if p in phases and status.get(phases[p].name) != "ok"]
        if missing:
            row["error"] = f"no {' and no '.join(missing)} case"
        elif failed:
            row["error"] = f"case {', '.join(failed)} failed"
        else:
            try:
                res = compute(out / phases["ED"].name, out / phases["ES"].name, config)
            except CardsegError as exc:
                row["error"] = _one_line(exc)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {_one_line(exc)}"
            else:
                row["nominal"] = res.get("nominal")
                for name, iv in res.items():
                    if name == "nominal" or not isinstance(iv, dict):
                        continue
                    if name not in names:
                        names.append(name)
                    row[name], row[f"{name}_low"], row[f"{name}_high"] = iv.get("value"), iv.get("low"), iv.get("high")
        rows.append(row)
    return rows, names


def subject_columns(names: Sequence[str]) -> List[str]:
    cols = ["subject", "ed_case", "es_case", "nominal"]
    for n in names:
        cols += [n, f"{n}_low", f"{n}_high"]
    return cols + ["error"]


# --------------------------------------------------------------------------------------------
# progress over cases
# --------------------------------------------------------------------------------------------
class CaseProgress:
    """A tqdm bar over cases with ETA and cases/min (``bar``), JSON lines (``json``) or nothing."""

    def __init__(self, kind: str = "bar", quiet: bool = False):
        self.kind = "none" if (quiet and kind != "json") else kind
        self.bar = None
        self.json = None
        self.t0 = time.perf_counter()
        self.failed = 0
        if self.kind == "json":
            from cardseg.base.progress import JsonProgress

            self.json = JsonProgress()

    def start(self, total: int, stage: str = "cases", leave: bool = True) -> None:
        self.close()
        self.t0 = time.perf_counter()
        self.failed = 0
        if self.kind == "bar":
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=stage, unit="case", file=sys.stderr, dynamic_ncols=True, leave=leave,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                       "[{elapsed}<{remaining}{postfix}]")
        elif self.json is not None:
            self.json.stage(stage, total)

    def advance(self, ok: bool = True) -> None:
        self.failed += 0 if ok else 1
        if self.bar is not None:
            self.bar.update(1)
            minutes = (time.perf_counter() - self.t0) / 60.0
            rate = self.bar.n / minutes if minutes > 0 else 0.0
            self.bar.set_postfix_str(f"{rate:.1f} cases/min" + (f", {self.failed} failed" if self.failed else ""),
                                     refresh=True)
        elif self.json is not None:
            self.json.advance(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# --------------------------------------------------------------------------------------------
# the batch
# --------------------------------------------------------------------------------------------
@dataclass
class BatchOptions:
    inputs: Sequence[str] = ()
    manifest: Optional[str] = None
    output: str = ""
    bundle: Optional[str] = None
    method: str = "card"
    device: str = "auto"
    batch_size: int = 8
    frame: Optional[int] = None
    spacing: Optional[str] = None
    overwrite: bool = False
    quiet: bool = False
    progress: str = "bar"
    threads: Optional[int] = None
    #: what runs the networks of the local worker: torch, onnx or auto (cardseg.bundle.load_bundle);
    #: Ray's workers always run torch
    backend: str = "torch"
    #: local worker processes, one model each (cardseg.local_pool); 1: the cases run in this process
    workers: int = 1
    ray: Optional[str] = None
    ray_workers: Optional[int] = None
    ray_cpus_per_worker: float = 1.0
    report: bool = True
    report_thumbnails: int = 200
    hash_threads: int = 4


@dataclass
class BatchResult:
    outdir: Path
    rows: List[dict] = field(default_factory=list)
    subjects: List[dict] = field(default_factory=list)
    files: List[str] = field(default_factory=list)
    computed: int = 0
    reused: int = 0
    failed: int = 0
    seconds: float = 0.0
    worker_loads: int = 0


def _check_options(o: BatchOptions) -> None:
    from cardseg.base.options import check_run_options

    check_run_options(o.batch_size, o.threads, o.frame)
    if o.method not in ("card", "uc"):
        raise CardsegError(f"unknown method {o.method!r} (card or uc)")
    if o.manifest and o.inputs:
        raise CardsegError("give INPUTs or --manifest, not both")
    if not o.manifest and not o.inputs:
        raise CardsegError("nothing to run: give INPUT files, folders or patterns, or --manifest CSV")
    if o.ray_workers is not None and o.ray_workers < 1:
        raise CardsegError(f"--ray-workers must be at least 1, got {o.ray_workers}")
    if o.workers < 1:
        raise CardsegError(f"--workers must be at least 1, got {o.workers}")
    if o.workers > 1 and o.ray:
        raise CardsegError("--workers is for this machine; with --ray use --ray-workers")
    if o.ray_cpus_per_worker <= 0:
        raise CardsegError(f"--ray-cpus-per-worker must be above 0, got {o.ray_cpus_per_worker}")
    if o.report_thumbnails < 0:
        raise CardsegError(f"--report-thumbnails must be 0 or more, got {o.report_thumbnails}")


@dataclass
class _Plan:
    """What a batch will do, decided before OUTDIR is touched."""

    options: BatchOptions
    out: Path
    earlier: Optional[dict]
    settings: dict
    config: dict
    bundle_root: Path
    cases: List[Case]
    hashes: Dict[str, object]
    keys: Dict[str, str]
    rows: Dict[str, dict]
    jobs: List[Job]

    @property
    def class_names(self) -> List[str]:
        return [c["name"] for c in self.config["classes"]][1:]


def run_batch(o: BatchOptions) -> BatchResult:
    """Run a batch: every check first, then the cases, then the tables and the report.

    Order: options, the cases (manifest or INPUTs), the bundle (schema, checksums), OUTDIR, the
    inputs' content hashes (read only), then the Ray cluster (``--ray``) or the networks (local);
    a refusal up to here is a one-line :class:`CardsegError` and nothing is written. Only then is
    OUTDIR created or taken (its lock), stamped, and filled.
    """
    from cardseg.bundle.folder import check_bundle_folder
    from cardseg.io.inputs import parse_spacing

    t_start = time.perf_counter()
    _check_options(o)
    spacing = parse_spacing(o.spacing) if o.spacing else None
    cases = read_manifest(o.manifest, o.frame) if o.manifest else cases_from_inputs(o.inputs, o.frame)
    bundle_root, config = check_bundle_folder(o.bundle)
    settings = bundle_settings(config, o.method)
    out, earlier = check_batch_outdir(o.output, settings, o.overwrite)
    progress = CaseProgress(o.progress, o.quiet)
    plan = _plan(o, out, earlier, settings, config, bundle_root, cases, spacing, progress)

    worker = cluster = None
    ray_started = False
    if plan.jobs and o.ray:  # a cluster that cannot be reached is a refusal, before OUTDIR is touched
        from cardseg.cohort import cluster

        ray_started = cluster.connect(o.ray)
    elif plan.jobs:  # the networks load here, once: a bundle that does not load is a refusal
        worker = CaseWorker(bundle_root, o.method, o.device, o.batch_size, o.threads, o.backend)
        from cardseg.base.progress import make_progress

        load_progress = make_progress(o.progress, o.quiet)
        try:
            worker.load(load_progress)
        finally:
            load_progress.close()
        if not o.quiet:
            for note in worker.bundle.notes:
                print(f"cardseg: note: {note}", file=sys.stderr)
    try:
        result = _execute(plan, progress, worker, cluster)
    finally:
        if cluster is not None:
            cluster.disconnect(ray_started)
    result.seconds = time.perf_counter() - t_start
    return result


def _plan(o: BatchOptions, out: Path, earlier: Optional[dict], settings: dict, config: dict, bundle_root: Path,
          cases: List[Case], spacing, progress: CaseProgress) -> _Plan:
    """Which cases are finished (same key in the state file, outputs still there) and which to run."""
    state = {} if (o.overwrite or earlier is None) else read_state(out)
    hashes = _hash_inputs(cases, progress, o.hash_threads)
    plan = _Plan(o, out, earlier, settings, config, Path(bundle_root), list(cases), hashes, {}, {}, [])
    for c in cases:
        h = hashes[c.name]
        if isinstance(h, CardsegError):
            plan.rows[c.name] = cohort_row(c, "error", _one_line(h))
            continue
        key = plan.keys[c.name] = case_key(h, c, spacing, settings)
        folder = out / c.name
        rec = state.get(c.name)
        report = _finished_report(folder) if rec and rec.get("key") == key else None
        if report is not None:
            plan.rows[c.name] = cohort_row(c, "ok", report=report, reused=True, input_sha256=h)
            continue
        plan.jobs.append(Job(c.name, c.path, str(folder), c.frame, tuple(spacing) if spacing else None,
                             overwrite=folder.exists()))
        plan.rows[c.name] = cohort_row(c, "pending", input_sha256=h)
    return plan


def _execute(plan: _Plan, progress: CaseProgress, worker: Optional[CaseWorker], cluster) -> BatchResult:
    from cardseg.io.outdir import FileLock

    o, out = plan.options, plan.out
    by_name = {c.name: c for c in plan.cases}
    created = not out.exists()
    os.makedirs(out, exist_ok=True)
    lock = FileLock(out / LOCK_FILE)
    if not lock.acquire():
        if created:
            _rmdir_quiet(out)
        raise CardsegError(f"{out}: another cardseg batch is running into this folder now")
    result = BatchResult(outdir=out)
    rows = plan.rows
    try:
        _write_stamp(out, plan.settings, (plan.earlier or {}).get("created"))

        def on_result(res: dict) -> None:
            c = by_name[res["case"]]
            h = plan.hashes[c.name]
            if res["status"] == "ok":
                _append_state(out, {"case": c.name, "key": plan.keys[c.name], "input_sha256": h,
                                    "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
                rows[c.name] = cohort_row(c, "ok", report=res["report"], input_sha256=h)
                result.computed += 1
            else:
                rows[c.name] = cohort_row(c, "error", res["error"], input_sha256=h)
            progress.advance(res["status"] == "ok")

        try:
            if plan.jobs:
                progress.start(len(plan.jobs))
                if cluster is not None:
                    result.worker_loads = cluster.run_jobs(
                        plan.jobs, on_result, bundle_root=plan.bundle_root, config=plan.config, outdir=out,
                        method=o.method, device=o.device, batch_size=o.batch_size, threads=o.threads,
                        workers=o.ray_workers, cpus_per_worker=o.ray_cpus_per_worker)
                elif o.workers > 1 and len(plan.jobs) > 1:
                    from cardseg.cohort import local_pool

                    result.worker_loads = local_pool.run_jobs(
                        plan.jobs, on_result, bundle_root=plan.bundle_root, method=o.method, device=o.device,
                        batch_size=o.batch_size, threads=o.threads, backend=worker.bundle.backend,
                        workers=o.workers)  # the backend the check load settled on: no second fallback
                else:
                    for j in plan.jobs:
                        on_result(worker.run(j))
                    result.worker_loads = worker.loads
        finally:  # the table also after Ctrl-C: unfinished cases are 'pending'
            progress.close()
            result.rows = [rows[c.name] for c in plan.cases]
            columns = table_columns(result.rows, plan.class_names)
            write_table(out / COHORT_CSV, result.rows, columns)
            result.files.append(COHORT_CSV)
            if write_parquet(out / COHORT_PARQUET, result.rows, columns):
                result.files.append(COHORT_PARQUET)
        _write_subjects(out, plan.cases, rows, plan.config, result)
        if o.report:
            from cardseg.cohort.triage import write_report

            write_report(out, config=plan.config, max_thumbnails=o.report_thumbnails)
            result.files.append(TRIAGE_HTML)
    finally:
        lock.release()
    result.reused = sum(1 for r in result.rows if r["reused"])
    result.failed = sum(1 for r in result.rows if r["status"] != "ok")
    return result


def _rmdir_quiet(p: Path) -> None:
    try:
        p.rmdir()
    except OSError:
        pass


def _hash_inputs(cases: Sequence[Case], progress: CaseProgress, threads: int) -> Dict[str, object]:
    """``{case: sha256 or CardsegError}``, several files at a time (hashlib releases the GIL)."""
    out: Dict[str, object] = {}
    progress.start(len(cases), stage="hashing", leave=False)

    def one(c: Case):
        try:
            return content_hash(c.path)
        except CardsegError as exc:
            return exc

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for c, h in zip(cases, pool.map(one, cases)):
            out[c.name] = h
            progress.advance(True)
    progress.close()
    return out


def _write_subjects(out: Path, cases: Sequence[Case], rows: Dict[str, dict], config: dict,
                    result: BatchResult) -> None:
    if not any(c.subject for c in cases):
        return
    compute = _indices_function()
    if compute is None:
        print("cardseg: note: cardiac indices are not available in this cardseg (no cardseg.indices); "
              f"{SUBJECTS_CSV} not written", file=sys.stderr)
        return
    status = {name: r["status"] for name, r in rows.items()}
    subj, names = subject_rows(out, cases, status, config, compute)
    write_table(out / SUBJECTS_CSV, subj, subject_columns(names))
    result.subjects = subj
    result.files.append(SUBJECTS_CSV)


def options_from_args(a) -> BatchOptions:
    """The :class:`BatchOptions` of a parsed ``cardseg batch`` command line."""
    return BatchOptions(inputs=list(a.inputs or ()), manifest=a.manifest, output=a.output, bundle=a.bundle,
                        method=a.method, device=a.device, batch_size=a.batch_size, frame=a.frame, spacing=a.spacing,
                        overwrite=a.overwrite, quiet=a.quiet, progress=a.progress, threads=a.threads,
                        backend=a.backend or "torch", workers=a.workers, ray=a.ray,
                        ray_workers=a.ray_workers, ray_cpus_per_worker=a.ray_cpus_per_worker,
                        report=not a.no_report, report_thumbnails=a.report_thumbnails)


def main_from_args(a) -> int:
    """``cardseg batch``: run, print one summary line; exit code 0, or 1 when a case failed."""
    r = run_batch(options_from_args(a))
    if not a.quiet:
        n = len(r.rows)
        ok = n - r.failed
        ood = sum(1 for row in r.rows if row.get("out_of_domain") is True)
        rate = r.computed / (r.seconds / 60.0) if r.seconds > 0 and r.computed else 0.0
        reused = f" ({r.reused} from earlier runs)" if r.reused else ""
        print(f"{r.outdir}: {n} case{'s' if n != 1 else ''}, {ok} ok{reused}, {r.failed} failed, {ood} out of domain; "
              f"{', '.join(r.files)}; {r.computed} computed in {r.seconds:.1f} s ({rate:.1f} cases/min)")
    return 1 if r.failed else 0
