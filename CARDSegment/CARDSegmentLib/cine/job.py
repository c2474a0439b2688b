"""One "Segment & Calibrate" on frames of a cine sequence, without Qt.

:class:`CineJob` has :class:`~CARDSegmentLib.runs.jobs.SegmentationJob`'s interface (start, poll,
wait, cancel, load_step, finish), so the panel's timer and :class:`~CARDSegmentLib.runs.jobs.JobMonitor`
drive it unchanged. It writes the chosen frames to a temporary folder and runs the engine once for
all of them: ``cardseg batch`` over a manifest (the model loaded once, progress per frame). When
the plan asks for the cardiac indices, the manifest marks the ED and ES frames, and the engine
writes ``subjects.csv`` with ``cardseg batch``'s own code (the same numbers as a batch's
subjects.csv); when ED or ES is to be found, it is picked after the frames are segmented
(:func:`~CARDSegmentLib.cine.sequences.pick_ed_es`) and a second, short batch run on the same folder
(every frame reused) writes the indices.

The results load a frame at a time (:meth:`CineJob.load_step`, one call per timer tick: the GUI
stays responsive); nothing replaces earlier nodes before every frame is loaded, and a failure
removes what was made. Each frame's nodes replace only that frame's earlier ones.

Each step is an engine child started and polled by :class:`~CARDSegmentLib.runs.child.ChildRuns`,
as a volume's run is: a :data:`~CARDSegmentLib.runs.child.RunFactory` makes it from the step's
:class:`~CARDSegmentLib.runs.process.BatchCommand`. The default is the one-shot ``cardseg batch``
process; the warm engine's ``Engine.run_factory`` sends the same manifest and folders to the
running ``cardseg serve`` as a ``batch`` request instead (the same code, the model already
loaded: no second engine process).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from ..runs import process as proc
from ..runs.process import BatchCommand  # noqa: F401 (the command of each step; also named here)
from ..install.bundles import bundle_classes
from .results import SUBJECT, commit_indices, indices_from_subjects, make_indices_table
from ..outputs.geometry import GEOMETRY_TOLERANCE_MM, ijk_to_ras, image_dimensions
from ..runs.child import ChildRuns, RunFactory, one_line
from ..runs.jobs import JobOptions, remove_tree
from ..outputs.loading import PendingOutputs, discard_outputs, frame_base_name, prepare_outputs
from ..outputs.nodes import OutputError, OutputNodes, all_nodes, read_report
from ..outputs.overlays import show_overlay
from .sequences import frame_outputs, record_frames, shown_outputs
from .sequences import Cine, FramePlan, lv_curve, pick_ed_es
from ..outputs.volume_files import write_volume_file

LOADED = "loaded"


def node_ids(scene) -> set:
    """The IDs of every node in ``scene``."""
    return {n.GetID() for n in all_nodes(scene)}


def grid_text(volume) -> str:
    """``56 x 64 x 3 voxels of 2.4 x 2.4 x 8 mm``: a volume's grid in words."""
    size = " x ".join(str(n) for n in (image_dimensions(volume) or (0, 0, 0)))
    spacing = np.linalg.norm(ijk_to_ras(volume)[:3, :3], axis=0)  # the IJK columns' lengths
    return f"{size} voxels of {' x '.join(f'{s:.3g}' for s in spacing)} mm"


def odd_frame(cine: Cine, frames, shown_volume) -> Optional[str]:
    """The one line naming the first of ``frames`` whose grid is not ``shown_volume``'s (the input:
    every frame's results are drawn on it), else None."""
    for frame in frames:
        volume = cine.frame_volume(frame)
        if (
            image_dimensions(volume) != image_dimensions(shown_volume)
            or np.abs(ijk_to_ras(volume) - ijk_to_ras(shown_volume)).max() > GEOMETRY_TOLERANCE_MM
        ):
            mine, shown = grid_text(volume), grid_text(shown_volume)
            where = f"{mine} against {shown}" if mine != shown else f"{mine}, placed or turned differently"
            return (
                f"{cine.frame_label(frame)} of '{shown_volume.GetName()}' is on another grid than the shown "
                f"{cine.frame_label(cine.shown)} ({where}); the frames of a sequence must share one grid"
            )
    return None


