"""One "Segment & Calibrate" from start to nodes, without Qt.

:class:`SegmentationJob` writes the input volume to a temporary file, runs ``cardseg segment``
in a separate process (:class:`~CARDSegmentLib.runs.process.CardsegRun`), and when the process has
succeeded turns its outputs into nodes (:func:`~CARDSegmentLib.outputs.loading.load_outputs`). The scene
is not touched before :meth:`SegmentationJob.finish`: a cancelled or failed run leaves it as it
was. The module's Logic drives a :class:`JobMonitor` from a ``QTimer`` (it turns every error,
expected or not, into the panel's one-line message); scripts and tests call :meth:`wait`.
:class:`EngineChoice` is the user's "Keep engine warm" setting: whether runs go through the warm
engine, and starting or closing it when the module is entered or the box is toggled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Optional, Tuple

from . import process as proc
from .child import ChildRuns, cancel_runs, one_line  # noqa: F401 (cancel_runs, one_line: re-exported)
from ..install.acknowledgement import ensure_acknowledged_for_bundle
from ..install.bundles import bundle_classes
from ..install.dependencies import missing_requirements
from ..outputs.loading import load_outputs
from ..outputs.nodes import OutputError, OutputNodes
from ..outputs.volume_files import write_volume_file


@dataclass
class JobOptions:
    """What the panel chose (and a few things tests and scripts may set)."""

    bundle_path: Optional[str] = None  # a bundle folder; None: the engine's own default
    device: str = "auto"  # auto | cpu | cuda
    method: str = "card"  # card | uc
    review_map: Optional[str] = None  # the bundle's flagged-region rule, by its map (None: its own; "tac": fast)
    load_probabilities: bool = False
    overlay: str = "disagreement"  # disagreement | temperature | none
    opacity: float = 0.5
    engine_dir: Optional[str] = None  # folder that holds the ``cardseg`` package
    python_executable: Optional[str] = None
    threads: Optional[int] = None
    batch_size: Optional[int] = None
    work_root: Optional[str] = None  # where the temporary folder is made (default: the system's)
    keep_files: bool = False  # keep the temporary folder (debugging)
    keep_engine_warm: bool = True  # runs go through one warm ``cardseg serve`` (CARDSegmentLib.runs.engine); the
    # panel sets it from the user's "Keep engine warm" box (EngineChoice.options)
    # a cine sequence's input (ignored for a plain volume): which frames, ED and ES (-1: found from the LV curve)
    frame_mode: str = "shown"  # shown | ed_es | all
    ed_frame: int = -1
    es_frame: int = -1

    def command(self, input_path, output_dir, kind=None) -> "proc.SegmentCommand":
        """The engine run these options ask for: ``kind`` (default ``SegmentCommand``) on ``input_path``."""
        return (kind or proc.SegmentCommand)(
            input_path=str(input_path),
            output_dir=str(output_dir),
            bundle_path=self.bundle_path,
            device=self.device,
            method=self.method,
            python_executable=self.python_executable,
            engine_dir=self.engine_dir,
            threads=self.threads,
            batch_size=self.batch_size,
            review_map=self.review_map,
        )

    def check(self) -> None:
        """Refuse a wrong device or method (ValueError naming it) before any file is written."""
        self.command("", "").engine_call()


class SegmentationJob:
    """Segment and calibrate one input volume in a separate process, then load the results."""

    def __init__(
        self,
        scene,
        input_volume,
        options: Optional[JobOptions] = None,
        launcher: Optional[proc.Launcher] = None,
        on_progress: Optional[Callable[[proc.Progress], None]] = None,
        run_factory=None,
    ):
        self.scene = scene
        self.input_volume = input_volume
        self.options = options or JobOptions()
        self.launcher = launcher
        self.on_progress = on_progress
        # the engine child: the warm engine's Engine.run_factory makes it, else a one-shot process
        self.children = ChildRuns(run_factory, launcher, self.cleanup, self._fail)
        self.work_dir: Optional[Path] = None
        self.outputs: Optional[OutputNodes] = None
        self._error: Optional[str] = None
        self._state = proc.IDLE

    # -- state

    @property
    def state(self) -> str:
        """idle, running, succeeded (outputs ready to load), loaded, failed or cancelled."""
        return self._state

    @property
    def error(self) -> Optional[str]:
        """The one-line error; a temporary path in it reads as what it held (the files are gone)."""
        volume = f"volume '{self.input_volume.GetName()}'" if self.input_volume is not None else "the input volume"
        names = {str(self.input_path): volume, str(self.output_dir): f"the results of {volume}"}
        return proc.name_paths(self._error or self.children.error, names if self.work_dir else {})

    @property
    def run(self):
        """The engine child's run (a CardsegRun or an EngineRun; None before the start)."""
        return self.children.run

    @property
    def progress(self) -> proc.Progress:
        return self.children.progress

    @property
    def input_path(self) -> Optional[Path]:
        return self.work_dir / "input.nrrd" if self.work_dir else None

    @property
    def output_dir(self) -> Optional[Path]:
        return self.work_dir / "output" if self.work_dir else None

    # -- steps

    def start(self) -> None:
        """Write the input to a temporary file and start the engine (the scene is not changed)."""
        if self._state != proc.IDLE:
            raise RuntimeError("this job was already started")
        if self.input_volume is None or self.input_volume.GetImageData() is None:
            self._fail("choose an input volume that has image data")
            return
        try:
            self.options.check()
            proc.sweep_orphaned_work_dirs(remove_tree, self.options.work_root)  # what a crashed Slicer left
            self.work_dir = proc.make_work_dir(self.options.work_root)
            write_volume_file(self.input_volume, self.input_path)
        except Exception as exc:  # noqa: BLE001 - any failure here is the run's one-line error
            self._fail(one_line(exc))
            return
        self._state = proc.RUNNING
        if self.children.start(self.options.command(self.input_path, self.output_dir), self.on_progress) == proc.FAILED:
            self._state = proc.FAILED

    def poll(self) -> str:
        """Advance: read the process's output; ``succeeded`` means :meth:`finish` may be called."""
        if self._state == proc.RUNNING:
            self._state = self.children.poll()
        return self._state

    def wait(self, timeout: Optional[float] = None) -> str:
        """Poll until the process ends (scripts, tests, Slicer's self-test)."""
        if self._state == proc.RUNNING:
            self._state = self.children.wait(timeout)
        return self._state

    def abort(self, message: str) -> None:
        """Fail the job with ``message``: end the process if it runs, delete the temporary files."""
        try:
            self.children.stop()
        finally:
            self._fail(message)

    def cancel(self, background: Optional[Callable] = None) -> None:
        """End the process and delete the temporary files; the scene stays as it was.

        ``background(fn)``: ending the process and deleting the files run there (the job is
        ``cancelled`` at once); without it they run here."""
        if self._state in (proc.IDLE, proc.RUNNING, proc.SUCCEEDED):
            self._state = proc.CANCELLED
        self.children.cancel(background)

    def load_step(self) -> bool:
        """Load the results (a plain volume's in one step); True when done."""
        self.finish()
        return True

    def finish(self, classes: Optional[list] = None) -> OutputNodes:
        """Turn the outputs of a succeeded run into nodes (replacing this module's earlier ones)."""
        if self._state != proc.SUCCEEDED:
            raise RuntimeError(f"nothing to load: the run is {self._state}")
        try:
            if classes is None and self.options.bundle_path:
                classes = bundle_classes(self.options.bundle_path)
            o = self.options
            self.outputs = load_outputs(
                self.scene,
                self.input_volume,
                self.output_dir,
                classes=classes,
                load_probabilities=o.load_probabilities,
                overlay=o.overlay,
                opacity=o.opacity,
            )
        except Exception as exc:  # noqa: BLE001 - whatever broke, the scene is as before and one line says why
            message = one_line(exc)
            self._fail(message)
            raise OutputError(message) from exc
        finally:
            self.cleanup()
        self._state = "loaded"
        return self.outputs

    def cleanup(self) -> None:
        """Delete the temporary folder (unless ``keep_files``); a failure is logged, naming it."""
        if self.work_dir is not None and not self.options.keep_files:
            remove_tree(self.work_dir)

    def _fail(self, message: str) -> None:
        self._state, self._error = proc.FAILED, message
        self.cleanup()


