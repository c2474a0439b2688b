"""Cancel with "Keep engine warm" (issue 22), runs refused before they start and errors that name
the volume rather than its deleted temporary file, on real MRML.

The panel cancels on a background thread: ``jobs.cancel_runs`` hands each run's ending to it.
A warm-engine run must take that hand-over as a one-shot run does: the engine lets go of the
process at once (the next click starts a new one), the kill and the deletion of the temporary
folder happen in the background. Before the fix ``EngineRun.cancel`` refused the ``background``
argument: the panel said "Cancelled" while ``cardseg serve`` went on computing, the temporary
folder (a copy of the patient's image) stayed, and the next click failed with "busy".

Fake engine processes (``test_slicer_engine``'s), no real engine.
"""

from __future__ import annotations

import contextlib
import json
import threading

import pytest

from conftest import MODULE_DIR, slicer_core

slicer = slicer_core()

import CARDSegmentLib as lib  # noqa: E402
from CARDSegmentLib.runs import process as proc  # noqa: E402
from CARDSegmentLib.runs.engine import Engine, EngineRun  # noqa: E402
from CARDSegmentLib.runs.jobs import cancel_runs  # noqa: E402
from CARDSegmentLib.panel.logic import ModuleLogic  # noqa: E402
from test_slicer_engine import FakeEngine, Launcher, OneShot, command, progress, succeed  # noqa: E402


def never_ends(request):
    """A request the engine is still computing when the user cancels."""
    return [[progress("trajectory", 0, 20)], [progress("trajectory", 1, 20)]]


class Timer:
    """qt.QTimer's part the Logic uses; the test fires the slot."""

    def __init__(self):
        self.slot, self.active = None, False

    def setInterval(self, ms):
        pass

    def connect(self, signal, slot):
        self.slot = slot

    def start(self):
        self.active = True

    def stop(self):
        self.active = False


class GatedEngine(FakeEngine):
    """A fake engine whose kill waits for ``gate`` (killing a real process takes a while)."""

    gate = threading.Event()

    def kill(self):
        self.gate.wait(10)
        super().kill()


# ---------------------------------------------------------------------------------------------
# the engine alone


def test_a_warm_run_hands_its_kill_to_the_background_and_frees_the_engine_at_once():
    launcher = Launcher(never_ends, succeed)
    engine = Engine(launcher)
    run = engine.run(command())
    run.start()
    run.poll()
    assert run.running and engine.busy
    later = []
    run.cancel(background=later.append)
    first = launcher.engines[0]
    assert run.state == proc.CANCELLED and not engine.busy and engine.handle is None
    assert not first.killed and len(later) == 1  # the kill waits for the background thread
    later[0]()
    assert first.killed
    again = engine.run(command())
    again.start()  # no "the engine is busy with another run"
    assert again.wait(5, interval=0) == proc.SUCCEEDED and engine.starts == 2


def test_a_fallback_run_hands_its_one_shot_kill_to_the_background():
    engine = Engine(Launcher(lambda r: [[("stderr", "ImportError: no cardseg")], 1], ready=False))
    one_shots = []
    run = engine.run(
        command(), one_shot_launcher=lambda argv, env, cwd: one_shots.append(OneShot(argv)) or one_shots[-1]
    )
    run.start()
    while not one_shots:
        run.poll()
    later = []
    run.cancel(background=later.append)
    assert run.state == proc.CANCELLED and not one_shots[0].killed and len(later) == 1
    later[0]()
    assert one_shots[0].killed


def test_cancel_runs_still_cleans_up_when_a_run_refuses_the_cancel():
    class Stubborn:
        def cancel(self, background=None):
            raise RuntimeError("cannot cancel")

    cleaned, later = [], []
    with pytest.raises(RuntimeError, match="cannot cancel"):
        cancel_runs([Stubborn()], lambda: cleaned.append(1), later.append)
    assert len(later) == 1
    later[0]()
    assert cleaned == [1]
    with pytest.raises(RuntimeError):
        cancel_runs([Stubborn()], lambda: cleaned.append(2))
    assert cleaned == [1, 2]


# ---------------------------------------------------------------------------------------------
# the module's Logic, as the panel drives it


def options_in(work, **kw):
    kw.setdefault("device", "cpu")
    return lib.JobOptions(
        engine_dir=str(MODULE_DIR), python_executable="/opt/Slicer/bin/PythonSlicer", work_root=str(work), **kw
    )


