"""Making the module's sample data (``CARDSegment/Resources/SampleData``) with the engine's phantom
code; ``CARDSegmentLib.install.sampledata`` (which may not import the engine) says what the files are and
registers them in Slicer. Run through ``make_screenshots.py --write-sample-data``, so that the
screenshots are drawn from exactly these files."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np

MODULE_DIR = Path(__file__).resolve().parents[2] / "CARDSegment"
if str(MODULE_DIR) not in sys.path:
    sys.path.insert(0, str(MODULE_DIR))

from CARDSegmentLib.install import sampledata  # noqa: E402


def phantom():
    """The phantom as the sample holds it: ``(Volume with int16 array (Z, Y, X), labels (Z, Y, X)
    uint8: 0 background, 1 RV, 2 MYO, 3 LV)``; ``cardseg synth``'s default phantom, rounded."""
    from cardseg.bundle.phantom import synthetic_cine_volume

    shape = (sampledata.PHANTOM_SLICES,) + sampledata.PHANTOM_SIZE
    volume, labels = synthetic_cine_volume(shape=shape, seed=sampledata.PHANTOM_SEED)
    volume.array = np.clip(np.rint(volume.array), -32768, 32767).astype(np.int16)
    return volume, labels


def thumbnail_rgb(image: np.ndarray, labels: np.ndarray, colors) -> np.ndarray:
    """The mid slice, windowed to its 1-99.5 percentiles, with the labels blended in their
    colours: ``(Y, X, 3)`` uint8. image, labels: ``(Z, Y, X)``; colors: RGB in [0, 1] per label."""
    k = image.shape[0] // 2
    sl = image[k].astype(np.float64)
    lo, hi = np.percentile(sl, (1, 99.5))
    grey = np.clip((sl - lo) / max(hi - lo, 1e-6), 0, 1)
    rgb = np.repeat(grey[..., None], 3, axis=2)
    for value, color in enumerate(colors):
        if value == 0:
            continue
        mask = labels[k] == value
        rgb[mask] = 0.55 * rgb[mask] + 0.45 * np.asarray(color, dtype=np.float64)
    return np.rint(rgb * 255).astype(np.uint8)


def write_sample_files(folder: os.PathLike, classes: List[dict]) -> Dict[str, str]:
    """Write the image, its true labels (``.seg.nrrd``, segment names and colours from
    ``classes``, the bundle's) and the thumbnail into ``folder``; returns each sample file's
    SHA-256 (what ``sampledata.SAMPLE_FILES`` must hold)."""
    import SimpleITK as sitk
    from cardseg.io.written import write_seg_nrrd

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    volume, labels = phantom()
    image_file, labels_file = (folder / f.file_name for f in sampledata.SAMPLE_FILES)
    sitk.WriteImage(volume.to_image(), str(image_file), True)
    write_seg_nrrd(labels_file, labels, volume, classes)
    thumb = thumbnail_rgb(volume.array, labels, [c.get("color", (1, 0, 0)) for c in classes])
    sitk.WriteImage(sitk.GetImageFromArray(thumb, isVector=True), str(folder / sampledata.THUMBNAIL))
    return {f.file_name: sampledata.sha256_of(folder / f.file_name) for f in sampledata.SAMPLE_FILES}
