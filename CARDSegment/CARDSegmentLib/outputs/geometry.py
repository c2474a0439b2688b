"""Volume geometry: IJK-to-RAS matrices, LPS/RAS points, and placing outputs on the input's grid.

Matrices are 4x4 ``numpy`` arrays (homogeneous, IJK columns to RAS mm); points are 3 floats.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import numpy as np

from .nodes import OutputError

#: largest difference (mm) tolerated between an output's IJK-to-RAS matrix and the input's before
#: the input's exact matrix is copied onto the output (NIfTI keeps its geometry in float32)
GEOMETRY_TOLERANCE_MM = 1e-3


def ijk_to_ras(volume_node) -> np.ndarray:
    """The node's 4x4 IJK-to-RAS matrix as an array."""
    import vtk

    m = vtk.vtkMatrix4x4()
    volume_node.GetIJKToRASMatrix(m)
    return np.array([[m.GetElement(r, c) for c in range(4)] for r in range(4)])


def vtk_matrix(array: np.ndarray):
    """A 4x4 array as a ``vtkMatrix4x4``."""
    import vtk

    m = vtk.vtkMatrix4x4()
    for r in range(4):
        for c in range(4):
            m.SetElement(r, c, float(array[r, c]))
    return m


def lps_to_ras(point: Iterable[float]) -> List[float]:
    """LPS (files, the engine's report) to RAS (Slicer): negate x and y."""
    x, y, z = [float(v) for v in point]
    return [-x, -y, z]


def local_to_world(node, point: Iterable[float]) -> List[float]:
    """A point in ``node``'s own coordinates, moved through its parent transforms (if any)."""
    import vtk

    p = [float(v) for v in point]
    parent = node.GetParentTransformNode() if node is not None else None
    if parent is None:
        return p
    t = vtk.vtkGeneralTransform()
    parent.GetTransformToWorld(t)
    return list(t.TransformPoint(p))


def image_dimensions(volume_node) -> Optional[Tuple[int, int, int]]:
    """The voxel grid's (I, J, K) size, or None without image data."""
    image = volume_node.GetImageData()
    return tuple(image.GetDimensions()) if image is not None else None


def adopt_geometry(node, input_volume, what: str) -> None:
    """Check that ``node`` lies on the input's grid, then give it the input's exact matrix."""
    if image_dimensions(node) != image_dimensions(input_volume):
        raise OutputError(
            f"{what}: grid {image_dimensions(node)} differs from the input's {image_dimensions(input_volume)}"
        )
    ref = ijk_to_ras(input_volume)
    diff = float(np.abs(ijk_to_ras(node) - ref).max())
    if diff > GEOMETRY_TOLERANCE_MM:
        raise OutputError(f"{what}: geometry differs from the input volume's by {diff:.3g} mm")
    node.CopyOrientation(input_volume)  # spacing, origin and directions: bit for bit the input's
    node.SetAndObserveTransformNodeID(input_volume.GetTransformNodeID())
