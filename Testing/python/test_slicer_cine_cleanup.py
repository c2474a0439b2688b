"""A cine run cleans up only what it made, and says which frame went wrong (issue 22's robustness
mends), on real MRML (PyPI slicer-core).

The results of a cine run load a frame per timer tick; between two ticks the GUI runs and the user
may add nodes. A cancel (or a failure) while loading removes the nodes the job made and nothing
of the user's. A sequence whose frames lie on different grids is refused before anything runs,
naming the first frame that differs.

``test_slicer_cine``'s replay fixture (the real engine's outputs of a 3-frame phantom, copied by a
fake ``cardseg batch``) is reused here.
"""

from __future__ import annotations

import contextlib
import shutil

import pytest

from conftest import MODULE_DIR, slicer_core

slicer = slicer_core()

import CARDSegmentLib as lib  # noqa: E402
import test_slicer_cine as cine_tests  # noqa: E402
from CARDSegmentLib.panel.logic import ModuleLogic  # noqa: E402
from test_slicer_cine import add_sequence, node_ids, options_for, show_frame  # noqa: E402
from test_slicer_module_panel import FakeTimer, make_scene  # noqa: E402

# the fixtures of test_slicer_cine: the real run (once per module) and its replay
cine_bundle, frame_paths, real_run, replay = (
    cine_tests.cine_bundle,
    cine_tests.frame_paths,
    cine_tests.real_run,
    cine_tests.replay,
)


def load_one_frame(r):
    """A monitor on an all-frames job, stepped until the first frame's results are loaded."""
    job = r.logic.makeJob(r.cine.proxy, r.options(frame_mode="all"))
    monitor = lib.JobMonitor(job)
    assert not monitor.start()
    while not (job.state == lib.SUCCEEDED and job.progress.done == 1):
        assert not monitor.step()
    return job, monitor


def add_user_nodes(scene, frame_path):
    """What a user may do between two timer ticks: load a volume, add a text node."""
    from CARDSegmentLib.outputs import volume_files

    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "my other patient")
    volume_files.read_volume_file(volume, frame_path)
    volume.CreateDefaultDisplayNodes()
    note = scene.AddNewNodeByClass("vtkMRMLTextNode", "my notes")
    return [volume, note, volume.GetDisplayNode()]


def test_cancel_while_loading_removes_the_jobs_nodes_and_none_of_the_users(replay, frame_paths):
    r = replay
    before = node_ids(r.scene)
    job, monitor = load_one_frame(r)
    assert node_ids(r.scene) - before  # the first frame's nodes, not yet in place
    mine = add_user_nodes(r.scene, frame_paths[0])
    monitor.cancel()
    assert monitor.outcome == (lib.CANCELLED, None)
    assert all(r.scene.IsNodePresent(n) for n in mine)
    assert node_ids(r.scene) == before | {n.GetID() for n in mine}  # the job's own nodes are gone
    assert not job.work_dir.exists()


def test_a_failure_while_loading_removes_the_jobs_nodes_and_none_of_the_users(replay, frame_paths):
    r = replay
    before = node_ids(r.scene)
    job, monitor = load_one_frame(r)
    mine = add_user_nodes(r.scene, frame_paths[1])
    shutil.rmtree(job.frame_dir(job.plan.frames[1]))  # the next frame's results cannot be read
    while not monitor.step():
        pass
    assert monitor.outcome == (
        lib.FAILED,
        "the engine wrote no report.json in the results of frame 1 (40 ms) of '7: SAX cine'",
    )  # not the deleted temporary folder
    assert all(r.scene.IsNodePresent(n) for n in mine)
    assert node_ids(r.scene) == before | {n.GetID() for n in mine}


# ---------------------------------------------------------------------------------------------
# frames on different grids: refused before anything runs


def write_frames(folder, shapes, spacings):
    import SimpleITK as sitk
    from cardseg.bundle.phantom import synthetic_cine_volume

    folder.mkdir()
    paths = []
    for i, (shape, spacing) in enumerate(zip(shapes, spacings)):
        vol, _ = synthetic_cine_volume(shape=shape, spacing=spacing, seed=20 + i)
        paths.append(folder / f"phase{i}.nrrd")
        sitk.WriteImage(vol.to_image(), str(paths[-1]))
    return paths


