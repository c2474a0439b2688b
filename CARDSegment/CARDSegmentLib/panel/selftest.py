"""The body of the module's self-test (``CARDSegmentTest`` in ``CARDSegment.py``, run by ctest and
"Reload and Test"): a small synthetic oblique volume through the whole path, with networks of the
shipped bundle's architecture (SwinUNETR primary, so a missing MONAI piece fails here), then once
with the shipped bundle itself.

The functions take the ``unittest.TestCase`` (for its assertions and ``delayDisplay``), the scene,
a Logic factory and Slicer's ``loadVolume``, so this module needs no Slicer application.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Callable, Tuple

from ..install import dependencies as deps
from ..install.bundles import bundle_classes, bundle_config, shipped_bundle_dir
from ..runs.jobs import JobOptions, remove_tree
from ..runs.process import SegmentCommand, default_python_executable
from ..outputs.review import review_rows, set_region_status, show_region
from .summary import agreement_summary

#: the shipped bundle's networks, used when the module folder has no shipped bundle
SHIPPED_NETWORKS = ("time-swinunetr:mini", "time-unet:tiny")

#: run by PythonSlicer with the engine: an untrained bundle and a synthetic oblique volume
#: (argv: output folder, primary "arch:size", reference "arch:size")
MAKE_INPUTS_SCRIPT = (
    "import sys, numpy as np, SimpleITK as sitk\n"
    "from cardseg.bundle.phantom import synthetic_cine_volume\n"
    "from cardseg.bundle.scaffold import InitOptions, init_bundle\n"
    "from cardseg.bundle.loading import update_config\n"
    "out, primary, reference = sys.argv[1:4]\n"
    "init_bundle(out + '/bundle', InitOptions(primary=primary, reference=reference, input_size=64,\n"
    "                                        pixel_spacing_mm=3.0, seed=1))\n"
    "update_config(out + '/bundle', {'regions': {'flag_threshold': 0.05, 'min_voxels': 5}})\n"
    "vol, _ = synthetic_cine_volume(shape=(3, 64, 56), spacing=(2.5, 2.2, 8.0), seed=3)\n"
    "img = vol.to_image()\n"
    "img.SetDirection(np.asarray(sitk.VersorTransform((0.3, -0.5, 0.8), 0.6).GetMatrix()).tolist())\n"
    "img.SetOrigin((-40.5, 12.25, 7.0))\n"
    "sitk.WriteImage(img, out + '/input.nrrd')\n"
)


def shipped_networks(module_dir: str) -> Tuple[str, str]:
    """ "arch:size" of the shipped bundle's primary and reference networks."""
    shipped = shipped_bundle_dir(module_dir)
    if not (shipped / "bundle.json").is_file():
        return SHIPPED_NETWORKS
    networks = bundle_config(shipped)["networks"]
    return tuple(f"{networks[role]['arch']}:{networks[role]['size']}" for role in ("primary", "reference"))


def make_inputs(folder: str, module_dir: str) -> Tuple[str, str]:
    """An untrained bundle with the shipped bundle's networks and a synthetic oblique volume,
    written by the engine in PythonSlicer: (bundle folder, volume file)."""
    primary, reference = shipped_networks(module_dir)
    env = SegmentCommand("", "", engine_dir=module_dir).env()
    subprocess.run(
        [default_python_executable(), "-c", MAKE_INPUTS_SCRIPT, folder, primary, reference],
        env=env,
        check=True,
        timeout=600,
    )
    return os.path.join(folder, "bundle"), os.path.join(folder, "input.nrrd")


def require_packages(test) -> None:
    """Skip ``test`` (``unittest.SkipTest``, which ctest reports as skipped, not passed) when the
    engine's packages are not installed, e.g. on a build machine without PyTorch."""
    missing = deps.missing_requirements()
    if missing:
        test.skipTest("the engine's packages are not installed: " + ", ".join(r.pip_spec for r in missing))


def work_folder(test) -> str:
    """A new temporary folder that is deleted when ``test`` ends (a failure to delete is logged)."""
    folder = tempfile.mkdtemp(prefix="CARDSegmentTest-")
    test.addCleanup(remove_tree, folder)
    return folder


def _assert_same_matrix(test, node, expected) -> None:
    import vtk

    m = vtk.vtkMatrix4x4()
    node.GetIJKToRASMatrix(m)
    for r in range(4):
        for c in range(4):
            test.assertAlmostEqual(m.GetElement(r, c), expected.GetElement(r, c), places=9)