def remove_tree(path: os.PathLike) -> Optional[str]:
    """Delete the folder ``path`` (this module's own temporary folder) as far as possible.

    Returns None when it is gone, else a one-line message naming the folder and the first file
    that could not be deleted, which is also logged as a warning (it used to be dropped silently).
    """
    failures = []

    def note(_func, name, exc_info):
        failures.append(f"{name}: {getattr(exc_info[1], 'strerror', None) or exc_info[1]}")

    if not os.path.lexists(path):
        return None
    if sys.version_info >= (3, 12):  # onerror is deprecated there
        shutil.rmtree(path, onexc=lambda func, name, exc: note(func, name, (type(exc), exc, None)))
    else:
        shutil.rmtree(path, onerror=note)
    if not failures and not os.path.lexists(path):
        return None
    message = f"CARDSegment could not delete its temporary folder {path} ({failures[0] if failures else 'still there'})"
    logging.getLogger(__name__).warning(message)
    return message


def engine_dir_of(module_file: os.PathLike) -> str:
    """The folder next to ``CARDSegment.py`` that holds the ``cardseg`` package."""
    return str(Path(module_file).resolve().parent)


class JobMonitor:
    """Drives one :class:`SegmentationJob` from a GUI timer; no exception ever leaves it.

    :meth:`start` and :meth:`step` return True once the job has ended; :attr:`outcome` is then
    ``(state, error)`` with state ``loaded``, ``failed`` or ``cancelled``. Whatever goes wrong while
    polling the process or loading its outputs (an unexpected exception included) ends the job as
    ``failed`` with a one-line message, the process stopped and the temporary files deleted, so
    that the panel can always return to its idle state.
    """

    def __init__(self, job: SegmentationJob, busy: Callable[[], ContextManager] = contextlib.nullcontext):
        self.job = job
        self.busy = busy  # wraps the loading of the results (the Logic passes a wait cursor)
        self.outcome: Optional[Tuple[str, Optional[str]]] = None

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def start(self) -> bool:
        """Start the job; True when it ended at once (e.g. the input could not be written)."""
        try:
            self.job.start()
        except Exception as exc:  # noqa: BLE001
            return self._failed(exc)
        if self.job.state in (proc.FAILED, proc.CANCELLED):
            self.outcome = (self.job.state, self.job.error)
        return self.finished

    def step(self) -> bool:
        """Poll once; load the results when the process has succeeded. True once the job has ended."""
        if self.finished:
            return True
        try:
            state = self.job.poll()
            if state == proc.RUNNING:
                return False
            if state == proc.SUCCEEDED:
                with self.busy():  # a step at a time: between steps the GUI runs (a sequence: a frame a step)
                    done = self.job.load_step()
                if not done:
                    return False
                self.outcome = ("loaded", None)
            else:
                self.outcome = (state, self.job.error)
        except Exception as exc:  # noqa: BLE001 - the panel must never stay stuck in "running"
            return self._failed(exc)
        return True

    def cancel(self, background: Optional[Callable] = None) -> None:
        """End the process (in ``background`` when given); the scene stays as it was."""
        if self.finished:
            return
        try:
            self.job.cancel(background)
        except Exception:  # noqa: BLE001 - cancelling must always end the run for the panel
            logging.getLogger(__name__).exception("CARDSegment: cancelling the run failed")
        self.outcome = (proc.CANCELLED, None)

    def _failed(self, exc: BaseException) -> bool:
        message = self.job.error if isinstance(exc, OutputError) and self.job.error else one_line(exc)
        if not isinstance(exc, OutputError):
            logging.getLogger(__name__).error("CARDSegment: the run failed", exc_info=exc)
        try:
            self.job.abort(message)
        except Exception:  # noqa: BLE001
            logging.getLogger(__name__).exception("CARDSegment: cleaning up after a failed run failed")
        self.outcome = (proc.FAILED, message)
        return True


