"""Perceptual colour maps for the disagreement and temperature overlays.

Inside Slicer the stock "Inferno" and "Viridis" colour tables exist (loaded from Slicer's colour
files); they are used as they are. Where they are missing (a bare MRML scene, e.g. slicer-core
in tests) an equivalent 256-entry table is made once per scene from the anchor colours below:
17 evenly spaced samples of each map (the maps are by Stéfan van der Walt and Nathaniel Smith,
released under CC0), interpolated linearly.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

#: 17 evenly spaced samples (RGB in [0, 1]) of each map
ANCHORS: Dict[str, List[Tuple[float, float, float]]] = {
    "Inferno": [
        (0.001, 0.000, 0.014),
        (0.042, 0.028, 0.141),
        (0.129, 0.047, 0.291),
        (0.238, 0.037, 0.396),
        (0.342, 0.062, 0.429),
        (0.441, 0.099, 0.432),
        (0.541, 0.135, 0.415),
        (0.640, 0.171, 0.381),
        (0.736, 0.216, 0.330),
        (0.822, 0.275, 0.266),
        (0.894, 0.353, 0.194),
        (0.947, 0.449, 0.115),
        (0.978, 0.558, 0.035),
        (0.988, 0.675, 0.065),
        (0.975, 0.798, 0.206),
        (0.948, 0.917, 0.411),
        (0.988, 0.998, 0.645),
    ],
    "Viridis": [
        (0.267, 0.005, 0.329),
        (0.282, 0.095, 0.417),
        (0.279, 0.175, 0.483),
        (0.259, 0.252, 0.525),
        (0.230, 0.322, 0.546),
        (0.199, 0.388, 0.555),
        (0.173, 0.449, 0.558),
        (0.149, 0.508, 0.557),
        (0.128, 0.567, 0.551),
        (0.121, 0.626, 0.533),
        (0.158, 0.684, 0.502),
        (0.246, 0.739, 0.452),
        (0.369, 0.789, 0.383),
        (0.516, 0.831, 0.294),
        (0.678, 0.864, 0.190),
        (0.846, 0.887, 0.100),
        (0.993, 0.906, 0.144),
    ],
}

#: the stock Slicer colour node of each map (vtkMRMLColorLogic's file colour tables)
STOCK_IDS = {name: f"vtkMRMLColorTableNodeFile{name}.txt" for name in ANCHORS}
#: attribute that marks the tables this module made itself
COLORMAP_ATTRIBUTE = "CARDSegment.ColorMap"
TABLE_SIZE = 256


def sample(name: str, n: int = TABLE_SIZE) -> List[Tuple[float, float, float]]:
    """``n`` colours of map ``name``, linearly interpolated between its anchors."""
    anchors = ANCHORS[name]
    last = len(anchors) - 1
    out = []
    for i in range(n):
        x = (i / (n - 1)) * last if n > 1 else 0.0
        k = min(int(x), last - 1)
        f = x - k
        a, b = anchors[k], anchors[k + 1]
        out.append(tuple(a[c] + (b[c] - a[c]) * f for c in range(3)))
    return out


def color_node(scene, name: str):
    """The colour node to use for map ``name`` ("Inferno" or "Viridis") in ``scene``.

    Slicer's stock node when the scene has it; else this module's own table (made on first use,
    then found again by its attribute).
    """
    import slicer

    if name not in ANCHORS:
        raise ValueError(f"unknown colour map {name!r} (known: {', '.join(ANCHORS)})")
    stock = scene.GetNodeByID(STOCK_IDS[name])
    if stock is not None:
        return stock
    nodes = scene.GetNodesByClass("vtkMRMLColorTableNode")
    for i in range(nodes.GetNumberOfItems()):
        node = nodes.GetItemAsObject(i)
        if node.GetAttribute(COLORMAP_ATTRIBUTE) == name:
            return node
    node = slicer.vtkMRMLColorTableNode()
    node.SetName(f"CARDSegment {name}")
    node.SetTypeToUser()
    node.SetNumberOfColors(TABLE_SIZE)
    for i, (r, g, b) in enumerate(sample(name)):
        node.SetColor(i, "", r, g, b, 1.0)
    node.SetAttribute(COLORMAP_ATTRIBUTE, name)
    node.SetAttribute("Category", "CARDSegment")
    scene.AddNode(node)
    return node
