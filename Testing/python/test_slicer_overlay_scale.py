"""The disagreement overlay's colour scale follows the bundle's validation data (slicer-core scene).

The report carries ``disagreement_display_max`` (the 99th percentile of the TAC near the heart on
the bundle's validation volumes, ``regions.display_max_disagreement``); the overlay's window ends
there and the legend names that scale. Without it the window is the whole [0, ln 2].
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import slicer_core

slicer = slicer_core()
import vtk  # noqa: E402

from CARDSegmentLib.outputs import overlays  # noqa: E402

LN2 = math.log(2.0)


def disagreement_node(scene, top: float):
    img = vtk.vtkImageData()
    img.SetDimensions(8, 8, 2)
    img.AllocateScalars(vtk.VTK_FLOAT, 1)
    values = np.linspace(0.0, top, 128, dtype=np.float32)
    for i, v in enumerate(values):
        img.GetPointData().GetScalars().SetTuple1(i, float(v))
    node = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "disagreement")
    node.SetAndObserveImageData(img)
    node.CreateDefaultDisplayNodes()
    return node


@pytest.fixture()
def scene():
    s = slicer.vtkMRMLScene()
    s.RegisterNodeClass(slicer.vtkMRMLColorLegendDisplayNode())
    return s


def test_window_and_legend_follow_the_validation_maximum(scene):
    node = disagreement_node(scene, 0.3)
    overlays.style_overlay(scene, node, "disagreement", {"disagreement_display_max": 0.18})
    d = node.GetDisplayNode()
    assert (d.GetWindowLevelMin(), d.GetWindowLevelMax()) == pytest.approx((0.0, 0.18))
    # values above the maximum stay shown (saturated), the low end stays transparent
    lower, upper = d.GetLowerThreshold(), d.GetUpperThreshold()
    assert lower == pytest.approx(overlays.SHOWN_FROM_DISAGREEMENT) and upper > 0.3
    title = overlays.color_legend(node, False).GetTitleText()
    assert "0.180" in title and "validation" in title


@pytest.mark.parametrize(
    "report",
    [{}, {"disagreement_display_max": None}, {"disagreement_display_max": 2.0}, {"disagreement_display_max": "x"}],
)
def test_without_a_usable_maximum_the_whole_range(scene, report):
    node = disagreement_node(scene, 0.5)
    overlays.style_overlay(scene, node, "disagreement", report)
    d = node.GetDisplayNode()
    assert (d.GetWindowLevelMin(), d.GetWindowLevelMax()) == pytest.approx((0.0, LN2))
    assert "ln 2" in overlays.color_legend(node, False).GetTitleText()
