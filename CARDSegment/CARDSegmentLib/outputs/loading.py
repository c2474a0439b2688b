"""Turning one ``cardseg segment`` output folder into nodes, replacing the previous ones.

The folder holds ``report.json``, ``segmentation.seg.nrrd`` and, as the run made them,
``disagreement.nii.gz`` and ``temperature.nii.gz`` (scalar maps on the input's grid) and
``probabilities.nii.gz`` (one component per class). MRML classes only (no Qt).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from . import terminology
from .geometry import GEOMETRY_TOLERANCE_MM, adopt_geometry, ijk_to_ras
from .nodes import (
    BUNDLE_ATTRIBUTE,
    METHOD_ATTRIBUTE,
    REPORT_REFERENCE,
    REVIEW_REFERENCE,
    ROLES,
    OutputError,
    OutputNodes,
    all_nodes,
    output_nodes_of,
    read_report,
    remove_node,
    tag_output,
)
from .overlays import show_overlay, style_overlay
from .region_outlines import load_region_outlines
from .review import create_review_table
from .volume_files import read_volume_file


def _check_labelmap_grid(segmentation, input_volume) -> None:
    """Every binary labelmap of ``segmentation`` lies on the input volume's grid."""
    import vtk

    ref = ijk_to_ras(input_volume)
    for i in range(segmentation.GetNumberOfSegments()):
        labelmap = segmentation.GetNthSegment(i).GetRepresentation("Binary labelmap")
        if labelmap is None:
            continue
        m = vtk.vtkMatrix4x4()
        labelmap.GetImageToWorldMatrix(m)
        world = np.array([[m.GetElement(r, c) for c in range(4)] for r in range(4)])
        corner = np.array([labelmap.GetExtent()[0], labelmap.GetExtent()[2], labelmap.GetExtent()[4], 1.0])
        if (
            np.abs(world[:3, :3] - ref[:3, :3]).max() > GEOMETRY_TOLERANCE_MM
            or np.abs(world @ corner - ref @ corner).max() > GEOMETRY_TOLERANCE_MM
        ):
            raise OutputError("segmentation: its grid is not the input volume's")


def _name_segments(segmentation, classes: Optional[List[dict]]) -> None:
    """The bundle's class names and colours on the segments; terminology where the bundle gives none."""
    for value, cls in enumerate(classes or []):
        if value == 0:
            continue
        segment = segmentation.GetSegment(f"Segment_{value}")
        if segment is None:
            continue
        segment.SetName(str(cls.get("name", segment.GetName())))
        if cls.get("color"):
            segment.SetColor(*[float(c) for c in cls["color"][:3]])
    explicit = {str(c.get("name")) for c in (classes or []) if c.get("terminology")}
    for i in range(segmentation.GetNumberOfSegments()):
        segment = segmentation.GetNthSegment(i)
        if segment.GetName() in explicit:
            continue
        entry = terminology.segment_terminology(segment.GetName())
        if entry:
            terminology.set_segment_terminology(segment, entry)


def load_segmentation(scene, input_volume, path: Path, name: str, classes: Optional[List[dict]]):
    """A segmentation node from ``segmentation.seg.nrrd``, checked to lie on the input's grid."""
    import slicer

    node = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", name)
    storage = slicer.vtkMRMLSegmentationStorageNode()
    storage.SetFileName(str(path))
    if not storage.ReadData(node):
        raise OutputError(f"cannot read {path}")
    node.SetReferenceImageGeometryParameterFromVolumeNode(input_volume)
    node.SetAndObserveTransformNodeID(input_volume.GetTransformNodeID())
    segmentation = node.GetSegmentation()
    _check_labelmap_grid(segmentation, input_volume)
    _name_segments(segmentation, classes)
    node.CreateDefaultDisplayNodes()
    display = node.GetDisplayNode()
    if display is not None:
        display.SetOpacity2DFill(0.25)
        display.SetOpacity2DOutline(1.0)
    return node


