"""The module's Logic without Qt: start, poll and cancel runs; show, review and export results.

``CARDSegmentLogic`` in ``CARDSegment.py`` is this class plus Slicer's
``ScriptedLoadableModuleLogic``; it hands in what only the application has: the scene, a timer
factory (an object with ``setInterval``, ``connect("timeout()", slot)``, ``start``, ``stop``:
a ``qt.QTimer``) and a busy cursor. Method names follow Slicer's camelCase Logic API.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, ContextManager, Optional

from . import install
from .jobs import JobMonitor, JobOptions, SegmentationJob
from .outputs import OutputNodes, find_outputs
from .overlays import show_overlay
from .parameters import bundle_path, job_options
from .process import SUCCEEDED
from .review import export_review, review_rows, set_region_status, show_region

#: how often the timer polls a running segmentation process
POLL_INTERVAL_MS = 200


class ModuleLogic:
    """Starts and polls runs (through the given timer) and calls the library for everything in the scene."""

    def __init__(self, moduleDir: str, scene: Callable[[], object], makeTimer: Callable[[], object],
                 busy: Callable[[], ContextManager]) -> None:
        self.moduleDir = moduleDir
        self._scene, self._makeTimer, self._busy = scene, makeTimer, busy
        self.job: Optional[SegmentationJob] = None
        self._monitor: Optional[JobMonitor] = None
        self._timer = None
        self._onProgress: Optional[Callable] = None
        self._onFinished: Optional[Callable] = None
        self.launcher = None  # tests may inject a fake process launcher

    @property
    def currentScene(self):
        """The scene the module works in (the application's, looked up at each use)."""
        return self._scene()

    # -- options and dependencies

    def bundlePath(self, parameterNode) -> str:
        return bundle_path(parameterNode, self.moduleDir)

    def jobOptions(self, parameterNode) -> JobOptions:
        return job_options(parameterNode, self.moduleDir)

    @staticmethod
    def ensureDependencies(askConfirmation: bool = True) -> None:
        """Install what the engine needs, after asking: torch via PyTorchUtils, the rest via pip."""
        install.ensure_dependencies(ask_confirmation=askConfirmation)

    # -- running

    @property
    def isRunning(self) -> bool:
        return self._monitor is not None and not self._monitor.finished

    def start(self, inputVolume, options: JobOptions, onProgress: Optional[Callable] = None,
              onFinished: Optional[Callable] = None) -> None:
        """Start a run in a separate process; a timer polls it; the scene changes only at the end.

        ``onFinished(state, error)`` is called exactly once: state ``loaded``, ``failed`` (with a
        one-line error, whatever went wrong) or ``cancelled``.
        """
        if self.isRunning:
            raise RuntimeError("a segmentation is already running")
        self._onProgress, self._onFinished = onProgress, onFinished
        self.job = SegmentationJob(self.currentScene, inputVolume, options, launcher=self.launcher, on_progress=onProgress)
        self._monitor = JobMonitor(self.job, busy=self._busy)
        if self._monitor.start():
            self._finished()
            return
        self._timer = self._makeTimer()
        self._timer.setInterval(POLL_INTERVAL_MS)
        self._timer.connect("timeout()", self._poll)
        self._timer.start()

    def elapsedSeconds(self) -> Optional[float]:
        """Seconds the current run has taken so far, or the last run took; None before any run."""
        run = self.job.run if self.job is not None else None
        if run is None or run.started_at is None:
            return None
        end = run.finished_at if run.finished_at is not None else time.monotonic()
        return max(0.0, end - run.started_at)

    def _poll(self) -> None:
        """The timer's slot: one step of the run; nothing may escape it (Qt would swallow it)."""
        monitor = self._monitor
        if monitor is None or not monitor.step():
            return
        self._stopTimer()
        self._finished()

    def _stopTimer(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def _finished(self) -> None:
        """Hand the run's outcome to the panel, once."""
        callback, self._onFinished = self._onFinished, None
        if callback is None or self._monitor is None or self._monitor.outcome is None:
            return
        state, error = self._monitor.outcome
        try:
            callback(state, error)
        except Exception:
            logging.exception("CARDSegment: updating the panel after the run failed")

    def cancel(self) -> None:
        """End the running process; the scene stays as it was."""
        if not self.isRunning:
            return
        self._stopTimer()
        self._monitor.cancel()
        self._finished()

    def runSync(self, inputVolume, options: JobOptions, timeout: float = 1800.0) -> OutputNodes:
        """Run to the end and load the results (scripts and the self-test); raises on failure."""
        job = SegmentationJob(self.currentScene, inputVolume, options, launcher=self.launcher)
        job.start()
        state = job.wait(timeout)
        if state != SUCCEEDED:
            raise RuntimeError(f"segmentation {state}: {job.error}")
        return job.finish()

    # -- results

    def outputs(self, inputVolume) -> OutputNodes:
        return find_outputs(self.currentScene, inputVolume)

    def showOverlay(self, inputVolume, overlay: str, opacity: float) -> None:
        outputs = self.outputs(inputVolume)
        if outputs.segmentation is not None:
            show_overlay(self.currentScene, inputVolume, outputs, overlay, opacity)

    def showRegion(self, inputVolume, regionId: int) -> dict:
        outputs = self.outputs(inputVolume)
        show_region(self.currentScene, inputVolume, outputs, regionId)
        return next(r for r in review_rows(outputs.review) if r["region"] == regionId)

    def setRegionStatus(self, inputVolume, regionId: int, status: str, note: Optional[str] = None) -> None:
        set_region_status(self.outputs(inputVolume).review, regionId, status, note)

    def exportReview(self, inputVolume, path: str) -> str:
        return str(export_review(self.outputs(inputVolume), path))
