"""Issue 24's defects of the module panel (CARDSegment.py with CARDSegmentLib.panel.gui), each driven
through the real module file with the stand-ins of test_slicer_module_panel (real MRML scene,
real job and loading; fake Qt, fake process)."""

from __future__ import annotations

import types

import pytest

from test_slicer_module_panel import (
    FakeWidget,
    CopyingProcess,
    fire_until_idle,  # noqa: F401
    load_volume,
    make_widget,
    slicer,
)
from test_slicer_module_panel import finished_run, module  # noqa: F401  (fixtures)

import CARDSegmentLib as lib  # noqa: E402  (on sys.path through test_slicer_module_panel)
from CARDSegmentLib.panel import gui as panel  # noqa: E402


@pytest.fixture
def observed(monkeypatch):
    """Widgets whose scene observers the test adds (as setup() does); removed after the test."""
    import contextlib

    widgets = []

    @contextlib.contextmanager
    def error_display(message, waitCursor=False):
        try:
            yield
        except Exception as exc:  # what Slicer's tryWithErrorDisplay shows in a dialog
            slicer.util.errorDisplay(f"{message} {exc}")

    monkeypatch.setattr(slicer.util, "tryWithErrorDisplay", error_display)

    def observe(widget):
        scene = slicer.mrmlScene
        widget.addObserver(scene, scene.NodeRemovedEvent, widget.onNodeRemoved)
        widget.addObserver(scene, scene.EndBatchProcessEvent, widget.onEndBatchProcess)
        widgets.append(widget)
        return widget

    yield observe
    for widget in widgets:
        widget.removeObservers()


def ran_widget(module, nifti, finished_run, observed):
    """``(widget, volume, outputs)`` after a run through an entered, observed panel."""
    scene = slicer.mrmlScene
    volume = load_volume(scene, nifti)
    widget, _ = entered_widget(module, volume, finished_run)
    observed(widget)
    run_through_panel(module, widget)
    return widget, volume, lib.find_outputs(scene, volume)


def run_through_panel(module, widget):
    widget.logic.ensureDependencies = lambda askConfirmation=True: None
    widget.onApplyButton()
    fire_until_idle(module, widget)
    assert widget.ui.statusLabel.text.startswith("Done"), widget.ui.statusLabel.text


def composite_state(scene):
    from CARDSegmentLib.outputs.views import slice_composite_nodes

    return [
        (c.GetBackgroundVolumeID(), c.GetForegroundVolumeID(), c.GetForegroundOpacity())
        for c in slice_composite_nodes(scene)
    ]


def set_views(scene, background, foreground, opacity):
    from CARDSegmentLib.outputs.views import slice_composite_nodes

    for c in slice_composite_nodes(scene):
        c.SetBackgroundVolumeID(background)
        c.SetForegroundVolumeID(foreground)
        c.SetForegroundOpacity(opacity)


def entered_widget(module, volume, finished_run):
    """A widget whose Logic hands back one parameter node (as the scene's singleton would)."""
    widget = make_widget(module, volume)
    widget.logic.launcher = CopyingProcess(finished_run)
    p = widget._parameterNode
    widget.logic.getParameterNode = lambda: p
    return widget, p


# ---------------------------------------------------------------------------------------------
# defect 7: removed outputs leave the panel


@pytest.mark.parametrize("removed", ["review", "segmentation", "report", "all"])
def test_removing_the_outputs_clears_the_review_table(module, rotated_nifti, finished_run, removed, observed):
    scene = slicer.mrmlScene
    widget, volume, outputs = ran_widget(module, rotated_nifti, finished_run, observed)
    rows = len(lib.review_rows(outputs.review))
    assert rows and widget.ui.regionsTable.called("setRowCount")[-1] == (rows,)
    doomed = outputs.nodes() if removed == "all" else [getattr(outputs, removed)]
    for node in doomed:
        scene.RemoveNode(node)
    if removed in ("review", "all"):
        assert widget.ui.regionsTable.called("setRowCount")[-1] == (0,)
        assert not widget.ui.exportButton.enabled
    if removed in ("segmentation", "all"):
        assert not widget.ui.keepResultsButton.enabled
    # a click on a row the table still showed: no error dialog, the table is refreshed
    widget._selectedRegion = lambda: (None, 1)  # (frame, region): a plain volume has no frame
    widget.onRegionSelected()
    assert not module.dialogs.errors