def case_name(frame: int) -> str:
    """The engine's case (and output folder) name of a frame."""
    return f"frame-{int(frame):03d}"


def write_manifest(path: Path, frames, ed: Optional[int] = None, es: Optional[int] = None) -> None:
    """``case,path,phase,subject``: one row per frame file; ED and ES marked for the indices."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["case", "path", "phase", "subject"])
        for frame in frames:
            phase = "ED" if frame == ed else "ES" if frame == es else ""
            writer.writerow([case_name(frame), f"frames/{case_name(frame)}.nrrd", phase, SUBJECT if phase else ""])


def failed_frames(
    cohort_csv: Path, describe: Callable[[object, str], str] = lambda f, error: f"frame {f}: {error}"
) -> Optional[str]:
    """``frame 2: <the engine's one line>`` (``describe(frame, line)``) for the first frame the batch's
    table marks failed (None: none)."""
    try:
        with open(cohort_csv, newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r.get("status") in ("error", "failed")]
    except OSError:
        return None
    if not rows:
        return None
    more = f" (and {len(rows) - 1} more frames)" if len(rows) > 1 else ""
    name = rows[0].get("case", "")
    frame = int(name.split("-")[-1]) if name.startswith("frame-") and name.split("-")[-1].isdigit() else name
    return f"{describe(frame, rows[0].get('error') or rows[0].get('status'))}{more}"


class CineJob:
    """Segment and calibrate the frames of ``plan`` of a cine sequence; load them frame by frame."""

    def __init__(
        self,
        scene,
        input_volume,
        cine: Cine,
        plan: FramePlan,
        options: Optional[JobOptions] = None,
        launcher: Optional[proc.Launcher] = None,
        on_progress: Optional[Callable] = None,
        run_factory: Optional[RunFactory] = None,
    ):
        self.scene, self.input_volume, self.cine, self.plan = scene, input_volume, cine, plan
        self.options = options or JobOptions()
        self.launcher, self.on_progress = launcher, on_progress
        self.children = ChildRuns(run_factory, launcher, self.cleanup, self._fail)  # the steps' engine children
        self.work_dir: Optional[Path] = None
        self.ed, self.es = plan.ed, plan.es
        self.outputs: Dict[int, OutputNodes] = {}
        self._pending: List[PendingOutputs] = []
        self._indices_table = None
        self._classes: Optional[list] = None
        self._made: set = set()  # IDs of every node the load steps made (pending outputs, their displays, ...)
        self._error: Optional[str] = None
        self._state = proc.IDLE
        self._loading = 0

    # -- state (as SegmentationJob)

    @property
    def state(self) -> str:
        return self._state

    @property
    def run(self):
        """The current step's run (a CardsegRun or an EngineRun; None before the start)."""
        return self.children.run

    @property
    def runs(self) -> list:
        """Every step's run so far, the current one last."""
        return self.children.runs

    @property
    def error(self) -> Optional[str]:
        """The one-line error; a temporary path in it reads as what it held (the files are gone)."""
        return proc.name_paths(self._error or self.children.error, self._path_names())

    def _label(self, frame) -> str:
        """``frame 3 (120 ms) of 'SAX cine'``."""
        return f"{self.cine.frame_label(frame)} of '{self.input_volume.GetName()}'"

    def _path_names(self) -> Dict[str, str]:
        """This job's temporary files and folders and what they held."""
        if self.work_dir is None:
            return {}
        names = {str(self.output_dir): f"the results of '{self.input_volume.GetName()}'"}
        for frame in self.plan.frames:
            names[str(self.work_dir / "frames" / f"{case_name(frame)}.nrrd")] = self._label(frame)
            names[str(self.frame_dir(frame))] = f"the results of {self._label(frame)}"
        return names

    def _frame_error(self, frame, error: str) -> str:
        """``frame 1 (40 ms) of 'cine': <error>``, the frame's file (named in the error) not named twice."""
        label = self._label(frame) if isinstance(frame, int) else f"frame {frame}"
        named = proc.name_paths(error, self._path_names())
        return named if named.startswith(label) else f"{label}: {named}"

    @property
    def progress(self) -> proc.Progress:
        if self._state == proc.SUCCEEDED:
            return proc.Progress("loading", self._loading, len(self.plan.frames), 1.0)
        if len(self.runs) > 1:
            return proc.Progress("indices", 0, 0, 1.0)
        return self.children.progress

    @property
    def output_dir(self) -> Optional[Path]:
        return self.work_dir / "output" if self.work_dir else None

    def frame_dir(self, frame: int) -> Path:
        return self.output_dir / case_name(frame)

    # -- steps

    def start(self) -> None:
        """Write the frames and the manifest, start the engine (the scene is not changed)."""
        if self._state != proc.IDLE:
            raise RuntimeError("this job was already started")
        odd = odd_frame(self.cine, self.plan.frames, self.input_volume)
        if odd:
            self._fail(odd)
            return
        try:
            self.options.check()
            proc.sweep_orphaned_work_dirs(remove_tree, self.options.work_root)  # what a crashed Slicer left
            self.work_dir = proc.make_work_dir(self.options.work_root)
            (self.work_dir / "frames").mkdir()
            for frame in self.plan.frames:
                write_volume_file(self.cine.frame_volume(frame), self.work_dir / "frames" / f"{case_name(frame)}.nrrd")
            known = self.plan.indices and not self.plan.find_ed_es
            write_manifest(self.work_dir / "manifest.csv", self.plan.frames, *((self.ed, self.es) if known else ()))
        except Exception as exc:  # noqa: BLE001 - the run's one-line error
            self._fail(one_line(exc))
            return
        self._start_run(self.work_dir / "manifest.csv", self.on_progress)

    def _start_run(self, manifest: Path, on_progress) -> None:
        command = self.options.command(manifest, self.output_dir, kind=BatchCommand)
        self._state = proc.RUNNING
        if self.children.start(command, on_progress) == proc.FAILED:
            self._state = proc.FAILED

    def poll(self) -> str:
        """Advance; ``succeeded`` means the frames (and indices) are ready to load."""
        if self._state != proc.RUNNING or self.run is None:
            return self._state
        state = self.children.poll(self._ended)
        if state in (proc.FAILED, proc.CANCELLED):
            self._state = state
        elif state == proc.SUCCEEDED:
            try:
                self._after_segmentation()
            except Exception as exc:  # noqa: BLE001
                self._fail(one_line(exc))
        return self._state

    def _ended(self, state: str) -> None:
        """A step failed: the frame that failed, from the batch's table (before the folder goes)."""
        if state == proc.FAILED:
            self._error = failed_frames(self.output_dir / "cohort.csv", self._frame_error) or self.run.error

    def _after_segmentation(self) -> None:
        """The frames are segmented: pick ED/ES when asked (then a second run writes the indices)."""
        if len(self.runs) > 1 or not self.plan.find_ed_es:
            self._state = proc.SUCCEEDED
            return
        reports = {f: read_report(self.frame_dir(f) / "report.json") for f in self.plan.frames}
        self.ed, self.es = pick_ed_es(lv_curve(reports), self.plan.ed, self.plan.es)
        manifest = self.work_dir / "manifest-ed-es.csv"
        write_manifest(manifest, self.plan.frames, self.ed, self.es)
        self._start_run(manifest, None)
        self._report_progress()

    def _report_progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def wait(self, timeout: Optional[float] = None) -> str:
        """Poll until the engine is done (scripts, tests)."""
        while self._state == proc.RUNNING:
            self.run.wait(timeout)
            self.poll()
        return self._state

    def abort(self, message: str) -> None:
        try:
            self.children.stop()
        finally:
            self._discard()
            self._fail(message)

    def cancel(self, background: Optional[Callable] = None) -> None:
        """End the process, remove what was loaded so far, delete the files; the scene is as it was."""
        if self._state == LOADED:
            return
        if self._state in (proc.IDLE, proc.RUNNING, proc.SUCCEEDED):
            self._state = proc.CANCELLED
        self._discard()
        self.children.cancel(background)

    def load_step(self) -> bool:
        """Load one frame (then the indices, then put everything in place); True when done."""
        if self._state != proc.SUCCEEDED:
            raise RuntimeError(f"nothing to load: the run is {self._state}")
        before = node_ids(self.scene)  # between two steps the user may add nodes: those are not ours
        try:
            if self._loading == 0 and self.options.bundle_path:
                self._classes = bundle_classes(self.options.bundle_path)
            if self._loading < len(self.plan.frames):
                frame = self.plan.frames[self._loading]
                self._pending.append(
                    prepare_outputs(
                        self.scene,
                        self.input_volume,
                        self.frame_dir(frame),
                        self._classes,
                        self.options.load_probabilities,
                        base_name=frame_base_name(self.cine.name, frame),
                        frame=frame,
                    )
                )
                self._loading += 1
                self._made |= node_ids(self.scene) - before
                self._report_progress()
                return False
            if self.plan.indices:
                indices = indices_from_subjects(self.output_dir / "subjects.csv", self.ed, self.es)
                self._indices_table = make_indices_table(self.scene, self.input_volume, indices, self.cine.name)
            self._commit()
        except Exception as exc:  # noqa: BLE001 - the scene as before, one line says why
            message = one_line(exc)
            self._made |= node_ids(self.scene) - before
            self._discard()
            self._fail(message)
            raise OutputError(message) from exc
        self.cleanup()
        self._state = LOADED
        return True

    def finish(self) -> Dict[int, OutputNodes]:
        """Load everything at once (scripts, tests); ``{frame: outputs}``."""
        while not self.load_step():
            pass
        return self.outputs

    def _commit(self) -> None:
        """Record the loaded frames in the result sequences and put the indices in place, in one
        batch of scene changes; then show the overlay of the shown frame (through the proxies)."""
        frames = {pending.frame: pending.new for pending in self._pending}
        self.scene.StartState(self.scene.BatchProcessState)  # observers hear of the frames' commit once
        try:
            held = record_frames(self.scene, self.cine, self.input_volume, frames)
            commit_indices(
                self.scene, self.input_volume, self._indices_table, replaced=list(frames), base_name=self.cine.name
            )
        finally:
            self.scene.EndState(self.scene.BatchProcessState)
        shown = shown_outputs(self.cine, held)
        if shown.segmentation is not None:
            show_overlay(self.scene, self.input_volume, shown, self.options.overlay, self.options.opacity)
        self.outputs = {f: frame_outputs(self.cine, f, held) for f in frames}
        self._pending, self._indices_table, self._made = [], None, set()

    def _discard(self) -> None:
        for pending in self._pending:
            discard_outputs(self.scene, pending)
        if self._indices_table is not None:
            discard_outputs(self.scene, PendingOutputs(OutputNodes(indices=self._indices_table), {}))
        self._pending, self._indices_table = [], None
        for node_id in sorted(self._made):  # what else the steps made (a volume's display, a colour legend)
            node = self.scene.GetNodeByID(node_id)
            if node is not None:
                self.scene.RemoveNode(node)
        self._made = set()

    def cleanup(self) -> None:
        if self.work_dir is not None and not self.options.keep_files:
            remove_tree(self.work_dir)

    def _fail(self, message: str) -> None:
        self._state = proc.FAILED
        self._error = message
        self.cleanup()
