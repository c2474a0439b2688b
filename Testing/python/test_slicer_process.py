"""The module's process runner (CARDSegmentLib.runs.process): command, progress lines, errors, cancel.

Pure Python: runs with or without slicer-core. A fake launcher replays scripted output; real
subprocesses check the error line of ``python -m cardseg segment`` and that cancel ends a process.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE_DIR = REPO / "CARDSegment"
if str(MODULE_DIR) not in sys.path:
    sys.path.insert(0, str(MODULE_DIR))

from CARDSegmentLib.runs import process as proc  # noqa: E402


class FakeHandle(proc.ProcessHandle):
    """Replays one batch of (stream, line) pairs per poll, then exits with ``code``."""

    def __init__(self, batches, code=0):
        self.batches = list(batches)
        self.code = code
        self.killed = False

    def read_lines(self):
        return self.batches.pop(0) if self.batches else []

    def returncode(self):
        if self.killed:
            return -9
        return None if self.batches else self.code

    def kill(self):
        self.killed = True


class FakeLauncher:
    def __init__(self, handle):
        self.handle = handle
        self.calls = []

    def __call__(self, argv, env, cwd):
        self.calls.append((argv, env, cwd))
        return self.handle


def progress_line(stage, done, total):
    return ("stderr", f'{{"stage": "{stage}", "done": {done}, "total": {total}}}')


def command(**kw):
    return proc.SegmentCommand("/tmp/in.nrrd", "/tmp/out", python_executable="/usr/bin/python3", **kw)


# ---------------------------------------------------------------------------------------------
# command line


def test_command_line_and_environment():
    cmd = command(bundle_path="/b/acdc", device="cuda", method="uc", engine_dir="/slicer/CARDSegment", threads=2)
    argv = cmd.argv()
    assert argv[:5] == ["/usr/bin/python3", "-m", "cardseg", "segment", "/tmp/in.nrrd"]
    assert argv[argv.index("-o") + 1] == "/tmp/out"
    assert argv[argv.index("--progress") + 1] == "json"
    assert argv[argv.index("--device") + 1] == "cuda"
    assert argv[argv.index("--method") + 1] == "uc"
    assert argv[argv.index("--bundle") + 1] == "/b/acdc"
    assert argv[argv.index("--threads") + 1] == "2"
    env = cmd.env({"PYTHONPATH": "/elsewhere", "HOME": "/h"})
    assert env["PYTHONPATH"].split(os.pathsep) == ["/slicer/CARDSegment", "/elsewhere"]
    assert env["HOME"] == "/h" and env["PYTHONUNBUFFERED"] == "1"
    plain = command().argv()
    assert "--bundle" not in plain and "--threads" not in plain
    assert plain[plain.index("--device") + 1] == "auto" and plain[plain.index("--method") + 1] == "card"


@pytest.mark.parametrize("kw", [{"device": "gpu"}, {"method": "ts"}])
def test_command_rejects_unknown_choices(kw):
    with pytest.raises(ValueError):
        command(**kw).argv()


# ---------------------------------------------------------------------------------------------
# lines


def test_progress_lines_are_parsed_and_other_lines_ignored():
    assert proc.parse_progress_line('{"stage": "trajectory", "done": 3, "total": 10}\n') == ("trajectory", 3, 10)
    for line in (
        "",
        "Traceback (most recent call last):",
        "cardseg: error: x",
        "{not json}",
        '{"done": 1}',
        '["stage"]',
        '{"stage": "read", "done": "many", "total": 1}',
    ):
        assert proc.parse_progress_line(line) is None


def test_overall_fraction_spans_the_stages_and_never_goes_back():
    f = proc.overall_fraction("read", 0, 1)
    assert f == 0.0
    f = proc.overall_fraction("read", 1, 1, f)
    assert f == pytest.approx(0.05)
    mid = proc.overall_fraction("trajectory", 5, 10, f)
    assert 0.05 < mid < 0.92
    assert proc.overall_fraction("read", 0, 1, mid) == mid  # a later stage restarting does not move it back
    assert proc.overall_fraction("mystery", 1, 2, mid) == mid
    assert proc.overall_fraction("write", 6, 6, mid) == pytest.approx(1.0)
    assert proc.overall_fraction("trajectory", 3, 0, 0.2) == 0.2


def test_error_line_extraction():
    lines = ['{"stage": "read", "done": 0, "total": 1}', "cardseg: error: /x.nii.gz: no such file"]
    assert proc.extract_error(lines, 2) == "/x.nii.gz: no such file"
    tb = ["Traceback (most recent call last):", '  File "x.py", line 1', "ModuleNotFoundError: No module named 'torch'"]
    msg = proc.extract_error(tb, 1)
    assert msg.startswith("ModuleNotFoundError: No module named 'torch'") and "code 1" in msg
    assert "SIGKILL" in proc.extract_error([], -9)
    assert (
        proc.extract_error(['{"stage": "read", "done": 0, "total": 1}'], 3)
        == "the segmentation process exited with code 3"
    )


# ---------------------------------------------------------------------------------------------
# a run, with a fake process


def test_fake_run_reports_progress_and_succeeds():
    batches = [
        [progress_line("read", 0, 1), progress_line("read", 1, 1)],
        [("stdout", "some chatter"), progress_line("trajectory", 2, 5)],
        [progress_line("trajectory", 5, 5), progress_line("write", 3, 6)],
        [progress_line("write", 6, 6)],
    ]
    launcher = FakeLauncher(FakeHandle(batches, code=0))
    seen = []
    run = proc.CardsegRun(command(engine_dir="/m"), launcher, on_progress=seen.append)
    assert run.state == proc.IDLE
    run.start()
    assert run.state == proc.RUNNING
    argv, env, _ = launcher.calls[0]
    assert argv[2:4] == ["cardseg", "segment"] and env["PYTHONPATH"].startswith("/m")
    fractions = []
    while run.poll() == proc.RUNNING:
        fractions.append(run.progress.fraction)
    assert run.state == proc.SUCCEEDED and run.error is None and run.returncode == 0
    assert fractions == sorted(fractions) and fractions[0] == pytest.approx(0.05)
    assert run.progress.fraction == 1.0
    # every progress line is reported, also when two stages arrive in one poll
    assert [p.stage for p in seen] == ["read", "read", "trajectory", "trajectory", "write", "write"]
    assert "Reverse diffusion" in seen[2].text and "(2/5)" in seen[2].text
    assert run.log == ["some chatter"]
    with pytest.raises(RuntimeError):
        run.start()


def test_fake_run_failure_gives_the_one_line_error():
    batches = [
        [progress_line("read", 0, 1)],
        [("stderr", "cardseg: error: /in.nii.gz: 4D image with 30 frames; choose one with --frame N (0..29)")],
    ]
    run = proc.CardsegRun(command(), FakeLauncher(FakeHandle(batches, code=2)))
    run.start()
    assert run.wait(timeout=5) == proc.FAILED
    assert run.returncode == 2
    assert run.error == "/in.nii.gz: 4D image with 30 frames; choose one with --frame N (0..29)"


def test_fake_run_cancel_kills_the_process():
    handle = FakeHandle([[progress_line("trajectory", 1, 50)]] * 100)
    run = proc.CardsegRun(command(), FakeLauncher(handle))
    run.start()
    run.poll()
    run.cancel()
    assert handle.killed and run.state == proc.CANCELLED and run.error is None
    assert run.poll() == proc.CANCELLED  # polling after cancel changes nothing
    run.cancel()
    assert run.state == proc.CANCELLED


def test_a_launcher_that_cannot_start_fails_the_run():
    def broken(argv, env, cwd):
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    run = proc.CardsegRun(command(), broken)
    run.start()
    assert run.state == proc.FAILED and "cannot start /usr/bin/python3" in run.error


# ---------------------------------------------------------------------------------------------
# real subprocesses


def test_real_engine_bad_input_gives_its_one_line_error(tmp_path):
    cmd = proc.SegmentCommand(
        str(tmp_path / "missing.nii.gz"),
        str(tmp_path / "out"),
        python_executable=sys.executable,
        engine_dir=str(MODULE_DIR),
        device="cpu",
        threads=1,
    )
    run = proc.CardsegRun(cmd)
    run.start()
    assert run.wait(timeout=900) == proc.FAILED, run.error  # generous: a loaded machine is slow to import torch
    assert run.returncode == 2
    assert run.error == f"{tmp_path / 'missing.nii.gz'}: no such file or folder"
    assert not (tmp_path / "out").exists()


def test_real_cancel_ends_the_child_process(tmp_path):
    script = (
        "import sys, time, json\n"
        "for i in range(600):\n"
        "    sys.stderr.write(json.dumps({'stage': 'trajectory', 'done': i, 'total': 600}) + '\\n')\n"
        "    sys.stderr.flush(); time.sleep(0.1)\n"
    )
    fake_engine = tmp_path / "cardseg"
    fake_engine.mkdir()
    (fake_engine / "__init__.py").write_text("")
    (fake_engine / "__main__.py").write_text(script)
    cmd = proc.SegmentCommand("in", "out", python_executable=sys.executable, engine_dir=str(tmp_path))
    run = proc.CardsegRun(cmd)
    run.start()
    handle = run._handle
    deadline = time.monotonic() + 30
    while run.progress.done < 2 and time.monotonic() < deadline:
        run.poll()
        time.sleep(0.05)
    assert run.progress.stage == "trajectory" and run.progress.done >= 2
    run.cancel()
    assert run.state == proc.CANCELLED
    assert handle._proc.poll() is not None  # the child is gone
    with pytest.raises(ProcessLookupError):
        os.kill(handle.pid, 0)


# ---------------------------------------------------------------------------------------------
# cancel ends the whole process tree (PythonSlicer is a launcher that starts the interpreter)


def _gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie waiting for its reaper counts as gone)."""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():  # Linux: read the process state
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


