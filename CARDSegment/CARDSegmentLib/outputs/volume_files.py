"""Reading and writing volume files for the engine, without storage nodes left in the scene."""

from __future__ import annotations

import os
from pathlib import Path

from .nodes import OutputError


def read_volume_file(node, path: os.PathLike) -> None:
    """Read an image file into ``node`` without attaching a storage node (the file is temporary)."""
    import slicer

    storage = slicer.vtkMRMLVolumeArchetypeStorageNode()
    storage.SetFileName(str(path))
    storage.SetSingleFile(True)
    if not storage.ReadData(node) or node.GetImageData() is None:
        raise OutputError(f"cannot read {path}")


def write_volume_file(volume_node, path: os.PathLike) -> None:
    """Write ``volume_node`` to ``path`` (e.g. .nrrd) for the engine; the node and scene are not changed."""
    import slicer

    if volume_node is None or volume_node.GetImageData() is None:
        raise OutputError("the input volume has no image data")
    storage = slicer.vtkMRMLVolumeArchetypeStorageNode()
    storage.SetFileName(str(path))
    storage.SetUseCompression(False)
    if not storage.WriteData(volume_node) or not Path(path).is_file():
        raise OutputError(f"cannot write the input volume to {path}")
