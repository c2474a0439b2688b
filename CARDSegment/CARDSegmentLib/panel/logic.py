"""The module's Logic without Qt: start, poll and cancel runs; show, review and export results.

``CARDSegmentLogic`` in ``CARDSegment.py`` is this class plus Slicer's
``ScriptedLoadableModuleLogic``; it hands in what only the application has: the scene, a timer
factory (an object with ``setInterval``, ``connect("timeout()", slot)``, ``start``, ``stop``:
a ``qt.QTimer``) and a busy cursor. Method names follow Slicer's camelCase Logic API.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, ContextManager, Dict, List, Optional

from ..install import packages as install
from ..runs.engine import Engine
from ..cine.job import CineJob
from ..cine.results import export_cine_review, indices_lines, read_indices
from ..runs.jobs import JobMonitor, JobOptions, SegmentationJob
from ..outputs.nodes import OutputNodes, find_outputs, output_nodes_of, read_report, release_outputs
from ..outputs.overlays import show_overlay
from .parameters import bundle_path, job_options
from ..runs.process import FAILED, SUCCEEDED
from ..outputs.region_outlines import highlight_region
from ..cine.sequences import (
    frame_outputs,
    recorded_frames,
    release_results,
    result_node_ids,
    result_sequences,
    shown_outputs,
)
from ..outputs.review import export_review, has_decisions, review_rows, set_region_status, show_region
from ..cine.sequences import (
    FrameMode,
    check_slices_for_indices,
    cine_of,
    frame_plan,
    release_retired,
    retired_count,
    slice_count,
)

#: how often the timer polls a running segmentation process
POLL_INTERVAL_MS = 200
#: how often replaced result items are let go after a run (a few each time, see release_retired)
RELEASE_INTERVAL_MS = 20


class ModuleLogic:
    """Starts and polls runs (through the given timer) and calls the library for everything in the scene."""

    def __init__(
        self,
        moduleDir: str,
        scene: Callable[[], object],
        makeTimer: Callable[[], object],
        busy: Callable[[], ContextManager],
    ) -> None:
        self.moduleDir = moduleDir
        self._scene, self._makeTimer, self._busy = scene, makeTimer, busy
        self.job: Optional[SegmentationJob] = None
        self._monitor: Optional[JobMonitor] = None
        self._timer = None
        self._releaseTimer = None
        self._onProgress: Optional[Callable] = None
        self._onFinished: Optional[Callable] = None
        self.launcher = None  # tests may inject a fake process launcher
        self.runFactory = None  # tests may make a sequence's runs (None: the warm engine's, as a volume's)
        self.engine: Optional[Engine] = None  # the warm cardseg serve process, made on first use
        self._background: List[threading.Thread] = []

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

    def start(
        self,
        inputVolume,
        options: JobOptions,
        onProgress: Optional[Callable] = None,
        onFinished: Optional[Callable] = None,
    ) -> None:
        """Start a run in a separate process; a timer polls it; the scene changes only at the end.

        ``onFinished(state, error)`` is called exactly once: state ``loaded``, ``failed`` (with a
        one-line error, whatever went wrong) or ``cancelled``.
        """
        if self.isRunning:
            raise RuntimeError("a segmentation is already running")
        self._onProgress, self._onFinished = onProgress, onFinished
        try:
            self.job = self.makeJob(inputVolume, options, onProgress)
        except ValueError as exc:  # a frame choice the sequence cannot give: one line, nothing started
            self._monitor = None
            callback, self._onFinished = self._onFinished, None
            if callback is not None:
                callback(FAILED, str(exc))
            return
        self._monitor = JobMonitor(self.job, busy=self._busy)
        if self._monitor.start():
            self._finished()
            return
        self._timer = self._makeTimer()
        self._timer.setInterval(POLL_INTERVAL_MS)
        self._timer.connect("timeout()", self._poll)
        self._timer.start()

    def makeJob(self, inputVolume, options: JobOptions, onProgress: Optional[Callable] = None):
        """A :class:`CineJob` for a sequence's proxy volume (the frames the options choose), else a
        :class:`SegmentationJob` (a plain volume, as before). Raises ValueError for impossible frames."""
        cine = cine_of(self.currentScene, inputVolume)
        if cine is None:
            return SegmentationJob(
                self.currentScene,
                inputVolume,
                options,
                launcher=self.launcher,
                on_progress=onProgress,
                run_factory=self.segmentRunFactory(options),
            )
        plan = frame_plan(FrameMode(options.frame_mode), cine.count, cine.shown, options.ed_frame, options.es_frame)
        check_slices_for_indices(plan, slice_count(cine.frame_volume(cine.shown)))
        return CineJob(
            self.currentScene,
            inputVolume,
            cine,
            plan,
            options,
            launcher=self.launcher,
            on_progress=onProgress,
            run_factory=self.runFactory or self.segmentRunFactory(options),
        )

    def segmentRunFactory(self, options: JobOptions):
        """The warm engine's run factory when the user keeps it warm (and no test launcher is
        injected), else None: the one-shot process. Volumes and cine sequences alike: one engine
        serves every run of the panel."""
        if not options.keep_engine_warm or self.launcher is not None:
            if self.engine is not None and not options.keep_engine_warm:
                self.closeEngine()  # the user turned it off: free its memory now
            return None
        if self.engine is None:
            self.engine = Engine()
        return self.engine.run_factory

    def warmUpEngine(self, options: JobOptions) -> None:
        """Start the engine before the first click (the module opened, the user keeps it warm)."""
        factory = self.segmentRunFactory(options)
        if factory is not None and not self.isRunning:
            self.engine.warm_up(options.command("", ""))

    def closeEngine(self) -> None:
        """End the warm engine (module cleanup, application exit; atexit does it too) and wait for
        the endings of cancelled runs: when this returns, no engine process of this Logic runs."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.waitForBackground()

    def elapsedSeconds(self) -> Optional[float]:
        """Seconds the current run has taken so far, or the last run took; None before any run."""
        runs = getattr(self.job, "runs", None) or [getattr(self.job, "run", None)]
        if runs[0] is None or runs[0].started_at is None:
            return None
        end = runs[-1].finished_at if runs[-1].finished_at is not None else time.monotonic()
        return max(0.0, end - runs[0].started_at)

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
        """Hand the run's outcome to the panel, once; then let the results it replaced go."""
        self._releaseRetired()
        callback, self._onFinished = self._onFinished, None
        if callback is None or self._monitor is None or self._monitor.outcome is None:
            return
        state, error = self._monitor.outcome
        try:
            callback(state, error)
        except Exception:
            logging.exception("CARDSegment: updating the panel after the run failed")

    def _releaseRetired(self) -> None:
        """Let the result items a commit replaced go a few per timer tick (deleting them all at
        once would hold the GUI for seconds), on a timer of their own."""
        if retired_count() == 0 or self._releaseTimer is not None:
            return

        def tick():
            if release_retired() == 0 and self._releaseTimer is not None:
                self._releaseTimer.stop()
                self._releaseTimer = None

        self._releaseTimer = self._makeTimer()
        self._releaseTimer.setInterval(RELEASE_INTERVAL_MS)
        self._releaseTimer.connect("timeout()", tick)
        self._releaseTimer.start()

    def cancel(self, wait: bool = False) -> None:
        """End the running process; the scene stays as it was. Returns at once: the process is
        ended and its files deleted on a background thread (:meth:`waitForBackground`); with
        ``wait``, here, before this returns (the module's cleanup: nothing may outlive it)."""
        if not self.isRunning:
            return
        self._stopTimer()
        self._monitor.cancel(background=None if wait else self._inBackground)
        self._finished()

    def _inBackground(self, fn: Callable[[], None]) -> None:
        def guarded():
            try:
                fn()
            except Exception:  # noqa: BLE001 - a thread's error would go nowhere: log it
                logging.exception("CARDSegment: ending a cancelled run failed")

        thread = threading.Thread(target=guarded, name="CARDSegment-cancel", daemon=True)
        self._background = [t for t in self._background if t.is_alive()] + [thread]
        thread.start()

    def waitForBackground(self, timeout: Optional[float] = 30.0) -> bool:
        """Wait for cancelled runs to be ended and cleaned up (tests, scene close); True when all are."""
        for thread in list(self._background):
            thread.join(timeout)
        return not any(t.is_alive() for t in self._background)

    def runSync(self, inputVolume, options: JobOptions, timeout: float = 1800.0):
        """Run to the end and load the results (scripts and the self-test); raises on failure.
        A plain volume gives its OutputNodes, a sequence ``{frame: OutputNodes}``."""
        job = self.makeJob(inputVolume, options)
        job.start()
        state = job.wait(timeout)
        if state != SUCCEEDED:
            raise RuntimeError(f"segmentation {state}: {job.error}")
        outputs = job.finish()
        release_retired(None)  # no GUI to keep responsive
        return outputs

    # -- results (a cine's: the result sequences of its browser, see CARDSegmentLib.cine.sequences)

    def outputs(self, inputVolume) -> OutputNodes:
        """The input's outputs; for a sequence the proxies that show the shown frame's, with its indices table."""
        cine = cine_of(self.currentScene, inputVolume)
        if cine is None:
            return find_outputs(self.currentScene, inputVolume)
        out = shown_outputs(cine)
        out.indices = find_outputs(self.currentScene, inputVolume, None).indices
        return out

    def shownReport(self, inputVolume) -> Optional[dict]:
        """The shown frame's ``report.json`` (None: not segmented), read from its proxy: no scene scan,
        so the panel can call it on every frame of a playing cine."""
        cine = cine_of(self.currentScene, inputVolume)
        report = shown_outputs(cine).report if cine is not None else find_outputs(self.currentScene, inputVolume).report
        return read_report(report) if report is not None else None

    @staticmethod
    def frameReport(cine, frame: int) -> Optional[dict]:
        """``frame``'s ``report.json`` from its item in the report sequence (None: not segmented); the
        browser's sequences only, no scene scan (the panel calls it on every frame of a playing cine)."""
        report = frame_outputs(cine, frame).report
        return read_report(report) if report is not None else None

    @staticmethod
    def frameChanged(cine) -> None:
        """The browser shows another frame: the outlines' proxy keeps no highlight of the last one
        (its segments are the new frame's)."""
        regions = shown_outputs(cine).regions
        if regions is not None and regions.GetDisplayNode() is not None:
            highlight_region(regions, None)

    def isSequence(self, inputVolume) -> bool:
        return cine_of(self.currentScene, inputVolume) is not None

    def sequenceInfo(self, inputVolume):
        """The :class:`~CARDSegmentLib.cine.sequences.Cine` behind the input, or None (a plain volume)."""
        return cine_of(self.currentScene, inputVolume)

    def baseName(self, inputVolume) -> str:
        """The stem of the input's output and export names: a sequence's name (its proxy's name
        may carry the shown frame), else the volume's."""
        cine = cine_of(self.currentScene, inputVolume)
        return cine.name if cine is not None else (inputVolume.GetName() or "Volume")

    def frameOutputs(self, inputVolume) -> Dict[Optional[int], OutputNodes]:
        """``{frame: outputs}`` of every segmented frame (the sequences' items; the shown frame's
        review through its proxy); ``{None: outputs}`` for a plain volume."""
        cine = cine_of(self.currentScene, inputVolume)
        if cine is None:
            return {None: find_outputs(self.currentScene, inputVolume)}
        held = result_sequences(cine)
        frames = {f: frame_outputs(cine, f, held) for f in recorded_frames(cine, held)}
        if cine.shown in frames:
            frames[cine.shown].review = shown_outputs(cine, held).review or frames[cine.shown].review
        return frames

    def indices(self, inputVolume) -> Optional[dict]:
        """The sequence's cardiac indices (:func:`~CARDSegmentLib.cine.results.read_indices`), or None."""
        return read_indices(find_outputs(self.currentScene, inputVolume, None).indices)

    def hasSegmentation(self, inputVolume) -> bool:
        """Whether the input (any frame of a sequence) has a segmentation of this module."""
        cine = cine_of(self.currentScene, inputVolume)
        if cine is not None:
            return bool(recorded_frames(cine))
        return find_outputs(self.currentScene, inputVolume).segmentation is not None

    def indicesText(self, inputVolume) -> str:
        """The panel's lines for the sequence's cardiac indices ("" for a plain volume or none yet)."""
        cine = cine_of(self.currentScene, inputVolume)
        return "\n".join(indices_lines(self.indices(inputVolume), cine.frame_label)) if cine is not None else ""

    def outputNodeIDs(self, inputVolume) -> tuple:
        """IDs of the input's output nodes in the scene (a sequence's: its result sequences, their
        proxies and the indices table): the panel watches their removal."""
        own = tuple(n.GetID() for n in output_nodes_of(self.currentScene, inputVolume, "all"))
        cine = cine_of(self.currentScene, inputVolume)
        return own + (result_node_ids(cine) if cine is not None else ())

    def keepResults(self, inputVolume) -> int:
        """Keep the current results as ordinary nodes (and sequences): the next run makes new ones."""
        cine = cine_of(self.currentScene, inputVolume)
        kept = release_results(cine) if cine is not None else 0
        return kept + release_outputs(self.currentScene, inputVolume)

    def reviewRows(self, inputVolume) -> List[dict]:
        """The review rows of every segmented frame, each with its ``frame`` (None: a plain volume)."""
        rows = []
        for frame, outputs in self.frameOutputs(inputVolume).items():
            rows += [dict(row, frame=frame) for row in review_rows(outputs.review)]
        return rows

    def decisionsAtRisk(self, inputVolume, options: JobOptions) -> bool:
        """Whether a run with ``options`` would replace a review that has decisions."""
        cine = cine_of(self.currentScene, inputVolume)
        if cine is None:
            review = find_outputs(self.currentScene, inputVolume).review
            return review is not None and has_decisions(review)
        try:
            plan = frame_plan(FrameMode(options.frame_mode), cine.count, cine.shown, options.ed_frame, options.es_frame)
        except ValueError:
            return False
        return any(
            o.review is not None and has_decisions(o.review)
            for f, o in self.frameOutputs(inputVolume).items()
            if f in plan.frames
        )

    def showOverlay(self, inputVolume, overlay: str, opacity: float) -> None:
        """The chosen map in front of every slice view (for a sequence its proxy: set once, it then
        follows the frame by itself)."""
        outputs = self.outputs(inputVolume)
        if outputs.segmentation is not None:
            show_overlay(self.currentScene, inputVolume, outputs, overlay, opacity)

    def _regionOutputs(self, inputVolume, frame: Optional[int]) -> OutputNodes:
        cine = cine_of(self.currentScene, inputVolume)
        if cine is None or frame is None:
            return self.outputs(inputVolume)
        cine.show(frame)
        return shown_outputs(cine)

    def showRegion(self, inputVolume, regionId: int, frame: Optional[int] = None) -> dict:
        """Highlight region ``regionId``'s outline (of ``frame``, which a sequence's browser then
        shows); no other frame keeps a highlight."""
        outputs = self._regionOutputs(inputVolume, frame)
        self.clearRegionHighlight(inputVolume)
        show_region(self.currentScene, inputVolume, outputs, regionId)
        return next(r for r in review_rows(outputs.review) if r["region"] == regionId)

    def clearRegionHighlight(self, inputVolume) -> None:
        """Every region outline of the input's results as loaded: nothing selected (a sequence's
        outlines are one proxy: its highlight is the only one)."""
        regions = self.outputs(inputVolume).regions if inputVolume is not None else None
        if regions is not None and regions.GetDisplayNode() is not None:
            highlight_region(regions, None)

    def setRegionStatus(
        self, inputVolume, regionId: int, status: str, note: Optional[str] = None, frame: Optional[int] = None
    ) -> None:
        """Record a decision in the review of ``frame`` (a sequence's item, and its proxy when shown)."""
        cine = cine_of(self.currentScene, inputVolume)
        if cine is None or frame is None:
            set_region_status(self.outputs(inputVolume).review, regionId, status, note)
            return
        set_region_status(frame_outputs(cine, frame).review, regionId, status, note)
        if frame == cine.shown and shown_outputs(cine).review is not None:
            set_region_status(shown_outputs(cine).review, regionId, status, note)

    def exportReview(self, inputVolume, path: str) -> str:
        """The review (and, for a sequence, every frame's review and the cardiac indices) to CSV or JSON."""
        if self.isSequence(inputVolume):
            frames = {f: o for f, o in self.frameOutputs(inputVolume).items()}
            return str(export_cine_review(self.currentScene, inputVolume, frames, path))
        return str(export_review(self.outputs(inputVolume), path))

    # -- a cine's volume curves and wall table (CARDSegmentLib.cine.curves)

    def updateCineTables(self, inputVolume, tables=None):
        """Make or update the sequence's volume-curve chart and wall table after a run, from
        ``tables`` (a :class:`~CARDSegmentLib.cine.curves.CineTables` of the run's folder), else the
        last job's ``cine_tables`` when it read them; curves missing there come from the segmented
        frames' reports, marked at the indices' ED and ES. A wall table whose ED and ES frames still
        have their indices is kept when the run gave none. Returns the CineNodes (None: a plain volume)."""
        from ..cine import curves as cc

        cine = cine_of(self.currentScene, inputVolume)
        if cine is None:
            return None
        if tables is None and getattr(self.job, "input_volume", None) is inputVolume:
            tables = getattr(self.job, "cine_tables", None)
        tables = tables or cc.CineTables(wall_note="this run measured no wall thickness")
        indices = self.indices(inputVolume)
        if tables.curves is None:
            reports = {f: self.frameReport(cine, f) for f in recorded_frames(cine)}
            ed, es = (indices["ed"], indices["es"]) if indices else (None, None)
            found, _ = cc.curves_from_reports(reports, cc.frame_times_ms(cine.sequence), ed, es)
            tables = cc.CineTables(found, tables.wall, tables.curves_note, tables.wall_note)
        held = cc.read_wall_table(cc.cine_nodes(self.currentScene, inputVolume).wall)
        keep = held is not None and indices is not None and (held.ed, held.es) == (indices["ed"], indices["es"])
        scene = self.currentScene
        scene.StartState(scene.BatchProcessState)
        try:
            return cc.show_cine_tables(scene, inputVolume, tables, cine.name, cine.frame_label, keep_wall=keep)
        finally:
            scene.EndState(scene.BatchProcessState)

    def showCineCurves(self, inputVolume) -> bool:
        """Show the sequence's volume-curve chart in a plot view of the layout (and its wall table in
        a table view); False when it has none."""
        from ..cine.curves import cine_nodes, show_in_layout

        return show_in_layout(self.currentScene, cine_nodes(self.currentScene, inputVolume))

    def cineTablesText(self, inputVolume) -> str:
        """The panel's lines on the sequence's curves and wall table ("" for a plain volume or an
        unsegmented sequence)."""
        from ..cine.curves import cine_nodes, tables_lines

        if not self.isSequence(inputVolume) or not self.hasSegmentation(inputVolume):
            return ""
        return "\n".join(tables_lines(cine_nodes(self.currentScene, inputVolume)))

    # -- single-slice series of one study combined into one cine (CARDSegmentLib.cine.stack)

    def combineOffer(self, inputVolume) -> str:
        """The offer to combine the input's study's single-slice series into one cine ("" when the
        input is not one of several such series)."""
        from ..cine.stack import offer_text, study_series

        return offer_text(study_series(self.currentScene, inputVolume)) if inputVolume is not None else ""

    def combineStudySeries(self, inputVolume):
        """Build one cine of the input's study's single-slice series; returns the
        :class:`~CARDSegmentLib.cine.stack.CombinedCine`. Raises StackError (a ValueError, one
        line naming the series that disagree) when they make no stack."""
        from ..cine.stack import combine_series, plan_stack, stack_name, study_series

        plan = plan_stack(study_series(self.currentScene, inputVolume))
        with self._busy():
            return combine_series(self.currentScene, plan, stack_name(plan.series))
