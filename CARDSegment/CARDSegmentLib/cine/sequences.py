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

The cardiac indices need a short-axis stack: a run that asks for them on frames of fewer than
:data:`MIN_SLICES_FOR_INDICES` slices (a per-slice-location series, loaded as a sequence of
single-slice volumes) is refused. The results are recorded as sequences in the same browser
(below). MRML classes only (no Qt).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from ..outputs.geometry import image_dimensions
from ..outputs.loading import frame_base_name, output_names
from ..outputs.nodes import FRAME_ATTRIBUTE, ROLE_ATTRIBUTE, OutputNodes, remove_node, tag_output

#: ``ed_frame`` / ``es_frame`` value meaning "find it from the LV volume curve"
AUTO = -1
#: the fewest slices a frame must have for the cardiac indices (EDV, ESV, EF, LV mass and their
#: intervals): a short-axis stack covering the ventricles from base to apex at the usual 8-10 mm
#: per slice has at least this many; one slice (or a few) cannot give a volume
MIN_SLICES_FOR_INDICES = 6


class FrameMode(enum.Enum):
    """Which frames of a sequence one run segments."""

    SHOWN = "shown"
    ED_ES = "ed_es"
    ALL = "all"

    def label(self):
        return {"shown": "Shown frame", "ed_es": "ED and ES (ejection fraction)", "all": "All frames"}[self.value]


@dataclass
class Cine:
    """A sequence browser and the volume sequence whose proxy is the panel's input.

    Frames are the input sequence's own item numbers, also when it is not the browser's master
    sequence (the browser's selected item is then the master's: it is mapped through the index value).
    """

    browser: object
    sequence: object

    @property
    def count(self) -> int:
        return int(self.sequence.GetNumberOfDataNodes())

    @property
    def name(self) -> str:
        """The sequence's name: the stem of the outputs' names (a proxy's name may carry the shown frame)."""
        return self.sequence.GetName() or "Volume"

    def _is_master(self) -> bool:
        master = self.browser.GetMasterSequenceNode()
        return master is None or master.GetID() == self.sequence.GetID()

    @property
    def shown(self) -> int:
        """The frame of the input sequence the browser shows now."""
        selected = int(self.browser.GetSelectedItemNumber())
        if self._is_master() or selected < 0:
            return max(0, selected)
        value = self.browser.GetMasterSequenceNode().GetNthIndexValue(selected)
        return max(0, int(self.sequence.GetItemNumberFromIndexValue(value, False)))

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
        """Move the browser to ``frame`` (its master's item of the same index value) and update the proxies."""
        if not 0 <= int(frame) < self.count or int(frame) == self.shown:
            return
        item = int(frame)
        if not self._is_master():
            value = self.sequence.GetNthIndexValue(item)
            item = int(self.browser.GetMasterSequenceNode().GetItemNumberFromIndexValue(value, False))
        if item >= 0:
            self.browser.SetSelectedItemNumber(item)
            sequences_logic(self.browser.GetScene()).UpdateProxyNodesFromSequences(self.browser)


def cine_of(scene, volume) -> Optional[Cine]:
    """The sequence browser and volume sequence whose proxy node is ``volume``, or None (a plain
    volume, or a proxy of this module's own results). The browser is asked of the Sequences logic
    (from the proxy), not looked for in the scene."""
    if volume is None or scene is None or volume.GetID() is None:
        return None
    browser = sequences_logic(scene).GetFirstBrowserNodeForProxyNode(volume)
    sequence = browser.GetSequenceNode(volume) if browser is not None else None
    if sequence is None or sequence.GetNumberOfDataNodes() < 1 or sequence.GetAttribute(ROLE_ATTRIBUTE) is not None:
        return None
    return Cine(browser, sequence)


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
    """``(ED, ES)`` frames by the engine's rule (:func:`cardseg.cine.phases.choose_phases`, the one
    ``cardseg batch`` uses): the set ones kept, ED the largest LV volume, ES the smallest (ties: the
    earlier frame). lv_volumes: ``{frame: LV volume (ml)}`` of the segmented frames (at least two)."""
    from cardseg.cine.phases import choose_phases

    choice = choose_phases(lv_volumes, ed, es)
    return int(choice.ed), int(choice.es)


