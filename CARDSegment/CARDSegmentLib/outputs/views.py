"""The slice views of a scene: their nodes, and centring them on a point."""

from __future__ import annotations

from typing import Iterable, List


def slice_composite_nodes(scene) -> List[object]:
    c = scene.GetNodesByClass("vtkMRMLSliceCompositeNode")
    return [c.GetItemAsObject(i) for i in range(c.GetNumberOfItems())]


def slice_nodes(scene) -> List[object]:
    c = scene.GetNodesByClass("vtkMRMLSliceNode")
    return [c.GetItemAsObject(i) for i in range(c.GetNumberOfItems())]


def jump_slices_to(scene, ras: Iterable[float]) -> None:
    """Centre every slice view on the RAS point ``ras``."""
    r, a, s = [float(v) for v in ras]
    for node in slice_nodes(scene):
        node.JumpSliceByCentering(r, a, s)
