"""What an input may be: sizes, spacings and axis directions the readers (files and DICOM series) accept."""

from typing import Optional

import numpy as np

#: most voxels a file may declare in all (every frame of a 4D cine), about 256 MB as float32
MAX_FILE_VOXELS = 64 * 2**20
#: most voxels of the volume that is segmented (one frame); what a whole run at this size needs in
#: memory is measured by Testing/benchmarks/peak_memory.py
MAX_VOLUME_VOXELS = 16 * 2**20
#: what a refusal of a larger volume says of the memory a run at the limit needs (the measured peaks)
LIMIT_MEMORY_NOTE = "a run that size needs about 2.7 GB of memory, 3 GB on a first run that exports the ONNX models"
#: smallest in-plane size (pixels) accepted as an image rather than a mistake
MIN_INPLANE = 16
#: plausible pixel spacing (mm) for MRI in-plane, and between slices
INPLANE_SPACING_MM = (0.05, 10.0)
SLICE_SPACING_MM = (0.05, 100.0)
#: largest departure from an orthonormal direction matrix accepted (each entry of D^T D - I):
#: about 0.006 degrees between axes, or a unit vector's length off by 1e-4; the outputs are written
#: on an orthonormal grid, so a skewed grid cannot come back where it was and is refused
DIRECTION_TOLERANCE = 1e-4
#: largest disagreement between a NIfTI's sform and qform (both set) taken for float rounding: the origins (mm),
#: and each entry of the unit axis directions; beyond it the input is refused (readers differ in which they take)
SFORM_QFORM_ORIGIN_MM = 1e-3
SFORM_QFORM_DIRECTION = 1e-4


def orthonormal_error(direction) -> float:
    """Largest entry of ``|D^T D - I|`` for the 3x3 (or 2x2) direction matrix ``D`` whose
    columns are the axis directions; 0 for an exactly orthonormal matrix, inf for a non-finite one."""
    d = _columns(direction)
    if not np.isfinite(d).all():
        return float("inf")
    return float(np.abs(d.T @ d - np.eye(d.shape[1])).max())


def nearest_orthonormal(direction) -> Optional[np.ndarray]:
    """The orthonormal matrix nearest to ``direction`` (polar decomposition, same handedness),
    or ``None`` when ``direction`` departs from one by more than :data:`DIRECTION_TOLERANCE`."""
    d = _columns(direction)
    if orthonormal_error(d) > DIRECTION_TOLERANCE:
        return None
    u, _, vt = np.linalg.svd(d, full_matrices=False)
    return u @ vt


def skew_degrees(direction) -> float:
    """The largest departure (degrees) of an angle between two axes of ``direction`` from 90."""
    d = _columns(direction)
    norms = np.linalg.norm(d, axis=0)
    if not np.isfinite(d).all() or (norms == 0).any():
        return 90.0
    c = (d / norms).T @ (d / norms)
    return float(np.degrees(np.arcsin(min(np.abs(c - np.eye(d.shape[1])).max(), 1.0))))


def _columns(direction) -> np.ndarray:
    """A matrix whose columns are axis directions: a flat row-major square (ITK's direction
    tuple) is reshaped, a 2D array is taken as it is."""
    d = np.asarray(direction, dtype=float)
    if d.ndim == 1:
        n = int(round(np.sqrt(d.size)))
        d = d.reshape(n, n)
    return d