def test_removing_an_unrelated_node_does_not_refresh(module, rotated_nifti, finished_run, observed):
    scene = slicer.mrmlScene
    volume = load_volume(scene, rotated_nifti)
    other = scene.AddNewNodeByClass("vtkMRMLTableNode", "other")
    widget, _ = entered_widget(module, volume, finished_run)
    observed(widget)
    run_through_panel(module, widget)
    before = len(widget.ui.regionsTable.called("setRowCount"))
    scene.RemoveNode(other)
    assert len(widget.ui.regionsTable.called("setRowCount")) == before


# ---------------------------------------------------------------------------------------------
# defect 3: a double click does not start and cancel


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def endless_launcher():
    class Endless(CopyingProcess):
        def __call__(self, argv, env, cwd):
            self.code = None
            return self

        def returncode(self):
            return self.code

    return Endless(None)


@pytest.mark.parametrize("gap", [0.0, 0.1, 0.39])
def test_a_double_click_starts_and_does_not_cancel(module, rotated_nifti, gap):
    volume = load_volume(slicer.mrmlScene, rotated_nifti)
    widget = make_widget(module, volume)
    clock = Clock()
    widget._clickGuard = lib.ClickGuard(0.4, clock=clock)
    widget.logic.ensureDependencies = lambda askConfirmation=True: None
    widget.logic.launcher = fake = endless_launcher()
    widget.onApplyButton()
    clock.now += gap
    widget.onApplyButton()  # the second click of the double click lands on "Cancel"
    assert widget.logic.isRunning and fake.code is None
    assert widget.ui.applyButton.text == "Cancel"
    clock.now += 0.5
    widget.onApplyButton()  # a deliberate click later cancels
    assert not widget.logic.isRunning and widget.logic.waitForBackground(10) and fake.code == -9


def test_the_click_guard_uses_the_interval_it_is_given():
    clock = Clock()
    guard = panel.ClickGuard(0.5, clock=clock)
    assert guard.accepts()
    guard.changed()
    for dt, ok in ((0.0, False), (0.49, False), (0.5, True), (3.0, True)):
        clock.now = 100.0 + dt
        assert guard.accepts() is ok


# ---------------------------------------------------------------------------------------------
# defect 1: entering the module leaves the slice views alone


def test_entering_the_module_does_not_touch_the_slice_views(module, rotated_nifti, finished_run):
    scene = slicer.mrmlScene
    volume = load_volume(scene, rotated_nifti)
    other = load_volume(scene, rotated_nifti, "other")
    widget, p = entered_widget(module, volume, finished_run)
    widget.enter()
    run_through_panel(module, widget)
    outputs = lib.find_outputs(scene, volume)
    assert composite_state(scene)[0][1] == outputs.disagreement.GetID()  # the run showed its overlay
    set_views(scene, other.GetID(), None, 0.0)  # the user looks at something else meanwhile
    expected = composite_state(scene)
    for _ in range(2):
        widget.exit()
        widget.enter()
        assert composite_state(scene) == expected
    p.overlay = module.Overlay.TEMPERATURE  # the user asks: now the views change
    widget._onParameterNodeModified()
    assert {s[1] for s in composite_state(scene)} == {outputs.temperature.GetID()}


# ---------------------------------------------------------------------------------------------
# defect 2: connectGui's missing tag on Slicer 5.8


class NamedWidget(FakeWidget):
    def property(self, name):
        return self.__dict__.get("parameterName") if name == "SlicerParameterName" else None