def lv_curve(reports: Mapping[int, Mapping]) -> Dict[int, float]:
    """``{frame: LV volume (ml)}`` from the frames' ``report.json`` dictionaries."""
    out = {}
    for frame, report in reports.items():
        volumes = (report or {}).get("class_volumes_ml") or {}
        if "LV" not in volumes:
            raise ValueError(f"frame {frame}: the report has no LV volume (a bundle without an 'LV' class?)")
        out[int(frame)] = float(volumes["LV"])
    return out


def slice_count(volume) -> int:
    """The number of slices (the K extent) of a frame volume; 0 without image data."""
    dims = image_dimensions(volume)
    return int(dims[2]) if dims else 0


def check_slices_for_indices(plan: FramePlan, slices: int) -> None:
    """Raise ValueError (one line) when ``plan`` asks for the cardiac indices of frames with fewer
    than :data:`MIN_SLICES_FOR_INDICES` slices."""
    if plan.indices and slices < MIN_SLICES_FOR_INDICES:
        raise ValueError(
            f"the cardiac indices need frames of at least {MIN_SLICES_FOR_INDICES} short-axis slices "
            f"(MIN_SLICES_FOR_INDICES); this sequence's frames have {slices} (a series per slice location "
            "is one slice: combine the study's short-axis series into one cine, or segment the shown frame)"
        )


# ---------------------------------------------------------------------------------------------
# the results: per-frame outputs recorded as sequences in the input's own browser
#
# Each output role of a cine (segmentation, disagreement, temperature, probabilities, report,
# review, regions) is one vtkMRMLSequenceNode with an item per segmented frame, at the input
# sequence's index value of that frame. The sequence is synchronised with the input's browser
# (playback, saving changes and recording on, a missing frame shown as an empty node), so that the
# browser itself shows the shown frame's results through one proxy node per role: moving the frame
# slider, playing the cine, saving the scene and the Sequences module need no observer of this
# module. The proxy keeps its display node (colours, overlay window, outline style) from frame to
# frame; a review decision made on the proxy's table is saved back into that frame's item. The
# result sequences carry the role attribute and the input reference of .outputs and a reference
# to the input sequence (INPUT_SEQUENCE_REFERENCE); they are found from the input's browser (its
# synchronised sequences), never by scanning the scene.

#: the roles recorded per frame (the cardiac-index table is the sequence's own: one node, no frame)
RESULT_ROLES = ("segmentation", "disagreement", "temperature", "probabilities", "report", "review", "regions")
#: reference from a result sequence to the input sequence it belongs to
INPUT_SEQUENCE_REFERENCE = "CARDSegment.InputSequence"

_LOGICS: Dict[int, tuple] = {}


def sequences_logic(scene):
    """The Sequences module's logic (in Slicer), else one ``vtkSlicerSequencesLogic`` kept per scene."""
    import slicer

    module = getattr(getattr(slicer, "modules", None), "sequences", None)
    if module is not None and scene is getattr(slicer, "mrmlScene", None):
        return module.logic()
    held = _LOGICS.get(id(scene))
    if held is None or held[0] is not scene:
        logic = slicer.vtkSlicerSequencesLogic()
        logic.SetMRMLScene(scene)
        held = _LOGICS[id(scene)] = (scene, logic)
    return held[1]


def synchronized_sequences(browser) -> List[object]:
    """The sequences of ``browser`` (master included)."""
    import vtk

    collection = vtk.vtkCollection()
    browser.GetSynchronizedSequenceNodes(collection, True)
    return [collection.GetItemAsObject(i) for i in range(collection.GetNumberOfItems())]


