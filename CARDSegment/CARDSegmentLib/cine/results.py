"""A cine sequence's own results: the cardiac indices of its ED and ES frames, and the export of
every segmented frame's review with them (and with the volume curves and wall table of :mod:`.curves`). MRML classes only (no Qt, no engine import).

The indices are not computed here: the engine writes them (``cardseg batch``'s ``subjects.csv``,
from ``cardseg.cohort.indices`` on the ED and ES frames' outputs: EDV, ESV, SV, EF for LV and RV,
LV mass, each with the bundle's fitted interval, and what the LVEF interval implies: the columns
``LVEF_category``, e.g. ``LVEF 38-46%: reduced or mildly reduced``, and ``LVEF_straddles``, written
by ``cardseg.cohort.ef_categories``). This module reads that file into a table node (role
``indices``, no frame) and shows and exports what it holds; the category is the engine's label as
written (no threshold is restated here). A ``subjects.csv`` from before those columns has no
category, and the panel then shows none.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..outputs.nodes import OutputNodes, output_nodes_of, read_report, remove_node, tag_output
from ..outputs.review import CSV_FIELDS, json_text, review_csv, review_document, write_text_atomic
from .curves import EXPORT_FIELDS, cine_nodes, export_document, export_rows

#: the subject name the manifest gives the sequence's ED and ES frames
SUBJECT = "cine"
ED_ATTRIBUTE, ES_ATTRIBUTE = "CARDSegment.EDFrame", "CARDSegment.ESFrame"
NOMINAL_ATTRIBUTE, ERROR_ATTRIBUTE = "CARDSegment.Nominal", "CARDSegment.IndicesError"
CATEGORY_ATTRIBUTE, STRADDLES_ATTRIBUTE = "CARDSegment.LVEFCategory", "CARDSegment.LVEFStraddles"
#: the engine's ``subjects.csv`` columns of what the LVEF interval implies (``cardseg.cohort.subjects``)
CATEGORY_COLUMNS = ("LVEF_category", "LVEF_straddles")
#: what the panel adds to the category of an interval that spans a category threshold
STRADDLES_TEXT = "interval straddles a threshold"


def index_label(name: str) -> str:
    """``LVEDV_ml`` -> ``LV EDV``, ``LVM_g`` -> ``LV mass``, ``RVEF`` -> ``RV EF``."""
    stem = name.rsplit("_", 1)[0] if name.endswith(("_ml", "_g")) else name
    if stem == "LVM":
        return "LV mass"
    return f"{stem[:2]} {stem[2:]}" if stem[:2] in ("LV", "RV") and len(stem) > 2 else stem


def index_unit(name: str) -> str:
    return "ml" if name.endswith("_ml") else "g" if name.endswith("_g") else "%" if name.endswith("EF") else ""


def _number(text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("nan")


def _flag(text) -> Optional[bool]:
    """``LVEF_straddles`` as written (``true`` / ``false``); None when empty or absent."""
    word = str(text or "").strip().lower()
    return True if word in ("true", "1") else False if word in ("false", "0") else None


def indices_from_subjects(path: os.PathLike, ed: int, es: int) -> dict:
    """The sequence's row of the engine's ``subjects.csv``.

    Returns ``{"ed", "es", "nominal", "error", "indices": [{"name", "value", "low", "high"}],
    "category", "straddles"}``; the indices are the columns that come with ``_low`` and ``_high``
    columns, in file order; ``category`` is the ``LVEF_category`` label ("" when the file has none:
    an older run, or no LVEF interval) and ``straddles`` ``LVEF_straddles`` (None without a
    category). A row with an error gives that error, and the indices it still has values for (none
    for a bundle without fitted intervals; all of them for a subject whose numbers the engine
    found implausible, e.g. an ESV above its EDV, which it keeps for the record).
    """
    p = Path(path)
    none = {"category": "", "straddles": None}
    if not p.is_file():
        return {
            "ed": ed,
            "es": es,
            "nominal": None,
            "error": "the engine wrote no cardiac indices",
            "indices": [],
            **none,
        }
    with open(p, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        row = next((r for r in reader if r.get("subject") == SUBJECT), None)
    if row is None:
        return {
            "ed": ed,
            "es": es,
            "nominal": None,
            "error": "no cardiac indices for the ED and ES frames",
            "indices": [],
            **none,
        }
    names = [c for c in columns if f"{c}_low" in columns and f"{c}_high" in columns]
    error = (row.get("error") or "").strip()
    indices = [
        {
            "name": n,
            "value": _number(row.get(n)),
            "low": _number(row.get(f"{n}_low")),
            "high": _number(row.get(f"{n}_high")),
        }
        for n in names
        if not math.isnan(_number(row.get(n)))
    ]
    nominal = _number(row.get("nominal"))
    category = str(row.get("LVEF_category") or "").strip()  # the engine leaves it out where it must
    return {
        "ed": int(ed),
        "es": int(es),
        "nominal": None if math.isnan(nominal) else nominal,
        "error": error,
        "indices": indices,
        "category": category,
        "straddles": _flag(row.get("LVEF_straddles")) if category else None,
    }


def make_indices_table(scene, input_volume, indices: dict, base_name: Optional[str] = None):
    """A table node of ``indices`` (one row per index), tagged as the sequence's ``indices`` output;
    named from ``base_name`` (the sequence's name; default: the input's)."""
    import vtk

    name = scene.GenerateUniqueName(f"{base_name or input_volume.GetName()} CARD indices")
    table = scene.AddNewNodeByClass("vtkMRMLTableNode", name)
    columns = {
        "index": vtk.vtkStringArray(),
        "label": vtk.vtkStringArray(),
        "value": vtk.vtkDoubleArray(),
        "low": vtk.vtkDoubleArray(),
        "high": vtk.vtkDoubleArray(),
        "unit": vtk.vtkStringArray(),
    }
    for key, arr in columns.items():
        arr.SetName(key)
    for item in indices["indices"]:
        columns["index"].InsertNextValue(item["name"])
        columns["label"].InsertNextValue(index_label(item["name"]))
        for key in ("value", "low", "high"):
            columns[key].InsertNextValue(float(item[key]))
        columns["unit"].InsertNextValue(index_unit(item["name"]))
    for arr in columns.values():
        table.AddColumn(arr)
    table.SetAttribute(ED_ATTRIBUTE, str(indices["ed"]))
    table.SetAttribute(ES_ATTRIBUTE, str(indices["es"]))
    table.SetAttribute(NOMINAL_ATTRIBUTE, "" if indices.get("nominal") is None else repr(float(indices["nominal"])))
    table.SetAttribute(ERROR_ATTRIBUTE, indices.get("error") or "")
    table.SetAttribute(CATEGORY_ATTRIBUTE, indices.get("category") or "")
    straddles = indices.get("straddles")
    table.SetAttribute(STRADDLES_ATTRIBUTE, "" if straddles is None else str(bool(straddles)).lower())
    tag_output(table, "indices", input_volume)
    return table


def read_indices(table) -> Optional[dict]:
    """What :func:`make_indices_table` stored, as :func:`indices_from_subjects` returns it (None: no
    table; a table saved before the category was kept has none)."""
    if table is None:
        return None
    t = table.GetTable()
    rows = []
    for i in range(table.GetNumberOfRows()):
        rows.append(
            {
                "name": t.GetColumnByName("index").GetValue(i),
                **{k: float(t.GetColumnByName(k).GetValue(i)) for k in ("value", "low", "high")},
            }
        )
    nominal = table.GetAttribute(NOMINAL_ATTRIBUTE)
    return {
        "ed": int(table.GetAttribute(ED_ATTRIBUTE)),
        "es": int(table.GetAttribute(ES_ATTRIBUTE)),
        "nominal": float(nominal) if nominal else None,
        "error": table.GetAttribute(ERROR_ATTRIBUTE) or "",
        "indices": rows,
        "category": table.GetAttribute(CATEGORY_ATTRIBUTE) or "",
        "straddles": _flag(table.GetAttribute(STRADDLES_ATTRIBUTE)),
    }


def commit_indices(scene, input_volume, table, replaced: List[int], base_name: Optional[str] = None) -> None:
    """Put a new indices ``table`` in place of the earlier one; without a new table, drop the earlier
    one when a frame it was computed from was just replaced (its numbers would be stale). The new
    table takes the name ``<base_name> CARD indices`` when it is free."""
    for old in output_nodes_of(scene, input_volume, None):
        if old.GetAttribute("CARDSegment.Role") != "indices" or old is table:
            continue
        held = read_indices(old)
        if table is not None or held["ed"] in replaced or held["es"] in replaced:
            remove_node(scene, old)
    if table is not None:
        final = f"{base_name or input_volume.GetName()} CARD indices"
        if table.GetName() != final and scene.GetFirstNodeByName(final) is None:
            table.SetName(final)


def _fmt(value: float) -> str:
    return "-" if value != value else f"{value:.1f}"


def category_line(indices: dict) -> str:
    """``LVEF 38-46%: reduced or mildly reduced (interval straddles a threshold)``: the engine's
    category label, flagged when the interval spans a threshold; "" without a category."""
    category = (indices.get("category") or "").strip()
    if not category:
        return ""
    return f"{category} ({STRADDLES_TEXT})" if indices.get("straddles") else category


def indices_lines(indices: Optional[dict], frame_label=str) -> List[str]:
    """The panel's lines: a heading, then ``LV EF: 58.1 % (52.3 to 63.0)`` per index, the LVEF
    category (:func:`category_line`) right after the LV EF line (last without one) when there is one."""
    if indices is None:
        return []
    head = f"ED {frame_label(indices['ed'])}, ES {frame_label(indices['es'])}"
    if indices["error"] and not indices["indices"]:
        return [head, f"No cardiac indices: {indices['error']}"]
    level = f"{indices['nominal']:.0%} intervals" if indices.get("nominal") is not None else "intervals"
    lines = [f"{head}; {level} from the bundle"]
    for item in indices["indices"]:
        unit = index_unit(item["name"])
        lines.append(
            f"{index_label(item['name'])}: {_fmt(item['value'])} {unit} ({_fmt(item['low'])} to {_fmt(item['high'])})"
        )
    category = category_line(indices)
    if category:
        names = [item["name"] for item in indices["indices"]]
        lines.insert(2 + names.index("LVEF") if "LVEF" in names else len(lines), category)
    if indices["error"]:
        lines.append(f"Check these numbers: {indices['error']}")
    return lines


#: the cine export's CSV columns: a record kind and frame, the review's columns, the indices' (the
#: LVEF category and straddle flag on the LVEF row, as ``subjects.csv`` has them), the volume
#: curves' and the wall table's (:mod:`.curves`)
CINE_CSV_FIELDS = (
    ("record", "frame")
    + CSV_FIELDS
    + ("index", "value", "low", "high", "unit", "nominal", "ed_frame", "es_frame")
    + CATEGORY_COLUMNS
    + EXPORT_FIELDS
)


def cine_review_csv(frames: Dict[int, OutputNodes], indices: Optional[dict], more: Sequence[dict] = ()) -> str:
    """Every segmented frame's review rows (``record`` = region), the indices (``record`` = index),
    then ``more`` rows (the volume curves' ``curve`` and the wall table's ``wall`` rows)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CINE_CSV_FIELDS, lineterminator="\n", restval="")
    writer.writeheader()
    for frame in sorted(frames):
        outputs = frames[frame]
        if outputs.review is None:
            continue
        for row in csv.DictReader(io.StringIO(review_csv(outputs.review, read_report(outputs.report)))):
            writer.writerow({"record": "region", "frame": frame, **row})
    for item in (indices or {}).get("indices", []):
        category = (indices.get("category") or "") if item["name"] == "LVEF" else ""
        straddles = indices.get("straddles") if category else None
        writer.writerow(
            {
                "record": "index",
                "index": item["name"],
                "value": item["value"],
                "low": item["low"],
                "high": item["high"],
                "unit": index_unit(item["name"]),
                "nominal": indices["nominal"],
                "ed_frame": indices["ed"],
                "es_frame": indices["es"],
                "LVEF_category": category,
                "LVEF_straddles": "" if straddles is None else str(bool(straddles)).lower(),
            }
        )
    for row in more:
        writer.writerow(row)
    return out.getvalue()


