"""The module's sample data (``CARDSegmentLib/install/sampledata.py``, written by
``Resources/Screenshots/phantom_sample.py``): the shipped phantom files are what the project's
phantom code draws, Sample Data gets everything it needs to copy them from the module
folder (no network) and check them, and they load into MRML as a volume and a three-segment
segmentation."""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

REPO = Path(__file__).resolve().parents[2]
MODULE_DIR = REPO / "CARDSegment"
if str(MODULE_DIR) not in sys.path:
    sys.path.insert(0, str(MODULE_DIR))

from CARDSegmentLib.install import sampledata  # noqa: E402

sys.path.insert(0, str(REPO / "Resources" / "Screenshots"))
import phantom_sample  # noqa: E402  (the maintainers' writer of the sample files)

FOLDER = MODULE_DIR / "Resources" / "SampleData"
CLASSES = json.loads((MODULE_DIR / "cardseg" / "bundles" / "acdc" / "bundle.json").read_text(encoding="utf-8"))[
    "classes"
]


def read_labels(path: Path):
    """A .seg.nrrd's label array (Z, Y, X) and its segments, read with slicerio."""
    import slicerio

    seg = slicerio.read_segmentation(str(path))
    return np.asarray(seg["voxels"]).transpose(2, 1, 0), seg["segments"]


def test_the_shipped_files_match_their_checksums_and_the_module_installs_them():
    cmake = (MODULE_DIR / "CMakeLists.txt").read_text(encoding="utf-8")
    for f in sampledata.SAMPLE_FILES:
        path = FOLDER / f.file_name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == f.sha256, f"{f.file_name}: checksum changed"
        assert path.stat().st_size < 1024 * 1024
        assert f"Resources/SampleData/{f.file_name}".replace("CARDSegment", "${MODULE_NAME}", 1) in cmake
    assert sampledata.missing_files(MODULE_DIR) == []
    assert "Resources/SampleData/${MODULE_NAME}Phantom.png" in cmake


def test_registration_arguments_point_at_the_module_folder_and_are_consistent():
    args = sampledata.registration_arguments(MODULE_DIR)
    n = len(sampledata.SAMPLE_FILES)
    assert args["category"] == "CARDSegment" and args["sampleName"] == "CARDSegmentPhantom"
    for key in ("uris", "fileNames", "nodeNames", "loadFileTypes", "checksums"):
        assert len(args[key]) == n, key  # Sample Data refuses lists of different lengths
    assert args["loadFileTypes"] == ["VolumeFile", "SegmentationFile"]
    assert all(u.startswith("file://") for u in args["uris"])
    assert Path(args["thumbnailFileName"]).is_file()


#: the parameters of ``SampleDataLogic.registerCustomSampleDataSource`` in each supported Slicer,
#: read from Modules/Scripted/SampleData/SampleData.py in the tags (the same list in all three)
REGISTER_PARAMETERS = (
    "category",
    "sampleName",
    "uris",
    "fileNames",
    "nodeNames",
    "customDownloader",
    "thumbnailFileName",
    "loadFileTypes",
    "loadFiles",
    "loadFileProperties",
    "checksums",
    "loadFileType",
)
REGISTER_TAGS = ("v5.8.0", "v5.10.0", "v5.12.0")
#: accepted there only for old callers; passing it beside loadFileTypes is an error
DEPRECATED_PARAMETERS = {"loadFileType"}


def test_registration_uses_only_current_parameters_of_every_supported_slicer():
    args = sampledata.registration_arguments(MODULE_DIR)
    assert set(args) <= set(REGISTER_PARAMETERS), set(args) - set(REGISTER_PARAMETERS)
    assert not set(args) & DEPRECATED_PARAMETERS
    assert "loadFileTypes" in args


