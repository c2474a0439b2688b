"""Every engine child stops when its input ends, the module's cleanup kills synchronously, and a
cine run goes through the warm engine, on real processes (and real MRML, PyPI slicer-core).

* A one-shot ``cardseg segment`` or ``cardseg batch`` child, started as the module starts it
  (``--eof stop``, its input a pipe the module holds and never writes to), stops within 5 s of the
  pipe's closing and leaves no temporary folder, nothing half written.
* ``ModuleLogic.cancel(wait=True)``, and the widget's cleanup (``cancel()`` then ``closeEngine()``),
  return only once the process is gone.
* With the engine kept warm, a cine run, automatic ED/ES included (two steps), starts no process
  besides the one warm engine, and gives the results of the one-shot ``cardseg batch`` path.
"""

from __future__ import annotations

import contextlib
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import MODULE_DIR, slicer_core

slicer = slicer_core()

import CARDSegmentLib as lib  # noqa: E402
import test_slicer_cine as cine_tests  # noqa: E402
from CARDSegmentLib.panel.logic import ModuleLogic  # noqa: E402
from CARDSegmentLib.runs import engine as engine_lib  # noqa: E402
from CARDSegmentLib.runs import process as proc  # noqa: E402
from test_slicer_cine import add_sequence, options_for, show_frame  # noqa: E402
from test_slicer_module_panel import FakeTimer, make_scene  # noqa: E402

cine_bundle, frame_paths = cine_tests.cine_bundle, cine_tests.frame_paths

#: the most seconds a child may run on after its input closed
GONE_WITHIN_S = 5.0
#: what a killed or interrupted cardseg run may leave (cardseg.io.outdir's staging names)
LEFTOVER_MARKS = (".cardseg-tmp", ".cardseg-old", ".cardseg.lock", ".cardseg-batch.lock")


@pytest.fixture(scope="module")
def long_input(tmp_path_factory) -> Path:
    """A 40-slice volume: long enough a run to close its input in the middle."""
    import SimpleITK as sitk
    from cardseg.bundle.phantom import synthetic_cine_volume

    vol, _ = synthetic_cine_volume(shape=(40, 96, 80), spacing=(1.6, 1.4, 8.0), seed=5)
    path = tmp_path_factory.mktemp("long") / "long.nrrd"
    sitk.WriteImage(vol.to_image(), str(path))
    return path


def leftovers(folder: Path) -> list:
    """Every file or folder under ``folder`` whose name says a cardseg run left it half done."""
    return [p for p in folder.rglob("*") if any(mark in p.name for mark in LEFTOVER_MARKS)]


