"""A cine's volume curves (a plot chart over a table) and 16-segment wall thickness table, on real
MRML (PyPI slicer-core): read from a ``curves.csv`` and ``subjects.csv`` with the engine's own
columns, or the curves from the segmented frames' reports; updated in place by a re-run; shown in
the layout's plot and table views; exported with the cine review."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import slicer_core

slicer = slicer_core()

from CARDSegmentLib.cine import curves as cc  # noqa: E402
from CARDSegmentLib.cine import results as cine_results  # noqa: E402
from CARDSegmentLib.cine import sequences as seqs  # noqa: E402
from CARDSegmentLib.outputs.nodes import OutputNodes  # noqa: E402
from CARDSegmentLib.panel.logic import ModuleLogic  # noqa: E402

FRAMES = 6
LV = (140.0, 120.0, 80.0, 60.0, 90.0, 130.0)
RV = (150.0, 128.0, 90.0, 70.0, 100.0, 141.0)
THICKNESS = tuple(7.0 + 0.25 * k for k in range(16))


class NullTimer:
    def setInterval(self, ms):
        pass

    def connect(self, signal, slot):
        pass

    def start(self):
        pass

    def stop(self):
        pass


def frame_volume(value: float):
    import vtk

    image = vtk.vtkImageData()
    image.SetDimensions(8, 8, 6)
    image.AllocateScalars(vtk.VTK_SHORT, 1)
    image.GetPointData().GetScalars().Fill(value)
    volume = slicer.vtkMRMLScalarVolumeNode()
    volume.SetAndObserveImageData(image)
    volume.SetSpacing(1.5, 1.5, 8.0)
    return volume


def make_cine(frames: int = FRAMES, name: str = "5: SAX cine"):
    scene = slicer.vtkMRMLScene()
    scene.RegisterNodeClass(slicer.vtkMRMLSequenceNode())
    scene.RegisterNodeClass(slicer.vtkMRMLSequenceBrowserNode())
    sequence = scene.AddNewNodeByClass("vtkMRMLSequenceNode", name)
    sequence.SetIndexName("time")
    sequence.SetIndexUnit("ms")
    for i in range(frames):
        sequence.SetDataNodeAtValue(frame_volume(i), str(40 * i))
    browser = scene.AddNewNodeByClass("vtkMRMLSequenceBrowserNode", f"{name} browser")
    browser.SetAndObserveMasterSequenceNodeID(sequence.GetID())
    seqs.sequences_logic(scene).UpdateProxyNodesFromSequences(browser)
    proxy = browser.GetProxyNode(sequence)
    proxy.SetName(name)
    return SimpleNamespace(
        scene=scene, sequence=sequence, browser=browser, proxy=proxy, cine=seqs.cine_of(scene, proxy)
    )


def write_curves(path: Path, lv=LV, rv=RV, ed=0, es=3, subject="cine") -> Path:
    """A ``curves.csv`` with the engine's columns (cardseg.cohort.cine_tables.CURVE_COLUMNS)."""
    from cardseg.cohort.cine_tables import CURVE_COLUMNS

    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CURVE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for k, (a, b) in enumerate(zip(lv, rv)):
            phase = "ED" if k == ed else "ES" if k == es else ""
            writer.writerow(
                {"subject": subject, "frame": k, "time_ms": 40.0 * k, "LV_ml": a, "RV_ml": b, "phase": phase}
            )
    return path


def write_subjects(path: Path, thickness=THICKNESS, wall: bool = True, mean=31.5) -> Path:
    """A ``subjects.csv`` row of the sequence with (``wall``) the engine's wall columns
    (cardseg.cohort.cine_tables.WALL_COLUMNS; segment 16 left unmeasured)."""
    from cardseg.cohort.cine_tables import WALL_COLUMNS

    row = {"subject": "cine", "ed_frame": 0, "es_frame": 3, "LVEF": 57.1, "error": ""}
    if wall:
        row.update({f"WT_seg{k}_mm": t for k, t in enumerate(thickness[:15], start=1)})
        row.update(WT_seg16_mm="", WT_max_mm=max(thickness[:15]), WT_thickening_mean_pct=mean)
    columns = list(row) + ([c for c in WALL_COLUMNS if c not in row] if wall else [])
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n", restval="")
        writer.writeheader()
        writer.writerow(row)
    return path


def engine_folder(tmp_path: Path, wall: bool = True, **curves) -> Path:
    folder = tmp_path / "out"
    folder.mkdir(exist_ok=True)
    write_curves(folder / "curves.csv", **curves)
    write_subjects(folder / "subjects.csv", wall=wall)
    return folder


