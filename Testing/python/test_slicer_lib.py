"""CARDSegmentLib on a real MRML scene (PyPI slicer-core, no Slicer application, no Qt).

A module fixture runs the whole "Segment & Calibrate" path once (SegmentationJob: input volume
node → temporary NRRD → ``python -m cardseg segment`` in a real subprocess with an untrained tiny
bundle → nodes); the other tests load that run's output folder into fresh scenes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import SimpleITK as sitk

from conftest import MODULE_DIR, slicer_core

slicer = slicer_core()
import vtk  # noqa: E402  (comes with slicer-core)
from vtk.util.numpy_support import vtk_to_numpy  # noqa: E402


import CARDSegmentLib as lib  # noqa: E402
from CARDSegmentLib.outputs import colormaps  # noqa: E402
from CARDSegmentLib.outputs import geometry  # noqa: E402
from CARDSegmentLib.outputs import overlays  # noqa: E402
from CARDSegmentLib.outputs import volume_files  # noqa: E402
from CARDSegmentLib.outputs import nodes as outputs_lib  # noqa: E402
from CARDSegmentLib.outputs import terminology as terminology_lib  # noqa: E402

LN2 = math.log(2.0)
SLICE_VIEWS = ("Red", "Yellow", "Green")


# ---------------------------------------------------------------------------------------------
# helpers


def make_scene():
    """A bare scene with what the Slicer application would have: legend node class, three views."""
    scene = slicer.vtkMRMLScene()
    scene.RegisterNodeClass(slicer.vtkMRMLColorLegendDisplayNode())
    for name in SLICE_VIEWS:
        sl = scene.AddNewNodeByClass("vtkMRMLSliceNode")
        sl.SetLayoutName(name)
        comp = scene.AddNewNodeByClass("vtkMRMLSliceCompositeNode")
        comp.SetLayoutName(name)
    return scene


def load_input(scene, path, name="cine"):
    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", name)
    volume_files.read_volume_file(volume, path)
    return volume


def node_ids(scene):
    c = scene.GetNodes()
    return {c.GetItemAsObject(i).GetID() for i in range(c.GetNumberOfItems())}


def matrix(node):
    return geometry.ijk_to_ras(node)


def array_of(volume_node):
    img = volume_node.GetImageData()
    nx, ny, nz = img.GetDimensions()
    comps = img.GetNumberOfScalarComponents()
    a = vtk_to_numpy(img.GetPointData().GetScalars())
    return a.reshape((nz, ny, nx, comps) if comps > 1 else (nz, ny, nx))


def segment_mask(segment):
    img = segment.GetRepresentation("Binary labelmap")
    e = img.GetExtent()
    a = vtk_to_numpy(img.GetPointData().GetScalars()).reshape(e[5] - e[4] + 1, e[3] - e[2] + 1, e[1] - e[0] + 1)
    return a == segment.GetLabelValue()


def composite(scene, name):
    c = scene.GetNodesByClass("vtkMRMLSliceCompositeNode")
    return next(
        c.GetItemAsObject(i) for i in range(c.GetNumberOfItems()) if c.GetItemAsObject(i).GetLayoutName() == name
    )


def segments(seg_node):
    s = seg_node.GetSegmentation()
    return [s.GetNthSegment(i) for i in range(s.GetNumberOfSegments())]


def terminology(segment) -> str:
    """A segment's terminology entry through the tag API that Slicer 5.8 has (GetTerminology came in 5.10)."""
    value = vtk.mutable("")
    segment.GetTag(slicer.vtkSegment.GetTerminologyEntryTagName(), value)
    return str(value)


# ---------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_bundle):
    """The tiny untrained bundle, flagging regions at 0.1 and out of domain below agreement 0.999."""
    from cardseg.bundle.loading import update_config

    path = tmp_path_factory.mktemp("slicer-bundle") / "bundle"
    shutil.copytree(tiny_bundle, path)
    update_config(
        path, {"regions": {"flag_threshold": 0.1, "min_voxels": 5}, "agreement": {"out_of_domain_threshold": 0.999}}
    )
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory, bundle, rotated_nifti):
    """One complete job in a real subprocess; its output folder is kept for the other tests."""
    scene = make_scene()
    volume = load_input(scene, rotated_nifti)
    before = node_ids(scene)
    seen = []
    options = lib.JobOptions(
        bundle_path=str(bundle),
        device="cpu",
        method="card",
        load_probabilities=True,
        engine_dir=str(MODULE_DIR),
        python_executable=sys.executable,
        threads=1,
        work_root=str(tmp_path_factory.mktemp("work")),
        keep_files=True,
    )
    job = lib.SegmentationJob(scene, volume, options, on_progress=seen.append)
    job.start()
    assert job.state == lib.RUNNING
    assert node_ids(scene) == before  # nothing in the scene changes while the process runs
    state = job.wait(timeout=1800)  # seconds on an idle machine; generous for a loaded one
    assert state == lib.SUCCEEDED, job.error
    outputs = job.finish()
    return SimpleNamespace(
        scene=scene,
        volume=volume,
        outputs=outputs,
        job=job,
        progress=seen,
        outdir=job.output_dir,
        bundle=bundle,
        input_path=rotated_nifti,
        report=json.loads((job.output_dir / "report.json").read_text(encoding="utf-8")),
        classes=json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))["classes"],
    )


@pytest.fixture
def fresh(run):
    """A new scene with the same input volume and the kept outputs loaded into it."""
    scene = make_scene()
    volume = load_input(scene, run.input_path)
    outputs = lib.load_outputs(scene, volume, run.outdir, classes=run.classes, load_probabilities=True)
    return SimpleNamespace(scene=scene, volume=volume, outputs=outputs)


# ---------------------------------------------------------------------------------------------
# the job, end to end


def test_job_runs_the_engine_in_a_subprocess_and_makes_the_nodes(run):
    o = run.outputs
    assert o.segmentation.GetClassName() == "vtkMRMLSegmentationNode"
    assert o.disagreement.GetClassName() == "vtkMRMLScalarVolumeNode"
    assert o.temperature.GetClassName() == "vtkMRMLScalarVolumeNode"
    assert o.probabilities.GetClassName() == "vtkMRMLVectorVolumeNode"
    assert o.report.GetClassName() == "vtkMRMLTextNode"
    assert o.review.GetClassName() == "vtkMRMLTableNode"
    for node in o.nodes():
        assert node.GetAttribute(lib.ROLE_ATTRIBUTE) in outputs_lib.ROLES
        assert node.GetNodeReferenceID(outputs_lib.INPUT_REFERENCE) == run.volume.GetID()
        assert run.scene.IsNodePresent(node)
    assert o.segmentation.GetNodeReference(outputs_lib.REVIEW_REFERENCE) is o.review
    assert o.segmentation.GetNodeReference(outputs_lib.REPORT_REFERENCE) is o.report
    assert o.report_dict()["agreement"] == pytest.approx(run.report["agreement"])
    # progress came from the process's JSON lines, through every stage, to the end
    stages = [p.stage for p in run.progress]
    assert "trajectory" in stages and stages[-1] == "write"
    assert "read" not in stages or stages[0] == "read"  # the engine may report reading, then first
    fractions = [p.fraction for p in run.progress]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    # the engine got the input volume written by the module: same voxels, same grid
    written = sitk.ReadImage(str(run.job.input_path))
    original = sitk.ReadImage(str(run.input_path))
    assert np.array_equal(sitk.GetArrayFromImage(written), sitk.GetArrayFromImage(original))
    assert np.allclose(written.GetDirection(), original.GetDirection(), atol=1e-12)
    assert np.allclose(written.GetOrigin(), original.GetOrigin(), atol=1e-9)


