"""The module's Logic with the warm engine (issue 25): two Segment & Calibrate runs on real MRML
share one ``cardseg serve`` process and load the same nodes as the one-shot process; with
"keep the engine warm" off, runs are one-shot and the engine is closed.

Needs slicer-core (real MRML, no Qt) and the real engine in a subprocess (tiny test bundle).
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

from conftest import MODULE_DIR, slicer_core

slicer = slicer_core()


import CARDSegmentLib as lib  # noqa: E402
from CARDSegmentLib.panel.logic import ModuleLogic  # noqa: E402
from vtk.util.numpy_support import vtk_to_numpy  # noqa: E402


def labels_of(outputs) -> np.ndarray:
    seg = outputs.segmentation.GetSegmentation()
    return np.stack(
        [
            vtk_to_numpy(seg.GetNthSegment(i).GetRepresentation("Binary labelmap").GetPointData().GetScalars()).copy()
            for i in range(seg.GetNumberOfSegments())
        ]
    )


def test_two_runs_share_one_warm_engine_and_match_the_one_shot_run(tmp_path, tiny_bundle, scene_and_volume):
    scene, volume = scene_and_volume
    logic = ModuleLogic(str(MODULE_DIR), lambda: scene, object, contextlib.nullcontext)
    options = lib.JobOptions(
        bundle_path=str(tiny_bundle),
        device="cpu",
        engine_dir=str(MODULE_DIR),
        python_executable=sys.executable,
        threads=1,
        work_root=str(tmp_path),
    )
    try:
        warm = [labels_of(logic.runSync(volume, options, timeout=600)) for _ in range(2)]
        assert logic.engine is not None and logic.engine.starts == 1 and logic.engine.alive
        options.keep_engine_warm = False
        cold = labels_of(logic.runSync(volume, options, timeout=600))
        assert logic.engine is None  # turned off: closed, its memory freed
    finally:
        logic.closeEngine()
    np.testing.assert_array_equal(warm[0], warm[1])
    np.testing.assert_array_equal(warm[1], cold)
