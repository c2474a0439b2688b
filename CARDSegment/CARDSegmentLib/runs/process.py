"""Running ``cardseg segment`` in a separate process, without Qt.

The Slicer module must never block its GUI: the engine runs in its own Python process
(PythonSlicer inside Slicer, any interpreter in tests) and reports progress as one JSON object
per line on stderr (``--progress json``). This module builds the command, starts it through an
injectable *launcher*, turns the progress lines into an overall fraction and a short status
text, and pulls the one-line ``cardseg: error: ...`` message out of a failed run.

Nothing here imports Qt or Slicer: the module's Logic polls :meth:`CardsegRun.poll` from a
``QTimer``; tests drive it with a fake launcher or a real subprocess.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .stages import STAGE_SPANS, STAGE_TEXT, Progress, overall_fraction, stage_spans  # noqa: F401 (re-exported)

#: states of a run
IDLE, RUNNING, SUCCEEDED, FAILED, CANCELLED = "idle", "running", "succeeded", "failed", "cancelled"
FINISHED_STATES = (SUCCEEDED, FAILED, CANCELLED)

ERROR_PREFIX = "cardseg: error:"
DEVICE_CHOICES = ("auto", "cpu", "cuda")
METHOD_CHOICES = ("card", "uc")
#: the environment variable that tells an engine child which process it must not outlive
#: (``cardseg.base.parent_watch.PARENT_ENV``, restated: this library does not import the engine)
PARENT_PID_ENV = "CARDSEG_PARENT_PID"
#: lines of process output kept for the error message and the log
LOG_LINES = 200


# ---------------------------------------------------------------------------------------------
# command


@dataclass
class SegmentCommand:
    """Everything needed to start one ``cardseg segment`` run."""

    input_path: str
    output_dir: str
    bundle_path: Optional[str] = None  # None: the engine's default ($CARDSEG_BUNDLE, then the shipped one)
    device: str = "auto"
    method: str = "card"
    python_executable: Optional[str] = None  # None: PythonSlicer when found, else this interpreter
    engine_dir: Optional[str] = None  # folder that holds the ``cardseg`` package (put on PYTHONPATH)
    threads: Optional[int] = None
    batch_size: Optional[int] = None
    review_map: Optional[str] = None  # which of the bundle's flagged-region rules; None: the bundle's own
    extra_env: Dict[str, str] = field(default_factory=dict)

    def argv(self) -> List[str]:
        """The full command line, interpreter first."""
        return self.engine_call("segment", str(self.input_path)) + ["--overwrite"]

    def engine_call(self, *subcommand: str) -> List[str]:
        """``python -m cardseg <subcommand...> -o OUT`` + the options every run passes (``cardseg batch`` too),
        ``--eof stop`` among them (see :class:`PopenHandle`).

        Checks ``device`` and ``method`` (ValueError naming the wrong choice)."""
        if self.device not in DEVICE_CHOICES:
            raise ValueError(f"device must be one of {DEVICE_CHOICES}, not {self.device!r}")
        if self.method not in METHOD_CHOICES:
            raise ValueError(f"method must be one of {METHOD_CHOICES}, not {self.method!r}")
        args = [
            self.python_executable or default_python_executable(),
            "-m",
            "cardseg",
            *subcommand,
            "-o",
            str(self.output_dir),
            "--progress",
            "json",
            "--device",
            self.device,
            "--method",
            self.method,
            "--eof",
            "stop",  # the child reads its input: the end of it (this process is gone) stops it at once
        ]
        for flag, value, kind in (
            ("--bundle", self.bundle_path, str),
            ("--threads", self.threads, int),
            ("--batch-size", self.batch_size, int),
            ("--review-map", self.review_map, str),
        ):
            args += [flag, str(kind(value))] if value else []
        return args

    def env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """The child's environment: ``engine_dir`` first on PYTHONPATH, unbuffered UTF-8 output.

        The panel reads the child's lines as UTF-8; without ``PYTHONUTF8``/``PYTHONIOENCODING`` a
        child on Windows under Slicer 5.8 and 5.10 writes its (non-ASCII) errors in the console's
        code page, which arrived as replacement characters (Slicer sets ``PYTHONUTF8`` from 5.12).
        """
        env = dict(os.environ if base is None else base)
        if self.engine_dir:
            parts = [str(self.engine_dir)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            env["PYTHONPATH"] = os.pathsep.join(parts)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONUTF8"] = "1"
        env["PYTHONIOENCODING"] = "utf-8"
        env[PARENT_PID_ENV] = str(os.getpid())  # the engine ends when this process is gone
        env.update(self.extra_env)
        return env


@dataclass
class BatchCommand(SegmentCommand):
    """``cardseg batch`` over a manifest of volume files (``input_path`` is the manifest), no triage report."""

    def argv(self) -> List[str]:
        return self.engine_call("batch", "--manifest", str(self.input_path)) + ["--no-report"]


def default_python_executable() -> str:
    """PythonSlicer when it is on PATH or beside this interpreter (inside Slicer), else this interpreter."""
    beside = Path(sys.executable).with_name("PythonSlicer" + (".exe" if os.name == "nt" else ""))
    return shutil.which("PythonSlicer") or (str(beside) if beside.is_file() else sys.executable)


# ---------------------------------------------------------------------------------------------
# progress and error lines


def parse_progress_line(line: str) -> Optional[Tuple[str, int, int]]:
    """``(stage, done, total)`` from one ``--progress json`` line, or None for any other line."""
    text = line.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    try:
        return str(obj["stage"]), int(obj.get("done", 0)), int(obj.get("total", 0))
    except (TypeError, ValueError, KeyError, AttributeError):  # not an object, no stage, not numbers
        return None


def extract_error(lines: Sequence[str], returncode: Optional[int]) -> str:
    """The one line that says why a run failed.

    The engine's own ``cardseg: error: ...`` line when there is one (without the prefix);
    otherwise the last line that is not a progress line (a Python exception's last line), with
    the exit status; otherwise just the exit status.
    """
    for line in reversed(lines):
        text = line.strip()
        if text.startswith(ERROR_PREFIX):
            return text[len(ERROR_PREFIX) :].strip()
    others = [ln.strip() for ln in lines if ln.strip() and parse_progress_line(ln) is None]
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except (ValueError, AttributeError):
            name = f"signal {-returncode}"
        status = f"the segmentation process was stopped by {name} (out of memory?)"
    else:
        status = f"the segmentation process exited with code {returncode}"
    return f"{others[-1]} ({status})" if others else status


def name_paths(message: Optional[str], names: Dict[str, str]) -> Optional[str]:
    """``message`` with each path of ``names`` (a temporary file or folder, gone by now) put as its
    label, longest first: ``PATH`` reads ``LABEL``, ``PATH/a/b.json`` reads ``a/b.json of LABEL``."""
    for path in sorted(names, key=len, reverse=True):
        for text in {path, os.path.realpath(path)}:
            message = message and re.sub(
                re.escape(text) + r"(?:[/\\]([^\s:;,'\"]*[^\s:;,'\".]))?(?![\w-]|\.\w)",
                lambda m: f"{m.group(1)} of {names[path]}" if m.group(1) else names[path],
                message,
            )
    return message


# ---------------------------------------------------------------------------------------------
# launchers: how a process is started (injectable)


class ProcessHandle:
    """What a launcher returns: a running process seen through three calls.

    ``read_lines()`` returns the ``(stream, line)`` pairs ("stdout" or "stderr") that arrived
    since the last call without blocking; ``returncode()`` is None while the process runs (or
    while output is still being read) and its exit status after; ``kill()`` ends it.
    """

    def read_lines(self) -> List[Tuple[str, str]]:  # pragma: no cover - interface
        raise NotImplementedError

    def returncode(self) -> Optional[int]:  # pragma: no cover - interface
        raise NotImplementedError

    def kill(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


Launcher = Callable[[List[str], Dict[str, str], Optional[str]], ProcessHandle]


class PopenHandle(ProcessHandle):
    """A real child process; two reader threads move its output lines into a queue.

    Its standard input is a pipe whose write end this handle keeps open and never writes to (unless
    ``stdin`` says otherwise): the operating system closes it when this process ends, however it
    ends, and a child started with ``--eof stop`` then stops at once. :meth:`close_input` closes it
    here; :meth:`kill` does so first.
    """

    def __init__(self, argv: List[str], env: Dict[str, str], cwd: Optional[str] = None, stdin=subprocess.PIPE):
        kwargs = {}
        if os.name == "nt":
            kwargs["creationflags"] = getattr(subprocess, "CREATE_NO_WINDOW", 0)
        else:
            kwargs["start_new_session"] = True  # its own process group: cancel ends all of it
        self._proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            **kwargs,
        )
        self._queue: "queue.Queue[Tuple[str, str]]" = queue.Queue()
        self._exited_at: Optional[float] = None
        self._readers = [
            threading.Thread(target=self._pump, args=(name, stream), daemon=True)
            for name, stream in (("stdout", self._proc.stdout), ("stderr", self._proc.stderr))
        ]
        for t in self._readers:
            t.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _pump(self, name: str, stream) -> None:
        try:
            for line in stream:
                self._queue.put((name, line.rstrip("\r\n")))
        except (OSError, ValueError):
            pass
        finally:
            try:
                stream.close()
            except OSError:
                pass

    def read_lines(self) -> List[Tuple[str, str]]:
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def returncode(self) -> Optional[int]:
        code = self._proc.poll()
        if code is None:
            return None
        if self._exited_at is None:
            self._exited_at = time.monotonic()
        for t in self._readers:  # the pipes close right after exit: wait for their last lines
            t.join(timeout=0.2)
        if any(t.is_alive() for t in self._readers) and time.monotonic() - self._exited_at < 5.0:
            return None  # something still holds the pipes open; give it a few seconds
        return code

    def close_input(self) -> None:
        """Close this end of the child's input pipe (a child with ``--eof stop`` then stops)."""
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass

    def kill(self) -> None:
        """End the process and every process it started (see :func:`kill_process_tree`)."""
        self.close_input()
        kill_process_tree(self._proc)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that survives SIGKILL
            pass


def run_quietly(argv: List[str], timeout: float = 30.0) -> int:
    """Run a short helper command without a console window; its exit status (-1 if it cannot run)."""
    flags = getattr(subprocess, "CREATE_NO_WINDOW", 0) if os.name == "nt" else 0
    try:
        return subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            creationflags=flags,
        ).returncode
    except (OSError, subprocess.SubprocessError):
        return -1


