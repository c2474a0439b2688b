"""CARDSegment: cardiac cine MRI segmentation with calibrated confidence (CARD) in 3D Slicer.

Thin on purpose: the method is the ``cardseg`` engine (in the module folder), run in a separate
PythonSlicer process so that the GUI never freezes; all that is not a Slicer class is in ``CARDSegmentLib``
(no Qt, tested outside Slicer: MRML work, run handling in ``panel.logic``, the self-test's body in
``panel.selftest``). Here: Module, parameter node, Widget, a Logic wrapping the library's, Test."""

import logging
import os
from typing import Annotated, Optional

import qt
import vtk

import slicer
from slicer import vtkMRMLScalarVolumeNode
from slicer.parameterNodeWrapper import Minimum, WithinRange, parameterNodeWrapper
from slicer.ScriptedLoadableModule import (
    ScriptedLoadableModule,
    ScriptedLoadableModuleLogic,
    ScriptedLoadableModuleTest,
    ScriptedLoadableModuleWidget,
)
from slicer.util import VTKObservationMixin

import CARDSegmentLib as lib
from CARDSegmentLib.panel import about
from CARDSegmentLib.panel import selftest
from CARDSegmentLib.cine.stack import combined_text
from CARDSegmentLib.install.acknowledgement import ensure_acknowledged_for_bundle as ensure_acknowledged
from CARDSegmentLib.install.packages import DependencyDeclined, InstallFailed, use_application
from CARDSegmentLib.runs.jobs import EngineChoice
from CARDSegmentLib.panel.logic import ModuleLogic
from CARDSegmentLib.panel.parameters import BundleSource, Device, FrameMode, Method, Overlay
from CARDSegmentLib.install.sampledata import register_sample_data

MODULE_DIR = os.path.dirname(os.path.abspath(__file__))


# -- CARDSegment
class CARDSegment(ScriptedLoadableModule):
    """Module description shown by Slicer."""

    def __init__(self, parent):
        ScriptedLoadableModule.__init__(self, parent)
        self.parent.title = "CARDSegment"
        self.parent.categories = ["Segmentation"]
        self.parent.dependencies = []  # the PyTorch extension is needed on first use only
        self.parent.contributors = list(about.CONTRIBUTORS)
        self.parent.helpText = about.HELP_TEXT
        self.parent.acknowledgementText = about.ACKNOWLEDGEMENT_TEXT
        slicer.app.connect("startupCompleted()", registerSampleData)


def registerSampleData() -> None:
    """The synthetic phantom in Slicer's Sample Data module (local files; nothing is downloaded)."""
    register_sample_data(MODULE_DIR)


# -- Parameters (the choices themselves: CARDSegmentLib.panel.parameters)


@parameterNodeWrapper
class CARDSegmentParameterNode:
    """The panel's state, saved with the scene and bound to the GUI (SlicerParameterName in the .ui)."""

    inputVolume: vtkMRMLScalarVolumeNode
    bundleSource: BundleSource = BundleSource.SHIPPED
    # a plain str bound by hand (onBundleFolderChanged): a pathlib.Path field shows an unset folder as "."
    bundleFolder: str = ""
    device: Device = Device.AUTO
    method: Method = Method.CARD
    fastReview: bool = False  # regions from the bundle's TAC rule: no flipped runs (CARDSegmentLib.panel.parameters)
    loadProbabilities: bool = False
    overlay: Overlay = Overlay.DISAGREEMENT
    overlayOpacity: Annotated[float, WithinRange(0.0, 1.0)] = 0.5
    # a cine sequence's input: which frames; ED and ES frames (-1, shown "auto": found from the LV
    # volume curve); the minimum keeps the spin boxes' range (and their "auto" text) from the .ui
    frameMode: FrameMode = FrameMode.SHOWN
    edFrame: Annotated[int, Minimum(-1)] = -1
    esFrame: Annotated[int, Minimum(-1)] = -1


# -- CARDSegmentWidget


