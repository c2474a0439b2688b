"""Shared fixtures: an untrained tiny bundle and small volumes written to disk."""

from __future__ import annotations

import csv
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))


# the suite never reads or writes the user's model cache (ONNX exports of the test bundles):
# this process and every child it starts (they inherit the variable) use a private folder.
# pytest_sessionfinish fails the run if a test left the variable pointing anywhere else; the
# user's own folder is never compared, so the user's runs beside the suite cannot fail it.
_MODEL_CACHE = tempfile.TemporaryDirectory(prefix="cardseg-test-cache-")
os.environ["CARDSEG_CACHE_DIR"] = _MODEL_CACHE.name
os.environ.pop("CARDSEG_BACKEND", None)
#: the model cache of the suite's processes
PRIVATE_CACHE = Path(_MODEL_CACHE.name)

REPO = Path(__file__).resolve().parents[2]
#: the Slicer module's folder (CARDSegment.py and CARDSegmentLib)
MODULE_DIR = REPO / "CARDSegment"
ACDC = REPO.parent / "shared" / "data" / "acdc"
#: the tests that read the ACDC data skip on a clone without ../shared/data/acdc (a user's)
needs_acdc = pytest.mark.skipif(not (ACDC / "volumes").is_dir(), reason="ACDC data not in ../shared/data/acdc")


def pytest_sessionfinish(session, exitstatus):
    """A run whose processes were left pointed at another model cache than the private one fails."""
    if os.environ.get("CARDSEG_CACHE_DIR") != str(PRIVATE_CACHE):
        print(f"\nFAILED: a test left CARDSEG_CACHE_DIR at {os.environ.get('CARDSEG_CACHE_DIR')!r}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _no_retired_cine_items():
    """Every test starts without the replaced cine result items an earlier test's panel left
    (they are process-wide, let go by a release timer that tests fire only when they test it)."""
    sequences = sys.modules.get("CARDSegmentLib.cine.sequences")
    if sequences is not None:
        sequences.release_retired(None)
    yield


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory) -> Path:
    """An untrained bundle of two tiny U-Nets (64 x 64 at 3 mm), made the documented way."""
    from cardseg.bundle.scaffold import InitOptions, init_bundle

    path = tmp_path_factory.mktemp("bundles") / "tiny"
    options = InitOptions(
        primary="time-unet:tiny", reference="time-unet:micro", input_size=64, pixel_spacing_mm=3.0, seed=1
    )
    init_bundle(path, options)
    return path


@pytest.fixture(scope="session")
def synthetic_volume():
    from cardseg.bundle.phantom import synthetic_cine_volume

    return synthetic_cine_volume(shape=(4, 96, 80), spacing=(1.6, 1.4, 8.0), seed=3)


@pytest.fixture(scope="session")
def phantom_file(tmp_path_factory, synthetic_volume) -> Path:
    """The synthetic volume as a plain NIfTI file (an input of ``cardseg segment``)."""
    vol, _ = synthetic_volume
    path = tmp_path_factory.mktemp("vol") / "phantom.nii.gz"
    sitk.WriteImage(vol.to_image(), str(path))
    return path