# ---------------------------------------------------------------------------------------------
# "Keep engine warm": the user's setting and what it asks of the Logic

#: where the choice is kept: the application's settings (the engine holds this computer's memory;
#: the choice belongs to no scene)
KEEP_ENGINE_WARM_KEY = "CARDSegment/KeepEngineWarm"
#: what :func:`engine_action` asks for
START_ENGINE, STOP_ENGINE, LEAVE_ENGINE = "start", "stop", "leave"


def settings_flag(value, default: bool) -> bool:
    """A yes/no setting as ``QSettings.value`` gives it back: a bool, or the text ("true",
    "false") read from the settings file in a later session; ``default`` when unset."""
    if value is None or value == "":
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on")
    return bool(value)


def engine_action(keep_warm: bool, engine_open: bool, engine_alive: bool, running: bool) -> str:
    """What to do with the warm engine when the module is entered or the box is toggled.

    A running Segment & Calibrate is never disturbed (leave it: the next click applies the
    choice). Kept warm: start the engine when none is alive (never started, or it crashed).
    Not kept warm: stop an open engine, so that its memory is freed now.
    """
    if running:
        return LEAVE_ENGINE
    if not keep_warm:
        return STOP_ENGINE if engine_open else LEAVE_ENGINE
    return LEAVE_ENGINE if engine_alive else START_ENGINE