class CARDSegmentWidget(ScriptedLoadableModuleWidget, VTKObservationMixin):
    """The panel: binds the parameters, starts and cancels runs, shows results. No method code."""

    def __init__(self, parent=None) -> None:
        ScriptedLoadableModuleWidget.__init__(self, parent)
        VTKObservationMixin.__init__(self)
        self.logic = None
        self._parameterNode, self._parameterNodeGuiTag = None, None
        self._shownOverlay = None
        self._preparing = False  # checking or installing the Python packages before a run
        self._clickGuard = lib.ClickGuard()  # a double click must not start and cancel at once
        self._watched = ()  # IDs of the output nodes the panel shows (their removal refreshes it)
        self._refreshAfterBatch = False  # one of them left during a batch of scene changes
        self._rowKeys = []  # (frame, region) of each row of the review table
        self._cine, self._shownFrame = None, None  # a cine input's sequence (its browser followed) and frame
        self._engineChoice = EngineChoice(qt.QSettings(), MODULE_DIR)  # "Keep engine warm" (application settings)

    def setup(self) -> None:
        ScriptedLoadableModuleWidget.setup(self)
        uiWidget = slicer.util.loadUI(self.resourcePath("UI/CARDSegment.ui"))
        self.layout.addWidget(uiWidget)
        self.ui = slicer.util.childWidgetVariables(uiWidget)
        uiWidget.setMRMLScene(slicer.mrmlScene)

        self.logic = CARDSegmentLogic()
        self._clickGuard = lib.ClickGuard(qt.QApplication.doubleClickInterval() / 1000.0)
        self.ui.progressBar.hide()

        self.addObserver(slicer.mrmlScene, slicer.mrmlScene.StartCloseEvent, self.onSceneStartClose)
        self.addObserver(slicer.mrmlScene, slicer.mrmlScene.EndCloseEvent, self.onSceneEndClose)
        self.addObserver(slicer.mrmlScene, slicer.mrmlScene.NodeRemovedEvent, self.onNodeRemoved)
        self.addObserver(slicer.mrmlScene, slicer.mrmlScene.EndBatchProcessEvent, self.onEndBatchProcess)

        self.ui.applyButton.connect("clicked(bool)", self.onApplyButton)
        self.ui.bundleFolderPathLineEdit.connect("currentPathChanged(QString)", self.onBundleFolderChanged)
        self.ui.regionsTable.connect("itemSelectionChanged()", self.onRegionSelected)
        self.ui.acceptButton.connect("clicked(bool)", lambda _: self.onSetStatus("accepted"))
        self.ui.correctedButton.connect("clicked(bool)", lambda _: self.onSetStatus("corrected"))
        self.ui.rejectButton.connect("clicked(bool)", lambda _: self.onSetStatus("rejected"))
        self.ui.exportButton.connect("clicked(bool)", self.onExportButton)
        self.ui.keepResultsButton.connect("clicked(bool)", self.onKeepResults)
        self.ui.cineCurvesButton.connect("clicked(bool)", self.onShowCineCurves)
        self.ui.combineSeriesButton.connect("clicked(bool)", self.onCombineSeries)
        self.ui.keepEngineWarmCheckBox.checked = self._engineChoice.keep_warm
        self.ui.keepEngineWarmCheckBox.connect("toggled(bool)", self.onKeepEngineWarm)

        self.initializeParameterNode()

    def cleanup(self) -> None:
        if self.logic is not None:
            self.logic.cancel()
            self.logic.closeEngine()  # the warm engine (it also ends when Slicer exits: its input closes)
        self._observeBrowser(None)
        self.removeObservers()

    def enter(self) -> None:
        self.initializeParameterNode()
        self._engineChoice.apply(self.logic, lambda: self.logic.jobOptions(self._parameterNode))  # warm it up

    def onKeepEngineWarm(self, checked: bool) -> None:
        """The "Keep engine warm" box: start the engine now (ticked) or close it and run one-shot (unticked)."""
        self._engineChoice.keep_warm = checked
        self._engineChoice.apply(self.logic, lambda: self.logic.jobOptions(self._parameterNode))

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

    def onNodeRemoved(self, caller, event) -> None:
        """A node left the scene: when it is one the panel shows, show what is left (once a batch of
        changes, such as replacing a run's outputs, has ended)."""
        scene = slicer.mrmlScene
        if scene.IsClosing() or not lib.watched_nodes_gone(scene, self._watched):
            return
        if scene.IsBatchProcessing():
            self._refreshAfterBatch = True
            return
        self.refreshResults()

    def onEndBatchProcess(self, caller, event) -> None:
        """A batch of scene changes ended: refresh once if a shown node left during it."""
        if self._refreshAfterBatch and not slicer.mrmlScene.IsClosing():
            self._refreshAfterBatch = False
            self.refreshResults()

    def initializeParameterNode(self) -> None:
        """Bind the module's parameter node; an unset input becomes the first plain volume."""
        node = self.logic.getParameterNode()
        if not node.inputVolume:
            first = lib.default_input(slicer.mrmlScene)
            if first:
                node.inputVolume = first
        self.setParameterNode(node)

    def setParameterNode(self, inputParameterNode: Optional[CARDSegmentParameterNode]) -> None:
        if self._parameterNode:
            self._parameterNode.disconnectGui(self._parameterNodeGuiTag)
            self.removeObserver(self._parameterNode, vtk.vtkCommand.ModifiedEvent, self._onParameterNodeModified)
        self._parameterNode = inputParameterNode
        self._shownOverlay = None
        if self._parameterNode:
            self._parameterNodeGuiTag = lib.connect_gui(self._parameterNode, self.ui)
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
        if shown != self._shownOverlay:  # the slice views change only when the user changes the overlay
            previous, self._shownOverlay = self._shownOverlay, shown
            if previous is None or shown[0] != previous[0]:
                self._observeBrowser(self.logic.sequenceInfo(p.inputVolume) if p.inputVolume else None)
                self.refreshResults()
            elif p.inputVolume:
                self.logic.showOverlay(p.inputVolume, p.overlay.value, p.overlayOpacity)
        lib.show_cine_choices(self.ui, self._cine, p.frameMode.value)

    def _observeBrowser(self, cine) -> None:
        """Follow the frame slider of the input's sequence browser (None: stop)."""
        if self._cine is not None:
            self.removeObserver(self._cine.browser, vtk.vtkCommand.ModifiedEvent, self.onBrowserModified)
        self._cine, self._shownFrame = cine, (cine.shown if cine is not None else None)
        if self._cine is not None:
            self.addObserver(self._cine.browser, vtk.vtkCommand.ModifiedEvent, self.onBrowserModified)

    def onBrowserModified(self, caller=None, event=None) -> None:
        """The user moved to another frame: the browser shows its results through the result
        sequences' proxies by itself; the panel updates the agreement line only (no scene scan)."""
        if self._cine is None or self._cine.shown == self._shownFrame:
            return
        self._shownFrame = self._cine.shown
        self.logic.frameChanged(self._cine)
        self._showAgreement(self.logic.frameReport(self._cine, self._shownFrame))

    def onBundleFolderChanged(self, path: str) -> None:
        """The folder box changed: store it ("" when empty, never ".")."""
        p, text = self._parameterNode, lib.folder_text(path)
        if p is not None and p.bundleFolder != text:
            p.bundleFolder = text

    # -- running

    def onApplyButton(self) -> None:
        """Start a run (after the package check), or cancel the running one."""
        if not self._clickGuard.accepts():  # the second click of a double click
            return
        if self.logic.isRunning:
            self.logic.cancel()
            return
        if self._preparing:  # pip processes GUI events while it installs: ignore clicks meanwhile
            return
        p = self._parameterNode
        if not p or not p.inputVolume:
            return
        try:
            options = self._engineChoice.options(self.logic.jobOptions(p))
            accepted = ensure_acknowledged(  # once, before the first run with research-only weights
                options.bundle_path,
                MODULE_DIR,
                qt.QSettings(),
                lambda title, text: slicer.util.confirmOkCancelDisplay(text, windowTitle=title),
            )
        except lib.BundleChoiceError as exc:
            slicer.util.errorDisplay(f"Cannot use this bundle: {exc}")
            return
        if not accepted:
            self.ui.statusLabel.text = about.DECLINED_TEXT
            return
        if p.bundleSource == BundleSource.FOLDER:
            self.ui.bundleFolderPathLineEdit.addCurrentPathToHistory()
        self._setPreparing(True)  # before anything can install: a second click must not start a second install
        try:
            ready = self._prepareRun(p, options)
        finally:
            self._setPreparing(False)
        if ready:
            self._setRunning(True)
            self.logic.start(p.inputVolume, options, onProgress=self._onProgress, onFinished=self._onFinished)

    def _prepareRun(self, p, options=None) -> bool:
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
            if not (isinstance(exc, InstallFailed) and exc.shown):  # 5.12+: Slicer's own dialog said it
                slicer.util.errorDisplay(message, windowTitle="CARDSegment")
            return False
        if options is not None and self.logic.decisionsAtRisk(p.inputVolume, options):
            return bool(
                slicer.util.confirmOkCancelDisplay(
                    "This volume's regions have review decisions. A new run replaces the results and the review "
                    "(use 'Keep these results' first to keep them). Continue?",
                    windowTitle="CARDSegment",
                )
            )
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
        self._clickGuard.changed()
        self.ui.applyButton.text = "Cancel" if running else "Segment && Calibrate"
        self.ui.applyButton.enabled = True
        self.ui.progressBar.setVisible(running)
        self.ui.progressBar.value = 0
        self.ui.inputsCollapsibleButton.enabled = not running
        if running:
            self.ui.statusLabel.text = "Starting the segmentation process..."

    def _onProgress(self, progress: "lib.Progress") -> None:
        self.ui.progressBar.value = int(round(progress.fraction * self.ui.progressBar.maximum))
        elapsed = lib.elapsed_text(self.logic.elapsedSeconds())
        self.ui.statusLabel.text = f"{progress.text} ({elapsed})" if elapsed else progress.text

    def _onFinished(self, state: str, error: Optional[str]) -> None:
        """The run ended: the panel returns to idle first, whatever happens next."""
        self._setRunning(False)
        try:
            self._onParameterNodeModified()
            if state == "loaded":
                elapsed = lib.elapsed_text(self.logic.elapsedSeconds())
                self.ui.statusLabel.text = f"Done in {elapsed}." if elapsed else "Done."
                self._afterCineRun(self._parameterNode.inputVolume)
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

    def refreshResults(self, table: bool = True) -> None:
        """Show the input's agreement, indices and (``table``) review table (the slice views are left alone)."""
        p = self._parameterNode
        volume = p.inputVolume if p else None
        self._watched = self.logic.outputNodeIDs(volume) if volume else ()
        self._showAgreement(self.logic.shownReport(volume) if volume else None)
        self.ui.indicesLabel.text = self.logic.indicesText(volume) if volume else ""
        self.ui.keepResultsButton.enabled = self.logic.hasSegmentation(volume)
        if table:  # not on each frame of a playing cine: the table holds every frame's regions already
            rows = self.logic.reviewRows(volume) if volume else []
            self.ui.exportButton.enabled = bool(rows) or bool(self.ui.indicesLabel.text)
            self._fillRegionsTable(rows)
        self._showCineTools(volume)

    def _showCineTools(self, volume) -> None:
        """A cine's curves line and button, and the offer to combine single-slice series into one
        cine (widgets of the panel that setup() loads)."""
        if not hasattr(self.ui, "cineTablesLabel"):
            return
        self.ui.cineTablesLabel.text = self.logic.cineTablesText(volume) if volume else ""
        self.ui.cineCurvesButton.enabled = self.ui.cineCurvesButton.visible = bool(self.ui.cineTablesLabel.text)
        offer = self.logic.combineOffer(volume) if volume else ""
        self.ui.combineSeriesButton.enabled = self.ui.combineSeriesButton.visible = bool(offer)
        self.ui.combineSeriesButton.toolTip = offer

    def _afterCineRun(self, volume) -> None:
        """A sequence's run loaded: its volume curves and wall table made and shown in the layout."""
        if volume is not None and self.logic.isSequence(volume):
            self.logic.updateCineTables(volume)
            self.logic.showCineCurves(volume)

    def onShowCineCurves(self) -> None:
        volume = self._parameterNode.inputVolume if self._parameterNode else None
        if volume is not None and not self.logic.showCineCurves(volume):
            self.ui.statusLabel.text = "No volume curves: fewer than two frames are segmented."

    def onCombineSeries(self) -> None:
        """Build one cine of the input's study's single-slice series and make it the input."""
        volume = self._parameterNode.inputVolume if self._parameterNode else None
        if volume is None:
            return
        try:
            combined = self.logic.combineStudySeries(volume)
        except ValueError as exc:
            self.ui.statusLabel.text = f"Cannot combine the series: {exc}"
            slicer.util.warningDisplay(self.ui.statusLabel.text, windowTitle="CARDSegment")
            return
        self._parameterNode.inputVolume = combined.proxy
        self.ui.statusLabel.text = combined_text(combined)

    def _showAgreement(self, report: Optional[dict]) -> None:
        summary = lib.agreement_summary(report)
        self.ui.agreementLabel.text = summary.text
        self.ui.agreementLabel.setStyleSheet("color: #c0392b; font-weight: bold;" if summary.warning else "")

    def _fillRegionsTable(self, rows) -> None:
        self._statusColumn, self._rowKeys = lib.fill_region_table(self.ui.regionsTable, rows, qt.QTableWidgetItem)
        self._enableReviewButtons(False)

    def _selectedRegion(self) -> Optional[tuple]:
        """``(frame, region)`` of the selected row (frame None for a plain volume), or None."""
        items = self.ui.regionsTable.selectedItems()
        row = items[0].row() if items else -1
        return self._rowKeys[row] if 0 <= row < len(self._rowKeys) else None

    def _enableReviewButtons(self, enabled: bool) -> None:
        for w in (self.ui.acceptButton, self.ui.correctedButton, self.ui.rejectButton, self.ui.noteLineEdit):
            w.enabled = enabled

    def onRegionSelected(self) -> None:
        key = self._selectedRegion()
        self._enableReviewButtons(key is not None)
        if key is None:  # selection cleared: no region highlighted
            return self.logic.clearRegionHighlight(self._parameterNode.inputVolume)
        volume = self._parameterNode.inputVolume
        if not any(r["frame"] == key[0] and r["region"] == key[1] for r in self.logic.reviewRows(volume)):
            self.refreshResults()  # removed meanwhile
            return
        with slicer.util.tryWithErrorDisplay("Cannot show the region.", waitCursor=True):
            row = self.logic.showRegion(volume, key[1], frame=key[0])
            self.ui.noteLineEdit.text = row.get("note", "")

    def onSetStatus(self, status: str) -> None:
        key = self._selectedRegion()
        if key is None:
            return
        rowIndex = self.ui.regionsTable.selectedItems()[0].row()
        with slicer.util.tryWithErrorDisplay("Cannot record the decision.", waitCursor=False):
            self.logic.setRegionStatus(
                self._parameterNode.inputVolume, key[1], status, self.ui.noteLineEdit.text, frame=key[0]
            )
            self.ui.regionsTable.item(rowIndex, self._statusColumn).setText(status)

    def onExportButton(self) -> None:
        volume = self._parameterNode.inputVolume
        if volume is None:
            return
        name = lib.safe_file_name(self.logic.baseName(volume))  # a sequence's name, not its proxy's
        default = os.path.join(qt.QDir.homePath(), f"{name}-CARD-review.csv")
        path = qt.QFileDialog.getSaveFileName(
            slicer.util.mainWindow(), "Export review", default, "CSV (*.csv);;JSON (*.json)"
        )
        if not path:
            return
        with slicer.util.tryWithErrorDisplay("Export failed.", waitCursor=True):
            written = self.logic.exportReview(volume, path)
            self.ui.statusLabel.text = f"Review exported to {written}"

    def onKeepResults(self) -> None:
        volume = self._parameterNode.inputVolume
        if volume is None:
            return
        count = self.logic.keepResults(volume)
        self.ui.statusLabel.text = f"Kept {count} result nodes; the next run makes new ones."
        self.refreshResults()