def result_sequences(cine) -> Dict[str, object]:
    """``{role: sequence}`` of this module's results for ``cine``'s input sequence (its browser's)."""
    out: Dict[str, object] = {}
    for sequence in synchronized_sequences(cine.browser):
        role = sequence.GetAttribute(ROLE_ATTRIBUTE)
        if role in RESULT_ROLES and sequence.GetNodeReferenceID(INPUT_SEQUENCE_REFERENCE) == cine.sequence.GetID():
            out.setdefault(role, sequence)
    return out


def recorded_frames(cine, held: Optional[Dict[str, object]] = None) -> List[int]:
    """The frames (input item numbers) that have a recorded segmentation, in order."""
    sequence = (held if held is not None else result_sequences(cine)).get("segmentation")
    if sequence is None:
        return []
    frames = set()
    for i in range(sequence.GetNumberOfDataNodes()):
        frame = cine.sequence.GetItemNumberFromIndexValue(sequence.GetNthIndexValue(i), True)
        if frame >= 0:
            frames.add(int(frame))
    return sorted(frames)


def frame_outputs(cine, frame: int, held: Optional[Dict[str, object]] = None) -> OutputNodes:
    """The recorded items of ``frame`` (nodes held by the sequences, not in the scene)."""
    value = cine.sequence.GetNthIndexValue(int(frame))
    out = OutputNodes()
    for role, sequence in (held if held is not None else result_sequences(cine)).items():
        setattr(out, role, sequence.GetDataNodeAtValue(value, True))
    return out


def shown_outputs(cine, held: Optional[Dict[str, object]] = None) -> OutputNodes:
    """The proxy nodes the browser shows the results through (an empty proxy on an unsegmented frame)."""
    out = OutputNodes()
    for role, sequence in (held if held is not None else result_sequences(cine)).items():
        setattr(out, role, cine.browser.GetProxyNode(sequence))
    return out


def result_node_ids(cine) -> tuple:
    """IDs of the result sequences and their proxies (the nodes a panel showing them watches)."""
    held = result_sequences(cine)
    proxies = [cine.browser.GetProxyNode(s) for s in held.values()]
    return tuple(n.GetID() for n in list(held.values()) + proxies if n is not None)


def _new_sequence(scene, cine, input_volume, role: str, name: str):
    """An empty result sequence for ``role``, indexed as the input sequence, synchronised with its browser."""
    sequence = scene.AddNewNodeByClass("vtkMRMLSequenceNode", scene.GenerateUniqueName(name))
    sequence.SetIndexName(cine.sequence.GetIndexName())
    sequence.SetIndexUnit(cine.sequence.GetIndexUnit())
    sequence.SetIndexType(cine.sequence.GetIndexType())
    tag_output(sequence, role, input_volume)
    sequence.SetNodeReferenceID(INPUT_SEQUENCE_REFERENCE, cine.sequence.GetID())
    browser = cine.browser
    browser.AddSynchronizedSequenceNode(sequence)
    browser.SetPlayback(sequence, True)
    browser.SetSaveChanges(sequence, True)  # a decision on the shown frame's review is kept in its item
    browser.SetRecording(sequence, True)
    browser.SetOverwriteProxyName(sequence, False)  # the proxy keeps the sequence's name on every frame
    browser.SetMissingItemMode(sequence, browser.MissingItemSetToDefault)  # an unsegmented frame shows nothing
    return sequence