def test_outputs_have_exactly_the_input_geometry(run):
    ref = matrix(run.volume)
    dims = run.volume.GetImageData().GetDimensions()
    for node in (run.outputs.disagreement, run.outputs.temperature, run.outputs.probabilities):
        # the input's spacing, origin and directions are copied; Slicer re-normalises direction
        # columns when setting them, hence equality to double rounding rather than bit for bit
        assert np.allclose(matrix(node), ref, rtol=0, atol=1e-12), node.GetName()
        assert node.GetSpacing() == run.volume.GetSpacing() and node.GetOrigin() == run.volume.GetOrigin()
        assert node.GetImageData().GetDimensions() == dims
    # voxel order: the node's array is the engine's (k, j, i) array, value for value
    for role in ("disagreement", "temperature"):
        engine = sitk.GetArrayFromImage(sitk.ReadImage(str(run.outdir / f"{role}.nii.gz")))
        assert np.array_equal(array_of(getattr(run.outputs, role)), engine)
    probs = array_of(run.outputs.probabilities)
    assert probs.shape[-1] == len(run.classes)
    assert np.allclose(probs.sum(-1), 1.0, atol=1e-5)
    # the segmentation: reference geometry is the input; every segment on the input's grid
    seg = run.outputs.segmentation
    assert seg.GetNodeReference(seg.GetReferenceImageGeometryReferenceRole()) is run.volume
    labels = sitk.GetArrayFromImage(sitk.ReadImage(str(run.outdir / "segmentation.nii.gz")))
    for value, segment in enumerate(segments(seg), start=1):
        lm = segment.GetRepresentation("Binary labelmap")
        m = vtk.vtkMatrix4x4()
        lm.GetImageToWorldMatrix(m)
        world = np.array([[m.GetElement(r, c) for c in range(4)] for r in range(4)])
        ext = lm.GetExtent()
        assert np.allclose(
            world @ np.array([ext[0], ext[2], ext[4], 1.0]), ref @ np.array([ext[0], ext[2], ext[4], 1.0]), atol=1e-6
        )
        assert np.allclose(world[:3, :3], ref[:3, :3], atol=1e-9)
        assert np.array_equal(segment_mask(segment), labels == value)
    assert len(np.unique(labels)) > 1


def test_flagged_regions_are_outlined_voxel_for_voxel(run):
    """regions.nii.gz becomes one outlined segment per region (no fill): its voxels exactly, on the
    input's grid, named with the region's rank, p_error and size (issue 22: outlines, not boxes)."""
    from CARDSegmentLib.outputs.region_outlines import region_segment_ids

    regions = sitk.GetArrayFromImage(sitk.ReadImage(str(run.outdir / "regions.nii.gz")))
    ids = sorted(int(v) for v in np.unique(regions) if v)
    assert ids and ids == sorted(int(r["id"]) for r in run.report["regions"])
    node = run.outputs.regions
    assert node.GetClassName() == "vtkMRMLSegmentationNode"
    assert node.GetAttribute(lib.ROLE_ATTRIBUTE) == "regions"
    by_id = region_segment_ids(node)
    assert sorted(by_id) == ids
    ref = matrix(run.volume)
    for k, segment_id in by_id.items():
        segment = node.GetSegmentation().GetSegment(segment_id)
        lm = segment.GetRepresentation("Binary labelmap")
        m = vtk.vtkMatrix4x4()
        lm.GetImageToWorldMatrix(m)
        world = np.array([[m.GetElement(r, c) for c in range(4)] for r in range(4)])
        assert np.allclose(world[:3, :3], ref[:3, :3], atol=1e-9)
        e = lm.GetExtent()
        assert np.allclose(
            world @ np.array([e[0], e[2], e[4], 1.0]), ref @ np.array([e[0], e[2], e[4], 1.0]), atol=1e-6
        )
        mask = np.zeros(regions.shape, bool)
        mask[e[4] : e[5] + 1, e[2] : e[3] + 1, e[0] : e[1] + 1] = segment_mask(segment)
        assert np.array_equal(mask, regions == k), k
        region = next(r for r in run.report["regions"] if int(r["id"]) == k)
        shown = f"p_error {float(region['p_error']):.2f}, " if region.get("p_error") is not None else ""
        assert segment.GetName() == f"Region {k}: {shown}{float(region['volume_mm3']) / 1000:.1f} ml"
    display = node.GetDisplayNode()
    assert display.GetVisibility2DOutline() and not display.GetVisibility2DFill()


def test_segment_names_colours_and_terminology_come_from_the_bundle(run):
    segs = segments(run.outputs.segmentation)
    assert [s.GetName() for s in segs] == [c["name"] for c in run.classes[1:]]
    for s, cls in zip(segs, run.classes[1:]):
        assert np.allclose(s.GetColor(), cls["color"], atol=1e-6)
    term = {s.GetName(): terminology(s) for s in segs}
    if hasattr(segs[0], "GetTerminology"):  # Slicer 5.10+: the same entry through the newer API
        assert {s.GetName(): s.GetTerminology() for s in segs} == term
    assert "^87878005^Left ventricle" in term["LV"]
    assert "^53085002^Right ventricle" in term["RV"]
    assert "^74281007^Myocardium" in term["MYO"]


def test_overlays_use_perceptual_maps_with_fixed_windows_and_legends(run):
    scene, o = run.scene, run.outputs
    d, t = o.disagreement.GetDisplayNode(), o.temperature.GetDisplayNode()
    assert d.GetColorNode().GetName() == "CARDSegment Inferno"  # no stock Inferno in a bare scene
    assert t.GetColorNode().GetName() == "CARDSegment Viridis"
    assert d.GetColorNode().GetNumberOfColors() == 256
    assert not d.GetAutoWindowLevel() and not t.GetAutoWindowLevel()
    assert (d.GetWindowLevelMin(), d.GetWindowLevelMax()) == pytest.approx((0.0, LN2))
    cal = run.report["calibration"]
    assert (t.GetWindowLevelMin(), t.GetWindowLevelMax()) == pytest.approx((cal["tau_min"], cal["tau_max"]))
    dmax = array_of(o.disagreement).max()
    assert 0.0 < dmax <= LN2 + 1e-6
    tarr = array_of(o.temperature)
    assert tarr.min() >= cal["tau_min"] - 1e-6 and tarr.max() <= cal["tau_max"] + 1e-6
    # shown: input behind, disagreement in front of every slice view, its legend only
    for name in SLICE_VIEWS:
        comp = composite(scene, name)
        assert comp.GetBackgroundVolumeID() == run.volume.GetID()
        assert comp.GetForegroundVolumeID() == o.disagreement.GetID()
        assert comp.GetForegroundOpacity() == pytest.approx(0.5)
    leg_d, leg_t = overlays.color_legend(o.disagreement, False), overlays.color_legend(o.temperature, False)
    assert leg_d is not None and leg_t is not None
    assert leg_d.GetVisibility() and not leg_t.GetVisibility()
    assert "Disagreement" in leg_d.GetTitleText() and "Temperature" in leg_t.GetTitleText()
    # toggle to temperature, change opacity, then nothing
    lib.show_overlay(scene, run.volume, o, "temperature", 0.8)
    assert composite(scene, "Red").GetForegroundVolumeID() == o.temperature.GetID()
    assert composite(scene, "Red").GetForegroundOpacity() == pytest.approx(0.8)
    assert leg_t.GetVisibility() and not leg_d.GetVisibility()
    lib.set_overlay_opacity(scene, o, 0.3)
    assert composite(scene, "Green").GetForegroundOpacity() == pytest.approx(0.3)
    lib.show_overlay(scene, run.volume, o, "none")
    assert composite(scene, "Yellow").GetForegroundVolumeID() is None
    assert not leg_t.GetVisibility() and not leg_d.GetVisibility()
    with pytest.raises(ValueError):
        lib.show_overlay(scene, run.volume, o, "probabilities")
    lib.show_overlay(scene, run.volume, o, "disagreement", 0.5)


