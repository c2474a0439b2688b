"""Turning ``cardseg segment`` outputs into MRML nodes, and finding, showing and replacing them.

MRML classes only (no Qt, no ScriptedLoadableModule): this runs inside Slicer and under the
PyPI ``slicer-core`` package alike.

Every node this module creates for an input volume carries the attribute
``CARDSegment.Role`` (segmentation, disagreement, temperature, probabilities, report, review,
roi) and a node reference ``CARDSegment.Input`` to that input volume: that is how a re-run finds
and replaces exactly its own outputs, and nothing else. The input volume itself is only read.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import numpy as np

from .colormaps import color_node

ROLE_ATTRIBUTE = "CARDSegment.Role"
INPUT_REFERENCE = "CARDSegment.Input"
REPORT_REFERENCE = "CARDSegment.Report"
REVIEW_REFERENCE = "CARDSegment.Review"
BUNDLE_ATTRIBUTE = "CARDSegment.Bundle"
METHOD_ATTRIBUTE = "CARDSegment.Method"
ROLES = ("segmentation", "disagreement", "temperature", "probabilities", "report", "review", "roi")
OVERLAY_CHOICES = ("disagreement", "temperature", "none")
#: largest difference (mm) tolerated between an output's IJK-to-RAS matrix and the input's before
#: the input's exact matrix is copied onto the output (NIfTI keeps its geometry in float32)
GEOMETRY_TOLERANCE_MM = 1e-3
LN2 = math.log(2.0)

#: terminology for the usual cardiac class names, used when the bundle gives none
#: (Slicer terminology string: context~category~type~type modifier~anatomic context~region~modifier)
_TERMINOLOGY_CONTEXT = "Segmentation category and type - DICOM master list"
_ANATOMIC_CONTEXT = "Anatomic codes - DICOM master list"
_CARDIAC_TYPES = {
    "lv": ("87878005", "Left ventricle"),
    "left ventricle": ("87878005", "Left ventricle"),
    "lv cavity": ("87878005", "Left ventricle"),
    "lv blood pool": ("87878005", "Left ventricle"),
    "rv": ("53085002", "Right ventricle"),
    "right ventricle": ("53085002", "Right ventricle"),
    "rv cavity": ("53085002", "Right ventricle"),
    "myo": ("74281007", "Myocardium"),
    "myocardium": ("74281007", "Myocardium"),
    "lv myocardium": ("74281007", "Myocardium"),
}

#: disagreement (nats) below which both overlays are transparent, so that the input shows
#: unchanged where the two networks agree (typical voxels lie near 0.002 on the [0, ln 2] window);
#: it is the display node's threshold, which the Volumes module shows and lets the user change
SHOWN_FROM_DISAGREEMENT = 0.01

OVERLAY_STYLE = {
    "disagreement": {"colormap": "Inferno", "title": "Disagreement (TAC)"},
    "temperature": {"colormap": "Viridis", "title": "Temperature"},
}


class OutputError(RuntimeError):
    """The engine's outputs cannot be turned into nodes (missing, unreadable or misplaced)."""


@dataclass
class OutputNodes:
    """This module's nodes for one input volume (any may be None)."""

    segmentation: object = None
    disagreement: object = None
    temperature: object = None
    probabilities: object = None
    report: object = None
    review: object = None
    roi: object = None

    def nodes(self) -> List[object]:
        return [getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None]

    def overlay(self, name: str):
        return {"disagreement": self.disagreement, "temperature": self.temperature}.get(name)

    def report_dict(self) -> Optional[dict]:
        return read_report(self.report)


# ---------------------------------------------------------------------------------------------
# geometry


def ijk_to_ras(volume_node) -> np.ndarray:
    """The node's 4x4 IJK-to-RAS matrix as an array."""
    import vtk

    m = vtk.vtkMatrix4x4()
    volume_node.GetIJKToRASMatrix(m)
    return np.array([[m.GetElement(r, c) for c in range(4)] for r in range(4)])