@pytest.mark.skipif(not os.environ.get("SLICER_SOURCE"), reason="needs SLICER_SOURCE: a Slicer git checkout")
@pytest.mark.parametrize("tag", REGISTER_TAGS)
def test_the_recorded_parameters_are_slicers(tag):
    source = subprocess.run(
        ["git", "-C", os.environ["SLICER_SOURCE"], "show", f"{tag}:Modules/Scripted/SampleData/SampleData.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == "registerCustomSampleDataSource"
    ]
    assert len(found) == 1
    assert tuple(a.arg for a in found[0].args.args) == REGISTER_PARAMETERS
    assert "loadFileType: deprecated" in source


def test_sample_data_copies_and_verifies_the_files_without_network(tmp_path):
    """What Sample Data does with a source: fetch each URI into its cache under fileName (urllib
    handles file:// addresses), then compare the SHA-256 with the registered checksum."""
    args = sampledata.registration_arguments(MODULE_DIR)
    cache = tmp_path / "cache"
    cache.mkdir()
    for uri, name, checksum in zip(args["uris"], args["fileNames"], args["checksums"]):
        target = cache / name
        urllib.request.urlretrieve(uri, target)
        algo, digest = checksum.split(":")
        assert algo == "SHA256" and hashlib.sha256(target.read_bytes()).hexdigest() == digest
        assert target.read_bytes() == (FOLDER / name).read_bytes()


def test_register_calls_sample_data_once_with_those_arguments():
    calls = []
    assert sampledata.register_sample_data(MODULE_DIR, register=lambda **kw: calls.append(kw)) is True
    assert calls == [sampledata.registration_arguments(MODULE_DIR)]


def test_register_refuses_a_module_folder_without_the_files(tmp_path, caplog):
    (tmp_path / "Resources" / "SampleData").mkdir(parents=True)
    shutil.copy(FOLDER / "CARDSegmentPhantom.nrrd", tmp_path / "Resources" / "SampleData")
    calls = []
    with caplog.at_level(logging.WARNING):
        assert sampledata.register_sample_data(tmp_path, register=lambda **kw: calls.append(kw)) is False
    assert calls == []
    assert "CARDSegmentPhantom-truth.seg.nrrd" in caplog.text and "CARDSegmentPhantom.png" in caplog.text
    assert "CARDSegmentPhantom.nrrd," not in caplog.text


def test_the_shipped_files_are_the_projects_phantom(tmp_path):
    """Drawn again by the phantom code, the image equals the shipped one (up to the int16 rounding
    of a float difference) and the labels are identical, with the bundle's segment names and colours."""
    pytest.importorskip("torch")  # the phantom lives beside the engine's networks
    volume, labels = phantom_sample.phantom()
    shipped = sitk.ReadImage(str(FOLDER / "CARDSegmentPhantom.nrrd"))
    assert shipped.GetPixelID() == sitk.sitkInt16
    assert shipped.GetSpacing() == pytest.approx(volume.spacing) and shipped.GetOrigin() == pytest.approx(volume.origin)
    array = sitk.GetArrayFromImage(shipped)
    assert array.shape == (sampledata.PHANTOM_SLICES,) + sampledata.PHANTOM_SIZE
    assert np.abs(array.astype(np.int32) - volume.array.astype(np.int32)).max() <= 1
    shipped_labels, segments = read_labels(FOLDER / "CARDSegmentPhantom-truth.seg.nrrd")
    np.testing.assert_array_equal(shipped_labels, labels)
    assert [(s["name"], s["labelValue"]) for s in segments] == [(c["name"], v) for v, c in enumerate(CLASSES) if v]
    for s, c in zip(segments, CLASSES[1:]):
        assert s["color"] == pytest.approx(c["color"])
    # the RV is gone from the apical slices, the LV pool and myocardium are on every slice
    assert (labels[-1] == 1).sum() == 0 and all(
        (labels[k] == 3).any() and (labels[k] == 2).any() for k in range(labels.shape[0])
    )


def test_write_sample_files_writes_what_it_reports(tmp_path):
    pytest.importorskip("torch")
    digests = phantom_sample.write_sample_files(tmp_path, CLASSES)
    assert set(digests) == {f.file_name for f in sampledata.SAMPLE_FILES}
    for name, digest in digests.items():
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == digest
    thumb = sitk.GetArrayFromImage(sitk.ReadImage(str(tmp_path / sampledata.THUMBNAIL)))
    assert thumb.shape == sampledata.PHANTOM_SIZE + (3,)
    # the labels are drawn in their colours: the LV pool is reddish, the background grey
    labels = read_labels(tmp_path / "CARDSegmentPhantom-truth.seg.nrrd")[0][sampledata.PHANTOM_SLICES // 2]
    lv, bg = thumb[labels == 3].mean(axis=0), thumb[labels == 0].mean(axis=0)
    assert lv[0] > lv[2] + 20 and abs(bg[0] - bg[2]) < 3


def test_thumbnail_windows_and_blends():
    image = np.zeros((3, 4, 4), np.int16)
    image[1, :, 2:] = 1000
    labels = np.zeros((3, 4, 4), np.uint8)
    labels[1, 0, 0] = 1
    rgb = phantom_sample.thumbnail_rgb(image, labels, [(0, 0, 0), (0.0, 0.0, 1.0)])
    assert rgb.shape == (4, 4, 3) and rgb.dtype == np.uint8
    assert (rgb[:, 2:] == 255).all() and (rgb[1:, :2] == 0).all()
    assert tuple(rgb[0, 0]) == (0, 0, round(0.45 * 255))


def test_the_files_load_into_mrml():
    slicer = pytest.importorskip("slicer")
    if not hasattr(slicer, "vtkMRMLScene"):
        pytest.skip("the importable 'slicer' is not slicer-core")
    scene = slicer.vtkMRMLScene()
    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "CARDSegmentPhantom")
    storage = slicer.vtkMRMLVolumeArchetypeStorageNode()
    storage.SetFileName(str(FOLDER / "CARDSegmentPhantom.nrrd"))
    assert storage.ReadData(volume)
    assert volume.GetImageData().GetDimensions() == (176, 192, 10)
    assert volume.GetSpacing() == pytest.approx((1.5, 1.5, 8.0))
    seg = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", "CARDSegmentPhantom truth")
    seg_storage = slicer.vtkMRMLSegmentationStorageNode()
    seg_storage.SetFileName(str(FOLDER / "CARDSegmentPhantom-truth.seg.nrrd"))
    assert seg_storage.ReadData(seg)
    segmentation = seg.GetSegmentation()
    names = [segmentation.GetNthSegment(i).GetName() for i in range(segmentation.GetNumberOfSegments())]
    assert names == ["RV", "MYO", "LV"]
