"""Cine input: a volume sequence as Slicer loads a cine MR series, and which of its frames to segment.

Slicer's DICOM image-sequence plugin loads a cine series as a ``vtkMRMLSequenceNode`` of scalar
volumes (one per cardiac phase) with a ``vtkMRMLSequenceBrowserNode`` that shows one frame at a
time through a *proxy* volume. The panel's input is that proxy (what the volume selector offers);
:func:`cine_of` finds the sequence behind it. A plain 3D volume has none and is handled as before.

Frames are the sequence's 0-based item numbers (as ``cardseg segment --frame``).

The end-diastolic and end-systolic frames (:func:`pick_ed_es`), when the user does not set them:
**ED is the segmented frame with the largest LV blood-pool volume, ES the one with the smallest**
(the LV volume of each frame is its segmentation's LV class volume, ``class_volumes_ml["LV"]`` of
the frame's ``report.json``, before any correction the bundle's index block applies); ties go to
the earlier frame. To find them, every frame is segmented. Either frame can be set by the user instead.
:func:`follow_frame` shows the shown frame's results and hides the other frames'. MRML classes only (no Qt).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from .outputs import INPUT_REFERENCE, OutputNodes, find_outputs
from .overlays import color_legend
from .views import slice_composite_nodes

#: ``ed_frame`` / ``es_frame`` value meaning "find it from the LV volume curve"
AUTO = -1


class FrameMode(enum.Enum):
    """Which frames of a sequence one run segments."""

    SHOWN = "shown"
    ED_ES = "ed_es"
    ALL = "all"

    def label(self):
        return {"shown": "Shown frame", "ed_es": "ED and ES (ejection fraction)", "all": "All frames"}[self.value]


@dataclass
class Cine:
    """A sequence browser and the volume sequence whose proxy is the panel's input."""

    browser: object
    sequence: object

    @property
    def count(self) -> int:
        return int(self.sequence.GetNumberOfDataNodes())

    @property
    def shown(self) -> int:
        """The frame the browser shows now."""
        return max(0, int(self.browser.GetSelectedItemNumber()))

    def frame_volume(self, frame: int):
        """The volume node of ``frame`` (held by the sequence, not in the scene)."""
        if not 0 <= int(frame) < self.count:
            raise ValueError(f"frame {frame} is not in this sequence (frames 0 to {self.count - 1})")
        return self.sequence.GetNthDataNode(int(frame))

    def frame_label(self, frame: int) -> str:
        """``frame 3 (120 ms)``: the item number and, when there is one, the sequence's index value."""
        value = self.sequence.GetNthIndexValue(int(frame)) if 0 <= int(frame) < self.count else ""
        unit = self.sequence.GetIndexUnit() or ""
        if not value:
            return f"frame {int(frame)}"
        return f"frame {int(frame)} ({value}{' ' + unit if unit else ''})"

    def show(self, frame: int) -> None:
        """Move the browser to ``frame`` (Slicer updates the proxy volume)."""
        if 0 <= int(frame) < self.count and int(frame) != self.browser.GetSelectedItemNumber():
            self.browser.SetSelectedItemNumber(int(frame))


def _synchronized(browser) -> List[object]:
    import vtk

    collection = vtk.vtkCollection()
    browser.GetSynchronizedSequenceNodes(collection, True)
    return [collection.GetItemAsObject(i) for i in range(collection.GetNumberOfItems())]


def cine_of(scene, volume) -> Optional[Cine]:
    """The sequence browser and volume sequence whose proxy node is ``volume``, or None (a plain volume)."""
    if volume is None or scene is None or volume.GetID() is None:
        return None
    browsers = scene.GetNodesByClass("vtkMRMLSequenceBrowserNode")
    for browser in (browsers.GetItemAsObject(i) for i in range(browsers.GetNumberOfItems())):
        for sequence in _synchronized(browser):
            proxy = browser.GetProxyNode(sequence)
            if proxy is not None and proxy.GetID() == volume.GetID() and sequence.GetNumberOfDataNodes() > 0:
                return Cine(browser, sequence)
    return None


@dataclass
class FramePlan:
    """The frames one run segments, and the ED and ES frames when they are known before it runs.

    ``ed`` / ``es`` None: found after the run by :func:`pick_ed_es` (``find_ed_es``); no
    indices when the plan does not ask for them (``indices`` False).
    """

    frames: Tuple[int, ...]
    ed: Optional[int] = None
    es: Optional[int] = None
    indices: bool = False

    @property
    def find_ed_es(self) -> bool:
        return self.indices and (self.ed is None or self.es is None)