# -- CARDSegmentLogic


class CARDSegmentLogic(ScriptedLoadableModuleLogic, ModuleLogic):
    """Slicer's Logic for this module: CARDSegmentLib's ModuleLogic on the application's scene, with
    a QTimer polling runs and Slicer's wait cursor while results load."""

    def __init__(self) -> None:
        ScriptedLoadableModuleLogic.__init__(self)
        ModuleLogic.__init__(
            self,
            moduleDir=MODULE_DIR,
            scene=lambda: slicer.mrmlScene,
            makeTimer=lambda: qt.QTimer(),
            busy=lambda: slicer.util.WaitCursor(),
        )
        terminologies = getattr(getattr(slicer, "modules", None), "terminologies", None)  # the myocardium's code
        lib.register_module_terminology(terminologies.logic() if terminologies else None, self.moduleDir)
        use_application(getattr(slicer, "app", None))  # from 5.12 pip_install shows its own dialogs

    def getParameterNode(self):
        return CARDSegmentParameterNode(super().getParameterNode())


# -- CARDSegmentTest


class CARDSegmentTest(ScriptedLoadableModuleTest):
    """Runs in Slicer: a small synthetic oblique volume through the whole path, with networks of the
    shipped bundle's architecture (SwinUNETR primary, so a missing MONAI piece fails here), then
    once with the shipped bundle itself. The steps: CARDSegmentLib.panel.selftest."""

    def setUp(self):
        slicer.mrmlScene.Clear()

    def runTest(self):
        self.setUp()
        self.test_segment_synthetic_volume()
        self.setUp()
        self.test_shipped_bundle()

    def _shippedNetworks(self):
        """ "arch:size" of the shipped bundle's primary and reference networks."""
        return selftest.shipped_networks(MODULE_DIR)

    def test_segment_synthetic_volume(self):
        selftest.require_packages(self)  # skipTest when missing: ctest reports a skip, not a pass
        selftest.segment_synthetic_volume(self, slicer.mrmlScene, CARDSegmentLogic, slicer.util.loadVolume, MODULE_DIR)

    def test_shipped_bundle(self):
        """The shipped default bundle itself (trained weights) segments the synthetic volume."""
        selftest.require_packages(self)  # skipTest when missing: ctest reports a skip, not a pass
        selftest.segment_with_shipped_bundle(self, CARDSegmentLogic, slicer.util.loadVolume, MODULE_DIR)