def test_segment_terminology_uses_the_tag_api_that_slicer_5_8_has():
    class Slicer58Segment:
        """What Slicer 5.8's vtkSegment offers for terminology: tags only, no SetTerminology."""

        def __init__(self):
            self.tags = {}

        @staticmethod
        def GetTerminologyEntryTagName():
            return "TerminologyEntry"

        def SetTag(self, tag, value):
            self.tags[tag] = value

    segment = Slicer58Segment()
    terminology_lib.set_segment_terminology(segment, terminology_lib.segment_terminology("LV"))
    assert segment.tags == {"TerminologyEntry": terminology_lib.segment_terminology("LV")}
    assert slicer.vtkSegment.GetTerminologyEntryTagName() == "TerminologyEntry"


# ---------------------------------------------------------------------------------------------
# the overlays' transparent low end, through Slicer's own display pipeline

TYPICAL_DISAGREEMENT = 0.0019  # the median over a real image (most voxels: the networks agree)


def _volume_array(node):
    return vtk_to_numpy(node.GetImageData().GetPointData().GetScalars())


def _with_agreeing_half(outputs, report):
    """Make the lower half of every map look like agreement (typical low disagreement there)."""
    low_temperature = overlays.temperature_at(TYPICAL_DISAGREEMENT, report["calibration"])
    d, t = _volume_array(outputs.disagreement), _volume_array(outputs.temperature)
    half = np.arange(d.size) < d.size // 2
    d[half] = TYPICAL_DISAGREEMENT
    t[half] = low_temperature
    for node in (outputs.disagreement, outputs.temperature):
        node.GetImageData().Modified()
    return half


def _display_rgba(node):
    """The RGBA a slice view gets from this volume's display node (its own colour mapping)."""
    display = node.GetDisplayNode()
    display.SetInputImageDataConnection(node.GetImageDataConnection())
    display.UpdateImageDataPipeline()
    port = display.GetOutputImageDataConnection()
    port.GetProducer().Update()
    image = port.GetProducer().GetOutputDataObject(port.GetIndex())
    return vtk_to_numpy(image.GetPointData().GetScalars()).reshape(-1, 4)


def test_the_engines_temperature_formula_is_restated_exactly():
    import torch
    from cardseg.method.calibration.card import temperature_field

    cal = {"tau_min": 1.0, "tau_max": 7.59, "w_b": 0.0074, "w_k": 0.0098}
    tac = np.array([0.0, 0.0019, 0.01, 0.05, 0.3, math.log(2.0)])
    engine = temperature_field(torch.tensor(tac), cal["tau_min"], cal["tau_max"], cal["w_b"], cal["w_k"]).numpy()
    assert [overlays.temperature_at(float(x), cal) for x in tac] == pytest.approx(engine.tolist(), rel=1e-9)
    assert overlays.temperature_at(0.1, {"tau_min": 1.0}) is None


def test_overlays_are_transparent_where_the_networks_agree(fresh, run):
    o = fresh.outputs
    half = _with_agreeing_half(o, run.report)
    for role in ("disagreement", "temperature"):
        node = getattr(o, role)
        display = node.GetDisplayNode()
        assert display.GetApplyThreshold()
        lower, upper = display.GetLowerThreshold(), display.GetUpperThreshold()
        assert (lower, upper) == pytest.approx(overlays.overlay_threshold(role, run.report, node))
        values = _volume_array(node)
        assert upper > values.max()
        rgba = _display_rgba(node)
        alpha = rgba[:, 3]
        # the display node's own colour mapping: low disagreement -> alpha 0, the rest opaque
        assert np.all(alpha[half] == 0), role
        assert np.array_equal(alpha == 0, values < lower), role
        assert np.all(alpha[values >= lower] == 255)
    assert o.disagreement.GetDisplayNode().GetLowerThreshold() == pytest.approx(overlays.SHOWN_FROM_DISAGREEMENT)
    # the temperature map hides the same voxels: its threshold is the temperature of that disagreement
    cal = run.report["calibration"]
    assert o.temperature.GetDisplayNode().GetLowerThreshold() == pytest.approx(
        overlays.temperature_at(overlays.SHOWN_FROM_DISAGREEMENT, cal)
    )
    assert overlays.overlay_threshold("temperature", {"calibration": {"tau_min": 1.0, "tau_max": 3.0}})[
        0
    ] == pytest.approx(1.0 + 2.0 * overlays.SHOWN_FROM_DISAGREEMENT / LN2)


def _slice_view(scene):
    """A red slice view's logic on ``scene`` (slicer-core reslices and blends without a window)."""
    colors = slicer.vtkMRMLColorLogic()  # Grey and the other stock tables, as in Slicer
    colors.SetMRMLScene(scene)
    app = slicer.vtkMRMLApplicationLogic()
    app.SetMRMLScene(scene)
    logic = slicer.vtkMRMLSliceLogic()
    logic.SetMRMLApplicationLogic(app)
    logic.SetMRMLScene(scene)
    logic.AddSliceNode("Red")
    return logic, (colors, app)


def _render(port):
    port.GetProducer().Update()
    image = port.GetProducer().GetOutputDataObject(port.GetIndex())
    nx, ny, _ = image.GetDimensions()
    return vtk_to_numpy(image.GetPointData().GetScalars()).reshape(ny, nx, -1).copy()


def test_rendered_slice_shows_the_input_unchanged_where_the_networks_agree(run):
    scene = slicer.vtkMRMLScene()
    scene.RegisterNodeClass(slicer.vtkMRMLColorLegendDisplayNode())
    view, _keep = _slice_view(scene)
    volume = load_input(scene, run.input_path)
    volume.CreateDefaultDisplayNodes()
    o = lib.load_outputs(scene, volume, run.outdir, classes=run.classes)
    _with_agreeing_half(o, run.report)
    composite_node = view.GetSliceCompositeNode()
    assert composite_node.GetForegroundVolumeID() == o.disagreement.GetID()
    assert composite_node.GetForegroundOpacity() == pytest.approx(0.5)
    view.FitSliceToAll()
    with_overlay = _render(view.GetImageDataConnection())
    reslice = view.GetForegroundLayer().GetReslice()
    reslice.Update()
    shown = vtk_to_numpy(reslice.GetOutput().GetPointData().GetScalars()).reshape(with_overlay.shape[:2])
    composite_node.SetForegroundVolumeID(None)
    input_only = _render(view.GetImageDataConnection())
    low = shown < overlays.SHOWN_FROM_DISAGREEMENT
    inside = np.isclose(shown, TYPICAL_DISAGREEMENT)  # the agreeing half of the volume, on this slice
    assert inside.mean() > 0.05 and (~low).mean() > 0.05, "the slice should cut both halves"
    # where the networks agree the input is shown exactly as without the overlay (not darkened) ...
    assert np.array_equal(with_overlay[low][:, :3], input_only[low][:, :3])
    # ... and where they disagree the overlay is there
    assert (with_overlay[~low][:, :3] != input_only[~low][:, :3]).any(axis=1).mean() > 0.5
    # before this change the whole overlay was opaque: the agreeing half came out darker
    o.disagreement.GetDisplayNode().SetApplyThreshold(0)
    composite_node.SetForegroundVolumeID(o.disagreement.GetID())
    opaque = _render(view.GetImageDataConnection())
    bright = inside & (input_only[..., 0] > 40)
    assert bright.any() and (opaque[bright][:, 0].astype(int) < input_only[bright][:, 0].astype(int)).all()