def load_scalar(scene, input_volume, path: Path, name: str, node_class: str = "vtkMRMLScalarVolumeNode"):
    """A volume node from an image file, given the input's exact geometry."""
    node = scene.AddNewNodeByClass(node_class, name)
    read_volume_file(node, path)
    adopt_geometry(node, input_volume, path.name)
    node.CreateDefaultDisplayNodes()
    return node


def _text_node(scene, name: str, text: str):
    node = scene.AddNewNodeByClass("vtkMRMLTextNode", name)
    node.SetText(text)
    return node


def output_names(base: str) -> Dict[str, str]:
    """The node name of each output role for an input volume named ``base``."""
    return {
        "segmentation": f"{base} CARD segmentation",
        "disagreement": f"{base} disagreement",
        "temperature": f"{base} temperature",
        "probabilities": f"{base} probabilities",
        "report": f"{base} CARD report",
        "review": f"{base} CARD review",
        "regions": f"{base} CARD regions",
    }


def _make_nodes(
    scene,
    input_volume,
    out_dir: Path,
    report: dict,
    pending: "PendingOutputs",
    classes: Optional[List[dict]],
    load_probabilities: bool,
) -> None:
    """Fill ``pending.new`` with the nodes of one output folder, named from ``pending.names`` and
    tagged with ``pending.frame`` (on error, what was made stays in ``pending.new``)."""
    new, names, frame = pending.new, pending.names, pending.frame
    new.segmentation = load_segmentation(
        scene, input_volume, out_dir / "segmentation.seg.nrrd", scene.GenerateUniqueName(names["segmentation"]), classes
    )
    for role in ("disagreement", "temperature"):
        path = out_dir / f"{role}.nii.gz"
        if path.is_file():
            node = load_scalar(scene, input_volume, path, scene.GenerateUniqueName(names[role]))
            style_overlay(scene, node, role, report)
            setattr(new, role, node)
    if load_probabilities:
        path = out_dir / "probabilities.nii.gz"
        if not path.is_file():
            raise OutputError(f"the engine wrote no {path.name}")
        new.probabilities = load_scalar(
            scene, input_volume, path, scene.GenerateUniqueName(names["probabilities"]), "vtkMRMLVectorVolumeNode"
        )
        components = [str(c.get("name")) for c in (classes or [])]
        new.probabilities.SetAttribute("CARDSegment.Components", json.dumps(components))
    new.report = _text_node(scene, scene.GenerateUniqueName(names["report"]), json.dumps(report, indent=1))
    new.segmentation.SetNodeReferenceID(REPORT_REFERENCE, new.report.GetID())
    if report.get("method") == "card":
        new.review = create_review_table(scene, report.get("regions") or [], scene.GenerateUniqueName(names["review"]))
        new.segmentation.SetNodeReferenceID(REVIEW_REFERENCE, new.review.GetID())
        path = out_dir / "regions.nii.gz"
        if path.is_file():  # the regions' own voxels, outlined (not their bounding boxes)
            new.regions = load_region_outlines(
                scene, input_volume, path, scene.GenerateUniqueName(names["regions"]), report.get("regions") or []
            )
    bundle = (report.get("bundle") or {}).get("id", "")
    for role in ROLES:
        node = getattr(new, role)
        if node is not None:
            tag_output(node, role, input_volume, frame)
            node.SetAttribute(BUNDLE_ATTRIBUTE, str(bundle))
            node.SetAttribute(METHOD_ATTRIBUTE, str(report.get("method", "")))


@dataclass
class PendingOutputs:
    """Nodes made from one output folder, not yet in place of the earlier ones (:func:`commit_outputs`)."""

    new: OutputNodes
    names: Dict[str, str]
    frame: Optional[int] = None


