"""The cohort table: one row per case (CSV, and Parquet when pyarrow is importable)."""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import List, Optional, Sequence

from cardseg.base.csvcells import read_cell, safe_cell
from cardseg.base.errors import one_line
from cardseg.base.files import open_new_file, write_atomic
from cardseg.cohort.cases import Case

#: how many of a case's flagged regions, in review order, the cohort table describes one by one
TOP_REGIONS = 3
#: ``region<k>_ml`` and ``region<k>_p_error`` of the first :data:`TOP_REGIONS` regions
REGION_COLUMNS = tuple(f"region{k}_{what}" for k in range(1, TOP_REGIONS + 1) for what in ("ml", "p_error"))
#: the cohort table's first columns: which case, and whether it was measured
CASE_COLUMNS = ("case", "subject", "phase", "frame", "status", "error")
#: after ``volume_<class>_ml`` per foreground class: how far to trust the case, its review, where
#: the grid lay (``grid_moved``, ``grid_offset_mm``: :func:`grid_cells`)
REVIEW_COLUMNS = (
    ("agreement", "out_of_domain", "no_foreground", "flagged_regions", "flagged_volume_ml")
    + REGION_COLUMNS
    + ("grid_moved", "grid_offset_mm")
)
#: last, the bookkeeping, then ``time_<stage>_s`` per timing in the reports (``total`` first)
RECORD_COLUMNS = ("input", "input_digest", "reused", "output", "method", "slices")
#: the cohort table's fixed columns, in the order :func:`table_columns` lays them out around the volumes
COHORT_COLUMNS = CASE_COLUMNS + REVIEW_COLUMNS + RECORD_COLUMNS
#: decimals of the table's millilitres (0.1 ml: what a segmentation's volume means)
ML_DECIMALS = 1


def cohort_row(
    case: Case,
    status: str,
    error: str = "",
    report: Optional[dict] = None,
    reused: bool = False,
    input_digest: str = "",
) -> dict:
    """One row of the cohort table; ``report`` is the case's ``report.json`` (``None`` if it failed);
    ``input_digest``: :func:`cardseg.cohort.hashing.content_hash` of the input (a sha256 over its
    files' names and sha256s, not ``sha256sum`` of one file).

    A result with no foreground at all (every class volume 0: noise, a wrong slice spacing, a
    broken network) gets ``no_foreground`` true and ``out_of_domain`` true whatever the report
    says: an empty segmentation of a heart study is not a measurement to trust, and it is counted
    and ranked with the cases out of domain (first among them), never as 'not measured'."""
    row = {
        "case": case.name,
        "subject": case.subject or "",
        "phase": case.phase or "",
        "frame": "" if case.frame is None else case.frame,
        "input": case.path,
        "input_digest": input_digest,
        "status": status,
        "error": error,
        "reused": reused,
        "output": f"{case.name}/" if report else "",
        "method": "",
        "slices": "",
        "grid_moved": None,
        "grid_offset_mm": None,
        "agreement": None,
        "out_of_domain": None,
        "no_foreground": None,
        "flagged_regions": None,
        "flagged_volume_ml": None,
        **dict.fromkeys(REGION_COLUMNS),
    }
    if report:
        regions = report.get("regions") or []
        measured = report.get("method") == "card"
        row.update(
            {
                "method": report.get("method", ""),
                "slices": report.get("slices", ""),
                "agreement": report.get("agreement"),
                "out_of_domain": report.get("out_of_domain"),
                "flagged_regions": len(regions) if measured else None,
                "flagged_volume_ml": (
                    round(sum(float(r.get("volume_mm3", 0.0)) for r in regions) / 1000.0, ML_DECIMALS)
                    if measured
                    else None
                ),
            }
        )
        if measured:
            row.update(top_region_cells(regions))
        row.update(grid_cells(report))
        volumes = report.get("class_volumes_ml") or {}
        for name, ml in volumes.items():
            row[f"volume_{name}_ml"] = ml
        if volumes:
            row["no_foreground"] = all(_is_zero(v) for v in volumes.values())
            if row["no_foreground"]:
                row["out_of_domain"] = True
        for stage, sec in (report.get("timings_s") or {}).items():
            row[f"time_{stage}_s"] = sec
    return row