def tree_kill_command(pid: int) -> List[str]:
    """Windows: end process ``pid`` and all its descendants, forcibly."""
    return ["taskkill", "/F", "/T", "/PID", str(int(pid))]


def kill_process_tree(
    proc: subprocess.Popen, windows: Optional[bool] = None, run_command: Callable[[List[str]], int] = run_quietly
) -> None:
    """End ``proc`` and every process it started.

    PythonSlicer is a launcher that starts the real interpreter as its child, so ending the
    launcher alone would leave the engine running (and its temporary folder locked on Windows).
    On Windows the tree goes with ``taskkill /F /T``; elsewhere the child runs in its own session,
    so its process group goes with one ``SIGKILL`` (also after the leader has exited, while
    descendants may still run). ``proc.kill()`` is the fallback when neither works.
    """
    windows = (os.name == "nt") if windows is None else windows
    running = proc.poll() is None
    if windows:
        if running and run_command(tree_kill_command(proc.pid)) != 0 and proc.poll() is None:
            _kill_quietly(proc)
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        if running:
            _kill_quietly(proc)


def _kill_quietly(proc: subprocess.Popen) -> None:
    try:
        proc.kill()
    except OSError:  # pragma: no cover - it ended in between
        pass


def subprocess_launcher(argv: List[str], env: Dict[str, str], cwd: Optional[str] = None) -> ProcessHandle:
    """The default launcher: a real child process."""
    return PopenHandle(argv, env, cwd)


