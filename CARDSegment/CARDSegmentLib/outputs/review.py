"""Reviewing the flagged regions: a table node that travels with the segmentation.

One row per region of ``report.json`` (already ranked by the engine, most concerning first),
with the reviewer's decision (pending / accepted / corrected / rejected) and a note. The table
is a ``vtkMRMLTableNode`` referenced by the segmentation node, so it is saved and loaded with
the scene. Selecting a region centres the slice views on it and highlights its outline (the
region's own voxels, from ``regions.nii.gz``: :mod:`.region_outlines`). MRML classes only (no Qt).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from .geometry import local_to_world, lps_to_ras
from .nodes import OutputNodes, read_report
from .region_outlines import highlight_region
from .views import jump_slices_to

STATUSES = ("pending", "accepted", "corrected", "rejected")
#: (column name, kind, title shown in Slicer's table view)
COLUMNS = (
    ("region", "int", "Region"),
    ("status", "string", "Status"),
    ("p_error", "double", "P(error)"),
    ("voxels", "int", "Voxels"),
    ("volume_mm3", "double", "Volume (mm3)"),
    ("mean_disagreement", "double", "Mean disagreement"),
    ("max_disagreement", "double", "Max disagreement"),
    ("summed_disagreement", "double", "Summed disagreement"),
    ("classes", "string", "Classes"),
    ("centroid_r", "double", "Centroid R"),
    ("centroid_a", "double", "Centroid A"),
    ("centroid_s", "double", "Centroid S"),
    ("bbox_ijk", "string", "Bounding box (i0 i1 j0 j1 k0 k1)"),
    ("note", "string", "Note"),
)
COLUMN_NAMES = tuple(c[0] for c in COLUMNS)
#: columns that tables saved by older versions lack (read as NaN)
OPTIONAL_COLUMNS = ("p_error",)


def _array(kind: str):
    import vtk

    return {"int": vtk.vtkIntArray, "double": vtk.vtkDoubleArray, "string": vtk.vtkStringArray}[kind]()


def _row_values(region: dict) -> Dict[str, object]:
    ras = lps_to_ras(region.get("centroid_lps", [0.0, 0.0, 0.0]))
    bbox = region.get("bbox_ijk") or [[0, 0], [0, 0], [0, 0]]
    return {
        "region": int(region["id"]),
        "status": "pending",
        "p_error": float("nan") if region.get("p_error") is None else float(region["p_error"]),
        "voxels": int(region.get("voxels", 0)),
        "volume_mm3": float(region.get("volume_mm3", 0.0)),
        "mean_disagreement": float(region.get("mean_disagreement", 0.0)),
        "max_disagreement": float(region.get("max_disagreement", 0.0)),
        "summed_disagreement": float(region.get("summed_disagreement", 0.0)),
        "classes": ", ".join(str(c) for c in region.get("classes", [])),
        "centroid_r": ras[0],
        "centroid_a": ras[1],
        "centroid_s": ras[2],
        "bbox_ijk": " ".join(str(int(v)) for pair in bbox for v in pair),
        "note": "",
    }


def create_review_table(scene, regions: List[dict], name: str = "CARD review"):
    """A table node with one pending row per region, in the report's order."""
    table = scene.AddNewNodeByClass("vtkMRMLTableNode", name)
    rows = [_row_values(r) for r in regions]
    for col, kind, title in COLUMNS:
        arr = _array(kind)
        arr.SetName(col)
        arr.SetNumberOfValues(len(rows))
        for i, row in enumerate(rows):
            arr.SetValue(i, row[col])
        table.AddColumn(arr)
        table.SetColumnTitle(col, title)
    table.SetUseColumnTitleAsColumnHeader(True)
    table.SetLocked(False)
    table.SetColumnDescription("status", "reviewer decision: " + ", ".join(STATUSES))
    table.Modified()
    return table


def _column(table, name: str):
    col = table.GetTable().GetColumnByName(name)
    if col is None:
        raise KeyError(f"table {table.GetName()!r} has no column {name!r}: not a CARDSegment review table")
    return col


