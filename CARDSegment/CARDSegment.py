"""CARDSegment: cardiac cine MRI segmentation with calibrated confidence (CARD) in 3D Slicer.

The module is thin on purpose: the method is the ``cardseg`` engine (shipped in the module
folder), run in a separate PythonSlicer process so that the GUI never freezes; the MRML work
(outputs to nodes, overlays, the region review) lives in ``CARDSegmentLib``, which has no Qt and
is tested outside Slicer. This file holds the four Slicer classes: Module, Widget, Logic, Test.
"""

import enum
import importlib
import logging
import os
import tempfile
from typing import Annotated, Callable, Optional

import qt
import vtk

import slicer
from slicer import vtkMRMLScalarVolumeNode
from slicer.parameterNodeWrapper import WithinRange, parameterNodeWrapper
from slicer.ScriptedLoadableModule import (ScriptedLoadableModule, ScriptedLoadableModuleLogic,
                                           ScriptedLoadableModuleTest, ScriptedLoadableModuleWidget)
from slicer.util import VTKObservationMixin

import CARDSegmentLib as lib
from CARDSegmentLib import dependencies as deps

POLL_INTERVAL_MS = 200


#
# CARDSegment
#


class CARDSegment(ScriptedLoadableModule):
    """Module description shown by Slicer."""

    def __init__(self, parent):
        ScriptedLoadableModule.__init__(self, parent)
        self.parent.title = "CARDSegment"
        self.parent.categories = ["Segmentation"]
        self.parent.dependencies = []  # the PyTorch extension is needed on first use only
        self.parent.contributors = ["CARDSegment authors"]
        self.parent.helpText = (
            "Segments the ventricles and myocardium in a short-axis cine MRI volume with a categorical "
            "diffusion model, and shows where not to trust it: a small reference network runs along the "
            "model's own reverse trajectory, and where the two disagree the confidence is lowered (CARD). "
            "Results: a segmentation, the disagreement and temperature maps as overlays with colour "
            "legends, the volume's agreement score, and a ranked list of flagged regions to review. "
            "Research software, not a medical device."
        )
        self.parent.acknowledgementText = (
            "CARD: Calibration via Agreement in Reverse Diffusion. The segmentation runs in a separate "
            "process; nothing leaves this computer."
        )


#
# Parameters
#


class BundleSource(enum.Enum):
    SHIPPED = "shipped"
    FOLDER = "folder"

    def label(self):
        return {"shipped": "Shipped default (ACDC)", "folder": "Bundle folder"}[self.value]


class Device(enum.Enum):
    AUTO = "auto"
    GPU = "cuda"
    CPU = "cpu"

    def label(self):
        return {"auto": "Automatic", "cuda": "GPU (CUDA)", "cpu": "CPU"}[self.value]


class Method(enum.Enum):
    CARD = "card"
    UNCALIBRATED = "uc"

    def label(self):
        return {"card": "CARD (calibrated)", "uc": "Uncalibrated (primary only)"}[self.value]


class Overlay(enum.Enum):
    DISAGREEMENT = "disagreement"
    TEMPERATURE = "temperature"
    NONE = "none"

    def label(self):
        return {"disagreement": "Disagreement", "temperature": "Temperature", "none": "None"}[self.value]


@parameterNodeWrapper
class CARDSegmentParameterNode:
    """The panel's state, saved with the scene and bound to the GUI (SlicerParameterName in the .ui)."""

    inputVolume: vtkMRMLScalarVolumeNode
    bundleSource: BundleSource = BundleSource.SHIPPED
    # a plain string, bound by hand (onBundleFolderChanged): a pathlib.Path field would show an
    # unset folder as "." in the path box
    bundleFolder: str = ""
    device: Device = Device.AUTO
    method: Method = Method.CARD
    loadProbabilities: bool = False
    overlay: Overlay = Overlay.DISAGREEMENT
    overlayOpacity: Annotated[float, WithinRange(0.0, 1.0)] = 0.5


class DependencyDeclined(RuntimeError):
    """Nothing was installed: the user said no, or the installed PyTorch must be replaced by hand first."""


#
# CARDSegmentWidget
#


