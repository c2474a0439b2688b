"""Labelled slices for training and validation, read from disk into :class:`SliceRecord` items.

Three on-disk layouts are read into one list of :class:`SliceRecord` (a 2D image, its 2D label
map, the in-plane spacing ``(sx, sy)`` in mm, and where it came from):

* ``acdc-h5``: the preprocessed ACDC HDF5 layout (``slices/patientNNN_frameFF_slice_S.h5`` for the
  training patients, ``volumes/patientNNN_frameFF.h5`` for validation and test patients; datasets
  ``image`` and ``label``; split lists ``train_patients.txt`` etc.). The files carry no geometry:
  pixels are taken to be :data:`ACDC_H5_SPACING_MM` in-plane (typical ACDC spacing is 1.37-1.68 mm).
* ``acdc-nifti``: the official ACDC release (``patientNNN/patientNNN_frameFF.nii.gz`` with
  ``patientNNN_frameFF_gt.nii.gz``), spacing from the NIfTI header.
* ``pairs``: a generic folder of NIfTI image/label pairs matched by file name (``imagesTr/x.nii.gz``
  with ``labelsTr/x.nii.gz``; nnU-Net's ``x_0000.nii.gz`` image names are accepted too).

:class:`cardseg_train.data.slice_dataset.SliceDataset` maps records onto the network grid.

Splits: ``train`` and ``val`` only ever come from the training and source-validation lists; a
case named in a ``test`` list is refused by every training loader (:func:`load_split`).
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from cardseg.base.errors import CardsegError

#: in-plane pixel size assumed for the ACDC HDF5 files, which store no geometry
ACDC_H5_SPACING_MM = 1.5
FORMATS = ("acdc-h5", "acdc-nifti", "pairs", "synthetic")
SPLITS = ("train", "val", "test")
_NII = (".nii.gz", ".nii", ".nrrd", ".mha", ".mhd")
_H5_SLICE = re.compile(r"^(patient\d+)_(frame\d+)_slice_(\d+)\.h5$")
_H5_VOLUME = re.compile(r"^(patient\d+)_(frame\d+)\.h5$")
_ACDC_FRAME = re.compile(r"^(patient\d+)_(frame\d+)\.nii(\.gz)?$")


@dataclass
class SliceRecord:
    """One labelled 2D slice on its own grid.

    image: float32 ``(Y, X)``; label: uint8 ``(Y, X)``; spacing: in-plane ``(sx, sy)`` in mm
    (x = columns, y = rows, SimpleITK order); case: the volume it belongs to (e.g.
    ``patient002_frame01``); patient: the subject (the unit of splitting); index: slice number.
    """

    image: np.ndarray
    label: np.ndarray
    spacing: Tuple[float, float]
    case: str
    patient: str
    index: int = 0


# --------------------------------------------------------------------------------------------
# split lists
# --------------------------------------------------------------------------------------------
def read_split_list(path: os.PathLike) -> List[str]:
    """Patient/case ids in a split file (one per line, ``#`` comments and blank lines ignored)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()]


def split_lists(root: os.PathLike) -> Dict[str, List[str]]:
    """``{"train": [...], "val": [...], "test": [...]}`` from ``<split>_patients.txt`` in ``root``.

    Missing files give missing keys. Raises if the lists overlap (a test patient in training
    would silently invalidate every reported number).
    """
    root = Path(root)
    out = {}
    for split in SPLITS:
        f = root / f"{split}_patients.txt"
        if f.is_file():
            out[split] = read_split_list(f)
    names = list(out)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            both = sorted(set(out[a]) & set(out[b]))
            if both:
                raise CardsegError(
                    f"{root}: split lists {a} and {b} share {len(both)} patients ({', '.join(both[:3])} ...)"
                )
    return out


def holdout_split(ids: Sequence[str], val_fraction: float, seed: int = 0) -> Dict[str, List[str]]:
    """Deterministic patient-level split of ``ids`` into train and val when no split files exist."""
    ids = sorted(set(ids))
    if len(ids) < 2:
        return {"train": list(ids), "val": []}
    rng = np.random.default_rng(seed)
    order = [ids[i] for i in rng.permutation(len(ids))]
    n_val = min(len(ids) - 1, max(1, int(round(val_fraction * len(ids)))))
    return {"train": sorted(order[n_val:]), "val": sorted(order[:n_val])}


def _guard_test(records: List[SliceRecord], test_ids: Iterable[str], what: str) -> None:
    test = set(test_ids)
    bad = sorted({r.patient for r in records if r.patient in test or r.case in test})
    if bad:
        raise CardsegError(f"{what}: test patients must never be used in training ({', '.join(bad[:3])} ...)")


# --------------------------------------------------------------------------------------------
# (a) ACDC HDF5
# --------------------------------------------------------------------------------------------
def _h5_arrays(path: Path) -> Tuple[np.ndarray, np.ndarray]:
    import h5py

    with h5py.File(path, "r") as f:
        if "image" not in f or "label" not in f:
            raise CardsegError(f"{path}: needs datasets 'image' and 'label'")
        return np.asarray(f["image"][()], dtype=np.float32), np.asarray(f["label"][()], dtype=np.uint8)


def acdc_h5_records(
    root: os.PathLike, patients: Iterable[str], spacing_mm: float = ACDC_H5_SPACING_MM
) -> List[SliceRecord]:
    """Slices of the given patients from the ACDC HDF5 layout, in (patient, frame, slice) order.

    A patient's slices come from ``slices/`` when present there (training patients), otherwise
    from its ``volumes/`` files (validation and test patients), so both halves of the layout work
    for any split. ``spacing_mm`` is the assumed pixel size (the files hold none).
    """
    root = Path(root)
    wanted = list(dict.fromkeys(patients))
    by_patient: Dict[str, List[Tuple[str, int, Path]]] = {p: [] for p in wanted}
    sdir, vdir = root / "slices", root / "volumes"
    if sdir.is_dir():
        for name in os.listdir(sdir):
            m = _H5_SLICE.match(name)
            if m and m.group(1) in by_patient:
                by_patient[m.group(1)].append((f"{m.group(1)}_{m.group(2)}", int(m.group(3)), sdir / name))
    records: List[SliceRecord] = []
    sp = (float(spacing_mm), float(spacing_mm))
    for p in wanted:
        items = sorted(by_patient[p])
        if items:
            for case, idx, path in items:
                img, lab = _h5_arrays(path)
                records.append(SliceRecord(img, lab, sp, case, p, idx))
            continue
        vols = sorted(vdir.glob(f"{p}_frame*.h5")) if vdir.is_dir() else []
        vols = [v for v in vols if _H5_VOLUME.match(v.name)]
        if not vols:
            raise CardsegError(f"{root}: no HDF5 slices or volumes for {p}")
        for v in vols:
            img, lab = _h5_arrays(v)
            if img.ndim == 2:
                img, lab = img[None], lab[None]
            case = v.name[:-3]
            records.extend(SliceRecord(img[z], lab[z], sp, case, p, z) for z in range(img.shape[0]))
    return records


# --------------------------------------------------------------------------------------------
# (b) official ACDC NIfTI and (c) generic image/label pairs
# --------------------------------------------------------------------------------------------
def _strip_ext(name: str) -> str:
    for ext in _NII:
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def read_labelled_volume(
    image_path: os.PathLike, label_path: os.PathLike
) -> Tuple[np.ndarray, np.ndarray, Tuple[float, float]]:
    """Image ``(Z, Y, X)`` float32, label ``(Z, Y, X)`` uint8 and in-plane spacing ``(sx, sy)``.

    2D files become one slice. The label must share the image's size (geometry is trusted to match).
    """
    import SimpleITK as sitk

    img = sitk.ReadImage(str(image_path))
    lab = sitk.ReadImage(str(label_path))
    if img.GetDimension() not in (2, 3) or lab.GetDimension() not in (2, 3):
        raise CardsegError(f"{image_path}: only 2D or 3D images are read for training (4D cine: pick a frame first)")
    if img.GetSize() != lab.GetSize():
        raise CardsegError(f"{label_path}: size {lab.GetSize()} differs from its image's {img.GetSize()}")
    a = sitk.GetArrayFromImage(img).astype(np.float32)
    b = sitk.GetArrayFromImage(lab)
    if a.ndim == 2:
        a, b = a[None], b[None]
    if b.min() < 0 or b.max() > 255 or not np.array_equal(b, np.round(b)):
        raise CardsegError(f"{label_path}: labels must be small non-negative integers")
    sx, sy = img.GetSpacing()[:2]
    return a, b.astype(np.uint8), (float(sx), float(sy))


def acdc_nifti_cases(root: os.PathLike) -> Dict[str, List[Tuple[str, Path, Path]]]:
    """``{patient: [(case, image, label), ...]}`` for the official ACDC layout under ``root``.

    ``root`` may be the release folder (with ``training/`` and ``testing/``) or one of them;
    only frames that have a ``_gt`` label file are listed (the 4D ``_4d`` files are not).
    """
    root = Path(root)
    out: Dict[str, List[Tuple[str, Path, Path]]] = {}
    for pdir in sorted(list(root.glob("patient*")) + list(root.glob("*/patient*"))):
        if not pdir.is_dir():
            continue
        for f in sorted(pdir.iterdir()):
            m = _ACDC_FRAME.match(f.name)
            if not m:
                continue
            gt = f.with_name(f"{m.group(1)}_{m.group(2)}_gt.nii" + (m.group(3) or ""))
            if gt.is_file():
                out.setdefault(m.group(1), []).append((f"{m.group(1)}_{m.group(2)}", f, gt))
    return out


def pair_cases(
    root: os.PathLike, image_dir: str = "imagesTr", label_dir: str = "labelsTr"
) -> Dict[str, List[Tuple[str, Path, Path]]]:
    """``{case: [(case, image, label)]}`` for image/label files matched by name.

    ``root/image_dir/x.nii.gz`` pairs with ``root/label_dir/x.nii.gz``; an image called
    ``x_0000.nii.gz`` (nnU-Net channel suffix) pairs with ``x.nii.gz``. Each case is its own
    patient for splitting.
    """
    root = Path(root)
    idir, ldir = root / image_dir, root / label_dir
    if not idir.is_dir() or not ldir.is_dir():
        raise CardsegError(f"{root}: needs folders {image_dir}/ and {label_dir}/")
    labels = {_strip_ext(f.name): f for f in ldir.iterdir() if f.is_file() and _strip_ext(f.name) != f.name}
    out: Dict[str, List[Tuple[str, Path, Path]]] = {}
    for f in sorted(idir.iterdir()):
        stem = _strip_ext(f.name)
        if stem == f.name:
            continue
        key = stem if stem in labels else re.sub(r"_\d{4}$", "", stem)
        if key in labels:
            out[key] = [(key, f, labels[key])]
    if not out:
        raise CardsegError(f"{root}: no image in {image_dir}/ has a label of the same name in {label_dir}/")
    return out


def _records_from_cases(cases: Dict[str, List[Tuple[str, Path, Path]]], patients: Iterable[str]) -> List[SliceRecord]:
    records: List[SliceRecord] = []
    for p in patients:
        if p not in cases:
            raise CardsegError(f"no labelled files for {p}")
        for case, ipath, lpath in cases[p]:
            img, lab, sp = read_labelled_volume(ipath, lpath)
            records.extend(SliceRecord(img[z], lab[z], sp, case, p, z) for z in range(img.shape[0]))
    return records


def acdc_nifti_records(root: os.PathLike, patients: Optional[Iterable[str]] = None) -> List[SliceRecord]:
    """Slices of the official ACDC NIfTI layout (all labelled patients when ``patients`` is None)."""
    cases = acdc_nifti_cases(root)
    if not cases:
        raise CardsegError(f"{root}: no patientNNN/patientNNN_frameFF.nii.gz with a _gt label found")
    return _records_from_cases(cases, sorted(cases) if patients is None else patients)


def pair_records(
    root: os.PathLike, cases: Optional[Iterable[str]] = None, image_dir: str = "imagesTr", label_dir: str = "labelsTr"
) -> List[SliceRecord]:
    """Slices of a generic image/label folder (all pairs when ``cases`` is None)."""
    found = pair_cases(root, image_dir, label_dir)
    return _records_from_cases(found, sorted(found) if cases is None else cases)


def synthetic_records(seeds: Iterable[int], slices: int = 8, shape=(160, 144), spacing=(1.5, 1.5)) -> List[SliceRecord]:
    """Labelled slices of :func:`cardseg.bundle.phantom.synthetic_cine_volume` (tests and smoke runs)."""
    from cardseg.bundle.phantom import synthetic_cine_volume

    out = []
    for s in seeds:
        vol, lab = synthetic_cine_volume(shape=(slices, *shape), spacing=(*spacing, 8.0), seed=int(s))
        case = f"synthetic{int(s):03d}"
        out.extend(
            SliceRecord(vol.array[z], lab[z], tuple(float(v) for v in spacing), case, case, z) for z in range(slices)
        )
    return out


# --------------------------------------------------------------------------------------------
# one entry point for the trainer
# --------------------------------------------------------------------------------------------
def detect_format(root: os.PathLike) -> str:
    """Guess the layout of ``root``: ``acdc-h5``, ``acdc-nifti`` or ``pairs``."""
    if str(root) == "synthetic":
        return "synthetic"
    r = Path(root)
    if not r.is_dir():
        raise CardsegError(f"{root}: no such data folder")
    if (r / "slices").is_dir() or (r / "volumes").is_dir():
        return "acdc-h5"
    if (r / "imagesTr").is_dir() and (r / "labelsTr").is_dir():
        return "pairs"
    if acdc_nifti_cases(r):
        return "acdc-nifti"
    raise CardsegError(f"{root}: not a known layout (ACDC HDF5, ACDC NIfTI or imagesTr/labelsTr pairs)")


def patient_ids(root: os.PathLike, fmt: str) -> List[str]:
    """Every labelled patient (or case) the layout holds."""
    r = Path(root)
    if fmt == "acdc-h5":
        ids = set()
        for sub, pat in (("slices", _H5_SLICE), ("volumes", _H5_VOLUME)):
            if (r / sub).is_dir():
                ids.update(m.group(1) for m in map(pat.match, os.listdir(r / sub)) if m)
        return sorted(ids)
    if fmt == "acdc-nifti":
        return sorted(acdc_nifti_cases(r))
    if fmt == "pairs":
        return sorted(pair_cases(r))
    raise CardsegError(f"unknown data format {fmt!r} (choose from {', '.join(FORMATS)})")


def resolve_split(root: os.PathLike, fmt: str, val_fraction: float = 0.1, seed: int = 0) -> Dict[str, List[str]]:
    """Train/val(/test) patient lists: the split files in ``root`` if present, else a seeded hold-out.

    The hold-out is drawn from the patients not listed in a ``test_patients.txt`` (if one exists).
    """
    if fmt == "synthetic":
        return {"train": [f"synthetic{i:03d}" for i in range(8)], "val": ["synthetic100", "synthetic101"], "test": []}
    lists = split_lists(root)
    if "train" in lists:
        lists.setdefault("val", [])
        lists.setdefault("test", [])
        return lists
    test = lists.get("test", [])
    pool = [p for p in patient_ids(root, fmt) if p not in set(test)]
    out = holdout_split(pool, val_fraction, seed)
    out["test"] = list(test)
    return out


def load_split(
    root: os.PathLike,
    split: str,
    fmt: Optional[str] = None,
    val_fraction: float = 0.1,
    seed: int = 0,
    max_patients: Optional[int] = None,
    spacing_mm: float = ACDC_H5_SPACING_MM,
) -> List[SliceRecord]:
    """Slices of the ``train`` or ``val`` split of a dataset in any supported layout.

    ``split="test"`` is refused: test patients are for reporting only, never for training or
    model selection. ``max_patients`` keeps the first few patients (smoke runs).
    """
    if split not in ("train", "val"):
        raise CardsegError(f"training reads only the train and val splits, not {split!r}")
    fmt = fmt or detect_format(root)
    lists = resolve_split(root, fmt, val_fraction, seed)
    patients = list(lists.get(split, []))
    if max_patients is not None:
        patients = patients[:max_patients]
    if fmt == "synthetic":
        records = synthetic_records([int(p[-3:]) for p in patients])
    elif fmt == "acdc-h5":
        records = acdc_h5_records(root, patients, spacing_mm)
    elif fmt == "acdc-nifti":
        records = acdc_nifti_records(root, patients)
    elif fmt == "pairs":
        records = pair_records(root, patients)
    else:
        raise CardsegError(f"unknown data format {fmt!r} (choose from {', '.join(FORMATS)})")
    _guard_test(records, lists.get("test", []), f"{root} ({split})")
    return records


def group_by_case(records: Sequence[SliceRecord]) -> "OrderedDict[str, List[int]]":
    """Indices of ``records`` grouped by case, in first-seen order, slices sorted by index."""
    groups: "OrderedDict[str, List[int]]" = OrderedDict()
    for i, r in enumerate(records):
        groups.setdefault(r.case, []).append(i)
    for case, idx in groups.items():
        idx.sort(key=lambda i: records[i].index)
    return groups