def test_stock_colour_nodes_are_preferred_when_the_scene_has_them(run):
    scene = make_scene()
    for name in ("Inferno", "Viridis"):
        stock = slicer.vtkMRMLColorTableNode()
        stock.SetSingletonTag(f"File{name}.txt")
        stock.SetName(name)
        scene.AddNode(stock)
        assert stock.GetID() == colormaps.STOCK_IDS[name]
    volume = load_input(scene, run.input_path)
    o = lib.load_outputs(scene, volume, run.outdir)
    assert o.disagreement.GetDisplayNode().GetColorNodeID() == "vtkMRMLColorTableNodeFileInferno.txt"
    assert o.temperature.GetDisplayNode().GetColorNodeID() == "vtkMRMLColorTableNodeFileViridis.txt"
    own = [
        scene.GetNodesByClass("vtkMRMLColorTableNode").GetItemAsObject(i)
        for i in range(scene.GetNodesByClass("vtkMRMLColorTableNode").GetNumberOfItems())
    ]
    assert not [n for n in own if n.GetAttribute(colormaps.COLORMAP_ATTRIBUTE)]


def test_colour_map_samples_run_dark_to_bright():
    for name in colormaps.ANCHORS:
        cols = colormaps.sample(name, 256)
        assert len(cols) == 256
        assert cols[0] == pytest.approx(colormaps.ANCHORS[name][0])
        assert cols[-1] == pytest.approx(colormaps.ANCHORS[name][-1])
        lum = [0.2126 * r + 0.7152 * g + 0.0722 * b for r, g, b in cols]
        assert lum[-1] > lum[0] and all(0.0 <= c <= 1.0 for col in cols for c in col)


# ---------------------------------------------------------------------------------------------
# replacing outputs


def test_rerun_replaces_only_this_modules_outputs_for_that_input(run):
    scene = make_scene()
    volume = load_input(scene, run.input_path, "first")
    second = load_input(scene, run.input_path, "second")
    user_seg = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", "my own segmentation")
    user_seg.SetAttribute("Owner", "me")
    user_table = scene.AddNewNodeByClass("vtkMRMLTableNode", "my table")
    volume.SetAttribute("Patient", "P1")
    img_mtime, before_matrix = volume.GetImageData().GetMTime(), matrix(volume)
    volume_storage, volume_display = volume.GetStorageNodeID(), volume.GetDisplayNodeID()

    first = lib.load_outputs(scene, volume, run.outdir, classes=run.classes)
    of_second = lib.load_outputs(scene, second, run.outdir, classes=run.classes)
    lib.show_region(scene, volume, first, lib.review_rows(first.review)[0]["region"])
    assert first.roi is None  # the region is highlighted in its outline node: no box is made
    count_after_first = scene.GetNumberOfNodes()
    old_ids = {n.GetID() for n in first.nodes()}
    old_display_ids = {
        first.segmentation.GetDisplayNodeID(),
        first.disagreement.GetDisplayNodeID(),
        first.regions.GetDisplayNodeID(),
    }

    again = lib.load_outputs(scene, volume, run.outdir, classes=run.classes)
    assert all(scene.GetNodeByID(i) is None for i in old_ids | old_display_ids)
    assert lib.find_outputs(scene, volume) == again
    assert again.roi is None and again.regions is not None
    assert again.segmentation.GetName() == "first CARD segmentation"  # same names as before, no "_1"
    assert again.disagreement.GetName() == "first disagreement"
    assert scene.GetNumberOfNodes() == count_after_first  # every node replaced by one new one
    # untouched: the other input's outputs, the user's nodes, the input itself
    for node in of_second.nodes() + [second, user_seg, user_table]:
        assert scene.IsNodePresent(node)
    assert lib.find_outputs(scene, second) == of_second
    assert user_seg.GetAttribute("Owner") == "me"
    assert volume.GetImageData().GetMTime() == img_mtime
    assert np.array_equal(matrix(volume), before_matrix)
    assert volume.GetAttribute("Patient") == "P1" and volume.GetAttribute(lib.ROLE_ATTRIBUTE) is None
    assert (volume.GetStorageNodeID(), volume.GetDisplayNodeID()) == (volume_storage, volume_display)

    assert lib.remove_outputs(scene, volume) == len(again.nodes())
    assert lib.find_outputs(scene, volume) == lib.OutputNodes()
    assert lib.find_outputs(scene, second) == of_second


def test_kept_results_are_not_replaced(fresh, run):
    kept = fresh.outputs.nodes()
    assert lib.release_outputs(fresh.scene, fresh.volume) == len(kept)
    assert lib.find_outputs(fresh.scene, fresh.volume) == lib.OutputNodes()
    new = lib.load_outputs(fresh.scene, fresh.volume, run.outdir)
    assert all(fresh.scene.IsNodePresent(n) for n in kept)
    assert new.segmentation is not kept[0]