def child_command(kind: str, work: Path, long_input: Path, bundle: Path) -> proc.SegmentCommand:
    kw = dict(bundle_path=str(bundle), device="cpu", python_executable=sys.executable, threads=1)
    kw["engine_dir"] = str(MODULE_DIR)
    if kind == "segment":
        return proc.SegmentCommand(str(long_input), str(work / "output"), **kw)
    manifest = work / "manifest.csv"
    rows = [f"case-{i:02d},{long_input},," for i in range(8)]
    manifest.write_text("case,path,phase,subject\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return proc.BatchCommand(str(manifest), str(work / "output"), **kw)


def lines_until(handle, wanted: str, timeout: float = 300.0) -> list:
    """The child's output lines up to the first that holds ``wanted``."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _stream, line in handle.read_lines():
            seen.append(line)
            if wanted in line:
                return seen
        assert handle.returncode() is None, f"the child ended first: {seen[-5:]}"
        time.sleep(0.02)
    raise AssertionError(f"no {wanted!r} line in {timeout} s: {seen[-5:]}")


@pytest.mark.parametrize("kind", ["segment", "batch"])
def test_a_child_whose_input_closes_stops_within_5_s_and_leaves_no_temporary_folder(
    kind, tmp_path, long_input, tiny_bundle
):
    command = child_command(kind, tmp_path, long_input, tiny_bundle)
    argv = command.argv()
    assert argv[argv.index("--eof") + 1] == "stop"
    handle = proc.PopenHandle(argv, command.env())
    try:
        lines_until(handle, '"stage": "trajectory"' if kind == "segment" else '"stage": "cases"')
        time.sleep(0.5)  # inside the work (a batch: its first case)
        handle.close_input()  # what the system does when the module's process ends
        closed_at = time.monotonic()
        while handle.returncode() is None and time.monotonic() - closed_at < GONE_WITHIN_S + 10:
            time.sleep(0.02)
        lasted = time.monotonic() - closed_at
    finally:
        handle.kill()
    assert lasted < GONE_WITHIN_S, f"the {kind} child ran on for {lasted:.1f} s after its input closed"
    assert handle.returncode() == 143  # stopped as SIGTERM stops it, not killed
    assert leftovers(tmp_path) == []
    if kind == "segment":
        assert not (tmp_path / "output").exists()  # nothing half written
    else:
        with open(tmp_path / "output" / "cohort.csv", newline="", encoding="utf-8") as f:
            assert {r["status"] for r in csv.DictReader(f)} <= {"ok", "pending"}  # unfinished: pending


def test_an_engine_child_without_eof_stop_reads_no_input(tmp_path, tiny_bundle):
    """``--eof finish`` (the command line's default): a closed input changes nothing."""
    import SimpleITK as sitk
    from cardseg.bundle.phantom import synthetic_cine_volume

    vol, _ = synthetic_cine_volume(shape=(2, 64, 56), spacing=(2.4, 2.4, 8.0), seed=1)
    sitk.WriteImage(vol.to_image(), str(tmp_path / "in.nrrd"))
    command = proc.SegmentCommand(str(tmp_path / "in.nrrd"), str(tmp_path / "out"), **_kw(tiny_bundle))
    argv = [a for a in command.argv() if a not in ("--eof", "stop")]
    handle = proc.PopenHandle(argv, command.env(), stdin=proc.subprocess.DEVNULL)
    run = proc.CardsegRun(command, lambda a, e, c: handle)
    run.start()
    assert run.wait(300) == lib.SUCCEEDED, run.error
    assert (tmp_path / "out" / "report.json").is_file()


def _kw(bundle) -> dict:
    return dict(
        bundle_path=str(bundle), device="cpu", python_executable=sys.executable, threads=1, engine_dir=str(MODULE_DIR)
    )


# ---------------------------------------------------------------------------------------------
# the module's cleanup


@pytest.mark.parametrize("how", ["cancel-wait", "widget-cleanup"])
def test_the_modules_cleanup_kills_the_engine_child_before_it_returns(how, tmp_path, long_input, tiny_bundle):
    from CARDSegmentLib.outputs import volume_files

    scene = make_scene()
    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "long")
    volume_files.read_volume_file(volume, long_input)
    work = tmp_path / "work"
    work.mkdir()
    options = lib.JobOptions(keep_engine_warm=False, work_root=str(work), **_kw(tiny_bundle))
    logic = ModuleLogic(str(MODULE_DIR), lambda: scene, FakeTimer, contextlib.nullcontext)
    seen = []
    logic.start(volume, options, onProgress=seen.append)
    run = logic.job.run
    deadline = time.monotonic() + 300
    while not any(p.stage == "trajectory" for p in seen) and time.monotonic() < deadline:
        FakeTimer.made[-1].slot()
        time.sleep(0.05)
    assert run.running and list(work.iterdir())
    child = run._handle._proc
    if how == "cancel-wait":
        logic.cancel(wait=True)
    else:  # what CARDSegmentWidget.cleanup calls
        logic.cancel()
        logic.closeEngine()
    assert child.poll() is not None, "the engine child outlived the cleanup"
    assert list(work.iterdir()) == []  # its temporary folder is gone too


# ---------------------------------------------------------------------------------------------
# a cine run through the warm engine


class Counted:
    """Counts the processes a launcher starts (wraps the real one)."""

    def __init__(self, launcher):
        self.launcher, self.argvs = launcher, []

    def __call__(self, argv, env, cwd):
        self.argvs.append(argv)
        return self.launcher(argv, env, cwd)


def run_cine(scene, cine, logic, options):
    job = logic.makeJob(cine.proxy, options)
    job.start()
    assert job.wait(timeout=1800) == lib.SUCCEEDED, job.error
    outputs = job.finish()
    return job, outputs


def frame_results(outdir: Path, frames) -> dict:
    """Each frame's labels and class volumes, read from the engine's folders."""
    import SimpleITK as sitk

    out = {}
    for f in frames:
        folder = outdir / f"frame-{f:03d}"
        labels = sitk.GetArrayFromImage(sitk.ReadImage(str(folder / "segmentation.nii.gz")))
        out[f] = (labels, json.loads((folder / "report.json").read_text())["class_volumes_ml"])
    return out


def subjects(outdir: Path) -> list:
    with open(outdir / "subjects.csv", newline="", encoding="utf-8") as f:
        return [{k: v for k, v in row.items() if "seconds" not in k} for row in csv.DictReader(f)]


def test_a_cine_run_with_the_engine_kept_warm_starts_no_second_engine_and_matches_the_one_shot_run(
    tmp_path, monkeypatch, cine_bundle, frame_paths
):
    one_shots = Counted(proc.subprocess_launcher)
    monkeypatch.setattr(proc, "subprocess_launcher", one_shots)
    scene = make_scene()
    cine = add_sequence(scene, frame_paths)
    show_frame(cine, 1)
    logic = ModuleLogic(str(MODULE_DIR), lambda: scene, FakeTimer, contextlib.nullcontext)
    engines = Counted(engine_lib.pipe_launcher)
    logic.engine = engine_lib.Engine(engines)
    try:
        warm = options_for(cine_bundle, tmp_path / "warm", frame_mode="ed_es", keep_files=True)
        (tmp_path / "warm").mkdir()
        job, _ = run_cine(scene, cine, logic, warm)
        assert len(job.runs) == 2 and all(isinstance(r, engine_lib.EngineRun) for r in job.runs)
        assert not any(r.engine_failed for r in job.runs)
        all_frames = options_for(cine_bundle, tmp_path / "warm", frame_mode="all")
        run_cine(scene, cine, logic, all_frames)  # a second click: the same engine
        assert len(engines.argvs) == 1 and one_shots.argvs == []  # one engine process, no cardseg batch
        assert logic.engine.starts == 1 and logic.engine.alive
        # the one-shot path (the box unticked) on the same frames
        (tmp_path / "one-shot").mkdir()
        cold = options_for(cine_bundle, tmp_path / "one-shot", frame_mode="ed_es", keep_files=True)
        cold.keep_engine_warm = False
        cold_job, _ = run_cine(scene, cine, logic, cold)
    finally:
        logic.closeEngine()
    assert len(one_shots.argvs) == 2 and all(a[3] == "batch" for a in one_shots.argvs)
    assert (cold_job.ed, cold_job.es) == (job.ed, job.es)
    warm_frames, cold_frames = frame_results(job.output_dir, (0, 1, 2)), frame_results(cold_job.output_dir, (0, 1, 2))
    for f in (0, 1, 2):
        assert np.array_equal(warm_frames[f][0], cold_frames[f][0]), f"frame {f}: other labels"
        assert warm_frames[f][1] == pytest.approx(cold_frames[f][1]), f"frame {f}: other volumes"
    assert subjects(job.output_dir) == subjects(cold_job.output_dir)