class CARDSegmentWidget(ScriptedLoadableModuleWidget, VTKObservationMixin):
    """The panel: binds the parameters, starts and cancels runs, shows results. No method code."""

    REGION_COLUMNS = ("#", "Status", "Volume (ml)", "Mean disagr.", "Classes")

    def __init__(self, parent=None) -> None:
        ScriptedLoadableModuleWidget.__init__(self, parent)
        VTKObservationMixin.__init__(self)
        self.logic = None
        self._parameterNode = None
        self._parameterNodeGuiTag = None
        self._shownOverlay = None
        self._preparing = False  # checking or installing the Python packages before a run

    def setup(self) -> None:
        ScriptedLoadableModuleWidget.setup(self)
        uiWidget = slicer.util.loadUI(self.resourcePath("UI/CARDSegment.ui"))
        self.layout.addWidget(uiWidget)
        self.ui = slicer.util.childWidgetVariables(uiWidget)
        uiWidget.setMRMLScene(slicer.mrmlScene)

        self.logic = CARDSegmentLogic()

        self.ui.progressBar.hide()
        self.ui.regionsTable.setColumnCount(len(self.REGION_COLUMNS))
        self.ui.regionsTable.setHorizontalHeaderLabels(list(self.REGION_COLUMNS))
        self.ui.regionsTable.horizontalHeader().setStretchLastSection(True)
        self.ui.regionsTable.verticalHeader().hide()

        self.addObserver(slicer.mrmlScene, slicer.mrmlScene.StartCloseEvent, self.onSceneStartClose)
        self.addObserver(slicer.mrmlScene, slicer.mrmlScene.EndCloseEvent, self.onSceneEndClose)

        self.ui.applyButton.connect("clicked(bool)", self.onApplyButton)
        self.ui.bundleFolderPathLineEdit.connect("currentPathChanged(QString)", self.onBundleFolderChanged)
        self.ui.regionsTable.connect("itemSelectionChanged()", self.onRegionSelected)
        self.ui.acceptButton.connect("clicked(bool)", lambda _: self.onSetStatus("accepted"))
        self.ui.correctedButton.connect("clicked(bool)", lambda _: self.onSetStatus("corrected"))
        self.ui.rejectButton.connect("clicked(bool)", lambda _: self.onSetStatus("rejected"))
        self.ui.exportButton.connect("clicked(bool)", self.onExportButton)
        self.ui.keepResultsButton.connect("clicked(bool)", self.onKeepResults)

        self.initializeParameterNode()

    def cleanup(self) -> None:
        if self.logic is not None:
            self.logic.cancel()
        self.removeObservers()

    def enter(self) -> None:
        self.initializeParameterNode()

    def exit(self) -> None:
        if self._parameterNode:
            self._parameterNode.disconnectGui(self._parameterNodeGuiTag)
            self._parameterNodeGuiTag = None
            self.removeObserver(self._parameterNode, vtk.vtkCommand.ModifiedEvent, self._onParameterNodeModified)

    def onSceneStartClose(self, caller, event) -> None:
        if self.logic is not None:
            self.logic.cancel()
        self.setParameterNode(None)

    def onSceneEndClose(self, caller, event) -> None:
        if self.parent.isEntered:
            self.initializeParameterNode()

    def initializeParameterNode(self) -> None:
        self.setParameterNode(self.logic.getParameterNode())
        if not self._parameterNode.inputVolume:
            first = slicer.mrmlScene.GetFirstNodeByClass("vtkMRMLScalarVolumeNode")
            if first:
                self._parameterNode.inputVolume = first

    def setParameterNode(self, inputParameterNode: Optional[CARDSegmentParameterNode]) -> None:
        if self._parameterNode:
            self._parameterNode.disconnectGui(self._parameterNodeGuiTag)
            self.removeObserver(self._parameterNode, vtk.vtkCommand.ModifiedEvent, self._onParameterNodeModified)
        self._parameterNode = inputParameterNode
        self._shownOverlay = None
        if self._parameterNode:
            self._parameterNodeGuiTag = self._parameterNode.connectGui(self.ui)
            self.addObserver(self._parameterNode, vtk.vtkCommand.ModifiedEvent, self._onParameterNodeModified)
            self._onParameterNodeModified()

    # -- reacting to the parameters

    def _onParameterNodeModified(self, caller=None, event=None) -> None:
        p = self._parameterNode
        if p is None:
            return
        running = self.logic.isRunning
        self.ui.applyButton.enabled = not self._preparing and (running or bool(p.inputVolume))
        folderBox = self.ui.bundleFolderPathLineEdit
        folderBox.enabled = p.bundleSource == BundleSource.FOLDER and not running and not self._preparing
        shownFolder = lib.folder_text(p.bundleFolder)
        if folderBox.currentPath != shownFolder:
            folderBox.currentPath = shownFolder
        shown = (p.inputVolume.GetID() if p.inputVolume else None, p.overlay, p.overlayOpacity)
        if shown != self._shownOverlay:
            inputChanged = self._shownOverlay is None or shown[0] != self._shownOverlay[0]
            self._shownOverlay = shown
            if inputChanged:
                self.refreshResults()
            elif p.inputVolume:
                self.logic.showOverlay(p.inputVolume, p.overlay.value, p.overlayOpacity)

    def onBundleFolderChanged(self, path: str) -> None:
        """The folder box changed: store it ("" when empty, never ".")."""
        p = self._parameterNode
        text = lib.folder_text(path)
        if p is not None and p.bundleFolder != text:
            p.bundleFolder = text

    # -- running

    def onApplyButton(self) -> None:
        """Start a run (after the package check), or cancel the running one."""
        if self.logic.isRunning:
            self.logic.cancel()
            return
        if self._preparing:  # pip processes GUI events while it installs: ignore clicks meanwhile
            return
        p = self._parameterNode
        if not p or not p.inputVolume:
            return
        try:
            options = self.logic.jobOptions(p)
        except lib.BundleChoiceError as exc:
            slicer.util.errorDisplay(f"Cannot use this bundle: {exc}")
            return
        if p.bundleSource == BundleSource.FOLDER:
            self.ui.bundleFolderPathLineEdit.addCurrentPathToHistory()
        self._setPreparing(True)  # before anything can install: a second click must not start a second install
        try:
            ready = self._prepareRun(p)
        finally:
            self._setPreparing(False)
        if ready:
            self._setRunning(True)
            self.logic.start(p.inputVolume, options, onProgress=self._onProgress, onFinished=self._onFinished)

    def _prepareRun(self, p) -> bool:
        """Check (and, after asking, install) the packages; ask before replacing reviewed results."""
        try:
            self.logic.ensureDependencies(askConfirmation=True)
        except DependencyDeclined as exc:
            self.ui.statusLabel.text = str(exc)
            slicer.util.warningDisplay(str(exc), windowTitle="CARDSegment")
            return False
        except Exception as exc:
            logging.exception("CARDSegment: installing dependencies failed")
            message = f"Installing the Python packages failed: {lib.one_line(exc)}"
            self.ui.statusLabel.text = message
            slicer.util.errorDisplay(message, windowTitle="CARDSegment")
            return False
        previous = self.logic.outputs(p.inputVolume)
        if previous.review is not None and lib.has_decisions(previous.review):
            return bool(slicer.util.confirmOkCancelDisplay(
                "This volume's regions have review decisions. A new run replaces the results and the review "
                "(use 'Keep these results' first to keep them). Continue?", windowTitle="CARDSegment"))
        return True

    def _setPreparing(self, preparing: bool) -> None:
        """While the packages are checked or installed: button and inputs disabled."""
        self._preparing = preparing
        self.ui.inputsCollapsibleButton.enabled = not preparing
        if preparing:
            self.ui.applyButton.enabled = False
            self.ui.statusLabel.text = "Checking the Python packages the engine needs..."
        else:
            self._onParameterNodeModified()

    def _setRunning(self, running: bool) -> None:
        self.ui.applyButton.text = "Cancel" if running else "Segment && Calibrate"
        self.ui.applyButton.enabled = True
        self.ui.progressBar.setVisible(running)
        self.ui.progressBar.value = 0
        self.ui.inputsCollapsibleButton.enabled = not running
        if running:
            self.ui.statusLabel.text = "Starting the segmentation process..."

    def _onProgress(self, progress: "lib.Progress") -> None:
        self.ui.progressBar.value = int(round(progress.fraction * self.ui.progressBar.maximum))
        self.ui.statusLabel.text = progress.text

    def _onFinished(self, state: str, error: Optional[str]) -> None:
        """The run ended: the panel returns to idle first, whatever happens next."""
        self._setRunning(False)
        try:
            self._onParameterNodeModified()
            if state == "loaded":
                self.ui.statusLabel.text = "Done."
                self.refreshResults()
                return
            if state == lib.CANCELLED:
                self.ui.statusLabel.text = "Cancelled: the scene was not changed."
                return
        except Exception as exc:  # showing the results failed: say so in one line
            logging.exception("CARDSegment: showing the results failed")
            state, error = lib.FAILED, lib.one_line(exc)
        self.ui.statusLabel.text = f"Failed: {error}"
        slicer.util.errorDisplay(f"Segmentation failed: {error}", windowTitle="CARDSegment")

    # -- results and review

    def refreshResults(self) -> None:
        p = self._parameterNode
        volume = p.inputVolume if p else None
        outputs = self.logic.outputs(volume) if volume else lib.OutputNodes()
        summary = lib.agreement_summary(outputs.report_dict() if outputs.report else None)
        self.ui.agreementLabel.text = summary.text
        self.ui.agreementLabel.setStyleSheet("color: #c0392b; font-weight: bold;" if summary.warning else "")
        self.ui.keepResultsButton.enabled = outputs.segmentation is not None
        self.ui.exportButton.enabled = outputs.review is not None
        self._fillRegionsTable(lib.review_rows(outputs.review))
        if volume is not None and outputs.segmentation is not None:
            self.logic.showOverlay(volume, p.overlay.value, p.overlayOpacity)

    def _fillRegionsTable(self, rows) -> None:
        table = self.ui.regionsTable
        table.blockSignals(True)
        table.clearContents()
        table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            values = (str(row["region"]), row["status"], f"{row['volume_mm3'] / 1000.0:.2f}",
                      f"{row['mean_disagreement']:.3f}", row["classes"])
            for c, text in enumerate(values):
                item = qt.QTableWidgetItem(text)
                if c == 0:
                    item.setData(qt.Qt.UserRole, row["region"])
                if row["note"]:
                    item.setToolTip(row["note"])
                table.setItem(r, c, item)
        table.blockSignals(False)
        self._enableReviewButtons(False)

    def _selectedRegion(self) -> Optional[int]:
        items = self.ui.regionsTable.selectedItems()
        if not items:
            return None
        first = self.ui.regionsTable.item(items[0].row(), 0)
        return int(first.text()) if first else None

    def _enableReviewButtons(self, enabled: bool) -> None:
        for w in (self.ui.acceptButton, self.ui.correctedButton, self.ui.rejectButton, self.ui.noteLineEdit):
            w.enabled = enabled

    def onRegionSelected(self) -> None:
        region = self._selectedRegion()
        self._enableReviewButtons(region is not None)
        if region is None:
            return
        with slicer.util.tryWithErrorDisplay("Cannot show the region.", waitCursor=True):
            row = self.logic.showRegion(self._parameterNode.inputVolume, region)
            self.ui.noteLineEdit.text = row.get("note", "")

    def onSetStatus(self, status: str) -> None:
        region = self._selectedRegion()
        if region is None:
            return
        rowIndex = self.ui.regionsTable.selectedItems()[0].row()
        with slicer.util.tryWithErrorDisplay("Cannot record the decision.", waitCursor=False):
            self.logic.setRegionStatus(self._parameterNode.inputVolume, region, status, self.ui.noteLineEdit.text)
            self.ui.regionsTable.item(rowIndex, 1).setText(status)

    def onExportButton(self) -> None:
        volume = self._parameterNode.inputVolume
        if volume is None:
            return
        default = os.path.join(qt.QDir.homePath(), f"{volume.GetName()}-CARD-review.csv")
        path = qt.QFileDialog.getSaveFileName(
            slicer.util.mainWindow(), "Export review", default, "CSV (*.csv);;JSON (*.json)")
        if not path:
            return
        with slicer.util.tryWithErrorDisplay("Export failed.", waitCursor=True):
            written = self.logic.exportReview(volume, path)
            self.ui.statusLabel.text = f"Review exported to {written}"

    def onKeepResults(self) -> None:
        volume = self._parameterNode.inputVolume
        if volume is None:
            return
        count = lib.release_outputs(slicer.mrmlScene, volume)
        self.ui.statusLabel.text = f"Kept {count} result nodes; the next run makes new ones."
        self.refreshResults()


