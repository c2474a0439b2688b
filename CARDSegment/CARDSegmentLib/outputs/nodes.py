"""This module's output nodes in a scene: their roles, and finding, releasing and removing them.

Every node CARDSegment creates for an input volume carries the attribute
``CARDSegment.Role`` (segmentation, disagreement, temperature, probabilities, report, review,
roi) and a node reference ``CARDSegment.Input`` to that input volume: that is how a re-run finds
and replaces exactly its own outputs, and nothing else. The input volume itself is only read.

A cine sequence's outputs are per frame: each node also carries ``CARDSegment.Frame`` (the
frame's 0-based item number in the sequence), so that a run on one frame replaces only that
frame's nodes; the sequence's own outputs (the cardiac-index table) and a plain volume's carry
no frame. ``frame=None`` below means exactly those.

The lowest layer of the library's MRML side (it imports no other module of the library).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterable, List, Optional

ROLE_ATTRIBUTE = "CARDSegment.Role"
INPUT_REFERENCE = "CARDSegment.Input"
REPORT_REFERENCE = "CARDSegment.Report"
REVIEW_REFERENCE = "CARDSegment.Review"
BUNDLE_ATTRIBUTE = "CARDSegment.Bundle"
METHOD_ATTRIBUTE = "CARDSegment.Method"
FRAME_ATTRIBUTE = "CARDSegment.Frame"
ROLES = (
    "segmentation",
    "disagreement",
    "temperature",
    "probabilities",
    "report",
    "review",
    "roi",
    "indices",
    "regions",
)


class OutputError(RuntimeError):
    """The engine's outputs cannot be turned into nodes (missing, unreadable or misplaced)."""


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
    indices: object = None
    regions: object = None  # the flagged regions as outlines (CARDSegmentLib.outputs.region_outlines)

    def nodes(self) -> List[object]:
        return [getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None]

    def overlay(self, name: str):
        return {"disagreement": self.disagreement, "temperature": self.temperature}.get(name)

    def report_dict(self) -> Optional[dict]:
        return read_report(self.report)


def all_nodes(scene) -> List[object]:
    """Every node of ``scene``, in scene order."""
    collection = scene.GetNodes()
    return [collection.GetItemAsObject(i) for i in range(collection.GetNumberOfItems())]


def tag_output(node, role: str, input_volume, frame: Optional[int] = None) -> None:
    """Mark ``node`` as this module's output ``role`` for ``input_volume`` (and its ``frame``)."""
    node.SetAttribute(ROLE_ATTRIBUTE, role)
    node.SetNodeReferenceID(INPUT_REFERENCE, input_volume.GetID())
    if frame is not None:
        node.SetAttribute(FRAME_ATTRIBUTE, str(int(frame)))


def frame_of(node) -> Optional[int]:
    """The frame an output node belongs to, or None (a plain volume's or the sequence's own)."""
    text = node.GetAttribute(FRAME_ATTRIBUTE)
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


#: ``frame`` argument meaning: the nodes of every frame and the frameless ones
ALL_FRAMES = "all"


def output_nodes_of(scene, input_volume, frame=None) -> List[object]:
    """Every node of ``scene`` that this module made for ``input_volume`` and ``frame``
    (None: the frameless ones; :data:`ALL_FRAMES`: all)."""
    if input_volume is None or input_volume.GetID() is None:
        return []
    return [
        n
        for n in all_nodes(scene)
        if n.GetAttribute(ROLE_ATTRIBUTE) in ROLES
        and n.GetNodeReferenceID(INPUT_REFERENCE) == input_volume.GetID()
        and (frame == ALL_FRAMES or frame_of(n) == frame)
    ]


def segmented_frames(scene, input_volume) -> List[int]:
    """The frames of ``input_volume``'s sequence that have outputs, in order."""
    return sorted({f for f in (frame_of(n) for n in output_nodes_of(scene, input_volume, ALL_FRAMES)) if f is not None})


def find_outputs(scene, input_volume, frame: Optional[int] = None) -> OutputNodes:
    """This module's current outputs for ``input_volume`` and ``frame`` (the first node of each role)."""
    out = OutputNodes()
    for node in output_nodes_of(scene, input_volume, frame):
        role = node.GetAttribute(ROLE_ATTRIBUTE)
        if getattr(out, role) is None:
            setattr(out, role, node)
    return out


def remove_node(scene, node) -> None:
    """Remove ``node`` and the display and storage nodes that belong to it only."""
    if node is None or not scene.IsNodePresent(node):
        return
    owned = []
    for getter, count in (
        ("GetNthDisplayNode", "GetNumberOfDisplayNodes"),
        ("GetNthStorageNode", "GetNumberOfStorageNodes"),
    ):
        if hasattr(node, count):
            owned += [getattr(node, getter)(i) for i in range(getattr(node, count)())]
    scene.RemoveNode(node)
    for dep in owned:
        if dep is not None and scene.IsNodePresent(dep):
            scene.RemoveNode(dep)


def remove_outputs(scene, input_volume, keep: Iterable[object] = (), frame=None) -> int:
    """Remove this module's outputs for ``input_volume`` and ``frame`` (except ``keep``); returns how many."""
    keep_ids = {n.GetID() for n in keep if n is not None}
    doomed = [n for n in output_nodes_of(scene, input_volume, frame) if n.GetID() not in keep_ids]
    for node in doomed:
        remove_node(scene, node)
    return len(doomed)


def release_outputs(scene, input_volume) -> int:
    """Keep the current outputs (of every frame) as ordinary nodes: the next run will not replace them."""
    nodes = output_nodes_of(scene, input_volume, ALL_FRAMES)
    for node in nodes:
        node.RemoveAttribute(ROLE_ATTRIBUTE)
        node.RemoveAttribute(FRAME_ATTRIBUTE)
        node.RemoveNodeReferenceIDs(INPUT_REFERENCE)
    return len(nodes)