def test_cancel_with_the_engine_kept_warm_kills_it_deletes_the_files_and_the_next_click_works(
    tmp_path, scene_and_volume
):
    scene, volume = scene_and_volume
    work = tmp_path / "work"
    work.mkdir()
    launcher_made = []

    def gated(argv, env, cwd):
        engine = GatedEngine(argv, env, never_ends)
        launcher_made.append(engine)
        return engine

    timers = []
    logic = ModuleLogic(
        str(MODULE_DIR), lambda: scene, lambda: timers.append(Timer()) or timers[-1], contextlib.nullcontext
    )
    logic.engine = Engine(gated)
    outcomes = []
    GatedEngine.gate.clear()
    logic.start(volume, options_in(work), onFinished=lambda s, e: outcomes.append((s, e)))
    timers[-1].slot()
    job = logic.job
    assert isinstance(job.run, EngineRun) and job.run.running and list(work.iterdir())
    logic.cancel()  # returns while the kill waits in the background
    assert outcomes == [(lib.CANCELLED, None)] and not logic.engine.busy and job.run.state == lib.CANCELLED
    GatedEngine.gate.set()
    assert logic.waitForBackground(10)
    assert launcher_made[0].killed and list(work.iterdir()) == []  # no copy of the image left behind
    # the next click starts a new engine process and sends it the request
    logic.start(volume, options_in(work), onFinished=lambda s, e: outcomes.append((s, e)))
    timers[-1].slot()
    assert logic.isRunning and len(outcomes) == 1, outcomes
    assert logic.engine.starts == 2 and len(launcher_made[1].requests) == 1
    logic.cancel()
    assert logic.waitForBackground(10) and launcher_made[1].killed and list(work.iterdir()) == []
    logic.closeEngine()


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("wrong", [{"device": "gpu"}, {"method": "CARD"}])
def test_run_sync_with_a_wrong_option_fails_in_one_line_and_leaves_no_folder(tmp_path, scene_and_volume, warm, wrong):
    scene, volume = scene_and_volume
    work = tmp_path / "work"
    work.mkdir()
    logic = ModuleLogic(str(MODULE_DIR), lambda: scene, Timer, contextlib.nullcontext)
    logic.engine = Engine(Launcher(succeed))
    name = next(iter(wrong))
    with pytest.raises(RuntimeError, match=f"segmentation failed: {name} must be one of"):
        logic.runSync(volume, options_in(work, keep_engine_warm=warm, **wrong), timeout=10)
    assert list(work.iterdir()) == []
    assert logic.engine is None or logic.engine.starts == 0  # nothing was started either
    outcomes = []
    logic.start(
        volume, options_in(work, keep_engine_warm=warm, **wrong), onFinished=lambda s, e: outcomes.append((s, e))
    )
    assert outcomes and outcomes[0][0] == lib.FAILED and outcomes[0][1].startswith(f"{name} must be one of")
    assert list(work.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# an error that names the temporary input file names the volume instead (the file is gone)


class RefusingProcess(proc.ProcessHandle):
    """A one-shot ``cardseg segment`` that refuses its input (``argv[4]``) as the engine does."""

    def __init__(self, argv, env, cwd):
        self.lines = [("stderr", f"cardseg: error: {argv[4]}: image is constant (0 everywhere)")]

    def read_lines(self):
        out, self.lines = self.lines, []
        return out

    def returncode(self):
        return 2

    def kill(self):
        pass


def refuse_input(request):
    return [
        [
            (
                "stdout",
                json.dumps(
                    {
                        "event": "result",
                        "id": request["id"],
                        "ok": False,
                        "code": 2,
                        "error": f"{request['input']}: image is constant (0 everywhere)",
                    }
                ),
            )
        ]
    ]


class WritesNothing(RefusingProcess):
    """A process that says it succeeded but wrote nothing."""

    def __init__(self, argv, env, cwd):
        self.lines = []

    def returncode(self):
        return 0


@pytest.mark.parametrize(
    "how, expected",
    [
        ("one-shot", "volume 'cine': image is constant (0 everywhere)"),
        ("warm", "volume 'cine': image is constant (0 everywhere)"),
        ("no outputs", "the engine wrote no report.json in the results of volume 'cine'"),
    ],
)
def test_an_error_names_the_volume_not_the_deleted_temporary_file(tmp_path, scene_and_volume, how, expected):
    scene, volume = scene_and_volume
    work = tmp_path / "work"
    work.mkdir()
    timers = []
    logic = ModuleLogic(
        str(MODULE_DIR), lambda: scene, lambda: timers.append(Timer()) or timers[-1], contextlib.nullcontext
    )
    if how == "warm":
        logic.engine = Engine(Launcher(refuse_input))
    else:
        logic.launcher = RefusingProcess if how == "one-shot" else WritesNothing
    outcomes = []
    logic.start(volume, options_in(work), onFinished=lambda s, e: outcomes.append((s, e)))
    while not outcomes:
        timers[-1].slot()
    assert outcomes == [(lib.FAILED, expected)] and list(work.iterdir()) == []
    logic.closeEngine()


def test_name_paths_puts_labels_for_whole_paths_only():
    """A temporary path gives way to its label; a longer name that only begins with it does not."""
    names = {"/tmp/run/input.nrrd": "volume 'cine'", "/tmp/run/out": "the results of volume 'cine'"}
    assert proc.name_paths("/tmp/run/input.nrrd: image is constant.", names) == "volume 'cine': image is constant."
    assert proc.name_paths("no report.json in /tmp/run/out", names) == "no report.json in the results of volume 'cine'"
    assert proc.name_paths("read /tmp/run/out/report.json", names) == "read report.json of the results of volume 'cine'"
    assert proc.name_paths("/tmp/run/input.nrrd.bak is stale", names) == "/tmp/run/input.nrrd.bak is stale"
    assert proc.name_paths("/tmp/run/output-2 missing", names) == "/tmp/run/output-2 missing"
    assert proc.name_paths(None, names) is None
