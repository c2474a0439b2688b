"""Engine children do not outlive the program that started them, and what they leave is swept.

A small "parent" process (standing in for Slicer) starts each kind of engine child the way the
module does (``CARDSegmentLib.runs.process.PopenHandle`` with the command's environment, in its own
session): a one-shot ``cardseg segment``, a ``cardseg batch`` and a warm ``cardseg serve``. The
test kills the parent with SIGKILL while the child works; the child must be gone within 5 s
(``cardseg.base.parent_watch``). The run folder the parent made is then deleted by the next run's
start, and no other folder is.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import MODULE_DIR, slicer_core

slicer = slicer_core()

import CARDSegmentLib as lib  # noqa: E402
from CARDSegmentLib.runs import process as workdirs  # noqa: E402
from cardseg.base import parent_watch  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to tell a reaped child from a live one")

#: the most seconds a child may outlive its parent
GONE_WITHIN_S = 5.0

PARENT = textwrap.dedent(
    """
    import json, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from CARDSegmentLib.runs import process as proc
    from CARDSegmentLib.cine.job import BatchCommand
    from CARDSegmentLib.runs.engine import engine_argv
    from CARDSegmentLib.runs.process import make_work_dir

    kind, input_path, bundle, root, watch = sys.argv[2:7]
    env_only = watch == "env"
    work = make_work_dir(root)
    kw = dict(bundle_path=bundle, device="cpu", python_executable=sys.executable, engine_dir=sys.argv[1], threads=1)
    command = (BatchCommand if kind == "batch" else proc.SegmentCommand)(input_path, str(work / "output"), **kw)
    argv = engine_argv(command) if kind == "serve" else command.argv()
    if kind != "serve" and env_only:  # only the environment's watch: the input is no pipe
        argv = [a for a in argv if a not in ("--eof", "stop")]
    handle = proc.PopenHandle(argv, command.env(), None, stdin=subprocess.DEVNULL if env_only else subprocess.PIPE)
    print(json.dumps({"child": handle.pid, "work": str(work)}), flush=True)
    while True:
        for stream, line in handle.read_lines():
            print(line, flush=True)
        time.sleep(0.05)
    """
)


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no one reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="module")
def long_input(tmp_path_factory) -> Path:
    """A 40-slice volume: long enough a run for the parent to be killed in its middle."""
    import SimpleITK as sitk
    from cardseg.bundle.phantom import synthetic_cine_volume

    vol, _ = synthetic_cine_volume(shape=(40, 96, 80), spacing=(1.6, 1.4, 8.0), seed=5)
    path = tmp_path_factory.mktemp("long") / "long.nrrd"
    sitk.WriteImage(vol.to_image(), str(path))
    return path


def child_input(kind: str, long_input: Path, tmp_path: Path) -> Path:
    if kind != "batch":
        return long_input
    manifest = tmp_path / "manifest.csv"
    rows = [f"case-{i:02d},{long_input},," for i in range(8)]
    manifest.write_text("case,path,phase,subject\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return manifest


@pytest.mark.parametrize(
    "kind, watch", [("segment", "pipe"), ("batch", "pipe"), ("serve", "pipe"), ("segment", "env"), ("batch", "env")]
)
def test_killing_the_parent_ends_the_engine_child_and_the_next_run_sweeps_its_folder(
    kind, watch, tiny_bundle, long_input, tmp_path
):
    """Each child, as the module starts it (its input a pipe the parent holds: the end of input
    stops it) and, for the one-shot children, with the environment's watch alone."""
    root = tmp_path / "runs"
    root.mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(MODULE_DIR), kind, str(child_input(kind, long_input, tmp_path))]
        + [str(tiny_bundle), str(root), watch],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        started = json.loads(parent.stdout.readline())
        child, work = started["child"], Path(started["work"])
        wanted = '"event": "ready"' if kind == "serve" else '"stage"'
        for line in parent.stdout:  # the child is at work (serve: loaded and waiting for requests)
            if wanted in line:
                break
        assert running(child), f"the {kind} child ended before its parent was killed"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        killed_at = time.monotonic()
        while running(child) and time.monotonic() - killed_at < GONE_WITHIN_S + 5:
            time.sleep(0.05)
        lasted = time.monotonic() - killed_at
    finally:
        with contextlib.suppress(ProcessLookupError):
            parent.kill()
        parent.wait(10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if running(child):
            os.kill(child, signal.SIGKILL)
    assert lasted < GONE_WITHIN_S, f"the {kind} child outlived its parent by {lasted:.1f} s"
    # the next run deletes the folder its owner left, and nothing else
    assert work.is_dir() and workdirs.owner_of(work) == parent.pid
    foreign = root / "CARDSegment-not-ours"
    foreign.mkdir()  # no owner file: not this module's, kept
    mine = workdirs.make_work_dir(root)  # this process runs: kept
    job = lib.SegmentationJob(None, FakeVolume(), lib.JobOptions(work_root=str(root)))
    job.start()  # (it fails at writing the fake volume, after the sweep)
    assert not work.exists() and foreign.is_dir() and mine.is_dir()


class FakeVolume:
    """Just enough of a volume node for a job to start: its writing is not reached."""

    def GetImageData(self):
        return object()


def test_the_engine_is_told_which_process_to_watch(tmp_path):
    from CARDSegmentLib.runs.process import SegmentCommand

    env = SegmentCommand("in.nrrd", str(tmp_path)).env({})
    assert env[workdirs.PARENT_PID_ENV] == str(os.getpid())
    assert workdirs.PARENT_PID_ENV == parent_watch.PARENT_ENV
    assert parent_watch.parent_pid_from_env({parent_watch.PARENT_ENV: str(os.getpid())}) == os.getpid()
    for text in ("", "0", "-3", "12a"):
        assert parent_watch.parent_pid_from_env({parent_watch.PARENT_ENV: text}) is None
    assert parent_watch.watch_parent_from_env({}) is None


def test_the_watch_calls_back_once_the_process_is_gone():
    gone = []
    states = iter([True, True, False])
    thread = parent_watch.watch_parent(123, on_gone=lambda: gone.append(True), poll_s=0.01, alive=lambda: next(states))
    thread.join(5)
    assert gone == [True] and not thread.is_alive()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not parent_watch.alive_check(dead.pid)() and parent_watch.alive_check(os.getpid())()
    assert not workdirs.process_alive(dead.pid) and workdirs.process_alive(os.getpid())