@pytest.fixture()
def model_cache(tmp_path, monkeypatch) -> Path:
    """A fresh ``$CARDSEG_CACHE_DIR`` for this test (prepared ONNX models and programs land there)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("CARDSEG_CACHE_DIR", str(path))
    return path


@pytest.fixture(scope="session")
def rotated_nifti(tmp_path_factory, synthetic_volume) -> Path:
    """The synthetic volume as a NIfTI with an oblique direction and anisotropic spacing."""
    vol, _ = synthetic_volume
    img = vol.to_image()
    rot = sitk.VersorTransform((0.3, -0.5, 0.8), 0.6)  # axis, angle
    img.SetDirection(np.asarray(rot.GetMatrix()).tolist())
    img.SetOrigin((-40.5, 12.25, 7.0))
    path = tmp_path_factory.mktemp("inputs") / "oblique.nii.gz"
    sitk.WriteImage(img, str(path))
    return path


@pytest.fixture
def scene_and_volume(tmp_path, synthetic_volume):
    """An MRML scene holding the synthetic volume as the scalar volume node *cine*: ``(scene,
    volume)``. For the Slicer-logic tests (their module has called :func:`slicer_core`)."""
    import slicer
    from CARDSegmentLib.outputs import volume_files

    vol, _ = synthetic_volume
    src = tmp_path / "in.nrrd"
    sitk.WriteImage(vol.to_image(), str(src))
    scene = slicer.vtkMRMLScene()
    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "cine")
    volume_files.read_volume_file(volume, src)
    return scene, volume


def assert_figure(path, min_width: int = 300, min_height: int = 200, min_ink: float = 0.01, min_colors: int = 3):
    """A written figure is a real, non-blank image: a PNG of at least that size whose pixels are
    not all background (at least ``min_ink`` of them differ from the corner colour) and that uses
    at least ``min_colors`` colours (axes, text and data, not one flat fill)."""
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG", f"{path}: {im.format}"
        assert im.width >= min_width and im.height >= min_height, f"{path}: {im.size}"
        rgb = np.asarray(im.convert("RGB"))
    ink = float((np.abs(rgb.astype(int) - rgb[0, 0].astype(int)).sum(axis=2) > 30).mean())
    assert ink >= min_ink, f"{path}: only {ink:.4f} of the pixels differ from the background"
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) >= min_colors, f"{path}: a flat image"


def refused(capsys, argv, *words) -> str:
    """Run ``cardseg`` in this process with ``argv``: exit status 2 and one stderr line (no
    traceback) holding each of ``words``; returns that line."""
    import cardseg.cli

    assert cardseg.cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for w in words:
        assert w in err[0], err[0]
    return err[0]


def files_of(folder) -> dict:
    """Every file under ``folder`` (relative POSIX path -> bytes): what a refused command must leave."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def read_csv(path):
    """The rows of a CSV file (a batch's cohort table) as dicts."""
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def without_timings(rows):
    """Cohort rows without their ``time_*`` columns (which differ between runs)."""
    return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]


def blob_error_maps(seed: int, case: str, decoy_tac=(0.06, 0.09)):
    """Labelled review maps whose answer is known: the prediction is wrong in two 8x8 blobs (64 px
    each, a substantial error) under strong disagreement; two 6x6 decoys of weaker disagreement
    (``decoy_tac``) sit where it is right. A ``cardseg_train.review.data.VolumeMaps``."""
    from cardseg_train.review.data import VolumeMaps

    rng = np.random.default_rng(seed)
    truth = np.zeros((4, 48, 48), np.uint8)
    truth[:, 10:38, 10:38] = 3
    pred = truth.copy()
    tac = rng.uniform(0, 0.01, truth.shape).astype(np.float32)
    for z, (y, x) in ((0, (12, 12)), (2, (26, 24))):
        pred[z, y : y + 8, x : x + 8] = 2
        tac[z, y - 1 : y + 9, x - 1 : x + 9] = rng.uniform(0.3, 0.5)
    for z, (y, x) in ((1, (30, 12)), (3, (14, 30))):
        tac[z, y : y + 6, x : x + 6] = rng.uniform(*decoy_tac)
    return VolumeMaps(case, "clean", pred, truth, tac, (1.5, 1.5, 8.0))


def slicer_core():
    """The slicer-core package (MRML without the application), with the module's folder on
    ``sys.path`` so that ``CARDSegmentLib`` imports; called at a test module's top, it skips that
    whole module where no slicer-core is installed."""
    slicer = pytest.importorskip("slicer")
    if not hasattr(slicer, "vtkMRMLScene"):
        pytest.skip("the importable 'slicer' is not slicer-core", allow_module_level=True)
    if str(MODULE_DIR) not in sys.path:
        sys.path.insert(0, str(MODULE_DIR))
    return slicer


def run_cli_quiet(args) -> tuple:
    """``cardseg ARGS`` in this process: ``(exit code, stderr)``, stdout swallowed."""
    import contextlib
    import io

    from cardseg.cli import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, err.getvalue()


def sigterm_now(*_a, **_k):
    """Stands in for a step of a batch: SIGTERM arrives (the handler raises in the main thread)."""
    import signal
    import time

    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    raise AssertionError("SIGTERM did not stop the batch")
