"""What the panel (``CARDSegmentWidget`` in ``CARDSegment.py``) decides, without Qt.

* :func:`parameter_widgets` and :func:`connect_gui`: bind the parameter node to the panel with a
  tag that every supported Slicer returns (``connectGui`` returns None on 5.8).
* :func:`default_input`: the volume the panel offers when none is chosen.
* :func:`watched_nodes_gone`: whether nodes the panel shows were removed from the scene.
* :class:`ClickGuard`: the second click of a double click is not a new command.
* :func:`safe_file_name`: a file name made from a node name that every system accepts.
* :func:`elapsed_text`: a duration in words.
* :func:`region_table` / :func:`fill_region_table`: the review table's cells (with each region's ``p_error``).
"""

from __future__ import annotations

import re
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ..outputs.nodes import BUNDLE_ATTRIBUTE, ROLE_ATTRIBUTE, all_nodes

#: the Qt property that names the parameter a widget shows (Slicer's parameterNodeWrapper)
PARAMETER_NAME_PROPERTY = "SlicerParameterName"


def parameter_widgets(ui) -> Dict[str, object]:
    """``{parameter name: widget}`` for every widget of ``ui`` (``childWidgetVariables``'s namespace)
    that carries the ``SlicerParameterName`` property, as ``connectGui`` collects them."""
    found = {}
    for widget in vars(ui).values():
        name = widget.property(PARAMETER_NAME_PROPERTY) if hasattr(widget, "property") else None
        if name:
            found[str(name)] = widget
    return found


def connect_gui(parameter_node, ui):
    """Bind ``parameter_node`` to the widgets of ``ui``; returns the tag for ``disconnectGui``.

    ``connectGui`` forgets to return its tag in Slicer 5.8 (``_connectGui`` ends without
    ``return``; 5.10 returns it), so ``disconnectGui(None)`` did nothing and each module entry added
    another set of bindings whose stale values then overwrote the parameters. The tag of
    ``connectParametersToGui``, which ``connectGui`` calls with the same mapping, is returned on
    every version; it is used here.
    """
    return parameter_node.connectParametersToGui(parameter_widgets(ui))


def default_input(scene):
    """The first plain scalar volume of ``scene`` that could be a cine frame, or None.

    Not a subclass (label map, vector or diffusion volume), not one of this module's outputs
    (kept ones included: they keep the bundle attribute), and holding single-component 3D image data.
    """
    for node in all_nodes(scene):
        if node.GetClassName() != "vtkMRMLScalarVolumeNode":
            continue
        if node.GetAttribute(ROLE_ATTRIBUTE) is not None or node.GetAttribute(BUNDLE_ATTRIBUTE) is not None:
            continue
        image = node.GetImageData()
        if image is None or image.GetNumberOfScalarComponents() != 1:
            continue
        if sum(1 for n in image.GetDimensions() if n > 1) < 2:
            continue
        return node
    return None


def watched_nodes_gone(scene, node_ids: Iterable[Optional[str]]) -> bool:
    """True when one of ``node_ids`` (the nodes the panel shows) is no longer in ``scene``."""
    return any(i is not None and scene.GetNodeByID(i) is None for i in node_ids)


class ClickGuard:
    """Ignores a click that comes within ``interval_s`` of the last change of the button's meaning.

    A double click on "Segment & Calibrate" used to start a run and cancel it at once: the second
    click landed on the button that had just become "Cancel". ``interval_s`` is the system's
    double-click interval; ``clock`` is injectable for tests.
    """

    def __init__(self, interval_s: float = 0.5, clock: Callable[[], float] = time.monotonic):
        self.interval_s, self.clock = float(interval_s), clock
        self._changed_at: Optional[float] = None

    def changed(self) -> None:
        """The button now means something else (Start became Cancel, or back)."""
        self._changed_at = self.clock()

    def accepts(self) -> bool:
        """False for a click that is the second half of a double click."""
        return self._changed_at is None or self.clock() - self._changed_at >= self.interval_s


