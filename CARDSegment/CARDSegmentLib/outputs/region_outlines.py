"""The flagged regions drawn as outlines: ``regions.nii.gz`` (region ``k`` has value ``k``, 0
elsewhere, on the input's grid) becomes a segmentation node with one segment per region, shown
in the slice views as outlines only (no fill), so that the reader sees exactly the voxels a
region holds, not a bounding box. Segment names carry the region's rank, ``p_error`` and size
from ``report.json``. Selecting a region in the review table highlights its outline
(:func:`highlight_region`: another colour, full opacity, the other regions dimmed). MRML
classes only (no Qt)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from .geometry import adopt_geometry
from .nodes import OutputError
from .volume_files import read_volume_file

#: the outline colour (a warm yellow, apart from the class colours and the overlays' maps)
OUTLINE_COLOR = (1.0, 0.85, 0.1)
#: the segment attribute that holds the region's id
REGION_ID_TAG = "CARDSegment.RegionId"
#: the selected region's outline colour (a cyan apart from the others' yellow and the class colours)
SELECTED_COLOR = (0.1, 0.9, 1.0)
#: the other regions' outline opacity while one is selected
DIMMED_OPACITY = 0.35
#: the node attribute that names the highlighted region (absent: none)
SELECTED_ATTRIBUTE = "CARDSegment.SelectedRegion"


def segment_name(region: Dict[str, object]) -> str:
    """``Region 2: p_error 0.56, 10.8 ml`` (what the report holds of it)."""
    parts = [f"Region {int(region['id'])}"]
    extra = []
    if region.get("p_error") is not None:
        extra.append(f"p_error {float(region['p_error']):.2f}")
    if region.get("volume_mm3") is not None:
        extra.append(f"{float(region['volume_mm3']) / 1000.0:.1f} ml")
    return parts[0] + (": " + ", ".join(extra) if extra else "")


def load_region_outlines(scene, input_volume, path: Path, name: str, regions: List[dict]):
    """A segmentation node from ``regions.nii.gz`` with one segment per region of ``regions``
    (the report's list), outlined in 2D; None when the file holds no region."""
    import slicer

    labels = scene.AddNewNodeByClass("vtkMRMLLabelMapVolumeNode", scene.GenerateUniqueName(f"{name} labels"))
    try:
        read_volume_file(labels, path)
        adopt_geometry(labels, input_volume, path.name)
        logic = slicer.vtkSlicerSegmentationsModuleLogic
        if not regions or not hasattr(logic, "ImportLabelmapToSegmentationNode"):  # (5.8 has it: static)
            return None
        node = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", name)
        node.SetReferenceImageGeometryParameterFromVolumeNode(input_volume)
        node.SetAndObserveTransformNodeID(input_volume.GetTransformNodeID())  # as the input's other outputs
        if not logic.ImportLabelmapToSegmentationNode(labels, node, ""):
            scene.RemoveNode(node)
            raise OutputError(f"cannot turn {path.name} into region outlines")
    finally:
        scene.RemoveNode(labels)
    by_id = {int(r["id"]): r for r in regions}
    segmentation = node.GetSegmentation()
    for i in range(segmentation.GetNumberOfSegments()):
        segment = segmentation.GetNthSegment(i)
        region = by_id.get(int(segment.GetLabelValue()), {"id": segment.GetLabelValue()})
        segment.SetName(segment_name(region))
        segment.SetTag(REGION_ID_TAG, str(int(region["id"])))
        segment.SetColor(*OUTLINE_COLOR)
    node.CreateDefaultDisplayNodes()
    display = node.GetDisplayNode()
    display.SetVisibility2DFill(False)
    display.SetVisibility2DOutline(True)
    display.SetVisibility3D(False)
    display.SetSliceIntersectionThickness(2)
    return node


def region_segment_ids(node) -> Dict[int, str]:
    """``{region id: segment id}`` of a node made by :func:`load_region_outlines`."""
    import vtk

    out: Dict[int, str] = {}
    segmentation = node.GetSegmentation()
    for i in range(segmentation.GetNumberOfSegments()):
        segment = segmentation.GetNthSegment(i)
        tag = vtk.mutable("") if hasattr(vtk, "mutable") else None
        value: Optional[str] = None
        if tag is not None and segment.GetTag(REGION_ID_TAG, tag):
            value = str(tag)
        if value is not None:
            out[int(value)] = segmentation.GetNthSegmentID(i)
    return out


def highlight_region(node, region_id: Optional[int]) -> Optional[str]:
    """Highlight region ``region_id`` of a node made by :func:`load_region_outlines`: its outline
    shown in :data:`SELECTED_COLOR` at full opacity, every other region's in its own colour at
    :data:`DIMMED_OPACITY`. ``None``, or a region the node does not hold, shows every region as
    loaded. Returns the highlighted segment's id (None: none)."""
    display = node.GetDisplayNode()
    ids = region_segment_ids(node)
    selected = ids.get(int(region_id)) if region_id is not None else None
    for segment_id in ids.values():
        if segment_id == selected:
            display.SetSegmentOverrideColor(segment_id, *SELECTED_COLOR)
            display.SetSegmentVisibility(segment_id, True)
        else:
            display.UnsetSegmentOverrideColor(segment_id)
        display.SetSegmentOpacity2DOutline(segment_id, DIMMED_OPACITY if selected not in (None, segment_id) else 1.0)
    if selected is None:
        node.RemoveAttribute(SELECTED_ATTRIBUTE)
    else:
        node.SetAttribute(SELECTED_ATTRIBUTE, str(int(region_id)))
    return selected