def test_entering_and_leaving_keeps_one_set_of_bindings(module):
    widget = make_widget(module)
    widget.ui.deviceComboBox = NamedWidget(parameterName="device")
    widget.ui.overlayComboBox = NamedWidget(parameterName="overlay")
    p = widget._parameterNode
    widget.logic.getParameterNode = lambda: p
    widget._parameterNode = None
    for _ in range(3):
        widget.enter()
        assert len(p.guis) == 1
        assert p.guis[widget._parameterNodeGuiTag] == {
            "device": widget.ui.deviceComboBox,
            "overlay": widget.ui.overlayComboBox,
        }
        widget.exit()
        assert p.guis == {}


# ---------------------------------------------------------------------------------------------
# defect 9: the default input


def _volume(scene, cls, name, components=1, dims=(8, 8, 3)):
    import vtk

    node = scene.AddNewNodeByClass(cls, name)
    image = vtk.vtkImageData()
    image.SetDimensions(*dims)
    image.AllocateScalars(vtk.VTK_FLOAT, components)
    node.SetAndObserveImageData(image)
    return node


def test_the_default_input_is_the_first_plain_volume(module):
    scene = slicer.mrmlScene
    _volume(scene, "vtkMRMLLabelMapVolumeNode", "labels")
    _volume(scene, "vtkMRMLVectorVolumeNode", "rgb", components=3)
    overlay = _volume(scene, "vtkMRMLScalarVolumeNode", "cine CARD disagreement")
    overlay.SetAttribute(lib.ROLE_ATTRIBUTE, "disagreement")
    kept = _volume(scene, "vtkMRMLScalarVolumeNode", "kept CARD temperature")
    kept.SetAttribute("CARDSegment.Bundle", "acdc")  # a kept output loses its role, not its bundle
    scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "empty")  # no image data
    _volume(scene, "vtkMRMLScalarVolumeNode", "line", dims=(8, 1, 1))
    assert panel.default_input(scene) is None
    cine = _volume(scene, "vtkMRMLScalarVolumeNode", "cine")
    _volume(scene, "vtkMRMLScalarVolumeNode", "later")
    assert panel.default_input(scene) is cine
    widget = make_widget(module)
    p = widget._parameterNode
    widget.logic.getParameterNode = lambda: p
    widget.enter()
    assert p.inputVolume is cine


# ---------------------------------------------------------------------------------------------
# defect 4: the export's default file name

WINDOWS_FORBIDDEN = set('<>:"/\\|?*') | {chr(c) for c in range(32)}


@pytest.mark.parametrize(
    "name",
    [
        "7: SAX cine",
        'a<b>c"d/e\\f|g?h*i',
        "cine\tES\n",
        "CON",
        "nul.cine",
        "...",
        "",
        "  : ",
        "séquence cine",
        "x" * 400,
        "trailing. ",
    ],
)
def test_export_file_names_are_valid_everywhere(name):
    out = panel.safe_file_name(name)
    assert out and not (set(out) & WINDOWS_FORBIDDEN)
    assert not out.endswith((".", " ")) and len(out) <= 120
    assert out.split(".")[0].upper() not in panel._RESERVED


def test_the_export_dialog_proposes_a_valid_name(module, rotated_nifti, finished_run, monkeypatch):
    scene = slicer.mrmlScene
    volume = load_volume(scene, rotated_nifti, "7: SAX cine")
    widget, _ = entered_widget(module, volume, finished_run)
    run_through_panel(module, widget)
    proposed = []
    qt = module.qt
    monkeypatch.setattr(qt, "QDir", types.SimpleNamespace(homePath=lambda: "/home/u"), raising=False)
    monkeypatch.setattr(
        qt,
        "QFileDialog",
        types.SimpleNamespace(getSaveFileName=lambda parent, title, default, filters: proposed.append(default) or ""),
        raising=False,
    )
    monkeypatch.setattr(slicer.util, "mainWindow", lambda: None)
    widget.onExportButton()
    assert proposed == ["/home/u/7_ SAX cine-CARD-review.csv"]


# ---------------------------------------------------------------------------------------------
# defect 12: elapsed time shown