def export_cine_review(scene, input_volume, frames: Dict[int, OutputNodes], path: os.PathLike) -> Path:
    """Write every frame's review, the indices, the volume curves and the wall table: ``.csv`` (:func:`cine_review_csv`; a missing
    index value or bound written ``nan`` as in the engine's ``subjects.csv``) or ``.json`` (a missing
    or non-finite number as ``null``, never a bare ``NaN``: :func:`~CARDSegmentLib.outputs.review.json_text`), both UTF-8
    (the CSV without a byte-order mark) and written whole or not at all (:func:`~CARDSegmentLib.outputs.review.write_text_atomic`)."""
    p = Path(path)
    indices_nodes = [
        n for n in output_nodes_of(scene, input_volume, None) if n.GetAttribute("CARDSegment.Role") == "indices"
    ]
    indices = read_indices(indices_nodes[0]) if indices_nodes else None
    tables = cine_nodes(scene, input_volume)
    if not any(o.review is not None for o in frames.values()) and indices is None and tables.curves is None:
        raise KeyError("no review table for this sequence")
    if p.suffix.lower() == ".json":
        doc = {
            "frames": {
                str(f): review_document(o.review, read_report(o.report))
                for f, o in sorted(frames.items())
                if o.review is not None
            },
            "indices": indices,
            **export_document(tables),
        }
        write_text_atomic(p, json_text(doc))
    elif p.suffix.lower() == ".csv":
        write_text_atomic(p, cine_review_csv(frames, indices, export_rows(tables)))
    else:
        raise ValueError(f"{p.name}: export to .csv or .json")
    return p