def record_frames(scene, cine, input_volume, frames: Dict[int, OutputNodes]) -> Dict[str, object]:
    """Record the scene nodes of ``frames`` (``{frame: OutputNodes}``, one run's) as the frames'
    items of the result sequences, replacing those frames' earlier items (a role the run did not
    make loses its item for them); other frames' items stay. The sequences (and proxies) are named
    from the input sequence's name (``7: SAX cine CARD segmentation``), an item from its frame too
    (``7: SAX cine frame 2 CARD segmentation``).

    The recorded nodes leave the scene, except one per role that becomes the role's proxy when the
    browser has none yet (its display nodes, already styled, stay); the browser then shows the
    shown frame. Returns ``{role: sequence}``. Call it inside the scene's batch state.
    """
    held = result_sequences(cine)
    names = output_names(cine.name)
    for role in RESULT_ROLES:
        made = {f: getattr(o, role) for f, o in frames.items()}
        if role not in held and not any(n is not None for n in made.values()):
            continue
        sequence = held.get(role) or _new_sequence(scene, cine, input_volume, role, names[role])
        held[role] = sequence
        modifying = sequence.StartModify()  # one modified event for the run's frames, not one per frame
        for frame, node in sorted(made.items()):
            value = cine.sequence.GetNthIndexValue(int(frame))
            if node is None:
                if sequence.GetItemNumberFromIndexValue(value, True) >= 0:
                    sequence.RemoveDataNodeAtValue(value)
            else:
                _set_item(sequence, node, value, output_names(frame_base_name(cine.name, frame))[role])
        sequence.EndModify(modifying)
        _place_proxy(scene, cine, input_volume, sequence, role, [n for n in made.values() if n is not None])
    sequences_logic(scene).UpdateProxyNodesFromSequences(cine.browser)
    return held


def _set_item(sequence, node, value: str, name: str) -> None:
    """``node`` as the item at ``value``: a new empty item of its class, then ``node``'s content
    shallow-copied into it (its image data shared, not copied: the scene node is dropped next).
    An item it replaces is retired (:func:`release_retired`), not deleted here."""
    if sequence.GetItemNumberFromIndexValue(value, True) >= 0:
        _RETIRED.append(sequence.GetDataNodeAtValue(value, True))
        sequence.RemoveDataNodeAtValue(value)
    sequence.SetDataNodeAtValue(type(node)(), value)
    sequence.UpdateDataNodeAtValue(node, value, True)
    sequence.GetDataNodeAtValue(value, True).SetName(name)


#: result items a commit replaced, still referenced: deleting a segmentation item costs 15-30 ms
#: (its segments go with it), so a commit replacing 30 frames would spend seconds on it; the
#: panel lets them go a few per timer tick instead (:func:`release_retired`)
_RETIRED: List[object] = []


def retired_count() -> int:
    """How many replaced result items are still held."""
    return len(_RETIRED)


def release_retired(seconds: float = 0.05) -> int:
    """Let replaced result items go, oldest first, for about ``seconds`` (at least one; all with
    ``seconds=None``). Returns how many are still held."""
    start = time.perf_counter()
    while _RETIRED:
        _RETIRED.pop(0)
        if seconds is not None and time.perf_counter() - start >= seconds:
            break
    return len(_RETIRED)


def _place_proxy(scene, cine, input_volume, sequence, role: str, nodes: List[object]) -> None:
    """The first of ``nodes`` becomes ``sequence``'s proxy when it has none; the others leave the scene."""
    proxy = cine.browser.GetProxyNode(sequence)
    if proxy is None and nodes:
        proxy = nodes[0]
        cine.browser.AddProxyNode(proxy, sequence, False)
        proxy.SetName(sequence.GetName())
        tag_output(proxy, role, input_volume)
        proxy.RemoveAttribute(FRAME_ATTRIBUTE)
    for node in nodes:
        if node is not proxy:
            remove_node(scene, node)


def release_results(cine) -> int:
    """Keep the recorded results as ordinary sequences: the next run records new ones. Returns how many."""
    held = result_sequences(cine)
    for sequence in held.values():
        sequence.RemoveAttribute(ROLE_ATTRIBUTE)
        sequence.RemoveNodeReferenceIDs(INPUT_SEQUENCE_REFERENCE)
    return len(held)