# ---------------------------------------------------------------------------------------------
# one run


class CardsegRun:
    """One ``cardseg segment`` run: start, poll, cancel; progress, state and error message.

    >>> run = CardsegRun(SegmentCommand("in.nrrd", "out"))      # doctest: +SKIP
    >>> run.start(); run.wait(); run.state                         # doctest: +SKIP
    'succeeded'
    """

    def __init__(
        self,
        command: SegmentCommand,
        launcher: Optional[Launcher] = None,
        on_progress: Optional[Callable[[Progress], None]] = None,
    ):
        self.command = command
        self.launcher = launcher or subprocess_launcher
        self.on_progress = on_progress
        self.state = IDLE
        self.progress = Progress()
        self.error: Optional[str] = None
        self.returncode: Optional[int] = None
        self.log: List[str] = []
        self.started_at: Optional[float] = None
        self.finished_at: Optional[float] = None
        self._handle: Optional[ProcessHandle] = None

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def start(self) -> None:
        if self.state != IDLE:
            raise RuntimeError(f"this run was already started (state {self.state})")
        argv, env = self.command.argv(), self.command.env()
        self.started_at = time.monotonic()
        try:
            self._handle = self.launcher(argv, env, None)
        except OSError as exc:
            self._finish(FAILED, f"cannot start {argv[0]}: {exc}")
            return
        self.state = RUNNING

    def poll(self) -> str:
        """Read what arrived, update progress; returns the state (call it from a timer)."""
        if self.state != RUNNING or self._handle is None:
            return self.state
        self._consume(self._handle.read_lines())
        code = self._handle.returncode()
        if code is None:
            return self.state
        self._consume(self._handle.read_lines())
        self.returncode = code
        if code == 0:
            self.progress.fraction = 1.0
            self._finish(SUCCEEDED, None)
        else:
            self._finish(FAILED, extract_error(self.log, code))
        return self.state

    def cancel(self, background: Optional[Callable[[Callable[[], None]], None]] = None) -> None:
        """End the process; the state becomes ``cancelled`` at once (nothing else is touched).

        ``background(fn)``: runs the ending (it waits for the process: seconds) off the GUI's thread."""
        if self.state not in (IDLE, RUNNING):
            return
        handle = self._handle if self.state == RUNNING else None
        self._finish(CANCELLED, None)
        if handle is not None and background is not None:
            background(handle.kill)
        elif handle is not None:
            handle.kill()
            self._consume(handle.read_lines())

    def wait(self, timeout: Optional[float] = None, interval: float = 0.05) -> str:
        """Poll until the run finishes (for scripts and tests); cancels it on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() == RUNNING:
            if deadline is not None and time.monotonic() > deadline:
                self.cancel()
                self.error = f"timed out after {timeout:.0f} s"
                break
            time.sleep(interval)
        return self.state

    # -- internals

    def _consume(self, pairs: List[Tuple[str, str]]) -> None:
        """Keep the log lines; report every progress line (a fast stage may share a poll with the next)."""
        for _stream, line in pairs:
            parsed = parse_progress_line(line)
            if parsed is None:
                if line.strip():
                    self.log.append(line)
                continue
            stage, done, total = parsed
            spans = stage_spans(self.command.method, self.command.review_map)
            self.progress = Progress(
                stage, done, total, overall_fraction(stage, done, total, self.progress.fraction, spans)
            )
            if self.on_progress is not None:
                self.on_progress(self.progress)
        if len(self.log) > LOG_LINES:
            del self.log[:-LOG_LINES]

    def _finish(self, state: str, error: Optional[str]) -> None:
        self.state = state
        self.error = error
        self.finished_at = time.monotonic()


# ---------------------------------------------------------------------------------------------
# a run's temporary folder: made with its owner's process id, swept when the owner is gone
#
# Each run writes its input and the engine's outputs under a folder CARDSegment-* (in the run's
# work_root, default the system's temporary folder) and deletes it when the run ends. When the
# program that made it exits or crashes first, the folder stays; its engine child ends by itself
# (cardseg.base.parent_watch). The next run then deletes every such folder whose OWNER_FILE names
# a process that no longer runs: only folders this module made (the prefix and the owner file
# both present), never another file.

#: the prefix of a run's temporary folder
WORK_PREFIX = "CARDSegment-"
#: the file in a run's temporary folder that holds the process id of the program that made it
OWNER_FILE = "CARDSegment-owner.pid"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (no signal is sent to it: on Windows ``os.kill`` would end it)."""
    if pid <= 0:
        return False
    if sys.platform == "win32":
        return _windows_process_alive(int(pid))
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _windows_process_alive(pid: int) -> bool:
    """Windows: a handle with SYNCHRONIZE rights, not yet signalled; True when it cannot be asked
    (a folder is then kept, never deleted)."""
    import ctypes

    try:
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        handle = kernel32.OpenProcess(0x00100000, False, pid)  # SYNCHRONIZE
        if not handle:
            return False
        try:
            return kernel32.WaitForSingleObject(handle, 0) == 0x00000102  # WAIT_TIMEOUT: still running
        finally:
            kernel32.CloseHandle(handle)
    except (AttributeError, OSError):
        return True


