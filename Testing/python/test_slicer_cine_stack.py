"""A study's short-axis series of one slice each combined into one cine, on real MRML (PyPI
slicer-core): single-slice sequences found for the panel's input, checked (frame count,
orientation, in-plane grid, even spacing; a refusal names the series) and stacked into a sequence
of 3-D volumes with the right geometry and voxels."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import slicer_core

slicer = slicer_core()

from CARDSegmentLib.cine import sequences as seqs  # noqa: E402
from CARDSegmentLib.cine import stack  # noqa: E402
from CARDSegmentLib.outputs.geometry import ijk_to_ras, image_dimensions, vtk_matrix  # noqa: E402
from CARDSegmentLib.panel.logic import ModuleLogic  # noqa: E402

COLS, ROWS, FRAMES = 5, 4, 4
SPACING = (1.5, 1.25)


def rotation(angle_deg: float = 30.0) -> np.ndarray:
    """An oblique orientation: columns the row (I), column (J) and normal directions in RAS."""
    a = np.radians(angle_deg)
    about_x = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    about_z = np.array([[np.cos(a / 2), -np.sin(a / 2), 0], [np.sin(a / 2), np.cos(a / 2), 0], [0, 0, 1]])
    return about_z @ about_x


def slice_matrix(position_mm: float, turn: np.ndarray = None, spacing=SPACING) -> np.ndarray:
    r = rotation() if turn is None else turn
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2] = r[:, 0] * spacing[0], r[:, 1] * spacing[1], r[:, 2] * 6.0
    m[:3, 3] = np.array([10.0, -20.0, 5.0]) + r[:, 2] * position_mm
    return m


def pixels(slice_id: int, frame: int, grid=(COLS, ROWS)) -> np.ndarray:
    """(J, I) values telling the slice, the frame and the pixel apart."""
    jj, ii = np.mgrid[0 : grid[1], 0 : grid[0]]
    return (1000 * slice_id + 100 * frame + 10 * jj + ii).astype(np.int16)


def slice_volume(matrix: np.ndarray, values: np.ndarray):
    import vtk
    from vtkmodules.util import numpy_support

    image = vtk.vtkImageData()
    image.SetDimensions(values.shape[1], values.shape[0], 1)
    image.GetPointData().SetScalars(numpy_support.numpy_to_vtk(values.ravel(), deep=True))
    volume = slicer.vtkMRMLScalarVolumeNode()
    volume.SetAndObserveImageData(image)
    volume.SetIJKToRASMatrix(vtk_matrix(matrix))
    return volume


def make_scene():
    scene = slicer.vtkMRMLScene()
    scene.RegisterNodeClass(slicer.vtkMRMLSequenceNode())
    scene.RegisterNodeClass(slicer.vtkMRMLSequenceBrowserNode())
    return scene


def add_series(scene, name, slice_id, position_mm, frames=FRAMES, turn=None, grid=(COLS, ROWS), spacing=SPACING):
    """A single-slice cine series as Slicer loads one: a sequence of 2-D volumes, a browser, a proxy."""
    sequence = scene.AddNewNodeByClass("vtkMRMLSequenceNode", name)
    sequence.SetIndexName("time")
    sequence.SetIndexUnit("ms")
    for t in range(frames):
        volume = slice_volume(slice_matrix(position_mm, turn, spacing), pixels(slice_id, t, grid))
        sequence.SetDataNodeAtValue(volume, str(35 * t))
    browser = scene.AddNewNodeByClass("vtkMRMLSequenceBrowserNode", f"{name} browser")
    browser.SetAndObserveMasterSequenceNodeID(sequence.GetID())
    seqs.sequences_logic(scene).UpdateProxyNodesFromSequences(browser)
    proxy = browser.GetProxyNode(sequence)
    proxy.SetName(name)
    return SimpleNamespace(sequence=sequence, browser=browser, proxy=proxy)


@pytest.fixture
def study():
    """Three single-slice series at 16, 0 and 8 mm along the normal (added out of order)."""
    scene = make_scene()
    series = {
        16: add_series(scene, "SAX cine slice 3", 3, 16.0),
        0: add_series(scene, "SAX cine slice 1", 1, 0.0),
        8: add_series(scene, "SAX cine slice 2", 2, 8.0),
    }
    return SimpleNamespace(scene=scene, series=series)


def refusal(scene, input_volume) -> str:
    with pytest.raises(stack.StackError) as caught:
        stack.plan_stack(stack.study_series(scene, input_volume))
    return str(caught.value)


def test_three_single_slice_series_make_one_cine_of_three_slices(study):
    found = stack.study_series(study.scene, study.series[8].proxy)
    assert [s.name for s in found][0] == "SAX cine slice 2" and len(found) == 3  # the input's own first
    plan = stack.plan_stack(found)
    assert plan.names == ["SAX cine slice 1", "SAX cine slice 2", "SAX cine slice 3"]  # along the normal
    assert plan.gap_mm == pytest.approx(8.0) and plan.frames == FRAMES
    combined = stack.combine_series(study.scene, plan, stack.stack_name(plan.series))
    assert combined.sequence.GetName() == "SAX cine slice (3 slices)"
    cine = seqs.cine_of(study.scene, combined.proxy)
    assert cine is not None and cine.count == FRAMES
    assert [cine.sequence.GetNthIndexValue(t) for t in range(FRAMES)] == [str(35 * t) for t in range(FRAMES)]
    assert cine.sequence.GetIndexUnit() == "ms"
    # geometry: the first slice's in-plane columns and origin, K along the normal by 8 mm
    expected = slice_matrix(0.0)
    expected[:3, 2] = rotation()[:, 2] * 8.0
    for t in range(FRAMES):
        frame = cine.frame_volume(t)
        assert image_dimensions(frame) == (COLS, ROWS, 3)
        np.testing.assert_allclose(ijk_to_ras(frame), expected, atol=1e-9)
        from vtkmodules.util import numpy_support

        voxels = numpy_support.vtk_to_numpy(frame.GetImageData().GetPointData().GetScalars()).reshape(3, ROWS, COLS)
        for k, slice_id in enumerate((1, 2, 3)):
            np.testing.assert_array_equal(voxels[k], pixels(slice_id, t))
    # the slice at 8 mm lies where slice 2's own pixels were
    np.testing.assert_allclose(expected @ [2, 3, 1, 1], slice_matrix(8.0) @ [2, 3, 0, 1], atol=1e-9)
    assert stack.combined_text(combined) == (
        "Combined 3 series into 'SAX cine slice (3 slices)': 3 slices 8 mm apart, 4 frames."
    )
    assert stack.study_series(study.scene, combined.proxy) == []  # a 3-D cine is offered nothing


def test_a_series_with_another_frame_count_is_refused_by_name(study):
    add_series(study.scene, "SAX cine slice 4", 4, 24.0, frames=5)
    assert refusal(study.scene, study.series[0].proxy) == (
        "the series differ in frame count: 'SAX cine slice 4' has 5, the others 4 frames"
    )


def test_a_series_in_another_orientation_is_refused_by_name(study):
    add_series(study.scene, "SAX cine tilted", 4, 24.0, turn=rotation(45.0))
    assert (
        refusal(study.scene, study.series[0].proxy)
        == "'SAX cine tilted' lie in another orientation than 'SAX cine slice 1'"
    )


def test_a_series_on_another_grid_is_refused_by_name(study):
    add_series(study.scene, "SAX cine fine", 4, 24.0, spacing=(1.0, 1.0))
    message = refusal(study.scene, study.series[0].proxy)
    assert message.startswith("'SAX cine fine' are on another in-plane grid than 'SAX cine slice 1' (5 x 4 pixels")


def test_a_missing_slice_location_is_refused():
    scene = make_scene()
    first = add_series(scene, "a", 1, 0.0)
    add_series(scene, "b", 2, 8.0)
    add_series(scene, "c", 3, 24.0)  # 16 mm is missing
    assert refusal(scene, first.proxy) == (
        "the slices are not evenly spaced: 16.0 mm between 'b' and 'c', 8.0 mm elsewhere (a slice location missing?)"
    )


def test_two_series_at_one_position_are_refused():
    scene = make_scene()
    first = add_series(scene, "a", 1, 0.0)
    add_series(scene, "b", 2, 0.0)
    assert refusal(scene, first.proxy).startswith("'a' and 'b' are at the same slice position")


def test_a_lone_single_slice_series_is_offered_nothing():
    scene = make_scene()
    only = add_series(scene, "a", 1, 0.0)
    logic = ModuleLogic("", lambda: scene, object, lambda: __import__("contextlib").nullcontext())
    assert logic.combineOffer(only.proxy) == "" and logic.combineOffer(None) == ""
    with pytest.raises(ValueError, match="at least two single-slice series"):
        logic.combineStudySeries(only.proxy)


# ---------------------------------------------------------------------------------------------
# the panel


from test_slicer_module_panel import module  # noqa: E402,F401  (a fixture)


def test_the_panel_offers_the_combination_and_makes_the_cine_its_input(module, study, monkeypatch):
    from test_slicer_module_panel import FakeWidget, make_widget

    monkeypatch.setattr(slicer, "mrmlScene", study.scene)
    widget = make_widget(module, study.series[0].proxy)
    for name in ("cineTablesLabel", "cineCurvesButton", "combineSeriesButton"):
        setattr(widget.ui, name, FakeWidget())
    widget.refreshResults()
    button = widget.ui.combineSeriesButton
    assert button.visible and button.enabled
    assert button.toolTip == "Combine the study's 3 single-slice series into one cine"
    widget.onCombineSeries()
    proxy = widget._parameterNode.inputVolume
    assert proxy is not study.series[0].proxy and image_dimensions(proxy) == (COLS, ROWS, 3)
    assert widget.ui.statusLabel.text.startswith("Combined 3 series into ")
    widget.refreshResults()
    assert not widget.ui.combineSeriesButton.visible  # the combined cine is offered nothing
    # a study that makes no stack: one line, the input unchanged
    add_series(study.scene, "SAX cine slice 4", 4, 24.0, frames=5)
    widget._parameterNode.inputVolume = study.series[0].proxy
    widget.onCombineSeries()
    assert widget.ui.statusLabel.text == (
        "Cannot combine the series: the series differ in frame count: 'SAX cine slice 4' has 5, the others 4 frames"
    )
    assert widget._parameterNode.inputVolume is study.series[0].proxy