class NoProcess:
    """A launcher that must not be called."""

    def __init__(self):
        self.calls = []

    def __call__(self, argv, env, cwd):
        self.calls.append(argv)
        raise AssertionError("no engine should start")


def start_all_frames(scene, cine, launcher, tmp_path):
    """Start an all-frames run of ``cine`` with ``launcher`` as its process: ``(logic, work
    folder, outcomes)``, the outcomes filled by ``onFinished`` as ``(state, error)``."""
    logic = ModuleLogic(str(MODULE_DIR), lambda: scene, FakeTimer, contextlib.nullcontext)
    logic.launcher = launcher
    work = tmp_path / "work"
    work.mkdir()
    outcomes = []
    logic.start(
        cine.proxy,
        options_for(tmp_path / "no-bundle", work, frame_mode="all"),
        onFinished=lambda s, e: outcomes.append((s, e)),
    )
    return logic, work, outcomes


ODD = {
    "size": (
        [(6, 64, 56), (6, 72, 56), (6, 64, 56)],
        [(2.4, 2.4, 8.0)] * 3,
        "(56 x 72 x 6 voxels of 2.4 x 2.4 x 8 mm against 56 x 64 x 6 voxels",
    ),
    "spacing": (
        [(6, 64, 56)] * 3,
        [(2.4, 2.4, 8.0), (2.0, 2.0, 8.0), (2.4, 2.4, 8.0)],
        "(56 x 64 x 6 voxels of 2 x 2 x 8 mm against 56 x 64 x 6 voxels of 2.4",
    ),
}


@pytest.mark.parametrize("odd", sorted(ODD))
def test_frames_on_different_grids_are_refused_before_the_engine_runs_naming_the_frame(tmp_path, odd):
    shapes, spacings, odd_grid = ODD[odd]
    scene = make_scene()
    cine = add_sequence(scene, write_frames(tmp_path / "frames", shapes, spacings))
    show_frame(cine, 0)
    before = node_ids(scene)
    logic, work, outcomes = start_all_frames(scene, cine, NoProcess(), tmp_path)
    assert len(outcomes) == 1 and outcomes[0][0] == lib.FAILED and not logic.isRunning
    error = outcomes[0][1]
    assert error.startswith("frame 1 (40 ms) of '7: SAX cine' is on another grid than the shown frame 0 (0 ms)")
    assert odd_grid in error and "\n" not in error
    assert logic.launcher.calls == [] and list(work.iterdir()) == [] and node_ids(scene) == before
    # the shown frame alone is on its own grid: that run is not refused
    job = logic.makeJob(cine.proxy, options_for(tmp_path / "no-bundle", work, frame_mode="shown"))
    with pytest.raises(AssertionError, match="no engine should start"):
        job.start()


# ---------------------------------------------------------------------------------------------
# a frame the engine refused: the error names the frame, not its deleted temporary file


class RefusingBatch:
    """A fake ``cardseg batch`` that refuses frame 1's file as the engine does (its cohort.csv row
    names the file's absolute path) and exits 1."""

    def __call__(self, argv, env, cwd):
        from pathlib import Path

        manifest = Path(argv[argv.index("--manifest") + 1])
        out = Path(argv[argv.index("-o") + 1])
        out.mkdir(exist_ok=True)
        frame_file = manifest.parent / "frames" / "frame-001.nrrd"
        assert frame_file.is_file()
        (out / "cohort.csv").write_text(
            f"case,status,error\nframe-000,ok,\nframe-001,error,{frame_file}: image is constant (0 everywhere)\n"
        )
        self.lines = [("stderr", "cardseg: error: 1 of 2 cases failed")]
        return self

    def read_lines(self):
        out, self.lines = self.lines, []
        return out

    def returncode(self):
        return 1

    def kill(self):
        pass


def test_a_refused_frame_is_named_by_frame_and_volume(tmp_path, frame_paths):
    scene = make_scene()
    cine = add_sequence(scene, frame_paths[:2])
    logic, work, outcomes = start_all_frames(scene, cine, RefusingBatch(), tmp_path)
    while not outcomes:
        FakeTimer.made[-1].slot()
    assert outcomes == [(lib.FAILED, "frame 1 (40 ms) of '7: SAX cine': image is constant (0 everywhere)")]
    assert list(work.iterdir()) == []