def ready_to_warm_up(
    options: JobOptions, module_dir: os.PathLike, settings, missing: Optional[Callable[[], list]] = None
) -> bool:
    """Whether the engine may start before any click: the packages it needs are installed
    (``missing()``, default :func:`~CARDSegmentLib.install.dependencies.missing_requirements`, is empty) and the
    research-use terms of ``options``' bundle need no agreement or were agreed (a click asks for
    both first; nothing is asked here)."""
    return not (missing or missing_requirements)() and ensure_acknowledged_for_bundle(
        options.bundle_path, module_dir, settings, lambda title, text: False
    )


class EngineChoice:
    """The user's "Keep engine warm" setting (default on) and its effect on the module's Logic.

    ``settings``: anything with ``value(key, default)`` and ``setValue(key, value)`` (Slicer's
    ``qt.QSettings()``, a test's dictionary stub). ``ready(options) -> bool``: whether the engine
    may start before a click (default :func:`ready_to_warm_up`).
    """

    def __init__(self, settings, module_dir: os.PathLike, ready: Optional[Callable[[JobOptions], bool]] = None):
        self.settings = settings
        self.ready = ready or (lambda options: ready_to_warm_up(options, module_dir, settings))

    @property
    def keep_warm(self) -> bool:
        return settings_flag(self.settings.value(KEEP_ENGINE_WARM_KEY, True), True)

    @keep_warm.setter
    def keep_warm(self, on: bool) -> None:
        self.settings.setValue(KEEP_ENGINE_WARM_KEY, bool(on))

    def options(self, options: JobOptions) -> JobOptions:
        """``options`` with the choice applied (off: the run is a one-shot process)."""
        options.keep_engine_warm = self.keep_warm
        return options

    def apply(self, logic, options: Callable[[], JobOptions]) -> str:
        """Start or close ``logic``'s engine as the choice asks (``logic``: a
        :class:`~CARDSegmentLib.panel.logic.ModuleLogic`; ``options()``: the panel's current run options).

        Returns the action taken: ``leave`` also when the engine cannot start yet (packages missing,
        terms not agreed, an unusable bundle folder: the first click deals with them and starts it).
        Never raises: it runs when the module is entered. Starting only launches the process.
        """
        engine = logic.engine
        action = engine_action(self.keep_warm, engine is not None, engine is not None and engine.alive, logic.isRunning)
        try:
            if action == STOP_ENGINE:
                logic.closeEngine()
            elif action == START_ENGINE:
                chosen = self.options(options())
                if not self.ready(chosen):
                    return LEAVE_ENGINE
                logic.warmUpEngine(chosen)
                if logic.engine is None or not logic.engine.alive:  # e.g. a test launcher: one-shot runs only
                    return LEAVE_ENGINE
        except Exception as exc:  # noqa: BLE001 - the module must open whatever the engine does; the click says why
            logging.getLogger(__name__).info("CARDSegment: could not %s the warm engine: %s", action, one_line(exc))
            return LEAVE_ENGINE
        return action
