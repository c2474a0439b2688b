"""One start-and-poll path for the engine children of every job, without Qt.

A job (:class:`~.jobs.SegmentationJob` for a volume, :class:`~CARDSegmentLib.cine.job.CineJob` for
a cine sequence) runs one or more steps one after another, each through an engine child: a
one-shot ``cardseg segment`` or ``cardseg batch`` process (:class:`~.process.CardsegRun`) or a
request to the warm engine (:class:`~.engine.EngineRun`), whichever the job's run factory makes.
:class:`ChildRuns` starts the run of each step, polls it, waits for it and cancels it, and deletes
the job's temporary folder whenever a run fails to start, fails or is cancelled. What a finished
step means (load the outputs, start another step) stays the job's.
"""

from __future__ import annotations

from typing import Callable, List, Optional

from . import process as proc
from ..install.packages import InstallFailed
from ..outputs.nodes import OutputError

#: makes the run of one step: ``(command, launcher, on_progress) -> a CardsegRun-like object``
RunFactory = Callable[[proc.SegmentCommand, Optional[proc.Launcher], Optional[Callable]], object]

#: errors whose message is already written for the user; others get their type name in front
_PLAIN_ERRORS = (OutputError, OSError, ValueError, InstallFailed)


def one_line(exc: BaseException) -> str:
    """The one line the panel shows for an exception.

    Expected errors (unreadable outputs, files, values) give their message; anything else (a bug,
    an API this Slicer lacks) gives ``Type: message`` so that the cause stays recognisable.
    """
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if isinstance(exc, _PLAIN_ERRORS) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ChildRuns:
    """The runs of one job's steps, the current one last (see the module docstring).

    ``factory`` makes each run (None: the one-shot :class:`~.process.CardsegRun`), ``launcher``
    starts its process (None: a real one), ``cleanup()`` deletes the job's temporary folder and
    ``fail(message)`` fails the job with a one-line message (deleting the folder too).
    """

    def __init__(
        self,
        factory: Optional[RunFactory],
        launcher: Optional[proc.Launcher],
        cleanup: Callable[[], None],
        fail: Callable[[str], None],
    ):
        self.factory = factory or proc.CardsegRun
        self.launcher = launcher
        self.cleanup, self.fail = cleanup, fail
        self.runs: List[object] = []

    @property
    def run(self):
        """The run of the current step (None before the first)."""
        return self.runs[-1] if self.runs else None

    @property
    def progress(self) -> proc.Progress:
        return self.run.progress if self.run is not None else proc.Progress()

    @property
    def error(self) -> Optional[str]:
        return self.run.error if self.run is not None else None

    def start(self, command: proc.SegmentCommand, on_progress: Optional[Callable] = None) -> str:
        """Make and start the run of ``command``; its state: ``running``, or ``failed`` (the folder
        deleted). An exception from the start fails the job with its one line, then goes on."""
        run = self.factory(command, self.launcher, on_progress)
        self.runs.append(run)
        try:
            run.start()
        except Exception as exc:
            self.fail(one_line(exc))
            raise
        if run.state == proc.FAILED:
            self.cleanup()
        return run.state

    def poll(self, ended: Optional[Callable[[str], None]] = None) -> str:
        """Poll the current run; its state. Failed or cancelled: ``ended(state)``, when given, reads
        what it needs of the folder, which is then deleted."""
        if self.run is None:
            return proc.IDLE
        state = self.run.poll()
        if state in (proc.FAILED, proc.CANCELLED):
            try:
                if ended is not None:
                    ended(state)
            finally:
                self.cleanup()
        return state

    def wait(self, timeout: Optional[float] = None) -> str:
        """Poll the current run until it ends (scripts, tests), then :meth:`poll` once more."""
        if self.run is not None and self.run.running:
            self.run.wait(timeout)
        return self.poll()

    def stop(self) -> None:
        """End the current run if it runs (the job then fails or cleans up on its own)."""
        if self.run is not None and self.run.running:
            self.run.cancel()

    def cancel(self, background: Optional[Callable] = None) -> None:
        """Cancel the current run, then delete the folder (see :func:`cancel_runs`)."""
        cancel_runs([self.run], self.cleanup, background)


def cancel_runs(runs, cleanup: Callable[[], None], background: Optional[Callable] = None) -> None:
    """Cancel ``runs`` (any may be None), then ``cleanup``; with ``background(fn)`` the waiting for
    the processes and the cleanup happen there, and this returns at once. The cleanup happens even
    when a run's cancel raises (the error is raised after it is handed over)."""
    endings: list = []

    def finish() -> None:
        try:
            for end in endings:
                end()
        finally:
            cleanup()

    try:
        for run in runs:
            if run is not None:
                run.cancel(background=endings.append if background is not None else None)
    finally:
        (background or (lambda fn: fn()))(finish)