def test_a_failed_load_leaves_the_scene_unchanged(fresh, run, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(run.outdir, bad)
    img = sitk.ReadImage(str(bad / "temperature.nii.gz"))
    sitk.WriteImage(img[:, :, :-1], str(bad / "temperature.nii.gz"))  # one slice short: not the input's grid
    ids, outputs = node_ids(fresh.scene), lib.find_outputs(fresh.scene, fresh.volume)
    with pytest.raises(lib.OutputError, match="grid"):
        lib.load_outputs(fresh.scene, fresh.volume, bad)
    assert node_ids(fresh.scene) == ids and lib.find_outputs(fresh.scene, fresh.volume) == outputs
    (bad / "segmentation.seg.nrrd").unlink()
    with pytest.raises(lib.OutputError, match="segmentation.seg.nrrd"):
        lib.load_outputs(fresh.scene, fresh.volume, bad)
    assert node_ids(fresh.scene) == ids


def test_outputs_follow_the_inputs_parent_transform(run):
    scene = make_scene()
    volume = load_input(scene, run.input_path)
    tnode = scene.AddNewNodeByClass("vtkMRMLLinearTransformNode", "moved")
    shift = vtk.vtkMatrix4x4()
    shift.SetElement(0, 3, 25.0)
    shift.SetElement(2, 3, -10.0)
    tnode.SetMatrixTransformToParent(shift)
    volume.SetAndObserveTransformNodeID(tnode.GetID())
    o = lib.load_outputs(scene, volume, run.outdir)
    for node in (o.segmentation, o.disagreement, o.temperature):
        assert node.GetTransformNodeID() == tnode.GetID()
    assert o.regions.GetTransformNodeID() == tnode.GetID()  # the outlines move with the input too,
    segmentation = o.regions.GetSegmentation()  # and lie on its grid in its frame (the shift not baked in)
    lm = segmentation.GetNthSegment(0).GetRepresentation("Binary labelmap")
    m = vtk.vtkMatrix4x4()
    lm.GetImageToWorldMatrix(m)
    world, e = np.array([[m.GetElement(r, c) for c in range(4)] for r in range(4)]), lm.GetExtent()
    assert np.allclose(world @ [e[0], e[2], e[4], 1.0], matrix(volume) @ [e[0], e[2], e[4], 1.0], atol=1e-6)
    row = lib.review_rows(o.review)[0]
    lib.show_region(scene, volume, o, row["region"])
    red = scene.GetNodesByClass("vtkMRMLSliceNode").GetItemAsObject(0)
    centre = [red.GetSliceToRAS().GetElement(r, 3) for r in range(3)]
    assert centre == pytest.approx([row["centroid_r"] + 25.0, row["centroid_a"], row["centroid_s"] - 10.0])


def test_writing_the_input_changes_neither_node_nor_scene(run, tmp_path):
    scene = make_scene()
    volume = load_input(scene, run.input_path)
    ids, count, mtime = node_ids(scene), scene.GetNumberOfNodes(), volume.GetMTime()
    volume_files.write_volume_file(volume, tmp_path / "x.nrrd")
    assert (tmp_path / "x.nrrd").is_file()
    assert node_ids(scene) == ids and scene.GetNumberOfNodes() == count and volume.GetMTime() == mtime
    assert volume.GetStorageNodeID() is None


# ---------------------------------------------------------------------------------------------
# the job's cancel and failure paths


def test_cancel_ends_the_process_and_leaves_the_scene_unchanged(run, tmp_path):
    scene = make_scene()
    volume = load_input(scene, run.input_path)
    ids = node_ids(scene)
    options = lib.JobOptions(
        bundle_path=str(run.bundle),
        device="cpu",
        engine_dir=str(MODULE_DIR),
        python_executable=sys.executable,
        threads=1,
        work_root=str(tmp_path),
    )
    job = lib.SegmentationJob(scene, volume, options)
    job.start()
    work = job.work_dir
    assert (work / "input.nrrd").is_file()
    job.poll()
    job.cancel()
    assert job.state == lib.CANCELLED and job.error is None
    assert job.run.state == lib.CANCELLED
    assert job.run._handle._proc.poll() is not None
    assert not work.exists()
    assert node_ids(scene) == ids
    with pytest.raises(RuntimeError):
        job.finish()


class ScriptedProcess:
    """A fake process for SegmentationJob: replays lines, then exits (see test_slicer_process.py)."""

    def __init__(self, lines, code):
        self.lines, self.code, self.argv = list(lines), code, None

    def __call__(self, argv, env, cwd):
        self.argv = argv
        return self

    def read_lines(self):
        out, self.lines = [("stderr", ln) for ln in self.lines], []
        return out

    def returncode(self):
        return None if self.lines else self.code

    def kill(self):
        self.code = -9


def test_a_failing_engine_gives_its_one_line_error(run, tmp_path):
    scene = make_scene()
    volume = load_input(scene, run.input_path)
    ids = node_ids(scene)
    fake = ScriptedProcess(
        ['{"stage": "read", "done": 0, "total": 1}', f"cardseg: error: {tmp_path}/b: not a bundle (no bundle.json)"],
        code=2,
    )
    options = lib.JobOptions(bundle_path=f"{tmp_path}/b", device="cpu", work_root=str(tmp_path))
    job = lib.SegmentationJob(scene, volume, options, launcher=fake)
    job.start()
    assert fake.argv[fake.argv.index("--bundle") + 1] == f"{tmp_path}/b"
    assert fake.argv[fake.argv.index("segment") + 1] == str(job.input_path)
    assert job.wait(timeout=10) == lib.FAILED
    assert job.error == f"{tmp_path}/b: not a bundle (no bundle.json)"
    assert node_ids(scene) == ids and not job.work_dir.exists()


def test_a_run_whose_outputs_cannot_be_loaded_fails_cleanly(run, tmp_path):
    scene = make_scene()
    volume = load_input(scene, run.input_path)
    ids = node_ids(scene)
    job = lib.SegmentationJob(
        scene,
        volume,
        lib.JobOptions(work_root=str(tmp_path)),
        launcher=ScriptedProcess(['{"stage": "write", "done": 6, "total": 6}'], code=0),
    )
    job.start()
    assert job.wait(timeout=10) == lib.SUCCEEDED  # the process said it succeeded but wrote nothing
    with pytest.raises(lib.OutputError, match="report.json"):
        job.finish()
    assert job.state == lib.FAILED and "report.json" in job.error
    assert node_ids(scene) == ids and not job.work_dir.exists()


class CopyingProcess(ScriptedProcess):
    """A fake engine that "writes" a finished run's outputs into the job's output folder."""

    def __init__(self, source):
        super().__init__(['{"stage": "write", "done": 6, "total": 6}'], 0)
        self.source = source

    def __call__(self, argv, env, cwd):
        shutil.copytree(self.source, argv[argv.index("-o") + 1])
        return super().__call__(argv, env, cwd)


def _drive(monitor, limit=200):
    """What the Logic's QTimer does: step until the job ends."""
    for _ in range(limit):
        if monitor.step():
            return monitor.outcome
    raise AssertionError("the job did not end")


def test_monitor_loads_a_finished_run(run, tmp_path):
    scene = make_scene()
    volume = load_input(scene, run.input_path)
    job = lib.SegmentationJob(
        scene,
        volume,
        lib.JobOptions(bundle_path=str(run.bundle), work_root=str(tmp_path)),
        launcher=CopyingProcess(run.outdir),
    )
    monitor = lib.JobMonitor(job)
    assert monitor.start() is False and not monitor.finished
    assert _drive(monitor) == ("loaded", None)
    assert lib.find_outputs(scene, volume).segmentation is not None and not job.work_dir.exists()


def test_an_unexpected_error_while_loading_ends_the_run_with_one_line(run, tmp_path, monkeypatch):
    """Slicer 5.8 lacked vtkSegment.SetTerminology: such an AttributeError used to escape the
    timer's slot and leave the panel in "running" for good. Now it is the run's one-line error."""
    scene = make_scene()
    volume = load_input(scene, run.input_path)
    ids = node_ids(scene)

    def missing_api(segment, entry):
        raise AttributeError("'vtkSegment' object has no attribute 'SetTerminology'")

    monkeypatch.setattr(terminology_lib, "set_segment_terminology", missing_api)
    entered = []

    class Busy:
        def __enter__(self):
            entered.append(True)

        def __exit__(self, *exc):
            return False

    job = lib.SegmentationJob(
        scene,
        volume,
        lib.JobOptions(bundle_path=str(run.bundle), work_root=str(tmp_path)),
        launcher=CopyingProcess(run.outdir),
    )
    monitor = lib.JobMonitor(job, busy=Busy)
    monitor.start()
    state, error = _drive(monitor)
    assert state == lib.FAILED and entered == [True]
    assert error == "AttributeError: 'vtkSegment' object has no attribute 'SetTerminology'"
    assert "\n" not in error and job.state == lib.FAILED and job.error == error
    assert node_ids(scene) == ids and not job.work_dir.exists()  # nothing half-made is left
    assert monitor.step() is True and monitor.outcome == (state, error)  # it stays ended


def test_an_error_while_polling_stops_the_process_and_ends_the_run(run, tmp_path):
    class BrokenPipe(ScriptedProcess):
        def read_lines(self):
            raise RuntimeError("the pipe broke\nsecond line")

    scene = make_scene()
    volume = load_input(scene, run.input_path)
    fake = BrokenPipe([], None)
    job = lib.SegmentationJob(scene, volume, lib.JobOptions(work_root=str(tmp_path)), launcher=fake)
    monitor = lib.JobMonitor(job)
    monitor.start()
    assert _drive(monitor) == (lib.FAILED, "RuntimeError: the pipe broke")
    assert fake.code == -9 and not job.work_dir.exists()  # the process was ended, the files deleted


def test_monitor_start_and_cancel(run, tmp_path):
    scene = make_scene()
    empty = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "empty")
    monitor = lib.JobMonitor(lib.SegmentationJob(scene, empty, lib.JobOptions(work_root=str(tmp_path))))
    assert monitor.start() is True and monitor.outcome[0] == lib.FAILED and "image data" in monitor.outcome[1]
    volume = load_input(scene, run.input_path)
    fake = ScriptedProcess([], None)
    job = lib.SegmentationJob(scene, volume, lib.JobOptions(work_root=str(tmp_path)), launcher=fake)
    monitor = lib.JobMonitor(job)
    monitor.start()
    assert monitor.step() is False
    monitor.cancel()
    assert monitor.outcome == (lib.CANCELLED, None) and fake.code == -9 and not job.work_dir.exists()
    assert lib.one_line(lib.OutputError("x: gone\nmore")) == "x: gone"
    assert lib.one_line(KeyError("LV")) == "KeyError: 'LV'" and lib.one_line(RuntimeError()) == "RuntimeError"