def frame_plan(mode: FrameMode, count: int, shown: int, ed_frame: int = AUTO, es_frame: int = AUTO) -> FramePlan:
    """What to segment for ``mode`` in a sequence of ``count`` frames showing frame ``shown``.

    * SHOWN: that frame alone (no indices).
    * ED_ES: the two frames when both are set; otherwise every frame (to find the unset one
      from the LV volume curve); indices.
    * ALL: every frame; indices (ED and ES set by the user or found from the curve), none for a
      one-frame sequence.

    Raises ValueError (one line) for a set frame outside the sequence or ED = ES.
    """
    mode = FrameMode(mode)
    if count < 1:
        raise ValueError("the sequence has no frames")
    for name, f in (("ED", ed_frame), ("ES", es_frame)):
        if f != AUTO and not 0 <= int(f) < count:
            raise ValueError(f"the {name} frame {f} is not in the sequence (frames 0 to {count - 1})")
    if mode == FrameMode.SHOWN:
        return FramePlan((min(max(int(shown), 0), count - 1),))
    ed = None if ed_frame == AUTO else int(ed_frame)
    es = None if es_frame == AUTO else int(es_frame)
    if ed is not None and ed == es:
        raise ValueError(f"ED and ES are the same frame ({ed}); choose two frames")
    if count < 2 and mode == FrameMode.ALL:
        return FramePlan((0,))  # every frame of a one-frame sequence: that frame, no indices
    if count < 2:
        raise ValueError("ED and ES need a sequence of at least two frames")
    if mode == FrameMode.ED_ES and ed is not None and es is not None:
        return FramePlan(tuple(sorted((ed, es))), ed, es, indices=True)
    return FramePlan(tuple(range(count)), ed, es, indices=True)


def pick_ed_es(lv_volumes: Mapping[int, float], ed: Optional[int] = None, es: Optional[int] = None) -> Tuple[int, int]:
    """``(ED, ES)`` frames: the set ones kept, the others from the LV volume curve.

    lv_volumes: ``{frame: LV volume (ml)}`` of the segmented frames. ED = the frame of the largest
    LV volume, ES = the frame of the smallest (ties: the earlier frame); a frame the user set is
    kept, and the other is then chosen among the remaining frames.
    """
    frames = sorted(lv_volumes)
    if len(frames) < 2:
        raise ValueError("finding ED and ES needs at least two segmented frames")
    if ed is None:
        ed = max((f for f in frames if f != es), key=lambda f: (lv_volumes[f], -f))
    if es is None:
        es = min((f for f in frames if f != ed), key=lambda f: (lv_volumes[f], f))
    return int(ed), int(es)


def lv_curve(reports: Mapping[int, Mapping]) -> Dict[int, float]:
    """``{frame: LV volume (ml)}`` from the frames' ``report.json`` dictionaries."""
    out = {}
    for frame, report in reports.items():
        volumes = (report or {}).get("class_volumes_ml") or {}
        if "LV" not in volumes:
            raise ValueError(f"frame {frame}: the report has no LV volume (a bundle without an 'LV' class?)")
        out[int(frame)] = float(volumes["LV"])
    return out


def follow_frame(scene, segmentations: Mapping[int, object], frame: int) -> None:
    """Show ``frame``'s results in the views and nothing of the other frames'.

    ``segmentations``: ``{frame: segmentation node}`` of the segmented frames (this module's
    outputs, tagged with their input and frame; the frame's other outputs are looked up), or
    ``{frame: OutputNodes}`` when the caller holds them already. Each frame's segmentation and region outlines
    (its ``regions`` output, one segmentation node per frame) are visible for ``frame`` only.
    Another frame's disagreement or temperature map leaves the slice views' foreground and its
    colour legend is hidden; which of the shown frame's maps is in front is
    :func:`~CARDSegmentLib.overlays.show_overlay`'s choice.
    """
    others = []
    for f, given in segmentations.items():
        node = given.segmentation if isinstance(given, OutputNodes) else given
        if node is None or not scene.IsNodePresent(node):
            continue
        outputs = given if isinstance(given, OutputNodes) else _frame_outputs(scene, node, f)
        for shown in (node, outputs.regions):
            display = shown.GetDisplayNode() if shown is not None else None
            if display is not None:
                display.SetVisibility(f == frame)
        if f != frame:
            others += [m for m in (outputs.disagreement, outputs.temperature) if m is not None]
    _hide_maps(scene, others)


def _frame_outputs(scene, segmentation, frame: int) -> OutputNodes:
    """The outputs of the segmentation's input volume and ``frame`` (the segmentation alone when
    it names no input)."""
    volume = scene.GetNodeByID(segmentation.GetNodeReferenceID(INPUT_REFERENCE) or "")
    return find_outputs(scene, volume, frame) if volume is not None else OutputNodes(segmentation=segmentation)


def _hide_maps(scene, maps: List[object]) -> None:
    """Take ``maps`` out of every slice view's foreground and hide their legends."""
    ids = {m.GetID() for m in maps}
    for comp in slice_composite_nodes(scene):
        if comp.GetForegroundVolumeID() in ids:
            comp.SetForegroundVolumeID(None)
    for node in maps:
        legend = color_legend(node, create=False)
        if legend is not None:
            legend.SetVisibility(False)
