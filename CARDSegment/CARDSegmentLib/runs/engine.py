"""A warm ``cardseg serve`` process for the Slicer module, without Qt.

A one-shot run (:mod:`.process`) pays for starting Python, importing torch and loading the
bundle at every click. :class:`Engine` keeps one ``cardseg serve`` process (PythonSlicer inside
Slicer, any interpreter in tests) alive between runs and sends it one JSON request per run (the
protocol is described in ``cardseg/serve.py``); :meth:`Engine.run` gives an :class:`EngineRun`,
which the module drives exactly like a :class:`~.process.CardsegRun` (``start``, ``poll`` from a
``QTimer``, ``cancel``, ``wait``; ``state``, ``progress``, ``error``).

* The process starts with the first run, or earlier with :meth:`Engine.warm_up` (when the module
  opens, if the user allows it), and again with the next run after it ended (a crash, a cancel).
* Cancel ends the work at once: the process (and what it started) is killed, as a one-shot run's
  is; the next run starts a new one.
* It dies with Slicer: the engine exits when its stdin reaches end of file (this process is gone),
  and :meth:`Engine.close` (also registered with :mod:`atexit`) kills it.
* The one-shot process stays the fallback: a run whose engine could not start or ended before it
  was ready (e.g. an engine without ``serve``) goes on as a one-shot ``cardseg segment``
  (:attr:`EngineRun.engine_failed` says so), and so do the later runs of that engine.
  :meth:`Engine.run_factory` has the signature of ``runs.child.RunFactory``: an engine run for a
  plain segment command and for a cine's ``cardseg batch`` command (a ``batch`` request: the frames
  on the model already loaded), the one-shot run for anything else.
"""

from __future__ import annotations

import atexit
import json
import time
import weakref
from typing import Callable, Dict, List, Optional, Tuple

from . import process as proc

#: what the engine reports at start and at the end of each request (see ``cardseg/serve.py``)
READY, RESULT, EXIT = "ready", "result", "exit"


def engine_argv(command: proc.SegmentCommand) -> List[str]:
    """The ``cardseg serve`` command line for the interpreter ``command`` names; it loads the
    bundle and device of ``command`` at start (later runs may name others: the engine reloads)."""
    python = command.python_executable or proc.default_python_executable()
    argv = [python, "-m", "cardseg", "serve", "--eof", "stop", "--device", command.device]
    return argv + (["--bundle", str(command.bundle_path)] if command.bundle_path else [])


def launch_key(command: proc.SegmentCommand) -> Tuple:
    """What a running engine must share with a run to serve it (else it is started again)."""
    return (
        command.python_executable or proc.default_python_executable(),
        command.engine_dir,
        tuple(sorted(command.extra_env.items())),
    )


def served(command: proc.SegmentCommand) -> bool:
    """Whether the engine serves ``command``: a plain ``cardseg segment`` or ``cardseg batch``
    command (a subclass of those may run another command line: it runs one-shot)."""
    return type(command) in (proc.SegmentCommand, proc.BatchCommand)


def request_of(command: proc.SegmentCommand, rid: int) -> Dict[str, object]:
    """The JSON request for one run: the options :meth:`~.process.SegmentCommand.argv` passes
    (a :class:`~.process.BatchCommand`: a ``batch`` request without the triage report)."""
    command.argv()  # the same refusal of a wrong device or method as a one-shot run
    request: Dict[str, object] = {"id": rid}
    if isinstance(command, proc.BatchCommand):
        request.update(op="batch", manifest=str(command.input_path), report=False)
    else:
        request.update(input=str(command.input_path), overwrite=True)
    request.update(output=str(command.output_dir), device=command.device, method=command.method)
    if command.bundle_path:
        request["bundle"] = str(command.bundle_path)
    if command.threads:
        request["threads"] = int(command.threads)
    if command.batch_size:
        request["batch_size"] = int(command.batch_size)
    if command.review_map:
        request["review_map"] = str(command.review_map)
    return request


# ---------------------------------------------------------------------------------------------
# the engine process: a launcher gives a handle that also writes lines to the child's stdin