def test_a_volume_without_image_data_is_refused(tmp_path):
    scene = make_scene()
    empty = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "empty")
    job = lib.SegmentationJob(scene, empty, lib.JobOptions(work_root=str(tmp_path)))
    job.start()
    assert job.state == lib.FAILED and "image data" in job.error


# ---------------------------------------------------------------------------------------------
# review


def test_review_table_lists_the_reports_regions_in_rank_order(fresh, run):
    rows = lib.review_rows(fresh.outputs.review)
    regions = run.report["regions"]
    assert len(regions) >= 2, "the test bundle should flag several regions"
    assert [r["region"] for r in rows] == [g["id"] for g in regions]
    for row, reg in zip(rows, regions):
        assert row["status"] == "pending" and row["note"] == ""
        assert row["voxels"] == reg["voxels"]
        assert row["volume_mm3"] == pytest.approx(reg["volume_mm3"])
        assert row["mean_disagreement"] == pytest.approx(reg["mean_disagreement"])
        assert row["classes"] == ", ".join(reg["classes"])
        lps = reg["centroid_lps"]
        assert [row["centroid_r"], row["centroid_a"], row["centroid_s"]] == pytest.approx([-lps[0], -lps[1], lps[2]])
    assert [r["summed_disagreement"] for r in rows] == sorted((r["summed_disagreement"] for r in rows), reverse=True)
    table = fresh.outputs.review
    assert table.GetColumnTitle("mean_disagreement") == "Mean disagreement"


def outline_masks(node, shape):
    """``{region id: boolean mask on the input's grid}`` of a region outline node's segments."""
    from CARDSegmentLib.outputs.region_outlines import region_segment_ids

    masks = {}
    for k, segment_id in region_segment_ids(node).items():
        segment = node.GetSegmentation().GetSegment(segment_id)
        e = segment.GetRepresentation("Binary labelmap").GetExtent()
        masks[k] = np.zeros(shape, bool)
        masks[k][e[4] : e[5] + 1, e[2] : e[3] + 1, e[0] : e[1] + 1] = segment_mask(segment)
    return masks


def rgb(vector):
    return [vector.GetX(), vector.GetY(), vector.GetZ()]


def test_selecting_a_region_highlights_its_outline_and_centres_the_views(fresh, run):
    """Issue 22: selecting region k shows region k's own voxels (its outline segment in another
    colour, the other regions dimmed), not a bounding box: no ROI node is made."""
    from CARDSegmentLib.outputs import region_outlines as ro

    o = fresh.outputs
    regions = sitk.GetArrayFromImage(sitk.ReadImage(str(run.outdir / "regions.nii.gz")))
    masks = outline_masks(o.regions, regions.shape)
    by_id = ro.region_segment_ids(o.regions)
    display = o.regions.GetDisplayNode()
    assert len(by_id) >= 2
    for reg in run.report["regions"][:3]:
        k = int(reg["id"])
        segment_id = lib.show_region(fresh.scene, fresh.volume, o, k)
        assert segment_id == by_id[k] and np.array_equal(masks[k], regions == k)  # exactly region k's voxels
        assert o.regions.GetAttribute(ro.SELECTED_ATTRIBUTE) == str(k)
        for other, sid in by_id.items():
            if other == k:
                assert rgb(display.GetSegmentOverrideColor(sid)) == pytest.approx(ro.SELECTED_COLOR)
                assert display.GetSegmentOpacity2DOutline(sid) == 1.0 and display.GetSegmentVisibility(sid)
            else:  # its own (yellow) colour, dimmed
                assert rgb(display.GetSegmentOverrideColor(sid)) == [-1.0, -1.0, -1.0]
                assert display.GetSegmentOpacity2DOutline(sid) == pytest.approx(ro.DIMMED_OPACITY)
        ras = [-reg["centroid_lps"][0], -reg["centroid_lps"][1], reg["centroid_lps"][2]]
        for sl in (fresh.scene.GetNodesByClass("vtkMRMLSliceNode").GetItemAsObject(i) for i in range(3)):
            assert [sl.GetSliceToRAS().GetElement(r, 3) for r in range(3)] == pytest.approx(ras)
    assert fresh.scene.GetNodesByClass("vtkMRMLMarkupsROINode").GetNumberOfItems() == 0
    assert lib.find_outputs(fresh.scene, fresh.volume).roi is None
    with pytest.raises(KeyError):
        lib.show_region(fresh.scene, fresh.volume, o, 10_000)
    # no selection (or a region without voxels): every outline as loaded
    assert ro.highlight_region(o.regions, None) is None
    assert o.regions.GetAttribute(ro.SELECTED_ATTRIBUTE) is None
    assert all(
        display.GetSegmentOpacity2DOutline(sid) == 1.0
        and rgb(display.GetSegmentOverrideColor(sid)) == [-1.0, -1.0, -1.0]
        for sid in by_id.values()
    )


def test_outputs_without_outlines_still_centre_the_views(fresh, run):
    """Results loaded before the outlines existed (no regions node): the views still jump."""
    o = fresh.outputs
    outputs_lib.remove_node(fresh.scene, o.regions)
    o.regions = None
    reg = run.report["regions"][0]
    assert lib.show_region(fresh.scene, fresh.volume, o, reg["id"]) is None
    red = fresh.scene.GetNodesByClass("vtkMRMLSliceNode").GetItemAsObject(0)
    ras = [-reg["centroid_lps"][0], -reg["centroid_lps"][1], reg["centroid_lps"][2]]
    assert [red.GetSliceToRAS().GetElement(r, 3) for r in range(3)] == pytest.approx(ras)


