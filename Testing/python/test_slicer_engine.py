"""The module's warm-engine client (CARDSegmentLib.runs.engine) with a fake launcher: requests, progress,
results, errors, a crash and the restart after it, cancel, a change of interpreter, close.

Pure Python (no Qt, no slicer-core needed). The fake engine answers each request line with the
scripted lines of ``cardseg serve``; the real process is tested in ``test_serve.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE_DIR = REPO / "CARDSegment"
if str(MODULE_DIR) not in sys.path:
    sys.path.insert(0, str(MODULE_DIR))

from CARDSegmentLib.runs import process as proc  # noqa: E402
from CARDSegmentLib.runs.engine import Engine, EngineHandle, engine_argv, parse_event, request_of  # noqa: E402


def progress(stage, done, total):
    return ("stdout", json.dumps({"stage": stage, "done": done, "total": total}))


class FakeEngine(EngineHandle):
    """Answers every request with ``script(request)``: a list of polls, each a list of (stream, line)
    pairs; a poll given as an int ends the process with that exit status."""

    def __init__(self, argv, env, script, ready=True):
        self.argv, self.env, self.script = argv, env, script
        self.requests = []
        self.pending = [[("stdout", json.dumps({"event": "ready", "protocol": 1}))]] if ready else []
        self.code = None
        self.killed = self.input_closed = False

    def write_line(self, text):
        if self.code is not None or self.input_closed:
            raise BrokenPipeError("the engine is gone")
        request = json.loads(text)
        self.requests.append(request)
        self.pending += self.script(request)

    def read_lines(self):
        if not self.pending:
            return []
        batch = self.pending.pop(0)
        if isinstance(batch, int):
            self.code = batch
            return []
        return batch

    def returncode(self):
        return -9 if self.killed else self.code

    def close_input(self):
        self.input_closed = True

    def kill(self):
        self.killed = True


def succeed(request):
    rid = request["id"]
    return [
        [progress("trajectory", 0, 2)],
        [progress("trajectory", 1, 2), progress("trajectory", 2, 2)],
        [progress("write", 7, 7), ("stdout", json.dumps({"event": "result", "id": rid, "ok": True, "slices": 3}))],
    ]


def refuse(request):
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
                        "error": "in.nrrd: no such file or folder",
                    }
                ),
            )
        ]
    ]


def crash(request):
    return [[progress("trajectory", 0, 2)], [("stderr", "Fatal Python error: Segmentation fault")], -11]


class Launcher:
    """Starts a :class:`FakeEngine` per call; ``scripts`` answers the requests of successive engines."""

    def __init__(self, *scripts, ready=True):
        self.scripts = list(scripts)
        self.engines = []
        self.ready = ready

    def __call__(self, argv, env, cwd):
        engine = FakeEngine(argv, env, self.scripts.pop(0) if len(self.scripts) > 1 else self.scripts[0], self.ready)
        self.engines.append(engine)
        return engine


def command(out="out", **kw):
    kw.setdefault("python_executable", "/opt/Slicer/bin/PythonSlicer")
    return proc.SegmentCommand("in.nrrd", out, engine_dir="/opt/ext", **kw)


def test_the_request_carries_the_run_options():
    r = request_of(command(bundle_path="/b", device="cpu", method="uc", threads=3, batch_size=4), 7)
    assert r == {
        "id": 7,
        "input": "in.nrrd",
        "output": "out",
        "device": "cpu",
        "method": "uc",
        "overwrite": True,
        "bundle": "/b",
        "threads": 3,
        "batch_size": 4,
    }
    assert engine_argv(command()) == [
        "/opt/Slicer/bin/PythonSlicer",
        "-m",
        "cardseg",
        "serve",
        "--eof",
        "stop",
        "--device",
        "auto",
    ]
    assert engine_argv(command(bundle_path="/b", device="cpu"))[-4:] == ["--device", "cpu", "--bundle", "/b"]


def test_runs_share_one_process_and_report_progress():
    launcher = Launcher(succeed)
    engine = Engine(launcher)
    seen = []
    for n in range(2):
        run = engine.run(command(f"out{n}"), on_progress=seen.append)
        run.start()
        assert run.wait(5, interval=0) == proc.SUCCEEDED and run.error is None and run.returncode == 0
        assert run.result["slices"] == 3 and run.progress.fraction == 1.0
    assert engine.starts == 1 and len(launcher.engines) == 1
    fake = launcher.engines[0]
    assert [r["output"] for r in fake.requests] == ["out0", "out1"] and [r["id"] for r in fake.requests] == [1, 2]
    assert fake.env["PYTHONPATH"].split(":")[0] == "/opt/ext" and fake.env["PYTHONUNBUFFERED"] == "1"
    assert [p.stage for p in seen] == (["trajectory"] * 3 + ["write"]) * 2
    first_run = [p.fraction for p in seen[:4]]
    assert first_run == sorted(first_run) and first_run[0] < first_run[-1] == 1.0
    assert engine.ready == {"event": "ready", "protocol": 1}


def test_a_refused_request_is_one_line_and_the_engine_stays():
    launcher = Launcher(lambda r: refuse(r) if r["output"] == "bad" else succeed(r))
    engine = Engine(launcher)
    bad = engine.run(command("bad"))
    bad.start()
    assert bad.wait(5, interval=0) == proc.FAILED and bad.error == "in.nrrd: no such file or folder"
    assert bad.returncode == 2 and not bad.engine_failed
    good = engine.run(command("good"))
    good.start()
    assert good.wait(5, interval=0) == proc.SUCCEEDED and engine.starts == 1


def test_a_crash_fails_the_run_and_the_next_run_starts_a_new_engine():
    launcher = Launcher(crash, succeed)
    engine = Engine(launcher)
    run = engine.run(command())
    run.start()
    assert run.wait(5, interval=0) == proc.FAILED
    assert run.returncode == -11 and "Segmentation fault" in run.error and "SIGSEGV" in run.error
    assert not run.engine_failed and engine.handle is None
    run = engine.run(command())
    run.start()
    assert run.wait(5, interval=0) == proc.SUCCEEDED
    assert engine.starts == 2 and len(launcher.engines) == 2


class OneShot(proc.ProcessHandle):
    """A one-shot ``cardseg segment`` that reports two progress lines and exits with ``code``."""

    def __init__(self, argv, code=0):
        self.argv, self.code, self.polls, self.killed = argv, code, 0, False

    def read_lines(self):
        self.polls += 1
        return [progress("trajectory", self.polls, 2)] if self.polls <= 2 else []

    def returncode(self):
        return -9 if self.killed else (self.code if self.polls > 2 else None)

    def kill(self):
        self.killed = True


def test_an_engine_that_never_got_ready_falls_back_to_the_one_shot_process():
    def old_engine(request):
        return [[("stderr", "cardseg: error: argument COMMAND: invalid choice: 'serve'")], 2]

    one_shots = []
    engine = Engine(Launcher(old_engine, ready=False))
    run = engine.run_factory(command(), lambda argv, env, cwd: one_shots.append(OneShot(argv)) or one_shots[-1])
    run.start()
    assert run.wait(5, interval=0) == proc.SUCCEEDED and run.engine_failed and run.returncode == 0
    assert one_shots[0].argv[3:6] == ["segment", "in.nrrd", "-o"] and run.progress.fraction == 1.0
    assert any("invalid choice: 'serve'" in line for line in run.log)
    # later runs of that interpreter go straight to the one-shot process; close() forgets it
    later = engine.run_factory(command(), lambda argv, env, cwd: OneShot(argv))
    assert isinstance(later, proc.CardsegRun) and engine.starts == 1
    engine.close()
    assert not isinstance(engine.run_factory(command()), proc.CardsegRun)


def test_a_fallback_run_is_cancelled_like_a_one_shot_run():
    engine = Engine(Launcher(lambda r: [[("stderr", "ImportError: no cardseg")], 1], ready=False))
    fallback = []
    run = engine.run(command(), one_shot_launcher=lambda argv, env, cwd: fallback.append(OneShot(argv)) or fallback[-1])
    run.start()
    for _ in range(5):
        if not fallback:
            run.poll()
    run.poll()
    assert fallback and run.running and run.progress.stage == "trajectory"
    run.cancel()
    assert run.state == proc.CANCELLED and fallback[0].killed and run.engine_failed


def test_a_batch_command_never_goes_to_the_engine():
    class BatchLike(proc.SegmentCommand):
        pass

    engine = Engine(Launcher(succeed))
    run = engine.run_factory(BatchLike("in.csv", "out", python_executable="/p"), lambda argv, env, cwd: OneShot(argv))
    assert isinstance(run, proc.CardsegRun) and engine.starts == 0


def test_a_cines_batch_command_goes_to_the_engine_as_a_batch_request():
    batch = proc.BatchCommand("m.csv", "out", python_executable="/p", device="cpu", threads=2)
    assert request_of(batch, 3) == {
        "id": 3,
        "op": "batch",
        "manifest": "m.csv",
        "output": "out",
        "report": False,
        "device": "cpu",
        "method": "card",
        "threads": 2,
    }

    def frames(request):
        rid = request["id"]
        lines = [progress("hashing", 3, 3), progress("cases", 1, 3), progress("cases", 3, 3)]
        return [lines, [("stdout", json.dumps({"event": "result", "id": rid, "ok": True, "cases": 3}))]]

    launcher = Launcher(frames)
    engine = Engine(launcher)
    one_shots = []
    runs = [engine.run_factory(batch, lambda argv, env, cwd: one_shots.append(argv)) for _ in range(2)]
    for run in runs:  # the frames, then the indices: one engine, no one-shot process
        run.start()
        assert run.wait(5, interval=0) == proc.SUCCEEDED and run.progress.fraction == 1.0
    assert engine.starts == 1 and one_shots == [] and [r["op"] for r in launcher.engines[0].requests] == ["batch"] * 2
    assert runs[0].progress.stage == "cases" and runs[0].result["cases"] == 3


def test_a_batch_the_engine_cannot_serve_falls_back_to_the_one_shot_cardseg_batch():
    engine = Engine(Launcher(lambda r: [[("stderr", "ImportError: no cardseg")], 1], ready=False))
    one_shots = []
    run = engine.run_factory(
        proc.BatchCommand("m.csv", "out", python_executable="/p"),
        lambda argv, env, cwd: one_shots.append(OneShot(argv)) or one_shots[-1],
    )
    run.start()
    assert run.wait(5, interval=0) == proc.SUCCEEDED and run.engine_failed
    assert one_shots[0].argv[3:6] == ["batch", "--manifest", "m.csv"] and "--no-report" in one_shots[0].argv


def test_an_interpreter_that_cannot_start_falls_back_and_fails_with_its_error():
    def launcher(argv, env, cwd):
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    def one_shot(argv, env, cwd):
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    run = Engine(launcher).run(command(), one_shot_launcher=one_shot)
    run.start()
    assert run.state == proc.FAILED and run.engine_failed and run.error.startswith("cannot start /opt/Slicer")


def test_cancel_kills_the_engine_at_once_and_the_next_run_restarts_it():
    launcher = Launcher(succeed)
    engine = Engine(launcher)
    run = engine.run(command())
    run.start()
    run.poll()
    run.poll()
    assert run.progress.stage == "trajectory" and run.running
    run.cancel()
    first = launcher.engines[0]
    assert run.state == proc.CANCELLED and first.killed and engine.handle is None
    run.poll()
    assert run.state == proc.CANCELLED  # nothing comes back to life
    again = engine.run(command())
    again.start()
    assert again.wait(5, interval=0) == proc.SUCCEEDED and engine.starts == 2
    assert launcher.engines[1].requests[0]["id"] == 2


def test_one_run_at_a_time_and_a_wrong_option_is_refused_before_sending():
    launcher = Launcher(succeed)
    engine = Engine(launcher)
    run = engine.run(command())
    run.start()
    with pytest.raises(RuntimeError, match="busy"):
        engine.run(command()).start()
    run.wait(5, interval=0)
    wrong = engine.run(command(device="tpu"))
    wrong.start()
    assert wrong.state == proc.FAILED and "device" in wrong.error
    assert len(launcher.engines[0].requests) == 1


def test_another_interpreter_restarts_the_engine_and_warm_up_starts_it_early():
    launcher = Launcher(succeed)
    engine = Engine(launcher)
    engine.warm_up(command())
    assert engine.starts == 1 and engine.alive and launcher.engines[0].requests == []
    engine.warm_up(command())
    assert engine.starts == 1
    run = engine.run(command(python_executable="/other/python"))
    run.start()
    assert run.wait(5, interval=0) == proc.SUCCEEDED
    assert engine.starts == 2 and launcher.engines[0].killed and launcher.engines[1].argv[0] == "/other/python"


def test_close_cancels_the_run_and_kills_the_engine():
    launcher = Launcher(succeed)
    engine = Engine(launcher)
    run = engine.run(command())
    run.start()
    engine.close()
    assert run.state == proc.CANCELLED and launcher.engines[0].killed
    assert not engine.alive


def test_only_event_objects_are_events():
    assert parse_event('{"event": "exit", "reason": "eof"}') == {"event": "exit", "reason": "eof"}
    assert parse_event('{"stage": "write", "done": 1, "total": 7}') is None
    assert parse_event('{"event": ') is None and parse_event("note: the event") is None