def _value(col, i: int, kind: str):
    v = col.GetValue(i)
    if kind == "int":
        return int(v) if not isinstance(v, str) else int(float(v))
    if kind == "double":
        return float(v)
    return "" if v is None else str(v)


def review_rows(table) -> List[Dict[str, object]]:
    """Every row of a review table as a dictionary (column name → value)."""
    if table is None:
        return []
    n = table.GetNumberOfRows()
    cols = {
        name: (_column(table, name), kind)
        for name, kind, _ in COLUMNS
        if name not in OPTIONAL_COLUMNS or table.GetTable().GetColumnByName(name) is not None
    }
    rows = [{name: _value(col, i, kind) for name, (col, kind) in cols.items()} for i in range(n)]
    for row in rows:
        for name in OPTIONAL_COLUMNS:
            row.setdefault(name, float("nan"))
    return rows


def _row_index(table, region_id: int) -> int:
    col = _column(table, "region")
    for i in range(table.GetNumberOfRows()):
        if _value(col, i, "int") == int(region_id):
            return i
    raise KeyError(f"no region {region_id} in {table.GetName()!r}")


def set_region_status(table, region_id: int, status: str, note: Optional[str] = None) -> None:
    """Record the reviewer's decision (and optionally a note) for one region."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
    i = _row_index(table, region_id)
    _column(table, "status").SetValue(i, status)
    if note is not None:
        _column(table, "note").SetValue(i, str(note))
    table.GetTable().Modified()
    table.Modified()


def review_counts(table) -> Dict[str, int]:
    """How many regions have each status."""
    counts = {s: 0 for s in STATUSES}
    for row in review_rows(table):
        counts[row["status"] if row["status"] in counts else "pending"] += 1
    return counts


def has_decisions(table) -> bool:
    """True when any region was marked accepted, corrected or rejected."""
    return any(row["status"] != "pending" for row in review_rows(table))


# ---------------------------------------------------------------------------------------------
# showing a region


def show_region(scene, input_volume, outputs: OutputNodes, region_id: int) -> Optional[str]:
    """Highlight region ``region_id``'s outline (:func:`~.region_outlines.highlight_region`: its
    own voxels, not a box) and centre the slice views on its centroid.

    Returns the highlighted segment's id in ``outputs.regions`` (None when the outputs have no
    outlines, e.g. results loaded by an older version). No node is made: a markups ROI box that
    an older version of the module made for this input is hidden (the next run removes it).
    Raises KeyError when the review table has no such region.
    """
    table = outputs.review
    if table is None:
        raise KeyError("no review table for this volume")
    row = review_rows(table)[_row_index(table, region_id)]
    old_box = outputs.roi.GetDisplayNode() if outputs.roi is not None and scene.IsNodePresent(outputs.roi) else None
    if old_box is not None:
        old_box.SetVisibility(False)
    segment_id = highlight_region(outputs.regions, region_id) if outputs.regions is not None else None
    centroid = [row["centroid_r"], row["centroid_a"], row["centroid_s"]]
    jump_slices_to(scene, local_to_world(input_volume, centroid))
    return segment_id


# ---------------------------------------------------------------------------------------------
# export


def review_document(table, report: Optional[dict]) -> dict:
    """The report with each region's review decision and note added (what the JSON export holds)."""
    report = dict(report or {})
    rows = {row["region"]: row for row in review_rows(table)}
    regions = []
    for region in report.get("regions") or []:
        region = dict(region)
        row = rows.pop(int(region["id"]), None)
        region["status"] = row["status"] if row else "pending"
        region["note"] = row["note"] if row else ""
        regions.append(region)
    for rid, row in sorted(rows.items()):  # regions known only to the table (no report available)
        regions.append(
            {
                "id": rid,
                "status": row["status"],
                "note": row["note"],
                "p_error": None if row["p_error"] != row["p_error"] else row["p_error"],
                "voxels": row["voxels"],
                "volume_mm3": row["volume_mm3"],
                "mean_disagreement": row["mean_disagreement"],
                "max_disagreement": row["max_disagreement"],
                "summed_disagreement": row["summed_disagreement"],
                "classes": [c for c in row["classes"].split(", ") if c],
                "centroid_lps": lps_to_ras([row["centroid_r"], row["centroid_a"], row["centroid_s"]]),
            }
        )
    report["regions"] = regions
    report["review"] = review_counts(table)
    return report


