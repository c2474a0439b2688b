"""A cine's LV and RV volume curves (a plot) and its 16-segment wall thickness (a table), as nodes.
MRML classes only (no Qt, no engine import).

The numbers are the engine's. ``cardseg batch`` on a cine input writes ``curves.csv`` (``subject,
frame, time_ms, LV_ml, RV_ml, phase``: one row per frame, ``phase`` ``ED`` or ``ES`` on the chosen
frames) and, in ``subjects.csv``, ``WT_seg1_mm`` .. ``WT_seg16_mm`` and ``WT_max_mm`` (the ED
frame's wall thickness per AHA segment) and ``WT_thickening_mean_pct`` (the mean systolic
thickening over the segments); :func:`read_cine_tables` reads them. A per-segment thickening
(``WT_thickening_seg<k>_pct``) is read when the file has it; ``cardseg batch`` writes the mean only,
so the table's thickening column is then empty and the mean is shown beside it. A run without
``curves.csv`` (the panel sends a sequence's frames as separate cases) gets its curves from the
frames' own reports (:func:`curves_from_reports`: the ``LV`` and ``RV`` class volumes of each
segmented frame, before the bundle's index corrections).

Nodes: one table of the curves, one of the ED and ES points, a plot chart with an LV and an RV
series and a marker series for each at ED and ES, and the wall table; each carries
:data:`KIND_ATTRIBUTE` and the ``CARDSegment.Input`` reference to the panel's input, so that a new
run updates the same nodes (no duplicates). The chart is put in a plot view only when asked
(:func:`show_in_layout`).
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..outputs.nodes import INPUT_REFERENCE, all_nodes, remove_node

#: what each of these nodes is (``curves``, ``curve-marks``, ``chart``, ``series-LV`` ...,
#: ``wall``); with ``CARDSegment.Input`` it identifies the node for a re-run
KIND_ATTRIBUTE = "CARDSegment.CineTable"
#: the ED and ES frames a table holds, and why a curve or wall table is missing
ED_ATTRIBUTE, ES_ATTRIBUTE = "CARDSegment.EDFrame", "CARDSegment.ESFrame"
SOURCE_ATTRIBUTE, WALL_NOTE_ATTRIBUTE = "CARDSegment.CurveSource", "CARDSegment.WallNote"
MAX_ATTRIBUTE, MEAN_ATTRIBUTE = "CARDSegment.WallMaxMM", "CARDSegment.ThickeningMeanPct"
N_SEGMENTS = 16
#: the AHA 17-segment model's names of segments 1-16
AHA_NAMES = tuple(
    f"{level} {wall}"
    for level, walls in (
        ("basal", ("anterior", "anteroseptal", "inferoseptal", "inferior", "inferolateral", "anterolateral")),
        ("mid", ("anterior", "anteroseptal", "inferoseptal", "inferior", "inferolateral", "anterolateral")),
        ("apical", ("anterior", "septal", "inferior", "lateral")),
    )
    for wall in walls
)
THICKNESS_COLUMNS = tuple(f"WT_seg{k}_mm" for k in range(1, N_SEGMENTS + 1))
THICKENING_COLUMNS = tuple(f"WT_thickening_seg{k}_pct" for k in range(1, N_SEGMENTS + 1))
FROM_CURVES_CSV, FROM_REPORTS = "curves.csv", "frame reports"
#: plot colours (RGB 0-1) of the LV and RV
COLORS = {"LV": (0.85, 0.2, 0.2), "RV": (0.2, 0.4, 0.85)}


@dataclass(frozen=True)
class VolumeCurves:
    """LV and RV volume (ml) per frame; ``times_ms`` nan where unknown; ``ed``/``es`` None: unmarked."""

    frames: Tuple[int, ...]
    times_ms: Tuple[float, ...]
    lv_ml: Tuple[float, ...]
    rv_ml: Tuple[float, ...]
    ed: Optional[int]
    es: Optional[int]
    source: str

    @property
    def has_times(self) -> bool:
        return bool(self.times_ms) and all(math.isfinite(t) for t in self.times_ms)

    def x(self) -> Tuple[float, ...]:
        """The plot's x values: the times when every frame has one, else the frame numbers."""
        return self.times_ms if self.has_times else tuple(float(f) for f in self.frames)