def frame_base_name(name: str, frame: Optional[int]) -> str:
    """The node-name stem of a volume's outputs: its name, with the frame for a sequence's frame."""
    base = name or "Volume"
    return base if frame is None else f"{base} frame {int(frame)}"


def prepare_outputs(
    scene,
    input_volume,
    output_dir: os.PathLike,
    classes: Optional[List[dict]] = None,
    load_probabilities: bool = False,
    base_name: Optional[str] = None,
    frame: Optional[int] = None,
) -> PendingOutputs:
    """Make the nodes of one ``cardseg segment`` output folder beside the earlier ones.

    On any error every node made on the way is removed again (the scene is as it was) and the
    error is raised. ``frame``: the sequence frame the folder belongs to (None: a plain volume).
    """
    out_dir = Path(output_dir)
    if input_volume is None or not scene.IsNodePresent(input_volume):
        raise OutputError("the input volume is no longer in the scene")
    report_path = out_dir / "report.json"
    for p in (report_path, out_dir / "segmentation.seg.nrrd"):
        if not p.is_file():
            raise OutputError(f"the engine wrote no {p.name} in {out_dir}")
    report = read_report(report_path)
    report["input_node"] = input_volume.GetName()
    if frame is not None:
        report["sequence_frame"] = int(frame)
    names = output_names(base_name or frame_base_name(input_volume.GetName(), frame))
    existing = {n.GetID() for n in all_nodes(scene)}
    pending = PendingOutputs(OutputNodes(), names, frame)
    try:
        _make_nodes(scene, input_volume, out_dir, report, pending, classes, load_probabilities)
    except Exception:
        discard_outputs(scene, pending, existing)
        raise
    return pending


def discard_outputs(scene, pending: PendingOutputs, existing: Optional[set] = None) -> None:
    """Remove the nodes of ``pending`` (and, given the IDs that were there before, anything else made since)."""
    for node in pending.new.nodes():
        remove_node(scene, node)
    if existing is not None:
        for node in all_nodes(scene):  # anything else made on the way (a half-read volume, its display)
            if node.GetID() not in existing and scene.IsNodePresent(node):
                scene.RemoveNode(node)


def commit_outputs(
    scene, input_volume, pending: PendingOutputs, overlay: str = "disagreement", opacity: float = 0.5, show: bool = True
) -> OutputNodes:
    """Put ``pending``'s nodes in place of this module's earlier outputs for the same input and frame
    (other frames' outputs stay), give them the freed names, and (``show``) show the overlay."""
    new = pending.new
    keep = {n.GetID() for n in new.nodes()}
    scene.StartState(scene.BatchProcessState)  # one refresh for the replaced nodes, not one each
    try:
        for node in output_nodes_of(scene, input_volume, pending.frame):
            if node.GetID() not in keep:
                remove_node(scene, node)
    finally:
        scene.EndState(scene.BatchProcessState)
    for role, name in pending.names.items():  # the names the replaced nodes had, now free again
        node = getattr(new, role)
        if node is not None and node.GetName() != name and scene.GetFirstNodeByName(name) is None:
            node.SetName(name)
    if show:
        show_overlay(scene, input_volume, new, overlay, opacity)
    return new


def load_outputs(
    scene,
    input_volume,
    output_dir: os.PathLike,
    classes: Optional[List[dict]] = None,
    load_probabilities: bool = False,
    overlay: str = "disagreement",
    opacity: float = 0.5,
    frame: Optional[int] = None,
) -> OutputNodes:
    """Make nodes from one ``cardseg segment`` output folder and replace the previous ones.

    The new nodes are all made first; only when every one of them is in place are this module's
    earlier outputs for ``input_volume`` (and ``frame``) removed. On any error the new nodes are
    removed again and the scene is as it was. The input volume is only read.
    """
    pending = prepare_outputs(scene, input_volume, output_dir, classes, load_probabilities, frame=frame)
    return commit_outputs(scene, input_volume, pending, overlay, opacity)