#
# CARDSegmentLogic
#


class CARDSegmentLogic(ScriptedLoadableModuleLogic):
    """Starts and polls runs (QTimer) and calls CARDSegmentLib for everything in the scene."""

    def __init__(self) -> None:
        ScriptedLoadableModuleLogic.__init__(self)
        self.moduleDir = os.path.dirname(os.path.abspath(__file__))
        self.job: Optional["lib.SegmentationJob"] = None
        self._monitor: Optional["lib.JobMonitor"] = None
        self._timer: Optional[qt.QTimer] = None
        self._onProgress: Optional[Callable] = None
        self._onFinished: Optional[Callable] = None
        self.launcher = None  # tests may inject a fake process launcher

    def getParameterNode(self):
        return CARDSegmentParameterNode(super().getParameterNode())

    # -- options and dependencies

    def bundlePath(self, parameterNode) -> str:
        return str(lib.resolve_bundle(parameterNode.bundleSource == BundleSource.SHIPPED,
                                      parameterNode.bundleFolder, self.moduleDir))

    def jobOptions(self, parameterNode) -> "lib.JobOptions":
        return lib.JobOptions(
            bundle_path=self.bundlePath(parameterNode),
            device=parameterNode.device.value,
            method=parameterNode.method.value,
            load_probabilities=parameterNode.loadProbabilities,
            overlay=parameterNode.overlay.value,
            opacity=parameterNode.overlayOpacity,
            engine_dir=self.moduleDir,
        )

    @staticmethod
    def ensureDependencies(askConfirmation: bool = True) -> None:
        """Install what the engine needs, after asking: torch via PyTorchUtils, the rest via pip."""
        missing = deps.missing_requirements()
        if not missing:
            return
        tooOld = deps.torch_too_old()
        if tooOld:  # an old torch cannot be replaced in a running Slicer: say what to do
            raise DependencyDeclined(tooOld)
        if askConfirmation and not slicer.util.confirmOkCancelDisplay(deps.describe(missing),
                                                                      windowTitle="CARDSegment"):
            raise DependencyDeclined(
                "Nothing was installed, so CARDSegment cannot segment yet. It needs: "
                + ", ".join(r.pip_spec for r in missing)
                + ". Click 'Segment & Calibrate' again to install them.")
        if any(r.module == "torch" for r in missing):
            try:
                import PyTorchUtils
            except ModuleNotFoundError:
                raise RuntimeError("CARDSegment needs the PyTorch extension: install it with the Extensions Manager, "
                                   "restart Slicer and try again.") from None
            torchLogic = PyTorchUtils.PyTorchUtilsLogic()
            if not torchLogic.torchInstalled():
                with slicer.util.WaitCursor():
                    torch = torchLogic.installTorch(askConfirmation=False,
                                                    torchVersionRequirement=deps.torch_version_requirement())
                if torch is None:
                    raise DependencyDeclined("PyTorch was not installed, so CARDSegment cannot segment yet.")
        others = deps.pip_specs(missing)  # the installed torch pinned: pip must not replace it
        if others:
            with slicer.util.WaitCursor():
                slicer.util.pip_install(others)
        importlib.invalidate_caches()
        still = deps.missing_requirements()
        if still:
            raise RuntimeError("still missing after installation: " + ", ".join(r.pip_spec for r in still))

    # -- running

    @property
    def isRunning(self) -> bool:
        return self._monitor is not None and not self._monitor.finished

    def start(self, inputVolume, options: "lib.JobOptions", onProgress: Optional[Callable] = None,
              onFinished: Optional[Callable] = None) -> None:
        """Start a run in a separate process; a QTimer polls it; the scene changes only at the end.

        ``onFinished(state, error)`` is called exactly once: state ``loaded``, ``failed`` (with a
        one-line error, whatever went wrong) or ``cancelled``.
        """
        if self.isRunning:
            raise RuntimeError("a segmentation is already running")
        self._onProgress, self._onFinished = onProgress, onFinished
        self.job = lib.SegmentationJob(slicer.mrmlScene, inputVolume, options, launcher=self.launcher,
                                       on_progress=onProgress)
        self._monitor = lib.JobMonitor(self.job, busy=slicer.util.WaitCursor)
        if self._monitor.start():
            self._finished()
            return
        self._timer = qt.QTimer()
        self._timer.setInterval(POLL_INTERVAL_MS)
        self._timer.connect("timeout()", self._poll)
        self._timer.start()

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

    def runSync(self, inputVolume, options: "lib.JobOptions", timeout: float = 1800.0) -> "lib.OutputNodes":
        """Run to the end and load the results (scripts and the self-test); raises on failure."""
        job = lib.SegmentationJob(slicer.mrmlScene, inputVolume, options, launcher=self.launcher)
        job.start()
        state = job.wait(timeout)
        if state != lib.SUCCEEDED:
            raise RuntimeError(f"segmentation {state}: {job.error}")
        return job.finish()

    # -- results

    @staticmethod
    def outputs(inputVolume) -> "lib.OutputNodes":
        return lib.find_outputs(slicer.mrmlScene, inputVolume)

    def showOverlay(self, inputVolume, overlay: str, opacity: float) -> None:
        outputs = self.outputs(inputVolume)
        if outputs.segmentation is not None:
            lib.show_overlay(slicer.mrmlScene, inputVolume, outputs, overlay, opacity)

    def showRegion(self, inputVolume, regionId: int) -> dict:
        outputs = self.outputs(inputVolume)
        lib.show_region(slicer.mrmlScene, inputVolume, outputs, regionId)
        return next(r for r in lib.review_rows(outputs.review) if r["region"] == regionId)

    def setRegionStatus(self, inputVolume, regionId: int, status: str, note: Optional[str] = None) -> None:
        lib.set_region_status(self.outputs(inputVolume).review, regionId, status, note)

    def exportReview(self, inputVolume, path: str) -> str:
        return str(lib.export_review(self.outputs(inputVolume), path))