def _vtk_matrix(array: np.ndarray):
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


def _dimensions(volume_node):
    image = volume_node.GetImageData()
    return tuple(image.GetDimensions()) if image is not None else None


def _adopt_geometry(node, input_volume, what: str) -> None:
    """Check that ``node`` lies on the input's grid, then give it the input's exact matrix."""
    if _dimensions(node) != _dimensions(input_volume):
        raise OutputError(f"{what}: grid {_dimensions(node)} differs from the input's {_dimensions(input_volume)}")
    ref = ijk_to_ras(input_volume)
    diff = float(np.abs(ijk_to_ras(node) - ref).max())
    if diff > GEOMETRY_TOLERANCE_MM:
        raise OutputError(f"{what}: geometry differs from the input volume's by {diff:.3g} mm")
    node.CopyOrientation(input_volume)  # spacing, origin and directions: bit for bit the input's
    node.SetAndObserveTransformNodeID(input_volume.GetTransformNodeID())


# ---------------------------------------------------------------------------------------------
# reading files


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


def read_report(node_or_path) -> Optional[dict]:
    """report.json from a file path or from this module's report text node."""
    if node_or_path is None:
        return None
    if isinstance(node_or_path, (str, os.PathLike)):
        try:
            return json.loads(Path(node_or_path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise OutputError(f"cannot read {node_or_path}: {exc}") from None
    text = node_or_path.GetText()
    return json.loads(text) if text else None


# ---------------------------------------------------------------------------------------------
# finding and removing outputs


def _all_nodes(scene) -> List[object]:
    collection = scene.GetNodes()
    return [collection.GetItemAsObject(i) for i in range(collection.GetNumberOfItems())]


def output_nodes_of(scene, input_volume) -> List[object]:
    """Every node of ``scene`` that this module made for ``input_volume``."""
    if input_volume is None or input_volume.GetID() is None:
        return []
    return [n for n in _all_nodes(scene)
            if n.GetAttribute(ROLE_ATTRIBUTE) in ROLES and n.GetNodeReferenceID(INPUT_REFERENCE) == input_volume.GetID()]


def find_outputs(scene, input_volume) -> OutputNodes:
    """This module's current outputs for ``input_volume`` (the first node of each role)."""
    out = OutputNodes()
    for node in output_nodes_of(scene, input_volume):
        role = node.GetAttribute(ROLE_ATTRIBUTE)
        if getattr(out, role) is None:
            setattr(out, role, node)
    return out


def remove_node(scene, node) -> None:
    """Remove ``node`` and the display and storage nodes that belong to it only."""
    if node is None or not scene.IsNodePresent(node):
        return
    owned = []
    for getter, count in (("GetNthDisplayNode", "GetNumberOfDisplayNodes"),
                          ("GetNthStorageNode", "GetNumberOfStorageNodes")):
        if hasattr(node, count):
            owned += [getattr(node, getter)(i) for i in range(getattr(node, count)())]
    scene.RemoveNode(node)
    for dep in owned:
        if dep is not None and scene.IsNodePresent(dep):
            scene.RemoveNode(dep)


def remove_outputs(scene, input_volume, keep: Iterable[object] = ()) -> int:
    """Remove this module's outputs for ``input_volume`` (except ``keep``); returns how many."""
    keep_ids = {n.GetID() for n in keep if n is not None}
    doomed = [n for n in output_nodes_of(scene, input_volume) if n.GetID() not in keep_ids]
    for node in doomed:
        remove_node(scene, node)
    return len(doomed)


def release_outputs(scene, input_volume) -> int:
    """Keep the current outputs as ordinary nodes: the next run will not replace them."""
    nodes = output_nodes_of(scene, input_volume)
    for node in nodes:
        node.RemoveAttribute(ROLE_ATTRIBUTE)
        node.RemoveNodeReferenceIDs(INPUT_REFERENCE)
    return len(nodes)


def _tag(node, role: str, input_volume) -> None:
    node.SetAttribute(ROLE_ATTRIBUTE, role)
    node.SetNodeReferenceID(INPUT_REFERENCE, input_volume.GetID())


# ---------------------------------------------------------------------------------------------
# building the nodes


def segment_terminology(name: str) -> Optional[str]:
    """Slicer terminology for a cardiac class name (LV, RV, MYO, ...), or None."""
    code = _CARDIAC_TYPES.get(name.strip().lower())
    if code is None:
        return None
    value, meaning = code
    return (f"{_TERMINOLOGY_CONTEXT}~SCT^123037004^Anatomical Structure~SCT^{value}^{meaning}~^^~"
            f"{_ANATOMIC_CONTEXT}~^^~^^")


def set_segment_terminology(segment, entry: str) -> None:
    """Give ``segment`` a terminology entry, in the way every supported Slicer understands.

    ``vtkSegment.SetTerminology`` is missing from Slicer 5.8 (it came with 5.10) and only stores
    the entry as the segment's tag named ``GetTerminologyEntryTagName()``, which Slicer 5.8
    already reads and writes in the same format. Setting that tag directly works on all of them.
    """
    segment.SetTag(segment.GetTerminologyEntryTagName(), entry)


def _load_segmentation(scene, input_volume, path: Path, name: str, classes: Optional[List[dict]]):
    import slicer
    import vtk

    node = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", name)
    storage = slicer.vtkMRMLSegmentationStorageNode()
    storage.SetFileName(str(path))
    if not storage.ReadData(node):
        raise OutputError(f"cannot read {path}")
    node.SetReferenceImageGeometryParameterFromVolumeNode(input_volume)
    node.SetAndObserveTransformNodeID(input_volume.GetTransformNodeID())
    segmentation = node.GetSegmentation()
    ref = ijk_to_ras(input_volume)
    for i in range(segmentation.GetNumberOfSegments()):
        labelmap = segmentation.GetNthSegment(i).GetRepresentation("Binary labelmap")
        if labelmap is None:
            continue
        m = vtk.vtkMatrix4x4()
        labelmap.GetImageToWorldMatrix(m)
        world = np.array([[m.GetElement(r, c) for c in range(4)] for r in range(4)])
        corner = np.array([labelmap.GetExtent()[0], labelmap.GetExtent()[2], labelmap.GetExtent()[4], 1.0])
        if (np.abs(world[:3, :3] - ref[:3, :3]).max() > GEOMETRY_TOLERANCE_MM
                or np.abs(world @ corner - ref @ corner).max() > GEOMETRY_TOLERANCE_MM):
            raise OutputError("segmentation: its grid is not the input volume's")
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
        terminology = segment_terminology(segment.GetName())
        if terminology:
            set_segment_terminology(segment, terminology)
    node.CreateDefaultDisplayNodes()
    display = node.GetDisplayNode()
    if display is not None:
        display.SetOpacity2DFill(0.25)
        display.SetOpacity2DOutline(1.0)
    return node


def _load_scalar(scene, input_volume, path: Path, name: str, node_class: str = "vtkMRMLScalarVolumeNode"):
    node = scene.AddNewNodeByClass(node_class, name)
    read_volume_file(node, path)
    _adopt_geometry(node, input_volume, path.name)
    node.CreateDefaultDisplayNodes()
    return node


def overlay_range(role: str, report: Optional[dict], node=None) -> tuple:
    """The colour window of an overlay: [0, ln 2] for disagreement, [tau_min, tau_max] for temperature."""
    if role == "disagreement":
        return 0.0, LN2
    cal = (report or {}).get("calibration") or {}
    if "tau_min" in cal and "tau_max" in cal and float(cal["tau_max"]) > float(cal["tau_min"]):
        return float(cal["tau_min"]), float(cal["tau_max"])
    if node is not None and node.GetImageData() is not None:
        lo, hi = node.GetImageData().GetScalarRange()
        return float(lo), float(max(hi, lo + 1e-6))
    return 1.0, 3.0


def temperature_at(disagreement: float, calibration: dict) -> Optional[float]:
    """The CARD temperature for a disagreement value, from the report's calibration parameters.

    The engine's map (``cardseg.calibration.card.temperature_field``, restated here because this
    library does not import the engine): ``tau_min + sigmoid((tac - w_b) / w_k) * (tau_max - tau_min)``.
    None when the parameters are missing.
    """
    try:
        lo, hi = float(calibration["tau_min"]), float(calibration["tau_max"])
        w_b, w_k = float(calibration["w_b"]), float(calibration["w_k"])
    except (KeyError, TypeError, ValueError):
        return None
    if w_k <= 0:
        return None
    z = (disagreement - w_b) / w_k
    weight = 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0
    return lo + weight * (hi - lo)


def overlay_threshold(role: str, report: Optional[dict], node=None) -> tuple:
    """``(lower, upper)``: the values an overlay shows; voxels outside are fully transparent.

    Both maps hide the voxels whose disagreement is below :data:`SHOWN_FROM_DISAGREEMENT`: the
    disagreement map directly, the temperature map at the temperature the calibration gives that
    disagreement (so both show the same voxels; outside the field of view, at ``tau_min``, it is
    transparent too). ``upper`` is above every value of the map.
    """
    lo, hi = overlay_range(role, report, node)
    data_hi = hi
    if node is not None and node.GetImageData() is not None:
        data_hi = max(hi, float(node.GetImageData().GetScalarRange()[1]))
    if role == "disagreement":
        lower = SHOWN_FROM_DISAGREEMENT
    else:
        lower = temperature_at(SHOWN_FROM_DISAGREEMENT, (report or {}).get("calibration") or {})
        if lower is None:
            lower = lo + (hi - lo) * SHOWN_FROM_DISAGREEMENT / LN2
    return float(lower), float(data_hi) + 1.0


def _style_overlay(scene, node, role: str, report: Optional[dict]) -> None:
    style = OVERLAY_STYLE[role]
    display = node.GetDisplayNode()
    display.SetAndObserveColorNodeID(color_node(scene, style["colormap"]).GetID())
    display.AutoWindowLevelOff()
    lo, hi = overlay_range(role, report, node)
    display.SetWindowLevelMinMax(lo, hi)
    display.SetInterpolate(False)
    # the low end transparent: only where the networks disagree does the overlay cover the input
    display.SetAutoThreshold(0)
    lower, upper = overlay_threshold(role, report, node)
    display.SetThreshold(lower, upper)
    display.SetApplyThreshold(1)
    legend = color_legend(node)
    if legend is not None:
        legend.SetTitleText(style["title"])
        legend.SetVisibility(False)


def color_legend(node, create: bool = True):
    """The colour legend display node of ``node`` (created if missing and ``create``), or None.

    Needs the Colors module's legend node class registered in the scene (always true in Slicer).
    """
    import slicer

    scene = node.GetScene()
    if scene is None or not scene.IsNodeClassRegistered("vtkMRMLColorLegendDisplayNode"):
        return None
    try:
        legend = slicer.vtkSlicerColorLogic.GetColorLegendDisplayNode(node)
        if legend is None and create:
            legend = slicer.vtkSlicerColorLogic.AddDefaultColorLegendDisplayNode(node)
    except (AttributeError, TypeError):  # pragma: no cover - a Slicer without colour legends
        return None
    return legend


def _text_node(scene, name: str, text: str):
    node = scene.AddNewNodeByClass("vtkMRMLTextNode", name)
    node.SetText(text)
    return node


def output_names(base: str) -> Dict[str, str]:
    """The node name of each output role for an input volume named ``base``."""
    return {"segmentation": f"{base} CARD segmentation", "disagreement": f"{base} disagreement",
            "temperature": f"{base} temperature", "probabilities": f"{base} probabilities",
            "report": f"{base} CARD report", "review": f"{base} CARD review"}


def load_outputs(scene, input_volume, output_dir: os.PathLike, classes: Optional[List[dict]] = None,
                 load_probabilities: bool = False, overlay: str = "disagreement", opacity: float = 0.5,
                 base_name: Optional[str] = None) -> OutputNodes:
    """Make nodes from one ``cardseg segment`` output folder and replace the previous ones.

    The new nodes are all made first; only when every one of them is in place are this module's
    earlier outputs for ``input_volume`` removed. On any error the new nodes are removed again
    and the scene is as it was. The input volume is only read.
    """
    from . import review as review_lib

    out_dir = Path(output_dir)
    if input_volume is None or not scene.IsNodePresent(input_volume):
        raise OutputError("the input volume is no longer in the scene")
    report_path = out_dir / "report.json"
    seg_path = out_dir / "segmentation.seg.nrrd"
    for p in (report_path, seg_path):
        if not p.is_file():
            raise OutputError(f"the engine wrote no {p.name} in {out_dir}")
    report = read_report(report_path)
    report["input_node"] = input_volume.GetName()
    base = base_name or input_volume.GetName() or "Volume"
    names = output_names(base)
    previous = output_nodes_of(scene, input_volume)
    existing = {n.GetID() for n in _all_nodes(scene)}
    new = OutputNodes()
    try:
        new.segmentation = _load_segmentation(scene, input_volume, seg_path,
                                              scene.GenerateUniqueName(names["segmentation"]), classes)
        for role in ("disagreement", "temperature"):
            path = out_dir / f"{role}.nii.gz"
            if path.is_file():
                node = _load_scalar(scene, input_volume, path, scene.GenerateUniqueName(names[role]))
                _style_overlay(scene, node, role, report)
                setattr(new, role, node)
        if load_probabilities:
            path = out_dir / "probabilities.nii.gz"
            if not path.is_file():
                raise OutputError(f"the engine wrote no {path.name}")
            new.probabilities = _load_scalar(scene, input_volume, path,
                                             scene.GenerateUniqueName(names["probabilities"]),
                                             "vtkMRMLVectorVolumeNode")
            components = [str(c.get("name")) for c in (classes or [])]
            new.probabilities.SetAttribute("CARDSegment.Components", json.dumps(components))
        new.report = _text_node(scene, scene.GenerateUniqueName(names["report"]), json.dumps(report, indent=1))
        new.segmentation.SetNodeReferenceID(REPORT_REFERENCE, new.report.GetID())
        if report.get("method") == "card":
            new.review = review_lib.create_review_table(scene, report.get("regions") or [],
                                                        scene.GenerateUniqueName(names["review"]))
            new.segmentation.SetNodeReferenceID(REVIEW_REFERENCE, new.review.GetID())
        bundle = (report.get("bundle") or {}).get("id", "")
        for role in ROLES:
            node = getattr(new, role)
            if node is not None:
                _tag(node, role, input_volume)
                node.SetAttribute(BUNDLE_ATTRIBUTE, str(bundle))
                node.SetAttribute(METHOD_ATTRIBUTE, str(report.get("method", "")))
    except Exception:
        for node in new.nodes():
            remove_node(scene, node)
        for node in _all_nodes(scene):  # anything else made on the way (a half-read volume, its display)
            if node.GetID() not in existing and scene.IsNodePresent(node):
                scene.RemoveNode(node)
        raise
    for node in previous:
        remove_node(scene, node)
    for role, name in names.items():  # the names the replaced nodes had, now free again
        node = getattr(new, role)
        if node is not None and node.GetName() != name and scene.GetFirstNodeByName(name) is None:
            node.SetName(name)
    show_overlay(scene, input_volume, new, overlay, opacity)
    return new


# ---------------------------------------------------------------------------------------------
# showing


def slice_composite_nodes(scene) -> List[object]:
    c = scene.GetNodesByClass("vtkMRMLSliceCompositeNode")
    return [c.GetItemAsObject(i) for i in range(c.GetNumberOfItems())]


def slice_nodes(scene) -> List[object]:
    c = scene.GetNodesByClass("vtkMRMLSliceNode")
    return [c.GetItemAsObject(i) for i in range(c.GetNumberOfItems())]


def show_overlay(scene, input_volume, outputs: OutputNodes, overlay: str = "disagreement",
                 opacity: float = 0.5) -> None:
    """Input as background of every slice view, the chosen map as foreground; its legend only.

    ``overlay`` "none" (or a map this run did not make) clears the foreground of the views that
    showed one of this module's maps and hides the legends.
    """
    if overlay not in OVERLAY_CHOICES:
        raise ValueError(f"overlay must be one of {OVERLAY_CHOICES}, not {overlay!r}")
    chosen = outputs.overlay(overlay)
    ours = {n.GetID() for n in (outputs.disagreement, outputs.temperature) if n is not None}
    for comp in slice_composite_nodes(scene):
        if input_volume is not None:
            comp.SetBackgroundVolumeID(input_volume.GetID())
        if chosen is not None:
            comp.SetForegroundVolumeID(chosen.GetID())
            comp.SetForegroundOpacity(float(opacity))
        elif comp.GetForegroundVolumeID() in ours:
            comp.SetForegroundVolumeID(None)
    for node in (outputs.disagreement, outputs.temperature):
        if node is None:
            continue
        legend = color_legend(node, create=False)
        if legend is not None:
            legend.SetVisibility(node is chosen)


def set_overlay_opacity(scene, outputs: OutputNodes, opacity: float) -> None:
    """Foreground opacity of the views that show one of this module's maps."""
    ours = {n.GetID() for n in (outputs.disagreement, outputs.temperature) if n is not None}
    for comp in slice_composite_nodes(scene):
        if comp.GetForegroundVolumeID() in ours:
            comp.SetForegroundOpacity(float(opacity))


def jump_slices_to(scene, ras: Iterable[float]) -> None:
    """Centre every slice view on the RAS point ``ras``."""
    r, a, s = [float(v) for v in ras]
    for node in slice_nodes(scene):
        node.JumpSliceByCentering(r, a, s)


# ---------------------------------------------------------------------------------------------
# the panel's summary


@dataclass
class Summary:
    """What the panel says about a run: a line of text and whether it is a warning."""

    text: str
    warning: bool = False
    agreement: Optional[float] = None


def agreement_summary(report: Optional[dict]) -> Summary:
    """The volume's agreement score (paper Eq. 4) in words, with the out-of-domain warning."""
    if not report:
        return Summary("No results yet.")
    if report.get("method") != "card" or report.get("agreement") is None:
        if report.get("method") == "uc":
            return Summary("Uncalibrated run: no disagreement map and no agreement score.")
        return Summary("No agreement score (no foreground was segmented).", warning=True)
    agr = float(report["agreement"])
    per_slice = [v for v in (report.get("agreement_per_slice") or []) if v is not None]
    text = f"Agreement {agr:.3f}"
    if per_slice:
        low = int(np.argmin(per_slice))
        text += f" (lowest slice {low}: {per_slice[low]:.3f})"
    regions = report.get("regions") or []
    text += f"; {len(regions)} flagged region{'s' if len(regions) != 1 else ''}."
    if report.get("out_of_domain"):
        text = ("Warning: the agreement score is below the bundle's out-of-domain threshold; this image may "
                "be unlike the training data, so check the whole segmentation. " + text)
        return Summary(text, warning=True, agreement=agr)
    return Summary(text, agreement=agr)