def test_a_box_left_by_an_older_version_is_hidden_and_goes_with_the_next_run(fresh, run, tmp_path):
    """A scene saved by a version that drew a markups ROI box: selecting a region hides that box
    (no new one), the review and export work, and the next run removes it with the old outputs."""
    scene, volume = fresh.scene, fresh.volume
    box = scene.AddNewNodeByClass("vtkMRMLMarkupsROINode", "cine CARD region")
    box.CreateDefaultDisplayNodes()
    outputs_lib.tag_output(box, "roi", volume)
    o = lib.find_outputs(scene, volume)
    assert o.roi is box and o.regions is not None
    ids = [r["region"] for r in lib.review_rows(o.review)]
    assert lib.show_region(scene, volume, o, ids[0]) is not None
    assert not box.GetDisplayNode().GetVisibility() and scene.IsNodePresent(box)
    assert scene.GetNodesByClass("vtkMRMLMarkupsROINode").GetNumberOfItems() == 1
    lib.set_region_status(o.review, ids[0], "accepted")
    doc = json.loads(lib.export_review(o, tmp_path / "review.json").read_text(encoding="utf-8"))
    assert doc["regions"][0]["status"] == "accepted"
    lib.load_outputs(scene, volume, run.outdir, classes=run.classes)
    assert not scene.IsNodePresent(box) and lib.find_outputs(scene, volume).roi is None


def test_region_decisions_are_recorded(fresh, run):
    table = fresh.outputs.review
    ids = [r["region"] for r in lib.review_rows(table)]
    assert not lib.has_decisions(table)
    lib.set_region_status(table, ids[0], "accepted")
    lib.set_region_status(table, ids[1], "rejected", note="partial volume at the apex")
    rows = {r["region"]: r for r in lib.review_rows(table)}
    assert rows[ids[0]]["status"] == "accepted" and rows[ids[1]]["note"] == "partial volume at the apex"
    assert lib.has_decisions(table)
    counts = lib.review_counts(table)
    assert counts["accepted"] == 1 and counts["rejected"] == 1 and counts["pending"] == len(ids) - 2
    with pytest.raises(ValueError):
        lib.set_region_status(table, ids[0], "maybe")
    with pytest.raises(KeyError):
        lib.set_region_status(table, 10_000, "accepted")


def test_review_survives_a_scene_save_and_reload(fresh, run, tmp_path):
    o = fresh.outputs
    ids = [r["region"] for r in lib.review_rows(o.review)]
    lib.set_region_status(o.review, ids[0], "corrected", note="RV wall redrawn")
    lib.set_region_status(o.review, ids[-1], "rejected")
    lib.show_region(fresh.scene, fresh.volume, o, ids[0])
    app = slicer.vtkMRMLApplicationLogic()
    app.SetMRMLScene(fresh.scene)
    folder = tmp_path / "saved"
    folder.mkdir()
    assert app.SaveSceneToSlicerDataBundleDirectory(str(folder), None)
    mrml = next(folder.glob("*.mrml"))
    data = {p.name for p in (folder / "Data").iterdir()}
    assert any(n.endswith(".seg.nrrd") for n in data) and any(n.endswith(".tsv") for n in data)

    scene = slicer.vtkMRMLScene()
    scene.RegisterNodeClass(slicer.vtkMRMLColorLegendDisplayNode())
    scene.SetURL(str(mrml))
    assert scene.Import()
    volume = scene.GetFirstNodeByName(fresh.volume.GetName())
    back = lib.find_outputs(scene, volume)
    assert back.segmentation is not None and back.review is not None and back.report is not None
    assert back.regions is not None and back.disagreement is not None and back.probabilities is not None
    assert back.roi is None  # no box: the selected region's outline is highlighted, and stays so
    from CARDSegmentLib.outputs import region_outlines as ro

    assert back.regions.GetAttribute(ro.SELECTED_ATTRIBUTE) == str(ids[0])
    shown = ro.region_segment_ids(back.regions)[ids[0]]
    assert rgb(back.regions.GetDisplayNode().GetSegmentOverrideColor(shown)) == pytest.approx(ro.SELECTED_COLOR)
    assert back.segmentation.GetNodeReference(outputs_lib.REVIEW_REFERENCE) is back.review
    rows = {r["region"]: r for r in lib.review_rows(back.review)}
    assert rows[ids[0]]["status"] == "corrected" and rows[ids[0]]["note"] == "RV wall redrawn"
    assert rows[ids[-1]]["status"] == "rejected"
    assert all(rows[i]["status"] == "pending" for i in ids[1:-1])
    # the table is saved as text with 6 significant digits: equal to a micrometre
    assert rows[ids[0]]["centroid_r"] == pytest.approx(lib.review_rows(o.review)[0]["centroid_r"], abs=1e-3)
    assert back.report_dict()["agreement"] == pytest.approx(run.report["agreement"])
    assert [s.GetName() for s in segments(back.segmentation)] == [c["name"] for c in run.classes[1:]]
    assert np.allclose(matrix(back.disagreement), matrix(volume), atol=1e-9)
    d = back.disagreement.GetDisplayNode()
    assert (d.GetWindowLevelMin(), d.GetWindowLevelMax()) == pytest.approx((0.0, LN2), abs=1e-5)  # saved as text
    # the reloaded scene still works: show a region, export, and a re-run replaces it all
    assert lib.show_region(scene, volume, back, ids[1]) == ro.region_segment_ids(back.regions)[ids[1]]
    doc = json.loads(lib.export_review(back, tmp_path / "after.json").read_text(encoding="utf-8"))
    assert doc["regions"][0]["status"] == "corrected"
    old = {n.GetID() for n in back.nodes()}
    lib.load_outputs(scene, volume, run.outdir)
    assert all(scene.GetNodeByID(i) is None for i in old)


def test_segmentation_seg_nrrd_round_trip(fresh, run, tmp_path):
    import slicerio

    seg = fresh.outputs.segmentation
    segs = segments(seg)
    segs[0].SetTag("CARDSegment.Note", "checked")
    path = tmp_path / "roundtrip.seg.nrrd"
    storage = slicer.vtkMRMLSegmentationStorageNode()
    storage.SetFileName(str(path))
    assert storage.WriteData(seg)
    # read by slicerio (numpy only): names, colours and voxels as the engine wrote them
    data = slicerio.read_segmentation(str(path))
    labels = sitk.GetArrayFromImage(sitk.ReadImage(str(run.outdir / "segmentation.nii.gz")))
    by_name = {s["name"]: s for s in data["segments"]}
    assert list(by_name) == [c["name"] for c in run.classes[1:]]
    voxels = data["voxels"]
    for value, cls in enumerate(run.classes[1:], start=1):
        s = by_name[cls["name"]]
        assert np.allclose(s["color"], cls["color"], atol=1e-4)
        mask = voxels == s["labelValue"] if voxels.ndim == 3 else voxels[..., s.get("layer", 0)] == s["labelValue"]
        assert np.array_equal(mask.transpose(2, 1, 0), labels == value)
    # and back into MRML: same names, colours, masks, tags
    scene = make_scene()
    node = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", "reloaded")
    reader = slicer.vtkMRMLSegmentationStorageNode()
    reader.SetFileName(str(path))
    assert reader.ReadData(node)
    again = segments(node)
    assert [s.GetName() for s in again] == [s.GetName() for s in segs]
    for a, b in zip(again, segs):
        assert np.allclose(a.GetColor(), b.GetColor())
        assert np.array_equal(segment_mask(a), segment_mask(b))
    assert again[0].GetTag("CARDSegment.Note", out := vtk.mutable("")) and str(out) == "checked"
    assert "^87878005^" in terminology({s.GetName(): s for s in again}["LV"])