CSV_FIELDS = (
    "region",
    "status",
    "p_error",
    "note",
    "voxels",
    "volume_mm3",
    "mean_disagreement",
    "max_disagreement",
    "summed_disagreement",
    "classes",
    "centroid_l",
    "centroid_p",
    "centroid_s",
    "bbox_ijk",
    "volume_agreement",
    "out_of_domain",
    "method",
    "bundle",
    "input",
)


def spreadsheet_safe(value):
    """A text cell that a spreadsheet would run as a formula (starting with = + - @, a tab or a
    carriage return) gets a leading apostrophe, as does one that already starts with one, so
    the text reads back exactly; numbers and empty cells are left alone."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r", "'"):
        return "'" + value
    return value


def review_csv(table, report: Optional[dict]) -> str:
    """One CSV row per region: the decision, the region's measures and the volume's report fields
    (every text cell made :func:`spreadsheet_safe`: notes and names are typed by people)."""
    doc = review_document(table, report)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for region in doc["regions"]:
        lps = region.get("centroid_lps") or ["", "", ""]
        bbox = region.get("bbox_ijk")
        writer.writerow(
            {
                key: spreadsheet_safe(value)
                for key, value in {
                    "region": region.get("id"),
                    "status": region.get("status"),
                    "p_error": region.get("p_error"),
                    "note": region.get("note", ""),
                    "voxels": region.get("voxels"),
                    "volume_mm3": region.get("volume_mm3"),
                    "mean_disagreement": region.get("mean_disagreement"),
                    "max_disagreement": region.get("max_disagreement"),
                    "summed_disagreement": region.get("summed_disagreement"),
                    "classes": " ".join(region.get("classes") or []),
                    "centroid_l": lps[0],
                    "centroid_p": lps[1],
                    "centroid_s": lps[2],
                    "bbox_ijk": " ".join(str(v) for pair in bbox for v in pair) if bbox else "",
                    "volume_agreement": doc.get("agreement"),
                    "out_of_domain": doc.get("out_of_domain"),
                    "method": doc.get("method"),
                    "bundle": (doc.get("bundle") or {}).get("id"),
                    "input": doc.get("input_node") or doc.get("input"),
                }.items()
            }
        )
    return out.getvalue()


def strict_json(value):
    """``value`` (dictionaries, lists, numbers, text) with every non-finite float (a missing
    measure: NaN, or an infinity) made None, so that ``json.dumps`` writes ``null``: what strict
    JSON readers (browsers, R's jsonlite by default, Go, Java) accept where a bare ``NaN`` is an error."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def json_text(document) -> str:
    """``document`` as the exports' JSON: indented, non-finite numbers as ``null`` (:func:`strict_json`)."""
    return json.dumps(strict_json(document), indent=2, allow_nan=False) + "\n"


def write_text_atomic(path: os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8 (whatever the machine's encoding: Windows' is cp1252), to
    a temporary file beside it renamed over ``path`` at the end: on any failure (a full disk, no
    permission) an earlier file at ``path`` is left as it was and the temporary file is removed.
    The file gets the usual mode under the umask, as a plain ``open`` would give it."""
    p = Path(path)
    data = text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def export_review(outputs: OutputNodes, path: os.PathLike) -> Path:
    """Write the review with the report: ``.json`` (the full report plus decisions; a missing or
    non-finite number as ``null``: :func:`json_text`) or ``.csv`` (a missing ``p_error`` an empty
    cell), both UTF-8 (the CSV without a byte-order mark) and written whole or not at all
    (:func:`write_text_atomic`)."""
    if outputs.review is None:
        raise KeyError("no review table for this volume")
    p = Path(path)
    report = read_report(outputs.report)
    if p.suffix.lower() == ".json":
        write_text_atomic(p, json_text(review_document(outputs.review, report)))
    elif p.suffix.lower() == ".csv":
        write_text_atomic(p, review_csv(outputs.review, report))
    else:
        raise ValueError(f"{p.name}: export to .csv or .json")
    return p
