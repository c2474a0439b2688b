"""Shared fixtures: an untrained tiny bundle and small volumes written to disk."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))

REPO = Path(__file__).resolve().parents[2]
ACDC = REPO.parent / "shared" / "data" / "acdc"


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory) -> Path:
    """An untrained bundle of two tiny U-Nets (64 x 64 at 3 mm), made the documented way."""
    from cardseg.scaffold import init_bundle

    path = tmp_path_factory.mktemp("bundles") / "tiny"
    init_bundle(path, primary="time-unet:tiny", reference="time-unet:micro", input_size=64, pixel_spacing_mm=3.0, seed=1)
    return path


@pytest.fixture(scope="session")
def synthetic_volume():
    from cardseg.scaffold import synthetic_cine_volume

    return synthetic_cine_volume(shape=(4, 96, 80), spacing=(1.6, 1.4, 8.0), seed=3)


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
