"""The disagreement and temperature maps as overlays: colour window, threshold, legend, slice views.

Both maps are scalar volumes on the input's grid: disagreement (TAC, nats, in [0, ln 2]) and the
CARD temperature (in [tau_min, tau_max] of the bundle's calibration).
"""

from __future__ import annotations

import math
from typing import Optional

from .colormaps import color_node
from .nodes import OutputNodes
from .views import slice_composite_nodes

OVERLAY_CHOICES = ("disagreement", "temperature", "none")
LN2 = math.log(2.0)

#: disagreement (nats) below which both overlays are transparent, so that the input shows
#: unchanged where the two networks agree (typical voxels lie near 0.002 on the [0, ln 2] window);
#: it is the display node's threshold, which the Volumes module shows and lets the user change
SHOWN_FROM_DISAGREEMENT = 0.01

OVERLAY_STYLE = {
    "disagreement": {"colormap": "Inferno", "title": "Disagreement (TAC)"},
    "temperature": {"colormap": "Viridis", "title": "Temperature"},
}


def disagreement_display_max(report: Optional[dict]) -> Optional[float]:
    """The disagreement the bundle's validation volumes reach (``report["disagreement_display_max"]``,
    the 99th percentile of their TAC near the heart), or None when the report has none usable."""
    try:
        value = float((report or {}).get("disagreement_display_max"))
    except (TypeError, ValueError):
        return None
    return value if 0.0 < value <= LN2 else None


def overlay_title(role: str, report: Optional[dict]) -> str:
    """The legend's title: for disagreement, the scale it is drawn on (validation's 99th percentile
    when the report carries it, else the whole [0, ln 2])."""
    title = OVERLAY_STYLE[role]["title"]
    if role != "disagreement":
        return title
    top = disagreement_display_max(report)
    if top is None:
        return f"{title}, 0-ln 2 nats"
    return f"{title}, 0-{top:.3f} nats (99th pct. on validation; brighter above)"


def overlay_range(role: str, report: Optional[dict], node=None) -> tuple:
    """The colour window of an overlay: for disagreement [0, the validation volumes' 99th
    percentile] (:func:`disagreement_display_max`; [0, ln 2] without it), [tau_min, tau_max] for
    temperature."""
    if role == "disagreement":
        top = disagreement_display_max(report)
        return 0.0, LN2 if top is None else top
    cal = (report or {}).get("calibration") or {}
    if "tau_min" in cal and "tau_max" in cal and float(cal["tau_max"]) > float(cal["tau_min"]):
        return float(cal["tau_min"]), float(cal["tau_max"])
    if node is not None and node.GetImageData() is not None:
        lo, hi = node.GetImageData().GetScalarRange()
        return float(lo), float(max(hi, lo + 1e-6))
    return 1.0, 3.0


def temperature_at(disagreement: float, calibration: dict) -> Optional[float]:
    """The CARD temperature for a disagreement value, from the report's calibration parameters.

    The engine's map (``cardseg.method.calibration.card.temperature_field``, restated here because this
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


def style_overlay(scene, node, role: str, report: Optional[dict]) -> None:
    """Colour map, window, transparent low end and (hidden) legend of a freshly loaded map."""
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
        legend.SetTitleText(overlay_title(role, report))
        legend.SetVisibility(False)


def show_overlay(
    scene, input_volume, outputs: OutputNodes, overlay: str = "disagreement", opacity: float = 0.5
) -> None:
    """Input as background of every slice view, the chosen map as foreground; its legend only.

    ``overlay`` "none" (or a map this run did not make) clears the foreground of the views that
    showed one of this module's maps and hides the legends.
    """
    if overlay not in OVERLAY_CHOICES:
        raise ValueError(f"overlay must be one of {OVERLAY_CHOICES}, not {overlay!r}")
    chosen = outputs.overlay(overlay)
    ours = {n.GetID() for n in (outputs.disagreement, outputs.temperature) if n is not None}
    helped = chosen is not None and input_volume is not None and _set_layers(scene, input_volume, chosen, opacity)
    for comp in () if helped else slice_composite_nodes(scene):  # the application's helper set every view
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


def _set_layers(scene, background, foreground, opacity: float) -> bool:
    """``slicer.util.setSliceViewerLayers`` on the application's scene; False elsewhere (not set)."""
    import slicer

    util = getattr(slicer, "util", None)
    if scene is not getattr(slicer, "mrmlScene", None) or not hasattr(util, "setSliceViewerLayers"):
        return False
    util.setSliceViewerLayers(background=background, foreground=foreground, foregroundOpacity=float(opacity))
    return True


def set_overlay_opacity(scene, outputs: OutputNodes, opacity: float) -> None:
    """Foreground opacity of the views that show one of this module's maps."""
    ours = {n.GetID() for n in (outputs.disagreement, outputs.temperature) if n is not None}
    for comp in slice_composite_nodes(scene):
        if comp.GetForegroundVolumeID() in ours:
            comp.SetForegroundOpacity(float(opacity))