@pytest.mark.parametrize(
    "seconds,text", [(None, ""), (-1, ""), (0.4, "0 s"), (42, "42 s"), (185, "3 min 05 s"), (3725, "1 h 02 min")]
)
def test_elapsed_text(seconds, text):
    assert panel.elapsed_text(seconds) == text


def test_the_panel_says_how_long_the_run_took(module, rotated_nifti, finished_run):
    volume = load_volume(slicer.mrmlScene, rotated_nifti)
    widget, _ = entered_widget(module, volume, finished_run)
    run_through_panel(module, widget)
    run = widget.logic.job.run
    assert run.started_at is not None and run.finished_at >= run.started_at
    assert widget.ui.statusLabel.text == f"Done in {panel.elapsed_text(run.finished_at - run.started_at)}."


# ---------------------------------------------------------------------------------------------
# defects 10 and 11: the self-test cleans up, skips and fails as it should

import os  # noqa: E402
import unittest  # noqa: E402

from CARDSegmentLib.install import dependencies  # noqa: E402

from CARDSegmentLib.runs import jobs  # noqa: E402

from CARDSegmentLib.panel import selftest  # noqa: E402


class Case(unittest.TestCase):
    def runTest(self):
        pass

    def delayDisplay(self, message, msec=1000):
        pass


def test_the_self_test_skips_when_the_packages_are_missing(monkeypatch):
    monkeypatch.setattr(dependencies, "missing_requirements", lambda: [dependencies.requirement("torch")])
    with pytest.raises(unittest.SkipTest, match="torch"):
        selftest.require_packages(Case())
    monkeypatch.setattr(dependencies, "missing_requirements", lambda: [])
    selftest.require_packages(Case())  # nothing missing: the test goes on


def test_the_module_test_methods_skip_rather_than_return(module, monkeypatch):
    monkeypatch.setattr(dependencies, "missing_requirements", lambda: [dependencies.requirement("monai")])
    test = module.CARDSegmentTest()
    for method in (test.test_segment_synthetic_volume, test.test_shipped_bundle, test.runTest):
        with pytest.raises(unittest.SkipTest):
            method()


def test_the_shipped_bundle_test_fails_without_the_shipped_bundle(tmp_path):
    with pytest.raises(AssertionError, match="install rules"):
        selftest.segment_with_shipped_bundle(Case(), make_logic=None, load_volume=None, module_dir=str(tmp_path))


def test_the_self_tests_folders_are_deleted_when_the_test_ends():
    case = Case()
    folder = selftest.work_folder(case)
    os.makedirs(os.path.join(folder, "bundle"))
    with open(os.path.join(folder, "bundle", "weights.bin"), "wb") as f:
        f.write(b"x" * 10)
    assert os.path.isdir(folder) and os.path.basename(folder).startswith("CARDSegmentTest-")
    case.doCleanups()
    assert not os.path.exists(folder)


