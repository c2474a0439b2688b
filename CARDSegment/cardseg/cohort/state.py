"""OUTDIR's ownership and a batch's resume state: the batch stamp, the state file (one line per
finished case) and the check that OUTDIR is new, empty or an earlier batch's output."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from cardseg.base.errors import CardsegError
from cardseg.base.files import PROBE_PREFIX, write_atomic
from cardseg.cohort.layout import BATCH_STAMP, OWN_FILES, SEGMENT_LEFTOVER, STATE_FILE
from cardseg.base.strictjson import bounded_loads


def read_batch_stamp(outdir: Path) -> Optional[dict]:
    try:
        stamp = bounded_loads((outdir / BATCH_STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or stamp.get("tool") != "cardseg-batch":
        return None
    return stamp


def check_batch_outdir(output: os.PathLike, settings: dict, overwrite: bool) -> Tuple[Path, Optional[dict]]:
    """Validate OUTDIR before any work; writes nothing. Returns ``(absolute path, earlier stamp)``."""
    from cardseg.io.outdir import STAMP, check_not_leftover_name, check_writable, nearest_existing, read_stamp

    out = Path(os.path.realpath(os.path.abspath(os.fspath(output))))
    check_not_leftover_name(out)
    if out.exists() and not out.is_dir():
        raise CardsegError(f"{out}: exists and is not a folder")
    base = nearest_existing(out)
    if not base.is_dir():
        raise CardsegError(f"{out}: cannot create it, {base} is a file")
    check_writable(base if not out.exists() else out, out)
    if not out.exists():
        return out, None
    present = sorted(e.name for e in out.iterdir() if not e.name.startswith(PROBE_PREFIX))  # a killed run's probe
    if not present:
        return out, None
    stamp = read_batch_stamp(out)
    if stamp is None:
        what = "an output folder of cardseg segment" if read_stamp(out) is not None else "not written by cardseg batch"
        raise CardsegError(
            f"{out}: folder is not empty and {what}; it is never used as a batch's OUTDIR, choose a new or empty folder"
        )
    own = set(OWN_FILES) | {f".{n}.tmp" for n in OWN_FILES}
    foreign = [
        n
        for n in present
        if n not in own and not SEGMENT_LEFTOVER.match(n) and not ((out / n).is_dir() and (out / n / STAMP).is_file())
    ]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise CardsegError(
            f"{out}: holds files cardseg did not write ({', '.join(foreign[:3])}{more}); "
            "move them or choose another folder"
        )
    if stamp.get("settings") != settings and not overwrite:
        old = stamp.get("settings") or {}
        old_id, new_id = (old.get("bundle") or {}).get("id"), (settings.get("bundle") or {}).get("id")
        what = (
            "another configuration of the same bundle: its bundle.json changed, or another --review-map"
            if old.get("method") == settings.get("method") and old_id == new_id
            else "other settings than now"
        )
        raise CardsegError(
            f"{out}: holds a batch made with method {old.get('method')} and bundle {old_id} ({what}); "
            "use --overwrite to recompute its cases, or choose another folder"
        )
    return out, stamp


def write_stamp(out: Path, settings: dict, created: Optional[str]) -> None:
    from cardseg import __version__

    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    stamp = {
        "tool": "cardseg-batch",
        "version": __version__,
        "created": created or now,
        "updated": now,
        "settings": settings,
        "files": list(OWN_FILES),
    }
    write_atomic(out / BATCH_STAMP, (json.dumps(stamp, indent=1) + "\n").encode())


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
            rec = bounded_loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("case"), str):
            state[rec["case"]] = rec
    return state


def recorded_cases(out: Path, names, keys: Dict[str, str]) -> List[str]:
    """Those of ``names`` whose state line (with the case's current key) is in the state file: a
    case interrupted while its line was being appended is finished exactly when the line made it."""
    if not names:
        return []
    state = read_state(out)
    return [n for n in names if state.get(n, {}).get("key") == keys[n]]


def append_state(out: Path, record: dict) -> None:
    """Add one finished case's line to the state file; after a line that a kill cut short (no
    newline at the end), on a line of its own, so that the record is not lost with the cut one."""
    with open(out / STATE_FILE, "a+b") as f:
        start = b""
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            start = b"" if f.read(1) == b"\n" else b"\n"
        f.write(start + (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


def outputs_digest(folder: Path) -> Optional[str]:
    """sha256 of what a case folder's own stamp records of its files (each file's size and sha256),
    or ``None`` when the folder holds no complete cardseg output. The state file keeps this next to
    the case's key, binding that key (input content, bundle, method) to exactly these outputs."""
    from cardseg.io.outdir import read_stamp

    stamp = read_stamp(folder)
    if stamp is None or not isinstance(stamp.get("files"), dict) or "report.json" not in stamp["files"]:
        return None
    return hashlib.sha256(json.dumps(stamp["files"], sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def finished_report(folder: Path, digest: Optional[str] = None) -> Optional[dict]:
    """The report of a case folder that still holds exactly the output this batch wrote, else ``None``.

    ``digest``: what :func:`outputs_digest` gave when the batch finished the case (the state
    file's ``outputs``). The folder is trusted only when its stamp still records that digest,
    every file it lists is there with its recorded size, and ``report.json`` still has its recorded
    sha256: a folder that another command (``cardseg segment -o`` into it), a hand or a cut-short
    write changed since is not reused, and neither is one whose state line has no digest.
    """
    from cardseg.base.files import sha256_file
    from cardseg.io.outdir import read_stamp

    if digest is None or outputs_digest(folder) != digest:
        return None
    files = read_stamp(folder)["files"]
    for name, rec in files.items():
        p = folder / name
        if not isinstance(rec, dict) or p.is_symlink() or not p.is_file() or p.stat().st_size != rec.get("size"):
            return None
    try:
        if sha256_file(folder / "report.json") != files["report.json"].get("sha256"):
            return None
        report = bounded_loads((folder / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None