def column(table_node, name):
    arr = table_node.GetTable().GetColumnByName(name)
    return [arr.GetValue(i) for i in range(arr.GetNumberOfValues())]


def count(scene, cls):
    return scene.GetNodesByClass(cls).GetNumberOfItems()


def show(c, tables):
    return cc.show_cine_tables(c.scene, c.proxy, tables, c.cine.name, c.cine.frame_label)


# ---------------------------------------------------------------------------------------------
# the engine's files


def test_the_nodes_hold_the_files_values(tmp_path):
    c = make_cine()
    tables = cc.read_cine_tables(engine_folder(tmp_path), "cine")
    assert tables.curves_note == "" and tables.wall_note == ""
    nodes = show(c, tables)
    assert column(nodes.curves, "frame") == list(range(FRAMES))
    assert column(nodes.curves, "LV_ml") == list(LV) and column(nodes.curves, "RV_ml") == list(RV)
    assert column(nodes.curves, "x") == [40.0 * k for k in range(FRAMES)]  # the times: every frame has one
    assert column(nodes.curves, "phase") == ["ED", "", "", "ES", "", ""]
    assert column(nodes.marks, "phase") == ["ED", "ES"] and column(nodes.marks, "LV_ml") == [LV[0], LV[3]]
    # the chart: LV and RV lines over the curves table, their ED and ES points over the marks table
    chart = nodes.chart
    series = [chart.GetNthPlotSeriesNode(i) for i in range(chart.GetNumberOfPlotSeriesNodes())]
    assert [(s.GetTableNodeID(), s.GetYColumnName()) for s in series] == [
        (nodes.curves.GetID(), "LV_ml"),
        (nodes.marks.GetID(), "LV_ml"),
        (nodes.curves.GetID(), "RV_ml"),
        (nodes.marks.GetID(), "RV_ml"),
    ]
    assert [s.GetMarkerStyle() == s.MarkerStyleNone for s in series] == [True, False, True, False]
    assert chart.GetXAxisTitle() == "time (ms)" and "ED frame 0 (0 ms), ES frame 3 (120 ms)" in chart.GetTitle()
    # the wall table: 16 AHA segments, ED thickness as written (segment 16 unmeasured), no per-segment thickening
    wall = nodes.wall
    assert column(wall, "segment") == list(range(1, 17))
    assert column(wall, "name")[0] == "basal anterior" and column(wall, "name")[13] == "apical septal"
    assert column(wall, "ED_thickness_mm")[:15] == list(THICKNESS[:15]) and math.isnan(
        column(wall, "ED_thickness_mm")[15]
    )
    assert all(math.isnan(v) for v in column(wall, "thickening_pct"))
    held = cc.read_wall_table(wall)
    assert held.max_mm == max(THICKNESS[:15]) and held.mean_thickening_pct == 31.5 and (held.ed, held.es) == (0, 3)
    lines = cc.tables_lines(nodes)
    assert lines[0] == "Volume curves: LV and RV over 6 frames, from the engine's curves.csv."
    assert lines[1] == "Wall thickness at ED (16 AHA segments): max 10.5 mm; mean systolic thickening 31.5 %."


def test_a_per_segment_thickening_column_fills_the_tables_thickening(tmp_path):
    folder = engine_folder(tmp_path)
    path = folder / "subjects.csv"
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    for k in range(1, 17):
        rows[0][f"WT_thickening_seg{k}_pct"] = 20.0 + k
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    nodes = show(make_cine(), cc.read_cine_tables(folder, "cine"))
    assert column(nodes.wall, "thickening_pct") == [20.0 + k for k in range(1, 17)]