#: characters Windows refuses in file names, and control characters
_UNSAFE = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


def safe_file_name(name: str, fallback: str = "Volume", max_length: int = 120) -> str:
    """``name`` as a file name that Windows, macOS and Linux all accept.

    Every forbidden character (``<>:"/\\|?*`` and control characters) becomes ``_``, runs of
    ``_`` and spaces collapse, trailing dots and spaces go, a reserved device name (CON, NUL,
    COM1, ...) gets a ``_`` in front, and the result is at most ``max_length`` characters; an
    empty result is ``fallback``. DICOM volumes are named like ``7: SAX cine``.
    """
    text = _UNSAFE.sub("_", str(name or ""))
    text = re.sub(r"_(\s*_)+", "_", re.sub(r"\s+", " ", text)).strip(" ._")
    text = text[:max_length].rstrip(" .")
    if not text:
        text = fallback
    if text.split(".")[0].upper() in _RESERVED:
        text = "_" + text
    return text


def elapsed_text(seconds: Optional[float]) -> str:
    """A duration as ``42 s``, ``3 min 05 s`` or ``1 h 02 min``; "" when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return ""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


#: the review table's columns in the panel; a sequence's rows get a "Frame" column first
REGION_COLUMNS = ("#", "Status", "P(error)", "Volume (ml)", "Mean disagr.", "Classes")


def p_error_text(value) -> str:
    """A region's ``p_error`` as ``0.42``; ``-`` when it has none (no region model in the bundle,
    or a review table saved before the column existed: None or NaN)."""
    try:
        p = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if p != p else f"{p:.2f}"


def region_table(rows) -> Tuple[Tuple[str, ...], List[Tuple[Tuple[Optional[int], int], Tuple[str, ...], str]]]:
    """``(headers, [(key, cells, note)])`` of the panel's review table from review rows (each with
    its ``frame``, None for a plain volume; ``p_error`` may be missing); ``key`` = ``(frame, region)``
    identifies the row."""
    framed = any(r.get("frame") is not None for r in rows)
    headers = (("Frame",) if framed else ()) + REGION_COLUMNS
    out = []
    for row in rows:
        cells = (
            str(row["region"]),
            row["status"],
            p_error_text(row.get("p_error")),
            f"{row['volume_mm3'] / 1000.0:.2f}",
            f"{row['mean_disagreement']:.3f}",
            row["classes"],
        )
        out.append(
            ((row.get("frame"), row["region"]), ((str(row.get("frame")),) if framed else ()) + cells, row["note"])
        )
    return headers, out


def fill_region_table(table, rows, make_item) -> Tuple[int, list]:
    """Fill the panel's ``QTableWidget`` with :func:`region_table` of ``rows`` (``make_item``:
    ``qt.QTableWidgetItem``); returns the Status column and the ``(frame, region)`` key of each row."""
    headers, cells = region_table(rows)
    table.blockSignals(True)
    table.clearContents()
    table.setColumnCount(len(headers))
    table.setHorizontalHeaderLabels(list(headers))
    table.setRowCount(len(cells))
    for r, (_, values, note) in enumerate(cells):
        for c, text in enumerate(values):
            item = make_item(text)
            if note:
                item.setToolTip(note)
            table.setItem(r, c, item)
    table.blockSignals(False)
    return headers.index("Status"), [key for key, _, _ in cells]


def show_cine_choices(ui, cine, frame_mode: str) -> None:
    """The frame choice only for a cine input (``cine``: its Cine, or None); the ED and ES boxes
    enabled only when the indices are wanted (``frame_mode`` not "shown"), up to the last frame."""
    ui.cineGroupBox.visible = cine is not None
    for box in (ui.edFrameSpinBox, ui.esFrameSpinBox):
        box.enabled = frame_mode != "shown"
        if cine is not None:
            box.maximum = cine.count - 1