@dataclass(frozen=True)
class WallTable:
    """The ED frame's wall thickness per AHA segment (16 values, nan: not measured), the segments'
    systolic thickening (%, nan where the file has none), the largest thickness and the mean thickening."""

    thickness_mm: Tuple[float, ...]
    thickening_pct: Tuple[float, ...]
    max_mm: float
    mean_thickening_pct: float
    ed: Optional[int] = None
    es: Optional[int] = None


@dataclass(frozen=True)
class CineTables:
    """What a run's folder gave: the curves and the wall table, or the one-line reason for each missing."""

    curves: Optional[VolumeCurves] = None
    wall: Optional[WallTable] = None
    curves_note: str = ""
    wall_note: str = ""


@dataclass
class CineNodes:
    """The nodes of one input's curves and wall table (any may be None)."""

    curves: object = None
    marks: object = None
    chart: object = None
    wall: object = None


# ---------------------------------------------------------------------------------------------
# reading the engine's files


def _number(text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("nan")


def _frame(text) -> Optional[int]:
    value = _number(text)
    return int(value) if math.isfinite(value) else None


def _rows(path: Path) -> Tuple[List[str], List[dict]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def read_curves(path: os.PathLike, subject: str) -> Tuple[Optional[VolumeCurves], str]:
    """``subject``'s rows of a ``curves.csv``: ``(curves, "")``, or ``(None, why)``."""
    p = Path(path)
    if not p.is_file():
        return None, "the run wrote no curves.csv"
    rows = sorted((r for r in _rows(p)[1] if r.get("subject") == subject), key=lambda r: _number(r.get("frame")))
    if len(rows) < 2:
        return None, f"curves.csv has {len(rows)} frame(s) of '{subject}' (a curve needs two)"
    phases = {(r.get("phase") or "").strip().upper(): _frame(r.get("frame")) for r in rows}
    curves = VolumeCurves(
        frames=tuple(int(_number(r["frame"])) for r in rows),
        times_ms=tuple(_number(r.get("time_ms")) for r in rows),
        lv_ml=tuple(_number(r.get("LV_ml")) for r in rows),
        rv_ml=tuple(_number(r.get("RV_ml")) for r in rows),
        ed=phases.get("ED"),
        es=phases.get("ES"),
        source=FROM_CURVES_CSV,
    )
    return curves, ""


def read_wall(
    path: os.PathLike, subject: str, ed: Optional[int] = None, es: Optional[int] = None
) -> Tuple[Optional[WallTable], str]:
    """``subject``'s wall thickness cells of a ``subjects.csv``: ``(table, "")``, or ``(None, why)``."""
    p = Path(path)
    if not p.is_file():
        return None, "the run wrote no subjects.csv (the ED and ES frames were not both segmented)"
    columns, rows = _rows(p)
    if not set(THICKNESS_COLUMNS) <= set(columns):
        return None, "subjects.csv has no WT_seg1_mm..WT_seg16_mm columns (no wall thickness was measured)"
    row = next((r for r in rows if r.get("subject") == subject), None)
    if row is None:
        return None, f"subjects.csv has no row of '{subject}'"
    thickness = tuple(_number(row.get(c)) for c in THICKNESS_COLUMNS)
    if not any(math.isfinite(v) for v in thickness):
        error = (row.get("error") or "").strip()
        return None, error or "no segment's wall thickness could be measured"
    table = WallTable(
        thickness_mm=thickness,
        thickening_pct=tuple(_number(row.get(c)) for c in THICKENING_COLUMNS),
        max_mm=_number(row.get("WT_max_mm")),
        mean_thickening_pct=_number(row.get("WT_thickening_mean_pct")),
        ed=_frame(row.get("ed_frame")) if ed is None else int(ed),
        es=_frame(row.get("es_frame")) if es is None else int(es),
    )
    return table, ""


def read_cine_tables(folder: os.PathLike, subject: str, ed: Optional[int] = None, es: Optional[int] = None):
    """The :class:`CineTables` of a ``cardseg batch`` output folder (its ``curves.csv`` and ``subjects.csv``)."""
    folder = Path(folder)
    curves, curves_note = read_curves(folder / "curves.csv", subject)
    wall, wall_note = read_wall(folder / "subjects.csv", subject, ed, es)
    return CineTables(curves, wall, curves_note, wall_note)


def curves_from_reports(
    reports: Mapping[int, Optional[dict]],
    times_ms: Mapping[int, float],
    ed: Optional[int] = None,
    es: Optional[int] = None,
) -> Tuple[Optional[VolumeCurves], str]:
    """The curves from the segmented frames' ``report.json`` (``class_volumes_ml`` ``LV`` and ``RV``);
    ED and ES as given, else by the engine's rule (:func:`~CARDSegmentLib.cine.sequences.pick_ed_es`)."""
    volumes = {int(f): (r or {}).get("class_volumes_ml") or {} for f, r in reports.items() if r}
    volumes = {f: v for f, v in volumes.items() if "LV" in v}
    if len(volumes) < 2:
        return None, f"{len(volumes)} frame(s) segmented (a curve needs two)"
    frames = tuple(sorted(volumes))
    lv = tuple(float(volumes[f]["LV"]) for f in frames)
    if ed is None or es is None:
        from .sequences import pick_ed_es

        ed, es = pick_ed_es(dict(zip(frames, lv)), ed, es)
    curves = VolumeCurves(
        frames=frames,
        times_ms=tuple(float(times_ms.get(f, float("nan"))) for f in frames),
        lv_ml=lv,
        rv_ml=tuple(_number(volumes[f].get("RV")) for f in frames),
        ed=int(ed),
        es=int(es),
        source=FROM_REPORTS,
    )
    return curves, ""


def frame_times_ms(sequence) -> Dict[int, float]:
    """``{frame: time (ms)}`` from a sequence's index values when its unit is ms or s (else empty)."""
    unit = (sequence.GetIndexUnit() or "").strip().lower()
    scale = {"ms": 1.0, "s": 1000.0, "sec": 1000.0}.get(unit)
    if scale is None:
        return {}
    times = {f: _number(sequence.GetNthIndexValue(f)) * scale for f in range(sequence.GetNumberOfDataNodes())}
    return times if all(math.isfinite(t) for t in times.values()) else {}


# ---------------------------------------------------------------------------------------------
# the nodes


def _tagged(node, kind: str, input_volume):
    node.SetAttribute(KIND_ATTRIBUTE, kind)
    node.SetNodeReferenceID(INPUT_REFERENCE, input_volume.GetID())
    return node


def _owned(scene, input_volume) -> Dict[str, object]:
    """``{kind: node}`` of these nodes for ``input_volume`` (the first of each kind)."""
    out: Dict[str, object] = {}
    if input_volume is None or input_volume.GetID() is None:
        return out
    for node in all_nodes(scene):
        kind = node.GetAttribute(KIND_ATTRIBUTE)
        if kind and node.GetNodeReferenceID(INPUT_REFERENCE) == input_volume.GetID():
            out.setdefault(kind, node)
    return out


def cine_nodes(scene, input_volume) -> CineNodes:
    """The curves table, ED/ES table, chart and wall table of ``input_volume`` (None: not made)."""
    held = _owned(scene, input_volume)
    return CineNodes(held.get("curves"), held.get("curve-marks"), held.get("chart"), held.get("wall"))


def _node(scene, held: Dict[str, object], input_volume, kind: str, cls: str, name: str):
    """The held node of ``kind``, else a new one named ``name``."""
    node = held.get(kind)
    if node is None:
        node = _tagged(scene.AddNewNodeByClass(cls, scene.GenerateUniqueName(name)), kind, input_volume)
        held[kind] = node
    return node


def _array(kind: str, name: str, values: Sequence):
    import vtk

    arr = vtk.vtkStringArray() if kind == "str" else vtk.vtkIntArray() if kind == "int" else vtk.vtkDoubleArray()
    arr.SetName(name)
    for v in values:
        arr.InsertNextValue(v if kind == "str" else int(v) if kind == "int" else float(v))
    return arr


def _fill(table_node, columns: Sequence) -> None:
    """Replace ``table_node``'s content by ``columns`` (vtk arrays)."""
    import vtk

    table = vtk.vtkTable()
    for arr in columns:
        table.AddColumn(arr)
    table_node.SetAndObserveTable(table)


def _fill_curves(node, curves: VolumeCurves) -> None:
    marks = {curves.ed: "ED", curves.es: "ES"}
    _fill(
        node,
        [
            _array("int", "frame", curves.frames),
            _array("float", "time_ms", curves.times_ms),
            _array("float", "x", curves.x()),
            _array("float", "LV_ml", curves.lv_ml),
            _array("float", "RV_ml", curves.rv_ml),
            _array("str", "phase", [marks.get(f, "") for f in curves.frames]),
        ],
    )
    node.SetAttribute(SOURCE_ATTRIBUTE, curves.source)
    node.SetAttribute(ED_ATTRIBUTE, "" if curves.ed is None else str(curves.ed))
    node.SetAttribute(ES_ATTRIBUTE, "" if curves.es is None else str(curves.es))


def _fill_marks(node, curves: VolumeCurves) -> None:
    """The ED and ES points (those of the curve's frames)."""
    rows = [(p, curves.frames.index(f)) for p, f in (("ED", curves.ed), ("ES", curves.es)) if f in curves.frames]
    x = curves.x()
    _fill(
        node,
        [
            _array("str", "phase", [p for p, _ in rows]),
            _array("int", "frame", [curves.frames[i] for _, i in rows]),
            _array("float", "x", [x[i] for _, i in rows]),
            _array("float", "LV_ml", [curves.lv_ml[i] for _, i in rows]),
            _array("float", "RV_ml", [curves.rv_ml[i] for _, i in rows]),
        ],
    )


def _series(scene, held, input_volume, base: str, ventricle: str, marks: bool):
    """The line of ``ventricle`` over the curves table, or (``marks``) its ED and ES points."""
    kind = f"series-{ventricle}{'-marks' if marks else ''}"
    title = f"{ventricle} at ED and ES" if marks else ventricle
    series = _node(scene, held, input_volume, kind, "vtkMRMLPlotSeriesNode", f"{base} {title}")
    table = held["curve-marks" if marks else "curves"]
    series.SetAndObserveTableNodeID(table.GetID())
    series.SetXColumnName("x")
    series.SetYColumnName(f"{ventricle}_ml")
    series.SetLabelColumnName("phase" if marks else "frame")
    series.SetPlotType(series.PlotTypeScatter)
    series.SetColor(*COLORS[ventricle])
    series.SetLineStyle(series.LineStyleNone if marks else series.LineStyleSolid)
    series.SetMarkerStyle(series.MarkerStyleCircle if marks else series.MarkerStyleNone)
    series.SetMarkerSize(12 if marks else 6)
    return series


def _chart(scene, held, input_volume, base: str, curves: VolumeCurves, label) -> object:
    chart = _node(scene, held, input_volume, "chart", "vtkMRMLPlotChartNode", f"{base} CARD volume curves")
    chart.RemoveAllPlotSeriesNodeIDs()
    for ventricle in ("LV", "RV"):
        for marks in (False, True):
            chart.AddAndObservePlotSeriesNodeID(_series(scene, held, input_volume, base, ventricle, marks).GetID())
    phases = ", ".join(f"{p} {label(f)}" for p, f in (("ED", curves.ed), ("ES", curves.es)) if f is not None)
    chart.SetTitle(f"{base}: LV and RV volume{' (' + phases + ')' if phases else ''}")
    chart.SetXAxisTitle("time (ms)" if curves.has_times else "frame")
    chart.SetYAxisTitle("volume (ml)")
    chart.SetLegendVisibility(True)
    return chart


def _fill_wall(node, wall: WallTable) -> None:
    _fill(
        node,
        [
            _array("int", "segment", range(1, N_SEGMENTS + 1)),
            _array("str", "name", AHA_NAMES),
            _array("float", "ED_thickness_mm", wall.thickness_mm),
            _array("float", "thickening_pct", wall.thickening_pct),
        ],
    )
    for column, title in (("ED_thickness_mm", "ED thickness (mm)"), ("thickening_pct", "thickening (%)")):
        node.SetColumnTitle(column, title)
    node.SetUseColumnTitleAsColumnHeader(True)
    node.SetAttribute(MAX_ATTRIBUTE, repr(float(wall.max_mm)))
    node.SetAttribute(MEAN_ATTRIBUTE, repr(float(wall.mean_thickening_pct)))
    node.SetAttribute(ED_ATTRIBUTE, "" if wall.ed is None else str(wall.ed))
    node.SetAttribute(ES_ATTRIBUTE, "" if wall.es is None else str(wall.es))


def show_cine_tables(scene, input_volume, tables: CineTables, base_name: str, label=str, keep_wall: bool = False):
    """Make or update ``input_volume``'s curve nodes and wall table from ``tables``: nodes of a
    missing part are removed (the wall table kept with ``keep_wall``: it belongs to ED and ES frames
    that this run did not replace). ``label(frame)`` names a frame in the chart's title. Returns
    :class:`CineNodes`. Call it inside the scene's batch state when the panel is shown."""
    held = _owned(scene, input_volume)
    curves = tables.curves
    if curves is None:
        for kind in [k for k in held if k != "wall"]:
            remove_node(scene, held.pop(kind))
    else:
        _fill_curves(
            _node(scene, held, input_volume, "curves", "vtkMRMLTableNode", f"{base_name} CARD volumes"), curves
        )
        _fill_marks(
            _node(scene, held, input_volume, "curve-marks", "vtkMRMLTableNode", f"{base_name} CARD ED ES"), curves
        )
        _chart(scene, held, input_volume, base_name, curves, label)
        held["curves"].SetAttribute(WALL_NOTE_ATTRIBUTE, "" if tables.wall is not None else tables.wall_note)
    if tables.wall is not None:
        _fill_wall(
            _node(scene, held, input_volume, "wall", "vtkMRMLTableNode", f"{base_name} CARD wall thickness"),
            tables.wall,
        )
    elif not keep_wall and "wall" in held:
        remove_node(scene, held.pop("wall"))
    return cine_nodes(scene, input_volume)


def remove_cine_tables(scene, input_volume) -> int:
    """Remove every one of these nodes of ``input_volume``; returns how many."""
    held = _owned(scene, input_volume)
    for node in held.values():
        remove_node(scene, node)
    return len(held)


# ---------------------------------------------------------------------------------------------
# reading the nodes back, the panel's lines, the export


def _column(table, name: str) -> list:
    arr = table.GetTable().GetColumnByName(name)
    return [arr.GetValue(i) for i in range(arr.GetNumberOfValues())] if arr is not None else []


def _attr_frame(node, name: str) -> Optional[int]:
    text = node.GetAttribute(name)
    return int(text) if text not in (None, "") else None


def read_curves_table(node) -> Optional[VolumeCurves]:
    """What :func:`show_cine_tables` stored in a curves table (None: no table)."""
    if node is None:
        return None
    return VolumeCurves(
        frames=tuple(int(v) for v in _column(node, "frame")),
        times_ms=tuple(float(v) for v in _column(node, "time_ms")),
        lv_ml=tuple(float(v) for v in _column(node, "LV_ml")),
        rv_ml=tuple(float(v) for v in _column(node, "RV_ml")),
        ed=_attr_frame(node, ED_ATTRIBUTE),
        es=_attr_frame(node, ES_ATTRIBUTE),
        source=node.GetAttribute(SOURCE_ATTRIBUTE) or "",
    )


def read_wall_table(node) -> Optional[WallTable]:
    """What :func:`show_cine_tables` stored in a wall table (None: no table)."""
    if node is None:
        return None
    return WallTable(
        thickness_mm=tuple(float(v) for v in _column(node, "ED_thickness_mm")),
        thickening_pct=tuple(float(v) for v in _column(node, "thickening_pct")),
        max_mm=_number(node.GetAttribute(MAX_ATTRIBUTE)),
        mean_thickening_pct=_number(node.GetAttribute(MEAN_ATTRIBUTE)),
        ed=_attr_frame(node, ED_ATTRIBUTE),
        es=_attr_frame(node, ES_ATTRIBUTE),
    )


def _fmt(value: float, unit: str) -> str:
    return "-" if not math.isfinite(value) else f"{value:.1f} {unit}"


def tables_lines(nodes: CineNodes, no_curves: str = "fewer than two frames are segmented") -> List[str]:
    """The panel's lines: the curves (frames, where they come from), the wall table's summary or
    why there is none."""
    curves = read_curves_table(nodes.curves)
    if curves is None:
        return [f"No volume curves: {no_curves}."]
    source = "the engine's curves.csv" if curves.source == FROM_CURVES_CSV else "the frames' segmentations"
    lines = [f"Volume curves: LV and RV over {len(curves.frames)} frames, from {source}."]
    wall = read_wall_table(nodes.wall)
    if wall is None:
        note = nodes.curves.GetAttribute(WALL_NOTE_ATTRIBUTE) or "this run measured no wall thickness"
        return lines + [f"No wall thickness table: {note}."]
    return lines + [
        f"Wall thickness at ED (16 AHA segments): max {_fmt(wall.max_mm, 'mm')}; "
        f"mean systolic thickening {_fmt(wall.mean_thickening_pct, '%')}."
    ]


def export_document(nodes: CineNodes) -> dict:
    """The curves and wall table for the cine review's JSON (None for a missing one)."""
    curves, wall = read_curves_table(nodes.curves), read_wall_table(nodes.wall)
    return {
        "curves": None if curves is None else asdict(curves),
        "wall": None
        if wall is None
        else {
            "segments": [
                {"segment": k + 1, "name": AHA_NAMES[k], "ED_thickness_mm": t, "thickening_pct": g}
                for k, (t, g) in enumerate(zip(wall.thickness_mm, wall.thickening_pct))
            ],
            "max_mm": wall.max_mm,
            "mean_thickening_pct": wall.mean_thickening_pct,
            "ed": wall.ed,
            "es": wall.es,
        },
    }


#: the cine export CSV's columns for these rows (after the review's and the indices')
EXPORT_FIELDS = ("time_ms", "LV_ml", "RV_ml", "phase", "segment", "segment_name", "ED_thickness_mm", "thickening_pct")


def export_rows(nodes: CineNodes) -> List[dict]:
    """The cine review CSV's ``curve`` rows (one per frame) and ``wall`` rows (one per segment)."""
    rows = []
    curves, wall = read_curves_table(nodes.curves), read_wall_table(nodes.wall)
    if curves is not None:
        marks = {curves.ed: "ED", curves.es: "ES"}
        for f, t, lv, rv in zip(curves.frames, curves.times_ms, curves.lv_ml, curves.rv_ml):
            rows.append(
                {"record": "curve", "frame": f, "time_ms": t, "LV_ml": lv, "RV_ml": rv, "phase": marks.get(f, "")}
            )
    if wall is not None:
        for k, (t, g) in enumerate(zip(wall.thickness_mm, wall.thickening_pct)):
            rows.append(
                {
                    "record": "wall",
                    "segment": k + 1,
                    "segment_name": AHA_NAMES[k],
                    "ED_thickness_mm": t,
                    "thickening_pct": g,
                }
            )
    return rows


# ---------------------------------------------------------------------------------------------
# the layout


def _view_nodes(scene, cls: str) -> List[object]:
    collection = scene.GetNodesByClass(cls)
    return [collection.GetItemAsObject(i) for i in range(collection.GetNumberOfItems())]


def show_in_layout(scene, nodes: CineNodes) -> bool:
    """Switch the layout to one with a plot view (and a table view when there is a wall table) and
    show the chart (and the table) there. Returns False when there is no chart to show."""
    import slicer

    if nodes.chart is None:
        return False
    layout = scene.GetFirstNodeByClass("vtkMRMLLayoutNode")
    if layout is not None:
        current = layout.GetViewArrangement()
        wanted = (
            layout.SlicerLayoutFourUpPlotTableView
            if nodes.wall is not None
            else slicer.vtkSlicerPlotsLogic.GetLayoutWithPlot(current)
        )
        if current != wanted:
            layout.SetViewArrangement(wanted)
    for view in _view_nodes(scene, "vtkMRMLPlotViewNode"):
        view.SetPlotChartNodeID(nodes.chart.GetID())
    if nodes.wall is not None:
        for view in _view_nodes(scene, "vtkMRMLTableViewNode"):
            view.SetTableNodeID(nodes.wall.GetID())
    return True