def test_a_rerun_updates_the_same_nodes(tmp_path):
    c = make_cine()
    first = show(c, cc.read_cine_tables(engine_folder(tmp_path), "cine"))
    before = {cls: count(c.scene, cls) for cls in ("vtkMRMLTableNode", "vtkMRMLPlotChartNode", "vtkMRMLPlotSeriesNode")}
    assert before == {"vtkMRMLTableNode": 3, "vtkMRMLPlotChartNode": 1, "vtkMRMLPlotSeriesNode": 4}
    again = show(c, cc.read_cine_tables(engine_folder(tmp_path, lv=[v + 5 for v in LV], ed=5, es=2), "cine"))
    assert {cls: count(c.scene, cls) for cls in before} == before  # no duplicates
    assert (again.curves.GetID(), again.chart.GetID(), again.wall.GetID()) == (
        first.curves.GetID(),
        first.chart.GetID(),
        first.wall.GetID(),
    )
    assert column(again.curves, "LV_ml") == [v + 5 for v in LV] and column(again.marks, "frame") == [5, 2]
    assert again.chart.GetNumberOfPlotSeriesNodes() == 4
    # another input's nodes are its own
    other = c.scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "other")
    cc.show_cine_tables(c.scene, other, cc.read_cine_tables(engine_folder(tmp_path), "cine"), "other")
    assert count(c.scene, "vtkMRMLPlotChartNode") == 2 and cc.cine_nodes(c.scene, c.proxy).chart is again.chart
    assert cc.remove_cine_tables(c.scene, c.proxy) == 8 and cc.cine_nodes(c.scene, c.proxy).curves is None


def test_a_cine_without_thickness_columns_shows_no_table_and_says_why(tmp_path):
    c = make_cine()
    show(c, cc.read_cine_tables(engine_folder(tmp_path), "cine"))  # an earlier run had a wall table
    tables = cc.read_cine_tables(engine_folder(tmp_path, wall=False), "cine")
    assert tables.wall is None and "no WT_seg1_mm..WT_seg16_mm columns" in tables.wall_note
    nodes = show(c, tables)
    assert nodes.wall is None and nodes.curves is not None
    assert count(c.scene, "vtkMRMLTableNode") == 2  # the curves and their ED/ES points
    assert cc.tables_lines(nodes)[1] == (
        "No wall thickness table: subjects.csv has no WT_seg1_mm..WT_seg16_mm columns (no wall thickness was measured)."
    )
    missing = cc.read_cine_tables(tmp_path / "nothing", "cine")
    assert missing.curves is None and missing.wall is None
    assert missing.curves_note == "the run wrote no curves.csv" and missing.wall_note.startswith(
        "the run wrote no subjects.csv"
    )


# ---------------------------------------------------------------------------------------------
# the Logic: curves from the frames' reports after a run, the layout, the export


def record_reports(c, frames):
    """Record a segmentation and a report.json (its LV and RV class volumes) per frame, as a run does."""
    made = {}
    for f in frames:
        report = c.scene.AddNewNodeByClass("vtkMRMLTextNode", f"report {f}")
        report.SetText(json.dumps({"class_volumes_ml": {"LV": LV[f], "RV": RV[f], "MYO": 100.0}}))
        segmentation = c.scene.AddNewNodeByClass("vtkMRMLSegmentationNode", f"segmentation {f}")
        made[f] = OutputNodes(segmentation=segmentation, report=report)
    seqs.record_frames(c.scene, c.cine, c.proxy, made)


def logic_for(c):
    return ModuleLogic("", lambda: c.scene, NullTimer, lambda: __import__("contextlib").nullcontext())


def add_views(scene):
    layout = scene.AddNewNodeByClass("vtkMRMLLayoutNode")
    layout.SetViewArrangement(layout.SlicerLayoutConventionalView)
    plot = scene.AddNewNodeByClass("vtkMRMLPlotViewNode")
    table = scene.AddNewNodeByClass("vtkMRMLTableViewNode")
    return layout, plot, table


def test_after_a_run_without_curves_csv_the_curves_come_from_the_frames_reports(tmp_path):
    c = make_cine()
    logic = logic_for(c)
    assert logic.cineTablesText(c.proxy) == ""  # nothing segmented: no line
    record_reports(c, [2])
    nodes = logic.updateCineTables(c.proxy)
    assert nodes.curves is None and nodes.chart is None
    assert logic.cineTablesText(c.proxy) == "No volume curves: fewer than two frames are segmented."
    assert not logic.showCineCurves(c.proxy)
    record_reports(c, range(FRAMES))
    nodes = logic.updateCineTables(c.proxy)
    assert column(nodes.curves, "LV_ml") == list(LV) and column(nodes.curves, "RV_ml") == list(RV)
    assert column(nodes.curves, "time_ms") == [40.0 * k for k in range(FRAMES)]
    held = cc.read_curves_table(nodes.curves)
    assert (held.ed, held.es) == (0, 3) and held.source == cc.FROM_REPORTS  # the engine's rule: largest, smallest LV
    assert nodes.wall is None
    assert logic.cineTablesText(c.proxy).splitlines() == [
        "Volume curves: LV and RV over 6 frames, from the frames' segmentations.",
        "No wall thickness table: this run measured no wall thickness.",
    ]
    # the run's folder (what CineJob would read): its wall table; then a run without one keeps it
    # while its ED and ES frames keep their indices, and drops it when they have none
    tables = cc.read_cine_tables(engine_folder(tmp_path), "cine", ed=0, es=3)
    assert logic.updateCineTables(c.proxy, tables).wall is not None
    assert logic.updateCineTables(c.proxy).wall is None  # no indices table in this scene
    logic.updateCineTables(c.proxy, tables)
    indices = cine_results.make_indices_table(
        c.scene, c.proxy, {"ed": 0, "es": 3, "nominal": 0.9, "error": "", "indices": []}, c.cine.name
    )
    assert indices is not None and logic.updateCineTables(c.proxy).wall is not None