def _launcher_engine(tmp_path):
    """A fake ``cardseg`` whose process starts a long-lived child of its own, like a launcher does."""
    script = (
        "import subprocess, sys, time, json\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('grandchild', child.pid, flush=True)\n"
        "for i in range(600):\n"
        "    sys.stderr.write(json.dumps({'stage': 'trajectory', 'done': i, 'total': 600}) + '\\n')\n"
        "    sys.stderr.flush(); time.sleep(0.1)\n"
    )
    engine = tmp_path / "cardseg"
    engine.mkdir()
    (engine / "__init__.py").write_text("")
    (engine / "__main__.py").write_text(script)
    return proc.SegmentCommand("in", "out", python_executable=sys.executable, engine_dir=str(tmp_path))


def _start_until_grandchild(cmd):
    run = proc.CardsegRun(cmd)
    run.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run.poll()
        pids = [int(line.split()[1]) for line in run.log if line.startswith("grandchild ")]
        if pids and run.progress.done >= 1:
            return run, pids[0]
        time.sleep(0.05)
    raise AssertionError(f"the fake engine did not start its child: {run.log}")


@pytest.mark.skipif(os.name == "nt", reason="POSIX process groups")
def test_real_cancel_ends_the_grandchild_too(tmp_path):
    run, grandchild = _start_until_grandchild(_launcher_engine(tmp_path))
    child = run._handle.pid
    assert not _gone(grandchild)
    run.cancel()
    assert run.state == proc.CANCELLED
    assert _wait_gone(child) and _wait_gone(grandchild), "cancel left part of the process tree running"


