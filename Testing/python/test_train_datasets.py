"""Training data loaders: ACDC HDF5 (real data when present, and a tiny written copy), the official
ACDC NIfTI layout and generic image/label pairs (tiny files written here), the split guards, and
the mapping onto the network grid (must equal the engine's inference preprocessing)."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch

from cardseg.bundle.loading import BundleSpec, default_config
from cardseg.base.errors import CardsegError
from cardseg.bundle.scaffold import ACDC_CLASSES
from cardseg.segment import network_inputs
from cardseg.io.volume import Volume
from cardseg_train.data import datasets as D
from cardseg_train.data.slice_dataset import SliceDataset

ACDC = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "acdc"
HAS_ACDC = (ACDC / "slices").is_dir() and (ACDC / "train_patients.txt").is_file()


def _toy_volume(z=3, ny=40, nx=36, seed=0):
    rng = np.random.default_rng(seed)
    lab = np.zeros((z, ny, nx), np.uint8)
    lab[:, 10:20, 8:18] = 3
    lab[:, 22:28, 8:30] = 1
    lab[:, 12:16, 20:26] = 2
    img = (100 + 400 * (lab > 0) + rng.normal(0, 10, lab.shape)).astype(np.float32)
    return img, lab


def _write_nifti(path: Path, arr: np.ndarray, spacing):
    import SimpleITK as sitk

    im = sitk.GetImageFromArray(arr)
    im.SetSpacing(spacing)
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(im, str(path))


# ---------------------------------------------------------------------------- ACDC HDF5
def _write_h5(path: Path, img, lab):
    import h5py

    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f["image"] = img.astype(np.float32)
        f["label"] = lab.astype(np.uint8)


@pytest.fixture
def tiny_h5(tmp_path):
    img, lab = _toy_volume(z=3)
    img = (img - img.min()) / (img.max() - img.min())
    for p in ("patient001", "patient002"):
        for fr in ("frame01", "frame12"):
            for s in range(3):
                _write_h5(tmp_path / "slices" / f"{p}_{fr}_slice_{s + 1}.h5", img[s], lab[s])
    for p in ("patient003", "patient004"):
        _write_h5(tmp_path / "volumes" / f"{p}_frame01.h5", img, lab)
    (tmp_path / "train_patients.txt").write_text("patient001\npatient002\n")
    (tmp_path / "val_patients.txt").write_text("patient003\n")
    (tmp_path / "test_patients.txt").write_text("patient004\n")
    return tmp_path


def test_h5_layout_written_here(tiny_h5):
    assert D.detect_format(tiny_h5) == "acdc-h5"
    train = D.load_split(tiny_h5, "train")
    assert len(train) == 2 * 2 * 3
    assert {r.patient for r in train} == {"patient001", "patient002"}
    assert all(r.spacing == (1.5, 1.5) for r in train)
    assert [r.index for r in train[:3]] == [1, 2, 3]
    val = D.load_split(tiny_h5, "val")
    assert len(val) == 3 and {r.case for r in val} == {"patient003_frame01"}
    assert np.array_equal(val[1].label, _toy_volume(z=3)[1][1])
    # spacing assumption is a parameter
    assert D.load_split(tiny_h5, "val", spacing_mm=1.2)[0].spacing == (1.2, 1.2)


def test_test_patients_never_reach_training(tiny_h5):
    with pytest.raises(CardsegError):
        D.load_split(tiny_h5, "test")
    # a test patient slipped into the training list is refused
    (tiny_h5 / "train_patients.txt").write_text("patient001\npatient004\n")
    with pytest.raises(CardsegError, match="share"):
        D.load_split(tiny_h5, "train")


@pytest.mark.acdc
@pytest.mark.skipif(not HAS_ACDC, reason="ACDC data not in ../shared/data/acdc")
def test_h5_real_acdc():
    lists = D.split_lists(ACDC)
    assert len(lists["train"]) == 70 and len(lists["val"]) == 10 and len(lists["test"]) == 10
    two = D.acdc_h5_records(ACDC, lists["train"][:2])
    assert two and {r.patient for r in two} == set(lists["train"][:2])
    r = two[0]
    assert r.image.dtype == np.float32 and r.label.dtype == np.uint8 and r.image.shape == r.label.shape
    assert 0.0 <= r.image.min() and r.image.max() <= 1.0 and set(np.unique(r.label)) <= {0, 1, 2, 3}
    val = D.acdc_h5_records(ACDC, lists["val"][:1])
    assert len({r.case for r in val}) == 2  # end-diastole and end-systole volumes
    ds = SliceDataset(two[:6] + val[:4], target_spacing=2.0, size=128)
    assert ds.images.shape == (10, 1, 128, 128) and ds.labels.shape == (10, 128, 128)
    assert ds.num_classes == 4 and 0.0 <= float(ds.images.min()) and float(ds.images.max()) <= 1.0
    assert not set(lists["test"]) & ({r.patient for r in two} | {r.patient for r in val})


# ---------------------------------------------------------------------------- ACDC NIfTI
def test_acdc_nifti_layout(tmp_path):
    root = tmp_path / "ACDC" / "training"
    img, lab = _toy_volume(z=2)
    for p in ("patient001", "patient002", "patient003"):
        for fr in ("frame01", "frame12"):
            _write_nifti(root / p / f"{p}_{fr}.nii.gz", img, (1.3, 1.6, 10.0))
            _write_nifti(root / p / f"{p}_{fr}_gt.nii.gz", lab, (1.3, 1.6, 10.0))
        _write_nifti(root / p / f"{p}_4d.nii.gz", img, (1.3, 1.6, 10.0))  # no label: ignored
    assert D.detect_format(root) == "acdc-nifti"
    cases = D.acdc_nifti_cases(tmp_path / "ACDC")  # the release folder works too
    assert sorted(cases) == ["patient001", "patient002", "patient003"]
    assert [c for c, _, _ in cases["patient001"]] == ["patient001_frame01", "patient001_frame12"]
    recs = D.acdc_nifti_records(root, ["patient002"])
    assert len(recs) == 4 and all(r.spacing == pytest.approx((1.3, 1.6)) for r in recs)
    assert np.array_equal(recs[1].label, lab[1]) and np.allclose(recs[1].image, img[1])
    # no split files: a seeded patient-level hold-out; a test list is respected
    (root / "test_patients.txt").write_text("patient003\n")
    split = D.resolve_split(root, "acdc-nifti", val_fraction=0.5, seed=0)
    assert sorted(split["train"] + split["val"]) == ["patient001", "patient002"] and len(split["val"]) == 1
    assert "patient003" not in {r.patient for r in D.load_split(root, "train", val_fraction=0.5)}


# ---------------------------------------------------------------------------- generic pairs
def test_generic_pairs(tmp_path):
    img, lab = _toy_volume(z=2)
    _write_nifti(tmp_path / "imagesTr" / "case_a_0000.nii.gz", img, (0.9, 0.9, 3.0))  # nnU-Net naming
    _write_nifti(tmp_path / "labelsTr" / "case_a.nii.gz", lab, (0.9, 0.9, 3.0))
    _write_nifti(tmp_path / "imagesTr" / "case_b.nii.gz", img[:1], (1.1, 1.2, 3.0))
    _write_nifti(tmp_path / "labelsTr" / "case_b.nii.gz", lab[:1], (1.1, 1.2, 3.0))
    _write_nifti(tmp_path / "imagesTr" / "case_c.nii.gz", img, (1.0, 1.0, 3.0))  # unlabelled: skipped
    assert D.detect_format(tmp_path) == "pairs"
    assert sorted(D.pair_cases(tmp_path)) == ["case_a", "case_b"]
    recs = D.pair_records(tmp_path)
    assert len(recs) == 3
    b = [r for r in recs if r.case == "case_b"][0]
    assert b.spacing == pytest.approx((1.1, 1.2)) and np.array_equal(b.label, lab[0])
    with pytest.raises(CardsegError):
        _write_nifti(tmp_path / "labelsTr" / "case_c.nii.gz", lab[:1], (1.0, 1.0, 3.0))  # wrong size
        D.pair_records(tmp_path, ["case_c"])


# ---------------------------------------------------------------------------- network grid
def test_mapping_equals_inference_preprocessing():
    img, lab = _toy_volume(z=3, ny=60, nx=52)
    spacing = (1.4, 1.7)
    recs = [D.SliceRecord(img[z], lab[z], spacing, "c", "p", z) for z in range(3)]
    ds = SliceDataset(recs, target_spacing=2.5, size=32)
    cfg = default_config(BundleSpec("t", ACDC_CLASSES, {"arch": "time-unet"}, {"arch": "time-unet"}, 2.5, 32))
    vol = Volume(array=img, spacing=(*spacing, 8.0), origin=(0.0, 0.0, 0.0), direction=tuple(np.eye(3).ravel()))
    x, grid = network_inputs(vol, types.SimpleNamespace(config=cfg))
    assert torch.equal(ds.images, x)
    # labels: nearest neighbour on the same grid, integer valued, every class kept
    assert ds.labels.dtype == torch.uint8 and set(ds.labels.unique().tolist()) == {0, 1, 2, 3}
    image, label = ds[1]
    assert image.shape == (1, 32, 32) and label.dtype == torch.int64
    vols = ds.volumes()
    assert len(vols) == 1 and vols[0][1].shape == (3, 1, 32, 32)


def test_dataset_rejects_too_many_classes():
    img, lab = _toy_volume(z=1)
    with pytest.raises(CardsegError):
        SliceDataset([D.SliceRecord(img[0], lab[0], (1.0, 1.0), "c", "p")], 2.0, 32, num_classes=3)