def top_region_cells(regions: Sequence[dict]) -> dict:
    """``region<k>_ml`` and ``region<k>_p_error`` of the first :data:`TOP_REGIONS` regions of a
    report (already in review order: most likely error first); ``None`` where a case has fewer
    regions or its bundle has no ``p_error`` model."""
    cells = {}
    for k in range(1, TOP_REGIONS + 1):
        r = regions[k - 1] if k <= len(regions) else None
        p = None if r is None else r.get("p_error")
        cells[f"region{k}_ml"] = None if r is None else round(float(r.get("volume_mm3", 0.0)) / 1000.0, ML_DECIMALS)
        cells[f"region{k}_p_error"] = None if p is None else float(p)
    return cells


def grid_cells(report: dict) -> dict:
    """Where the networks' grid lay (``report.json``'s ``field_of_view``, :mod:`cardseg.io.field_of_view`):
    ``grid_moved`` (true: moved onto a heart near the edge of the centred grid, and that run kept) and
    ``grid_offset_mm`` (how far its centre lay from the slice centre, in-plane mm; 0 on the centred
    grid). Both ``None`` for a report without the key (written before recentring existed)."""
    fov = report.get("field_of_view")
    if not isinstance(fov, dict):
        return {"grid_moved": None, "grid_offset_mm": None}
    try:
        dx, dy = (float(v) for v in fov.get("offset_mm") or (0.0, 0.0))
    except (TypeError, ValueError):
        dx = dy = 0.0
    return {"grid_moved": bool(fov.get("recentred")), "grid_offset_mm": round(math.hypot(dx, dy), 3)}


def _is_zero(v) -> bool:
    try:
        return float(v) == 0.0
    except (TypeError, ValueError):
        return False


def table_columns(rows: Sequence[dict], class_names: Sequence[str] = ()) -> List[str]:
    """The cohort table's columns: :data:`CASE_COLUMNS`, ``volume_<class>_ml`` (the bundle's classes
    first), :data:`REVIEW_COLUMNS`, :data:`RECORD_COLUMNS`, ``time_<stage>_s``."""
    vols = [f"volume_{n}_ml" for n in class_names]
    times: List[str] = ["time_total_s"]
    for r in rows:
        for k in r:
            if k.startswith("volume_") and k not in vols:
                vols.append(k)
            elif k.startswith("time_") and k not in times:
                times.append(k)
    return list(CASE_COLUMNS) + vols + list(REVIEW_COLUMNS) + list(RECORD_COLUMNS) + times


def _csv_value(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(float(v))
    if isinstance(v, int):
        return str(int(v))
    return safe_cell(str(v))  # text: never a spreadsheet formula


def write_table(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """Write a CSV table atomically; every text cell goes through
    :func:`cardseg.base.csvcells.safe_cell` (no cell a spreadsheet would run as a formula), the
    header included."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([safe_cell(str(c)) for c in columns])
    for r in rows:
        w.writerow([_csv_value(r.get(c)) for c in columns])
    write_atomic(path, buf.getvalue().encode("utf-8"))


def write_parquet(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> bool:
    """The table as Parquet when pyarrow is importable (typed columns); False otherwise."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return False
    types = {
        "frame": pa.int64(),
        "reused": pa.bool_(),
        "slices": pa.int64(),
        "grid_moved": pa.bool_(),
        "grid_offset_mm": pa.float64(),
        "agreement": pa.float64(),
        "out_of_domain": pa.bool_(),
        "no_foreground": pa.bool_(),
        "flagged_regions": pa.int64(),
        "flagged_volume_ml": pa.float64(),
        **dict.fromkeys(REGION_COLUMNS, pa.float64()),
    }
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
    try:
        with os.fdopen(open_new_file(tmp), "wb") as f:  # never through a link planted under that name
            pq.write_table(pa.Table.from_arrays(arrays, schema=pa.schema(fields)), f)
        os.replace(tmp, path)
    except OSError as exc:  # pyarrow's own message names no file (a full disk, a file-size limit)
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise OSError(exc.errno, one_line(exc), str(path)) from None
    return True


def read_table(path: os.PathLike) -> List[dict]:
    """``cohort.csv`` (or ``subjects.csv``) as a list of ``{column: text}``, each cell as it was
    before :func:`write_table` made it safe for spreadsheets."""
    with open(path, newline="", encoding="utf-8") as f:
        return [
            {read_cell(k): read_cell(v or "") for k, v in r.items() if isinstance(k, str)} for r in csv.DictReader(f)
        ]