def make_work_dir(work_root: Optional[os.PathLike] = None) -> Path:
    """A new run folder ``CARDSegment-*`` holding :data:`OWNER_FILE` with this process's id."""
    path = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=work_root))
    (path / OWNER_FILE).write_text(str(os.getpid()), encoding="ascii")
    return path


def owner_of(folder: Path) -> Optional[int]:
    """The process id :data:`OWNER_FILE` of ``folder`` names, or None (no such file, not a number)."""
    try:
        text = (folder / OWNER_FILE).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def orphaned_work_dirs(
    work_root: Optional[os.PathLike] = None, alive: Callable[[int], bool] = process_alive
) -> List[Path]:
    """The run folders in ``work_root`` whose owner no longer runs (this process's are never among them)."""
    root = Path(work_root) if work_root else Path(tempfile.gettempdir())
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(WORK_PREFIX) and p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    out = []
    for folder in sorted(candidates):
        owner = owner_of(folder)
        if owner is not None and owner != os.getpid() and not alive(owner):
            out.append(folder)
    return out


def sweep_orphaned_work_dirs(remove: Callable[[Path], object], work_root: Optional[os.PathLike] = None) -> List[Path]:
    """Delete (with ``remove``) the run folders :func:`orphaned_work_dirs` finds; returns them."""
    folders = orphaned_work_dirs(work_root)
    for folder in folders:
        remove(folder)
    return folders
