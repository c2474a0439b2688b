"""Benchmark: the main-thread time of a 30-frame cine in the Slicer module, on slicer-core (not a test).

    python Testing/benchmarks/slicer_cine.py [--frames 30] [--slices 10] [--out FILE.json]

A cine of ``--frames`` frames of ``--slices`` slices (a phantom frame, 64 x 56 at 2.4 mm) in a
slicer-core scene with its sequence browser, as Slicer's DICOM plugin loads one. The engine runs
once for real on one frame (the untrained tiny test bundle, CPU); a fake ``cardseg batch`` hands
that frame's output folder to every frame, so only the module's own work is timed:

* **commit**: the timer tick that puts a run's 30 loaded frames in place (recording them in the
  result sequences, the indices table, the overlay), for the first run and for a second run that
  replaces every frame's results; the ticks that load one frame each are reported too (each hands
  the GUI back), and so are the ticks after the commit that let the replaced items go;
* **frame change**: what runs on the main thread when the user moves the frame slider: the
  browser's move and the Sequences logic's update of the proxies (Slicer's own C++), then the
  panel's handler (the outlines' highlight cleared, the agreement line read from the frame's
  report).

Goals: a commit under 2 s, a frame change under 20 ms. Writes
``Testing/benchmarks/results/slicer_cine.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "Testing" / "python"), str(REPO / "CARDSegment")]

import test_slicer_cine as cine_tests  # noqa: E402  (the tests' scene helpers; registers the converters)
from test_slicer_module_panel import FakeTimer, make_scene  # noqa: E402

import CARDSegmentLib as lib  # noqa: E402
from CARDSegmentLib.cine.job import case_name  # noqa: E402
from CARDSegmentLib.cine import sequences  # noqa: E402
from CARDSegmentLib.panel.logic import ModuleLogic  # noqa: E402

GOAL_COMMIT_S, GOAL_FRAME_CHANGE_S = 2.0, 0.020


def _bundle(folder: Path) -> Path:
    """The tiny untrained test bundle with an invented ``indices`` block (as the tests make it)."""
    from cardseg.bundle.loading import update_config
    from cardseg.bundle.scaffold import InitOptions, init_bundle

    path = folder / "bundle"
    init_bundle(
        path, InitOptions(primary="time-unet:tiny", reference="time-unet:micro", input_size=64, pixel_spacing_mm=3.0)
    )
    config = json.loads((path / "bundle.json").read_text(encoding="utf-8"))
    update_config(path, {"indices": cine_tests.invented_block(config)})
    return path


def _frame(folder: Path, slices: int) -> Path:
    import SimpleITK as sitk
    from cardseg.bundle.phantom import synthetic_cine_volume

    vol, _ = synthetic_cine_volume(shape=(slices, 64, 56), spacing=(2.4, 2.4, 8.0), seed=31)
    path = folder / "phase.nrrd"
    sitk.WriteImage(vol.to_image(), str(path))
    return path


def _engine_folders(folder: Path, bundle: Path, frame: Path, frames: int) -> Path:
    """The real engine's output of one frame, copied as every frame's, and a subjects.csv."""
    scene = make_scene()
    cine = cine_tests.add_sequence(scene, [frame])
    logic = ModuleLogic(str(REPO / "CARDSegment"), lambda: scene, FakeTimer, contextlib.nullcontext)
    job = logic.makeJob(cine.proxy, cine_tests.options_for(bundle, folder, frame_mode="shown", keep_files=True))
    job.start()
    if job.wait(timeout=1800) != lib.SUCCEEDED:
        raise SystemExit(f"the engine failed: {job.error}")
    source = folder / "every-frame"
    for f in range(frames):
        shutil.copytree(job.frame_dir(0), source / case_name(f))
    cine_tests.write_subjects(source / "subjects.csv", (58.0, 52.6, 63.4))
    return source


def _timed_run(logic, cine, options) -> dict:
    """One all-frames run, its load ticks timed one by one: ``{"commit_s", "load_ticks_s": [...]}``."""
    job = logic.makeJob(cine.proxy, options)
    job.start()
    if job.wait(timeout=600) != lib.SUCCEEDED:
        raise SystemExit(f"the fake run failed: {job.error}")
    ticks = []
    while True:
        t0 = time.perf_counter()
        done = job.load_step()
        ticks.append(time.perf_counter() - t0)
        if done:
            break
    releases = []  # the panel's release timer: replaced items let go a few per tick after the commit
    while sequences.retired_count():
        t0 = time.perf_counter()
        sequences.release_retired()
        releases.append(time.perf_counter() - t0)
    return {"commit_s": ticks[-1], "load_ticks_s": ticks[:-1], "release_ticks_s": releases}


def _frame_changes(logic, cine, frames: int) -> list:
    """Seconds of each frame change: the browser's move and proxy update, then the panel's handler."""
    seen = lib.cine_of(cine.browser.GetScene(), cine.proxy)
    times = []
    for f in [*range(1, frames), 0]:
        t0 = time.perf_counter()
        cine_tests.show_frame(cine, f)
        logic.frameChanged(seen)
        lib.agreement_summary(logic.frameReport(seen, seen.shown))
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=30)
    p.add_argument("--slices", type=int, default=10)
    p.add_argument("--out", default=str(REPO / "Testing" / "benchmarks" / "results" / "slicer_cine.json"))
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="slicer-cine-bench-") as tmp:
        folder = Path(tmp)
        bundle = _bundle(folder)
        frame = _frame(folder, a.slices)
        source = _engine_folders(folder, bundle, frame, a.frames)
        scene = make_scene()
        cine = cine_tests.add_sequence(scene, [frame] * a.frames)
        cine_tests.show_frame(cine, 4)
        logic = ModuleLogic(str(REPO / "CARDSegment"), lambda: scene, FakeTimer, contextlib.nullcontext)
        logic.launcher = cine_tests.CopyingBatch(source)
        options = cine_tests.options_for(bundle, folder, frame_mode="all")
        first = _timed_run(logic, cine, options)
        again = _timed_run(logic, cine, options)  # every frame has results: all are replaced
        changes = _frame_changes(logic, cine, a.frames)
        nodes = scene.GetNumberOfNodes()
    commit = max(first["commit_s"], again["commit_s"])
    result = {
        "benchmark": "slicer_cine",
        "what": "main-thread seconds of a cine's commit and of a frame change in the module's library on slicer-core",
        "frames": a.frames,
        "slices": a.slices,
        "slicer_core": _version("slicer-core"),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "commit_first_run_s": round(first["commit_s"], 4),
        "commit_replacing_every_frame_s": round(again["commit_s"], 4),
        "load_tick_max_s": round(max(first["load_ticks_s"] + again["load_ticks_s"]), 4),
        "load_ticks_total_s": round(sum(again["load_ticks_s"]), 3),
        "release_ticks": len(again["release_ticks_s"]),
        "release_tick_max_s": round(max(again["release_ticks_s"], default=0.0), 4),
        "release_ticks_total_s": round(sum(again["release_ticks_s"]), 3),
        "frame_change_median_s": round(statistics.median(changes), 5),
        "frame_change_max_s": round(max(changes), 5),
        "scene_nodes_after": nodes,
        "goal_commit_s": GOAL_COMMIT_S,
        "goal_frame_change_s": GOAL_FRAME_CHANGE_S,
        "commit_meets_goal": commit < GOAL_COMMIT_S,
        "frame_change_meets_goal": statistics.median(changes) < GOAL_FRAME_CHANGE_S,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    return 0


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    raise SystemExit(main())
