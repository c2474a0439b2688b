"""The module's sample data: the project's synthetic short-axis phantom in Slicer's Sample Data
module (category "CARDSegment"), so that a user can try the module without data of their own.

ACDC may not be redistributed, so the sample is the phantom ``cardseg synth`` draws (10 slices
of 192 x 176 pixels at 1.5 mm, 8 mm apart, seed 0; see
``cardseg.bundle.phantom.synthetic_cine_volume``), stored as int16, with its true labels as a
segmentation. It is one cardiac phase: the phantom has no motion, so there is no cine sequence.
The files ship in the module folder (``Resources/SampleData``, about 0.5 MB) and nothing is
downloaded: Sample Data "downloads" them from their ``file://`` address into Slicer's cache,
checking their SHA-256, and loads them from there.

:func:`register_sample_data` needs no Qt (``register`` defaults to Slicer's
``SampleData.SampleDataLogic.registerCustomSampleDataSource``; tests pass their own). The files
are made with the engine, outside the module, by ``Resources/Screenshots/phantom_sample.py``
(``python Resources/Screenshots/make_screenshots.py --write-sample-data``), which prints the
checksums :data:`SAMPLE_FILES` must hold.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

CATEGORY = "CARDSegment"
SAMPLE_NAME = "CARDSegmentPhantom"
#: where the files live, relative to the module folder (installed by CARDSegment/CMakeLists.txt)
SAMPLE_FOLDER = Path("Resources") / "SampleData"
THUMBNAIL = "CARDSegmentPhantom.png"
#: the phantom, as ``cardseg synth`` writes it by default
PHANTOM_SLICES = 10
PHANTOM_SEED = 0
PHANTOM_SIZE = (192, 176)  # rows, columns


@dataclass(frozen=True)
class SampleFile:
    file_name: str
    node_name: str
    load_type: str  # Slicer's file type for loading it
    sha256: str


#: the shipped files and their checksums
SAMPLE_FILES = (
    SampleFile(
        "CARDSegmentPhantom.nrrd",
        "CARDSegmentPhantom",
        "VolumeFile",
        "3f1c4f5febb97a15d211fb3457200df74b929f0afe42923d9bd66981d4abf893",
    ),
    SampleFile(
        "CARDSegmentPhantom-truth.seg.nrrd",
        "CARDSegmentPhantom truth",
        "SegmentationFile",
        "b5c0539fae9f61c709148d87e54a71e40e5774ca7bc20ec15ac3a66a6e33cb76",
    ),
)


def sample_folder(module_dir: os.PathLike) -> Path:
    return Path(module_dir).resolve() / SAMPLE_FOLDER


def sha256_of(path: os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def missing_files(module_dir: os.PathLike) -> List[str]:
    """The sample files (and thumbnail) absent from the module folder."""
    folder = sample_folder(module_dir)
    names = [f.file_name for f in SAMPLE_FILES] + [THUMBNAIL]
    return [n for n in names if not (folder / n).is_file()]


def registration_arguments(module_dir: os.PathLike) -> Dict[str, object]:
    """The keyword arguments of ``SampleDataLogic.registerCustomSampleDataSource`` for the phantom:
    the files' ``file://`` addresses in the module folder, their names in the cache and the scene,
    how to load them (``loadFileTypes``, which every Slicer 5 accepts; ``loadFileType`` is its
    deprecated spelling) and their checksums."""
    folder = sample_folder(module_dir)
    return {
        "category": CATEGORY,
        "sampleName": SAMPLE_NAME,
        "uris": [(folder / f.file_name).as_uri() for f in SAMPLE_FILES],
        "fileNames": [f.file_name for f in SAMPLE_FILES],
        "nodeNames": [f.node_name for f in SAMPLE_FILES],
        "thumbnailFileName": str(folder / THUMBNAIL),
        "loadFileTypes": [f.load_type for f in SAMPLE_FILES],
        "checksums": [f"SHA256:{f.sha256}" for f in SAMPLE_FILES],
    }


def register_sample_data(module_dir: os.PathLike, register: Optional[Callable[..., None]] = None) -> bool:
    """Register the phantom with Sample Data (call it once Slicer has started). False, with a
    warning in the log, when the files are not in the module folder (a build that missed them)."""
    missing = missing_files(module_dir)
    if missing:
        logging.warning(
            "CARDSegment: sample data not registered, missing in %s: %s", sample_folder(module_dir), ", ".join(missing)
        )
        return False
    if register is None:
        import SampleData  # Slicer's own module

        register = SampleData.SampleDataLogic.registerCustomSampleDataSource
    register(**registration_arguments(module_dir))
    return True
