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

import shutil

from conftest import slicer_core

slicer = slicer_core()

import CARDSegmentLib as lib  # noqa: E402
import test_slicer_cine as cine_tests  # noqa: E402
from test_slicer_cine import node_ids  # noqa: E402

# the fixtures of test_slicer_cine: the real run (once per module) and its replay
cine_bundle, frame_paths, real_run, replay = (cine_tests.cine_bundle, cine_tests.frame_paths, cine_tests.real_run,
                                              cine_tests.replay)


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
    from CARDSegmentLib import volume_files

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
    assert monitor.outcome[0] == lib.FAILED and "report.json" in monitor.outcome[1]
    assert all(r.scene.IsNodePresent(n) for n in mine)
    assert node_ids(r.scene) == before | {n.GetID() for n in mine}