def test_review_export_csv_and_json(fresh, run, tmp_path):
    o = fresh.outputs
    first = run.report["regions"][0]["id"]
    lib.set_region_status(o.review, first, "accepted", note="fine, ok")
    doc = json.loads(lib.export_review(o, tmp_path / "review.json").read_text(encoding="utf-8"))
    assert doc["agreement"] == pytest.approx(run.report["agreement"])
    assert doc["out_of_domain"] is True and doc["input_node"] == fresh.volume.GetName()
    assert [r["id"] for r in doc["regions"]] == [r["id"] for r in run.report["regions"]]
    assert doc["regions"][0]["status"] == "accepted" and doc["regions"][0]["note"] == "fine, ok"
    assert doc["regions"][0]["bbox_ijk"] == run.report["regions"][0]["bbox_ijk"]
    assert doc["review"]["accepted"] == 1
    text = lib.export_review(o, tmp_path / "review.csv").read_text(encoding="utf-8")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(run.report["regions"])
    assert rows[0]["region"] == str(first) and rows[0]["status"] == "accepted" and rows[0]["note"] == "fine, ok"
    assert float(rows[0]["mean_disagreement"]) == pytest.approx(run.report["regions"][0]["mean_disagreement"])
    assert float(rows[0]["centroid_l"]) == pytest.approx(run.report["regions"][0]["centroid_lps"][0])
    assert float(rows[0]["volume_agreement"]) == pytest.approx(run.report["agreement"])
    assert rows[1]["status"] == "pending"
    with pytest.raises(ValueError):
        lib.export_review(o, tmp_path / "review.xlsx")


# ---------------------------------------------------------------------------------------------
# summary, uncalibrated runs


def test_agreement_summary_warns_when_out_of_domain(run):
    s = lib.agreement_summary(run.report)
    assert s.warning and s.agreement == pytest.approx(run.report["agreement"])  # threshold 0.999 in this bundle
    assert "out-of-domain" in s.text and f"{run.report['agreement']:.3f}" in s.text
    calm = dict(run.report, out_of_domain=False)
    s = lib.agreement_summary(calm)
    assert not s.warning and s.text.startswith("Agreement") and "flagged region" in s.text
    assert lib.agreement_summary(None).text == "No results yet."
    assert "Uncalibrated" in lib.agreement_summary({"method": "uc", "agreement": None}).text


def test_uncalibrated_run_gives_a_segmentation_without_maps(run, tmp_path):
    from cardseg.cli import main

    out = tmp_path / "uc"
    assert (
        main(
            [
                "segment",
                str(run.input_path),
                "-o",
                str(out),
                "--bundle",
                str(run.bundle),
                "--method",
                "uc",
                "--quiet",
                "--progress",
                "none",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    scene = make_scene()
    volume = load_input(scene, run.input_path)
    o = lib.load_outputs(scene, volume, out, classes=run.classes)
    assert o.segmentation is not None and o.report is not None
    assert o.disagreement is None and o.temperature is None and o.review is None
    assert composite(scene, "Red").GetForegroundVolumeID() is None
    assert "Uncalibrated" in lib.agreement_summary(o.report_dict()).text
    # the segmentation is the same as the calibrated run's
    other = make_scene()
    card = lib.load_outputs(other, load_input(other, run.input_path), run.outdir)
    for a, b in zip(segments(o.segmentation), segments(card.segmentation)):
        assert np.array_equal(segment_mask(a), segment_mask(b))


def test_bundle_choice(tmp_path, run):
    with pytest.raises(lib.BundleChoiceError, match="not shipped"):
        lib.resolve_bundle(True, None, tmp_path)
    shipped = lib.shipped_bundle_dir(tmp_path)
    shipped.mkdir(parents=True)
    shutil.copy(run.bundle / "bundle.json", shipped / "bundle.json")
    assert lib.resolve_bundle(True, "/ignored", tmp_path) == shipped
    assert lib.resolve_bundle(False, run.bundle, tmp_path) == run.bundle
    for bad in (None, "", "."):
        with pytest.raises(lib.BundleChoiceError, match="choose a bundle folder"):
            lib.resolve_bundle(False, bad, tmp_path)
    with pytest.raises(lib.BundleChoiceError, match="no bundle.json"):
        lib.resolve_bundle(False, tmp_path, tmp_path)
    assert [c["name"] for c in lib.bundle_classes(run.bundle)] == ["background", "RV", "MYO", "LV"]
    assert lib.bundle_label(run.bundle) == "untrained 0.0.0"


@pytest.mark.parametrize("content, kind", [("[1, 2]", "list"), ('"acdc"', "str"), ("3", "int"), ("null", "NoneType")])
def test_a_bundle_json_that_is_not_an_object_is_a_bundle_choice_error(tmp_path, content, kind):
    """What the panel's Apply catches (BundleChoiceError), in one line naming the file, for every
    reader of bundle.json: the acknowledgement check, the classes and the label."""
    from CARDSegmentLib.install.acknowledgement import ensure_acknowledged_for_bundle

    (tmp_path / "bundle.json").write_text(content, encoding="utf-8")
    never = SimpleNamespace(value=lambda key: None, setValue=lambda key, value: None)
    for read in (
        lib.bundle_config,
        lib.bundle_classes,
        lib.bundle_label,
        lambda p: ensure_acknowledged_for_bundle(p, tmp_path / "module", never, lambda *a: True),
    ):
        with pytest.raises(lib.BundleChoiceError) as caught:
            read(tmp_path)
        message = str(caught.value)
        assert "\n" not in message and str(tmp_path / "bundle.json") in message and f"JSON {kind}" in message


@pytest.mark.parametrize(
    "provenance", ["trained on ACDC", ["acdc"], 7, {"training": "acdc"}, {"training": {"primary": "acdc"}}]
)
def test_a_bundle_with_a_provenance_that_is_not_an_object_is_asked_nothing_and_does_not_crash(tmp_path, provenance):
    from CARDSegmentLib.install.acknowledgement import ensure_acknowledged_for_bundle, research_only_sources

    config = {"id": "not an object", "classes": [{"name": "background"}], "provenance": provenance}
    (tmp_path / "bundle.json").write_text(json.dumps(config), encoding="utf-8")
    asked = []
    settings = SimpleNamespace(value=lambda key: None, setValue=lambda key, value: None)
    assert (
        ensure_acknowledged_for_bundle(tmp_path, tmp_path / "module", settings, lambda *a: asked.append(a) or False)
        is True
    )
    assert asked == []  # names no research-only data set
    assert research_only_sources(config, shipped=True) == [research_only_sources({}, shipped=True)[0]]
    assert lib.bundle_label(tmp_path) == "?"