def test_a_temporary_folder_that_cannot_be_deleted_is_reported(tmp_path, monkeypatch, caplog):
    folder = tmp_path / "CARDSegment-x"
    (folder / "output").mkdir(parents=True)
    (folder / "output" / "report.json").write_text("{}")
    real_rmdir = os.rmdir

    def refuse(path, *args, **kwargs):
        if str(path).endswith("output") or str(path) == str(folder):
            raise PermissionError(13, "Permission denied", str(path))
        return real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", refuse)
    with caplog.at_level("WARNING"):
        message = jobs.remove_tree(folder)
    assert message and str(folder) in message and "Permission denied" in message
    assert any(str(folder) in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(os, "rmdir", real_rmdir)
    job = jobs.SegmentationJob(None, None)
    job.work_dir = folder
    job.cleanup()  # now it can: gone, nothing logged
    assert not folder.exists() and jobs.remove_tree(folder) is None


# ---------------------------------------------------------------------------------------------
# defect 6: every segment's terminology entry names a terminology Slicer has loaded

from pathlib import Path  # noqa: E402

from CARDSegmentLib.outputs import terminology  # noqa: E402

MODULE_DIR = Path(__file__).resolve().parents[2] / "CARDSegment"
#: (category, type) codes of Slicer's DICOM master list used here, read in the
#: SegmentationCategoryTypeModifier-DICOM-Master.json of Slicer v5.8.1, v5.10.0 and main
DICOM_MASTER_TYPES = {("123037004", "87878005"), ("123037004", "53085002")}


def _codes_in(logic, context):
    codes = set()
    category, kind = slicer.vtkSlicerTerminologyCategory(), slicer.vtkSlicerTerminologyType()
    for c in range(logic.GetNumberOfCategoriesInTerminology(context)):
        logic.GetNthCategoryInTerminology(context, c, category)
        for t in range(logic.GetNumberOfTypesInTerminologyCategory(context, category)):
            logic.GetNthTypeInTerminologyCategory(context, category, t, kind)
            codes.add((category.GetCodeValue(), kind.GetCodeValue()))
    return codes


@pytest.mark.parametrize("name", sorted(terminology.CARDIAC_TYPES))
def test_each_class_has_a_terminology_entry_that_slicer_can_resolve(name):
    logic = slicer.vtkSlicerTerminologiesModuleLogic()
    assert terminology.register_module_terminology(logic, str(MODULE_DIR))
    assert terminology.register_module_terminology(logic, str(MODULE_DIR))  # a second call loads nothing twice
    entry = slicer.vtkSlicerTerminologyEntry()
    assert logic.DeserializeTerminologyEntry(terminology.segment_terminology(name), entry)
    codes = (entry.GetCategoryObject().GetCodeValue(), entry.GetTypeObject().GetCodeValue())
    context = entry.GetTerminologyContextName()
    if context == terminology.MODULE_CONTEXT:
        assert codes in _codes_in(logic, context)
    else:
        assert context == terminology.TERMINOLOGY_CONTEXT and codes in DICOM_MASTER_TYPES


def test_a_terminology_file_that_does_not_load_is_reported(tmp_path, caplog):
    logic = slicer.vtkSlicerTerminologiesModuleLogic()
    with caplog.at_level("WARNING"):
        assert not terminology.register_module_terminology(logic, str(tmp_path))
    assert "CARDSegment.term.json" in caplog.text
    assert terminology.register_module_terminology(None, str(MODULE_DIR)) is False  # outside Slicer


def test_clearing_the_table_selection_clears_the_regions_highlight(module, rotated_nifti, finished_run, observed):
    """A selected row highlights its region's outline; a cleared selection (no row) leaves every
    region as loaded, with the decision buttons off."""
    from CARDSegmentLib.outputs.region_outlines import SELECTED_ATTRIBUTE

    widget, volume, outputs = ran_widget(module, rotated_nifti, finished_run, observed)
    region = lib.review_rows(outputs.review)[0]["region"]
    widget._selectedRegion = lambda: (None, region)
    widget.onRegionSelected()
    assert outputs.regions.GetAttribute(SELECTED_ATTRIBUTE) == str(region) and widget.ui.acceptButton.enabled
    widget._selectedRegion = lambda: None
    widget.onRegionSelected()
    assert outputs.regions.GetAttribute(SELECTED_ATTRIBUTE) is None and not widget.ui.acceptButton.enabled
    assert not module.dialogs.errors


# ---------------------------------------------------------------------------------------------
# segmenting again: the old outputs go in one batch, and the panel refreshes once for them


def test_segmenting_again_refreshes_the_panel_once_not_per_removed_node(module, rotated_nifti, finished_run, observed):
    scene = slicer.mrmlScene
    widget, volume, first = ran_widget(module, rotated_nifti, finished_run, observed)
    old = [n.GetID() for n in first.nodes()]
    calls = []
    real = widget.refreshResults
    widget.refreshResults = lambda table=True: calls.append(table) or real(table)
    run_through_panel(module, widget)
    assert all(scene.GetNodeByID(i) is None for i in old)  # the earlier outputs were replaced
    assert len(old) >= 5 and len(calls) <= 2, (len(old), calls)