class _Recorder:
    """Stands in for ``taskkill``: records the command, then does what taskkill /T would (here: the group)."""

    def __init__(self, returncode=0, act=True):
        self.calls, self.returncode, self.act = [], returncode, act

    def __call__(self, argv):
        self.calls.append(argv)
        if self.act and self.returncode == 0 and os.name != "nt":
            import signal

            os.killpg(int(argv[-1]), signal.SIGKILL)
        return self.returncode


@pytest.mark.skipif(os.name == "nt", reason="emulates taskkill with a POSIX process group")
def test_windows_cancel_kills_the_tree_with_taskkill(tmp_path):
    run, grandchild = _start_until_grandchild(_launcher_engine(tmp_path))
    popen = run._handle._proc
    taskkill = _Recorder()
    proc.kill_process_tree(popen, windows=True, run_command=taskkill)
    assert taskkill.calls == [["taskkill", "/F", "/T", "/PID", str(popen.pid)]]
    popen.wait(timeout=10)
    assert _wait_gone(grandchild)
    run.cancel()
    # an ended process is not sent to taskkill again (its pid may belong to someone else by now)
    proc.kill_process_tree(popen, windows=True, run_command=taskkill)
    assert len(taskkill.calls) == 1


def test_windows_cancel_falls_back_to_kill_when_taskkill_fails():
    class Proc:
        pid, killed = 4242, False

        def poll(self):
            return 1 if self.killed else None

        def kill(self):
            self.killed = True

    failing = _Recorder(returncode=128, act=False)
    p = Proc()
    proc.kill_process_tree(p, windows=True, run_command=failing)
    assert failing.calls == [proc.tree_kill_command(4242)] and p.killed
    assert proc.tree_kill_command(17) == ["taskkill", "/F", "/T", "/PID", "17"]


def test_popen_handle_kills_through_the_tree_killer(monkeypatch):
    seen = []
    monkeypatch.setattr(proc, "kill_process_tree", lambda p, **kw: (seen.append(p.pid), p.kill()))
    handle = proc.PopenHandle([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    handle.kill()
    assert seen == [handle.pid] and handle._proc.poll() is not None


@pytest.mark.parametrize(
    "console",
    [
        {"PYTHONIOENCODING": "cp1252", "PYTHONUTF8": "0"},
        {"PYTHONIOENCODING": "ascii"},
        {"PYTHONIOENCODING": "latin-1:strict"},
    ],
)
def test_non_ascii_errors_of_the_child_arrive_intact(console):
    """Issue 24 defect 8: whatever encoding the inherited environment gives the child (a Windows
    console code page under Slicer 5.8/5.10), its stderr reaches the panel as written."""
    message = "cardseg: error: Datei fehlt: /Daten/Größe_ß/ε.nii.gz → 患者"
    command = proc.SegmentCommand("in.nii.gz", "out")
    env = command.env(dict(os.environ, **console))
    assert env["PYTHONUTF8"] == "1" and env["PYTHONIOENCODING"] == "utf-8"
    code = f"import sys; print({message!r}, file=sys.stderr); sys.exit(2)"
    handle = proc.PopenHandle([sys.executable, "-c", code], env)
    deadline = time.monotonic() + 30
    while handle.returncode() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [line for _, line in handle.read_lines()]
    assert proc.extract_error(lines, 2) == message[len("cardseg: error: ") :]