class EngineHandle(proc.ProcessHandle):
    """A :class:`~.process.ProcessHandle` that also sends lines: ``write_line(text)`` (raises
    :class:`OSError` when the process is gone) and ``close_input()``."""

    def write_line(self, text: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def close_input(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


EngineLauncher = Callable[[List[str], Dict[str, str], Optional[str]], EngineHandle]


class PipedProcess(proc.PopenHandle, EngineHandle):
    """A real engine process: :class:`~.process.PopenHandle` (reader threads queue its output
    lines; its input pipe, closed by :meth:`close_input` and by ``kill``) that also writes the
    requests on its input pipe."""

    def write_line(self, text: str) -> None:
        try:
            self._proc.stdin.write(text + "\n")
            self._proc.stdin.flush()
        except ValueError as exc:  # the pipe was closed here
            raise BrokenPipeError(str(exc)) from None


def pipe_launcher(argv: List[str], env: Dict[str, str], cwd: Optional[str] = None) -> EngineHandle:
    """The default launcher: a real child process."""
    return PipedProcess(argv, env, cwd)


# ---------------------------------------------------------------------------------------------
# one run through the engine


class EngineRun:
    """One segmentation through the :class:`Engine`, with :class:`~.process.CardsegRun`'s interface."""

    def __init__(
        self,
        engine: "Engine",
        command: proc.SegmentCommand,
        on_progress: Optional[Callable[[proc.Progress], None]] = None,
        one_shot_launcher: Optional[proc.Launcher] = None,
    ):
        self.engine = engine
        self.command = command
        self.on_progress = on_progress
        self.one_shot_launcher = one_shot_launcher  # for the fallback (None: a real process)
        self.one_shot: Optional[proc.CardsegRun] = None
        self.state = proc.IDLE
        self.progress = proc.Progress()
        self.error: Optional[str] = None
        self.returncode: Optional[int] = None
        self.log: List[str] = []
        self.result: Optional[dict] = None  # the engine's result event of a succeeded run
        self.engine_failed = False  # the engine could not serve it: it runs as the one-shot process
        self.started_at: Optional[float] = None
        self.finished_at: Optional[float] = None
        self.id: Optional[int] = None

    @property
    def running(self) -> bool:
        return self.state == proc.RUNNING

    @property
    def finished(self) -> bool:
        return self.state in proc.FINISHED_STATES

    def start(self) -> None:
        if self.state != proc.IDLE:
            raise RuntimeError(f"this run was already started (state {self.state})")
        self.started_at = time.monotonic()
        self.engine.submit(self)

    def poll(self) -> str:
        """Read what the engine sent, update progress; returns the state (call it from a timer)."""
        if self.state == proc.RUNNING:
            if self.one_shot is not None:
                self.one_shot.poll()
                self._follow()
            else:
                self.engine.poll()
        return self.state

    def cancel(self, background: Optional[Callable[[Callable[[], None]], None]] = None) -> None:
        """End the work at once (the engine process is killed); the state becomes ``cancelled``.

        ``background(fn)``: the killing (it waits for the process: seconds) runs there, as
        :meth:`~.process.CardsegRun.cancel` hands it; the engine is free for the next run at once."""
        if self.state == proc.IDLE:
            self.finish(proc.CANCELLED, None)
        elif self.one_shot is not None:
            self.one_shot.cancel(background=background)
            self._follow()
        elif self.state == proc.RUNNING:
            self.engine.cancel(self, background)

    def wait(self, timeout: Optional[float] = None, interval: float = 0.05) -> str:
        """Poll until the run finishes (scripts and tests); cancels it on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() == proc.RUNNING:
            if deadline is not None and time.monotonic() > deadline:
                self.cancel()
                self.error = f"timed out after {timeout:.0f} s"
                break
            time.sleep(interval)
        return self.state

    # -- called by the engine

    def advance(self, stage: str, done: int, total: int) -> None:
        spans = proc.stage_spans(self.command.method, self.command.review_map)
        fraction = proc.overall_fraction(stage, done, total, self.progress.fraction, spans)
        self.progress = proc.Progress(stage, done, total, fraction)
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def fall_back(self, reason: str) -> None:
        """The engine cannot serve this run (it never got ready): run it as the one-shot process."""
        self.engine_failed = True
        self.log.append(f"the warm engine did not start ({reason}); running a one-shot process instead")
        self.one_shot = proc.CardsegRun(self.command, self.one_shot_launcher, self.on_progress)
        self.state = proc.RUNNING
        self.one_shot.start()
        self._follow()

    def _follow(self) -> None:
        """Take over the one-shot run's progress and, once it ended, its outcome."""
        run = self.one_shot
        self.progress, self.returncode = run.progress, run.returncode
        if run.finished:
            self.log += run.log
            self.finish(run.state, run.error)

    def finish(self, state: str, error: Optional[str]) -> None:
        if state == proc.SUCCEEDED:
            self.progress.fraction = 1.0
        self.state, self.error = state, error
        self.finished_at = time.monotonic()
        del self.log[: -proc.LOG_LINES]


# ---------------------------------------------------------------------------------------------
# the engine


_OPEN_ENGINES: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def close_all() -> None:
    """Kill every engine process this interpreter started (Slicer exits)."""
    for engine in list(_OPEN_ENGINES):
        engine.close()


class Engine:
    """One warm ``cardseg serve`` process, serving one run at a time (see the module docstring)."""

    def __init__(self, launcher: Optional[EngineLauncher] = None):
        self.launcher = launcher or pipe_launcher
        self.handle: Optional[EngineHandle] = None
        self.key: Optional[Tuple] = None
        self.ready: Optional[dict] = None  # the engine's ready event, once it came
        self.current: Optional[EngineRun] = None
        self.log: List[str] = []  # the process's other lines (stderr), the latest kept
        self.starts = 0  # processes started so far
        self.broken: Optional[Tuple] = None  # the launch key of an engine that never got ready
        self._next_id = 0
        _OPEN_ENGINES.add(self)

    @property
    def alive(self) -> bool:
        return self.handle is not None and self.handle.returncode() is None

    @property
    def busy(self) -> bool:
        return self.current is not None and self.current.running

    def run(
        self,
        command: proc.SegmentCommand,
        on_progress: Optional[Callable[[proc.Progress], None]] = None,
        one_shot_launcher: Optional[proc.Launcher] = None,
    ) -> EngineRun:
        """A run of ``command`` through this engine (not started yet: call its ``start``);
        ``one_shot_launcher`` starts its fallback process (None: a real one)."""
        return EngineRun(self, command, on_progress, one_shot_launcher)

    def run_factory(
        self,
        command: proc.SegmentCommand,
        launcher: Optional[proc.Launcher] = None,
        on_progress: Optional[Callable[[proc.Progress], None]] = None,
    ):
        """:data:`~.child.RunFactory`'s signature: an :class:`EngineRun` for a plain ``cardseg
        segment`` or ``cardseg batch`` command (:func:`served`), else (another command, or an
        engine for this interpreter that never got ready) the one-shot :class:`~.process.CardsegRun`
        with ``launcher``."""
        if not served(command) or self.broken == launch_key(command):
            return proc.CardsegRun(command, launcher, on_progress)
        return self.run(command, on_progress, launcher)

    def warm_up(self, command: proc.SegmentCommand) -> None:
        """Start the engine for runs like ``command`` now (it loads the default bundle), if not running."""
        self.poll()
        if not self.busy:
            self._ensure(command)

    def submit(self, run: EngineRun) -> None:
        """Send ``run``'s request, starting the engine first when none runs for its command."""
        self.poll()
        if self.busy:
            raise RuntimeError("the engine is busy with another run")
        self._next_id += 1
        run.id = self._next_id
        try:
            line = json.dumps(request_of(run.command, run.id))
        except ValueError as exc:  # a wrong device or method, refused as a one-shot run would be
            run.finish(proc.FAILED, str(exc))
            return
        try:
            self._ensure(run.command)
        except OSError as exc:
            self.broken = launch_key(run.command)
            run.fall_back(f"cannot start {engine_argv(run.command)[0]}: {exc}")
            return
        self.current = run
        run.state = proc.RUNNING
        try:
            self.handle.write_line(line)
        except OSError:  # it ended before it read the request: poll() reports its exit as the run's error
            pass

    def poll(self) -> None:
        """Read what the engine sent: progress and the result go to the current run; an ended process fails it."""
        if self.handle is None:
            return
        self._consume(self.handle.read_lines())
        code = self.handle.returncode()
        if code is None:
            return
        self._consume(self.handle.read_lines())
        run = self.current
        failed_before_ready = self.ready is None
        self.handle = None  # the next run starts a new process
        if failed_before_ready:
            self.broken = self.key
        if run is not None and run.running:
            self.current = None
            error = proc.extract_error(run.log or self.log, code)
            if failed_before_ready:
                run.fall_back(error)
            else:
                run.returncode = code
                run.finish(proc.FAILED, error)

    def cancel(self, run: EngineRun, background: Optional[Callable[[Callable[[], None]], None]] = None) -> None:
        """End ``run`` at once: the engine process goes (the next run starts another). The engine
        lets go of the process before killing it, so that the kill, handed to ``background(fn)``
        when given (else done here), never holds up the next run."""
        handle = None
        if self.current is run:
            handle, self.handle, self.current = self.handle, None, None
        run.finish(proc.CANCELLED, None)
        if handle is not None:
            (background or (lambda kill: kill()))(handle.kill)

    def close(self) -> None:
        """End the engine (the running run, if any, is cancelled); a later run starts a new one."""
        if self.current is not None and self.current.running:
            self.current.finish(proc.CANCELLED, None)
        self._discard()
        self.broken = None

    # -- internals

    def _ensure(self, command: proc.SegmentCommand) -> None:
        key = launch_key(command)
        if self.alive and key == self.key:
            return
        self._discard()
        self.ready = None
        self.handle = self.launcher(engine_argv(command), command.env(), None)
        self.key = key
        self.starts += 1

    def _discard(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.kill()

    def _consume(self, pairs: List[Tuple[str, str]]) -> None:
        run = self.current if self.current is not None and self.current.running else None
        for stream, line in pairs:
            event = parse_event(line) if stream == "stdout" else None
            if event is None:
                parsed = proc.parse_progress_line(line) if stream == "stdout" else None
                if parsed is not None and run is not None:
                    run.advance(*parsed)
                elif line.strip():
                    (run.log if run is not None else self.log).append(line)
            elif event.get("event") == READY:
                self.ready = event
            elif event.get("event") == RESULT and run is not None and event.get("id") == run.id:
                run.result = event
                if event.get("ok"):
                    run.returncode = 0
                    run.finish(proc.SUCCEEDED, None)
                else:
                    run.returncode = event.get("code")
                    run.finish(proc.FAILED, str(event.get("error") or "the engine failed"))
                run = None
        del self.log[: -proc.LOG_LINES]


def parse_event(line: str) -> Optional[dict]:
    """The engine's event object on one stdout line (``{"event": ...}``), else None."""
    text = line.strip()
    if not (text.startswith("{") and '"event"' in text):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and "event" in obj else None