def segment_synthetic_volume(test, scene, make_logic: Callable, load_volume: Callable, module_dir: str) -> None:
    """Segment the synthetic volume twice: the outputs on the input's geometry, then replaced."""
    import vtk

    test.delayDisplay("Making a synthetic volume and an untrained bundle with the shipped networks")
    bundle, volume_path = make_inputs(work_folder(test), module_dir)
    primary = bundle_config(bundle)["networks"]["primary"]
    test.assertEqual(f"{primary['arch']}:{primary['size']}", shipped_networks(module_dir)[0])
    volume = load_volume(volume_path)
    other = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "unrelated")
    before = vtk.vtkMatrix4x4()
    volume.GetIJKToRASMatrix(before)
    input_mtime = volume.GetImageData().GetMTime()

    logic = make_logic()
    options = JobOptions(
        bundle_path=bundle, device="cpu", method="card", load_probabilities=True, engine_dir=logic.moduleDir
    )
    test.delayDisplay("Segmenting (separate process)")
    outputs = logic.runSync(volume, options, timeout=900)

    test.assertEqual(outputs.segmentation.GetClassName(), "vtkMRMLSegmentationNode")
    segmentation = outputs.segmentation.GetSegmentation()
    names = [segmentation.GetNthSegment(i).GetName() for i in range(segmentation.GetNumberOfSegments())]
    test.assertEqual(names, [c["name"] for c in bundle_classes(bundle)[1:]])
    for node in (outputs.disagreement, outputs.temperature, outputs.probabilities):
        _assert_same_matrix(test, node, before)
    display = outputs.disagreement.GetDisplayNode()
    test.assertAlmostEqual(display.GetWindowLevelMin(), 0.0)
    test.assertAlmostEqual(display.GetWindowLevelMax(), 0.6931471805599453, places=6)
    test.assertTrue(display.GetApplyThreshold())  # the low end is transparent
    test.assertIsNotNone(outputs.review)
    test.assertIsNotNone(agreement_summary(outputs.report_dict()).agreement)

    test.delayDisplay("Re-running replaces this module's outputs only")
    old = [n.GetID() for n in outputs.nodes()]
    again = logic.runSync(volume, options, timeout=900)
    for node_id in old:
        test.assertIsNone(scene.GetNodeByID(node_id))
    test.assertTrue(scene.IsNodePresent(other))
    test.assertTrue(scene.IsNodePresent(volume))
    test.assertEqual(volume.GetImageData().GetMTime(), input_mtime)
    if review_rows(again.review):
        region = review_rows(again.review)[0]["region"]
        show_region(scene, volume, again, region)
        set_region_status(again.review, region, "accepted")
    test.delayDisplay("CARDSegment test passed")


def segment_with_shipped_bundle(test, make_logic: Callable, load_volume: Callable, module_dir: str) -> None:
    """The shipped default bundle itself (trained weights) segments the synthetic volume.

    The source tree always holds the bundle (cardseg/bundles/acdc) and CMakeLists.txt installs
    every file of it, so a module folder without it is a broken build or install: the test fails.
    """
    shipped = shipped_bundle_dir(module_dir)
    if not (shipped / "bundle.json").is_file():
        test.fail(f"no shipped bundle in {shipped}: the build or install rules lost cardseg/bundles/")
    test.delayDisplay("Segmenting with the shipped bundle (separate process)")
    _, volume_path = make_inputs(work_folder(test), module_dir)
    volume = load_volume(volume_path)
    logic = make_logic()
    options = JobOptions(bundle_path=str(shipped), device="cpu", method="card", engine_dir=logic.moduleDir)
    outputs = logic.runSync(volume, options, timeout=900)
    segmentation = outputs.segmentation.GetSegmentation()
    names = [segmentation.GetNthSegment(i).GetName() for i in range(segmentation.GetNumberOfSegments())]
    test.assertEqual(names, [c["name"] for c in bundle_classes(shipped)[1:]])
    report = outputs.report_dict()
    test.assertEqual(os.path.realpath(report["bundle"]["path"]), os.path.realpath(str(shipped)))
    test.assertIsNotNone(outputs.disagreement)
    test.delayDisplay("CARDSegment shipped-bundle test passed")