#
# CARDSegmentTest
#


class CARDSegmentTest(ScriptedLoadableModuleTest):
    """Runs in Slicer: a small synthetic oblique volume through the whole path, with networks of the
    shipped bundle's architecture (SwinUNETR primary, so a missing MONAI piece fails here), then
    once with the shipped bundle itself."""

    #: the shipped bundle's networks, used when the module folder has no shipped bundle
    SHIPPED_NETWORKS = ("time-swinunetr:mini", "time-unet:tiny")

    def setUp(self):
        slicer.mrmlScene.Clear()

    def runTest(self):
        self.setUp()
        self.test_segment_synthetic_volume()
        self.setUp()
        self.test_shipped_bundle()

    @staticmethod
    def _moduleDir() -> str:
        return os.path.dirname(os.path.abspath(__file__))

    def _shippedNetworks(self):
        """"arch:size" of the shipped bundle's primary and reference networks."""
        shipped = lib.shipped_bundle_dir(self._moduleDir())
        if not (shipped / "bundle.json").is_file():
            return self.SHIPPED_NETWORKS
        networks = lib.bundle_config(shipped)["networks"]
        return tuple(f"{networks[role]['arch']}:{networks[role]['size']}" for role in ("primary", "reference"))

    def _makeInputs(self, folder: str):
        """An untrained bundle with the shipped bundle's networks and a synthetic oblique volume,
        written by the engine in PythonSlicer."""
        import subprocess

        script = (
            "import sys, numpy as np, SimpleITK as sitk\n"
            "from cardseg.scaffold import init_bundle, synthetic_cine_volume\n"
            "from cardseg.bundle import update_config\n"
            "out, primary, reference = sys.argv[1:4]\n"
            "init_bundle(out + '/bundle', primary=primary, reference=reference, input_size=64,\n"
            "            pixel_spacing_mm=3.0, seed=1)\n"
            "update_config(out + '/bundle', {'regions': {'flag_threshold': 0.05, 'min_voxels': 5}})\n"
            "vol, _ = synthetic_cine_volume(shape=(3, 64, 56), spacing=(2.5, 2.2, 8.0), seed=3)\n"
            "img = vol.to_image()\n"
            "img.SetDirection(np.asarray(sitk.VersorTransform((0.3, -0.5, 0.8), 0.6).GetMatrix()).tolist())\n"
            "img.SetOrigin((-40.5, 12.25, 7.0))\n"
            "sitk.WriteImage(img, out + '/input.nrrd')\n"
        )
        from CARDSegmentLib.process import default_python_executable

        primary, reference = self._shippedNetworks()
        env = lib.SegmentCommand("", "", engine_dir=self._moduleDir()).env()
        subprocess.run([default_python_executable(), "-c", script, folder, primary, reference], env=env, check=True,
                       timeout=600)
        return os.path.join(folder, "bundle"), os.path.join(folder, "input.nrrd")

    def _skipWhenPackagesMissing(self) -> bool:
        missing = deps.missing_requirements()
        if missing:
            self.delayDisplay("Skipped: install " + ", ".join(r.pip_spec for r in missing) + " first")
        return bool(missing)

    def test_segment_synthetic_volume(self):
        if self._skipWhenPackagesMissing():
            return
        self.delayDisplay("Making a synthetic volume and an untrained bundle with the shipped networks")
        folder = tempfile.mkdtemp(prefix="CARDSegmentTest-")
        bundle, volumePath = self._makeInputs(folder)
        primary = lib.bundle_config(bundle)["networks"]["primary"]
        self.assertEqual(f"{primary['arch']}:{primary['size']}", self._shippedNetworks()[0])
        volume = slicer.util.loadVolume(volumePath)
        other = slicer.mrmlScene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "unrelated")
        before = vtk.vtkMatrix4x4()
        volume.GetIJKToRASMatrix(before)
        inputMTime = volume.GetImageData().GetMTime()

        logic = CARDSegmentLogic()
        options = lib.JobOptions(bundle_path=bundle, device="cpu", method="card", load_probabilities=True,
                                 engine_dir=logic.moduleDir)
        self.delayDisplay("Segmenting (separate process)")
        outputs = logic.runSync(volume, options, timeout=900)

        self.assertEqual(outputs.segmentation.GetClassName(), "vtkMRMLSegmentationNode")
        names = [outputs.segmentation.GetSegmentation().GetNthSegment(i).GetName()
                 for i in range(outputs.segmentation.GetSegmentation().GetNumberOfSegments())]
        self.assertEqual(names, [c["name"] for c in lib.bundle_classes(bundle)[1:]])
        for node in (outputs.disagreement, outputs.temperature, outputs.probabilities):
            m = vtk.vtkMatrix4x4()
            node.GetIJKToRASMatrix(m)
            for r in range(4):
                for c in range(4):
                    self.assertAlmostEqual(m.GetElement(r, c), before.GetElement(r, c), places=9)
        display = outputs.disagreement.GetDisplayNode()
        self.assertAlmostEqual(display.GetWindowLevelMin(), 0.0)
        self.assertAlmostEqual(display.GetWindowLevelMax(), 0.6931471805599453, places=6)
        self.assertTrue(display.GetApplyThreshold())  # the low end is transparent
        self.assertIsNotNone(outputs.review)
        summary = lib.agreement_summary(outputs.report_dict())
        self.assertIsNotNone(summary.agreement)

        self.delayDisplay("Re-running replaces this module's outputs only")
        old = [n.GetID() for n in outputs.nodes()]
        again = logic.runSync(volume, options, timeout=900)
        for nodeID in old:
            self.assertIsNone(slicer.mrmlScene.GetNodeByID(nodeID))
        self.assertTrue(slicer.mrmlScene.IsNodePresent(other))
        self.assertTrue(slicer.mrmlScene.IsNodePresent(volume))
        self.assertEqual(volume.GetImageData().GetMTime(), inputMTime)
        if lib.review_rows(again.review):
            region = lib.review_rows(again.review)[0]["region"]
            lib.show_region(slicer.mrmlScene, volume, again, region)
            lib.set_region_status(again.review, region, "accepted")
        self.delayDisplay("CARDSegment test passed")

    def test_shipped_bundle(self):
        """The shipped default bundle itself (trained weights) segments the synthetic volume."""
        if self._skipWhenPackagesMissing():
            return
        shipped = lib.shipped_bundle_dir(self._moduleDir())
        if not (shipped / "bundle.json").is_file():
            self.delayDisplay("Skipped: this version ships no default bundle")
            return
        self.delayDisplay("Segmenting with the shipped bundle (separate process)")
        folder = tempfile.mkdtemp(prefix="CARDSegmentTest-")
        _, volumePath = self._makeInputs(folder)
        volume = slicer.util.loadVolume(volumePath)
        logic = CARDSegmentLogic()
        options = lib.JobOptions(bundle_path=str(shipped), device="cpu", method="card", engine_dir=logic.moduleDir)
        outputs = logic.runSync(volume, options, timeout=900)
        segmentation = outputs.segmentation.GetSegmentation()
        names = [segmentation.GetNthSegment(i).GetName() for i in range(segmentation.GetNumberOfSegments())]
        self.assertEqual(names, [c["name"] for c in lib.bundle_classes(shipped)[1:]])
        report = outputs.report_dict()
        self.assertEqual(os.path.realpath(report["bundle"]["path"]), os.path.realpath(str(shipped)))
        self.assertIsNotNone(outputs.disagreement)
        self.delayDisplay("CARDSegment shipped-bundle test passed")