def test_the_chart_and_wall_table_go_to_the_layouts_views(tmp_path):
    c = make_cine()
    layout, plot, table = add_views(c.scene)
    logic = logic_for(c)
    record_reports(c, range(FRAMES))
    logic.updateCineTables(c.proxy)
    assert layout.GetViewArrangement() == layout.SlicerLayoutConventionalView  # nothing shown until asked
    assert logic.showCineCurves(c.proxy)
    nodes = cc.cine_nodes(c.scene, c.proxy)
    assert layout.GetViewArrangement() == layout.SlicerLayoutConventionalPlotView
    assert plot.GetPlotChartNodeID() == nodes.chart.GetID() and table.GetTableNodeID() is None
    logic.updateCineTables(c.proxy, cc.read_cine_tables(engine_folder(tmp_path), "cine"))
    assert logic.showCineCurves(c.proxy)
    assert layout.GetViewArrangement() == layout.SlicerLayoutFourUpPlotTableView
    assert table.GetTableNodeID() == cc.cine_nodes(c.scene, c.proxy).wall.GetID()


def test_the_cine_review_export_has_the_curves_and_the_wall(tmp_path):
    c = make_cine()
    show(c, cc.read_cine_tables(engine_folder(tmp_path), "cine"))
    path = cine_results.export_cine_review(c.scene, c.proxy, {}, tmp_path / "review.csv")
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    curve = [r for r in rows if r["record"] == "curve"]
    assert [float(r["LV_ml"]) for r in curve] == list(LV) and [r["phase"] for r in curve][:4] == ["ED", "", "", "ES"]
    wall = [r for r in rows if r["record"] == "wall"]
    assert [int(r["segment"]) for r in wall] == list(range(1, 17))
    assert float(wall[2]["ED_thickness_mm"]) == THICKNESS[2] and wall[2]["segment_name"] == "basal inferoseptal"
    doc = json.loads(cine_results.export_cine_review(c.scene, c.proxy, {}, tmp_path / "review.json").read_text())
    assert doc["curves"]["lv_ml"] == list(LV) and (doc["curves"]["ed"], doc["curves"]["es"]) == (0, 3)
    assert doc["wall"]["segments"][15]["ED_thickness_mm"] is None and doc["wall"]["mean_thickening_pct"] == 31.5


# ---------------------------------------------------------------------------------------------
# the panel


@pytest.fixture
def panel(module, monkeypatch):
    from test_slicer_module_panel import FakeWidget, make_widget

    c = make_cine()
    add_views(c.scene)
    monkeypatch.setattr(slicer, "mrmlScene", c.scene)
    widget = make_widget(module, c.proxy)
    for name in ("cineTablesLabel", "cineCurvesButton", "combineSeriesButton"):
        setattr(widget.ui, name, FakeWidget())
    return SimpleNamespace(c=c, widget=widget)


from test_slicer_module_panel import module  # noqa: E402,F401  (a fixture)


def test_the_panel_shows_the_curves_when_a_cine_run_finishes(panel):
    c, widget = panel.c, panel.widget
    record_reports(c, range(FRAMES))
    widget._onFinished("loaded", None)  # what the Logic calls when the run's results are loaded
    nodes = cc.cine_nodes(c.scene, c.proxy)
    plot = c.scene.GetFirstNodeByClass("vtkMRMLPlotViewNode")
    assert nodes.chart is not None and plot.GetPlotChartNodeID() == nodes.chart.GetID()
    assert widget.ui.cineTablesLabel.text.startswith("Volume curves: LV and RV over 6 frames")
    assert widget.ui.cineCurvesButton.visible and not widget.ui.combineSeriesButton.visible
    plot.SetPlotChartNodeID(None)
    widget.onShowCineCurves()  # the user asks again
    assert plot.GetPlotChartNodeID() == nodes.chart.GetID()
