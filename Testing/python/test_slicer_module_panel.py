"""The module file itself (CARDSegment.py: Widget, Logic, self-test, with what they call in CARDSegmentLib) driven
without the Slicer application.

``CARDSegment.py`` imports Qt and Slicer's scripted-module classes, which only the application
has. Here they are replaced by small stand-ins (a timer whose ticks the test fires, widgets that
remember their state, a parameter node that is a plain object) while MRML, the scene, the job,
the process and the engine are real (PyPI slicer-core). What this checks is the module's own
control flow: the button's state around the package check, the panel returning to idle whatever
a run does, the folder box, and the self-test ``CARDSegmentTest`` end to end.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import types
import unittest
from pathlib import Path

import pytest

from conftest import MODULE_DIR, slicer_core

slicer = slicer_core()


import CARDSegmentLib as lib  # noqa: E402
from CARDSegmentLib.install import dependencies  # noqa: E402
from CARDSegmentLib.outputs import terminology  # noqa: E402
from CARDSegmentLib.outputs import volume_files  # noqa: E402


# ---------------------------------------------------------------------------------------------
# stand-ins for what only the Slicer application has


class FakeTimer:
    """qt.QTimer: remembers its slot; the test fires it."""

    made = []

    def __init__(self):
        self.slot, self.active, self.interval = None, False, None
        FakeTimer.made.append(self)

    def setInterval(self, ms):
        self.interval = ms

    def connect(self, signal, slot):
        assert signal == "timeout()"
        self.slot = slot

    def start(self):
        self.active = True

    def stop(self):
        self.active = False


class FakeWidget:
    """A Qt widget: explicit attributes, and any other method call recorded and ignored."""

    def __init__(self, **attrs):
        self.calls = []
        self.enabled, self.text = True, ""
        self.__dict__.update(attrs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def method(*args):
            self.calls.append((name, args))

        return method

    def called(self, name):
        return [args for n, args in self.calls if n == name]


class FakeSettings:
    """qt.QSettings: one store for every instance (the application's settings), cleared per test."""

    store: dict = {}

    def value(self, key, default=None):
        return self.store.get(key, default)

    def setValue(self, key, value):
        self.store[key] = value


def _fake_qt():
    qt = types.ModuleType("qt")
    qt.QTimer = FakeTimer
    qt.QSettings = FakeSettings
    qt.Qt = types.SimpleNamespace(UserRole=32)
    qt.QTableWidgetItem = lambda text: FakeWidget(text=text)
    qt.QApplication = types.SimpleNamespace(doubleClickInterval=lambda: 400)
    return qt


def _fake_parameter_node_wrapper():
    module = types.ModuleType("slicer.parameterNodeWrapper")

    def parameterNodeWrapper(cls):
        defaults = {name: getattr(cls, name, None) for name in cls.__annotations__}

        class Wrapped:
            """As in Slicer 5.8: connectGui returns None, connectParametersToGui the tag."""

            def __init__(self, node=None):
                self.__dict__.update(defaults)
                self.guis, self._next = {}, 0

            def connectParametersToGui(self, mapping):
                self._next += 1
                self.guis[self._next] = mapping
                return self._next

            def connectGui(self, ui):
                self.connectParametersToGui({})

            def disconnectGui(self, tag):
                self.guis.pop(tag, None)

            def AddObserver(self, event, callback, priority=0.0):
                return id(callback)

            def RemoveObserver(self, tag):
                pass

        Wrapped.__name__ = cls.__name__
        return Wrapped

    module.parameterNodeWrapper = parameterNodeWrapper
    module.WithinRange = lambda lo, hi: ("range", lo, hi)
    module.Minimum = lambda lo: ("minimum", lo)
    return module


def _fake_scripted_module():
    module = types.ModuleType("slicer.ScriptedLoadableModule")

    class ScriptedLoadableModule:
        def __init__(self, parent):
            self.parent = parent

    class ScriptedLoadableModuleWidget:
        def __init__(self, parent=None):
            self.parent = parent

    class ScriptedLoadableModuleLogic:
        def __init__(self):
            pass

        def getParameterNode(self):
            return None

    class ScriptedLoadableModuleTest(unittest.TestCase):
        def delayDisplay(self, message, msec=1000):
            self.messages = getattr(self, "messages", []) + [message]

    for cls in (
        ScriptedLoadableModule,
        ScriptedLoadableModuleWidget,
        ScriptedLoadableModuleLogic,
        ScriptedLoadableModuleTest,
    ):
        setattr(module, cls.__name__, cls)
    return module


class Dialogs:
    """slicer.util's message boxes, recorded."""

    def __init__(self):
        self.errors, self.warnings, self.confirm = [], [], True

    def error(self, text, **kw):
        self.errors.append(text)

    def warning(self, text, **kw):
        self.warnings.append(text)

    def ok_cancel(self, text, **kw):
        return self.confirm


class NoWaitCursor:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def make_scene():
    scene = slicer.vtkMRMLScene()
    scene.RegisterNodeClass(slicer.vtkMRMLColorLegendDisplayNode())
    for name in ("Red", "Yellow", "Green"):
        scene.AddNewNodeByClass("vtkMRMLSliceNode").SetLayoutName(name)
        scene.AddNewNodeByClass("vtkMRMLSliceCompositeNode").SetLayoutName(name)
    return scene


@pytest.fixture
def module(monkeypatch):
    """CARDSegment.py, imported with the stand-ins; a fresh scene as slicer.mrmlScene."""
    monkeypatch.setitem(sys.modules, "qt", _fake_qt())
    monkeypatch.setitem(sys.modules, "slicer.parameterNodeWrapper", _fake_parameter_node_wrapper())
    monkeypatch.setitem(sys.modules, "slicer.ScriptedLoadableModule", _fake_scripted_module())
    monkeypatch.setattr(slicer, "mrmlScene", make_scene(), raising=False)
    dialogs = Dialogs()
    monkeypatch.setattr(slicer.util, "errorDisplay", dialogs.error)
    monkeypatch.setattr(slicer.util, "warningDisplay", dialogs.warning)
    monkeypatch.setattr(slicer.util, "confirmOkCancelDisplay", dialogs.ok_cancel)
    monkeypatch.setattr(slicer.util, "WaitCursor", NoWaitCursor)
    spec = importlib.util.spec_from_file_location("CARDSegment_under_test", MODULE_DIR / "CARDSegment.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.dialogs = dialogs
    FakeTimer.made.clear()
    FakeSettings.store = {}
    return mod


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_bundle, rotated_nifti):
    """One real ``cardseg segment`` output folder (in-process), which fake processes hand back."""
    from cardseg.cli import main

    out = tmp_path_factory.mktemp("panel") / "out"
    assert (
        main(
            [
                "segment",
                str(rotated_nifti),
                "-o",
                str(out),
                "--bundle",
                str(tiny_bundle),
                "--quiet",
                "--progress",
                "none",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    return out


class CopyingProcess:
    """A fake engine process: "writes" a finished run's outputs, reports progress, exits 0."""

    def __init__(self, source):
        self.source, self.lines, self.code = source, [], None

    def __call__(self, argv, env, cwd):
        shutil.copytree(self.source, argv[argv.index("-o") + 1])
        self.lines = ['{"stage": "trajectory", "done": 1, "total": 2}', '{"stage": "write", "done": 6, "total": 6}']
        self.code = 0
        return self

    def read_lines(self):
        out, self.lines = [("stderr", ln) for ln in self.lines], []
        return out

    def returncode(self):
        return None if self.lines else self.code

    def kill(self):
        self.code = -9


def make_widget(module, volume=None):
    """The module's widget without setup(): stand-in widgets, a real Logic, a plain parameter node."""
    widget = module.CARDSegmentWidget()
    widget.logic = module.CARDSegmentLogic()
    names = (
        "applyButton",
        "inputsCollapsibleButton",
        "statusLabel",
        "progressBar",
        "bundleFolderPathLineEdit",
        "agreementLabel",
        "keepResultsButton",
        "exportButton",
        "regionsTable",
        "acceptButton",
        "correctedButton",
        "rejectButton",
        "noteLineEdit",
        "cineGroupBox",
        "edFrameSpinBox",
        "esFrameSpinBox",
        "indicesLabel",
    )
    widget.ui = types.SimpleNamespace(**{n: FakeWidget() for n in names})
    widget.ui.progressBar.maximum, widget.ui.progressBar.value = 100, 0
    widget.ui.bundleFolderPathLineEdit.currentPath = ""
    widget.ui.applyButton.text = "Segment && Calibrate"
    widget._parameterNode = module.CARDSegmentParameterNode()
    widget._parameterNode.inputVolume = volume
    widget._clickGuard = lib.ClickGuard(0.0)  # no double-click interval (test_slicer_panel_defects tests it)
    return widget


def load_volume(scene, path, name="cine"):
    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", name)
    volume_files.read_volume_file(volume, path)
    return volume


def fire_until_idle(module, widget, limit=500):
    for _ in range(limit):
        if not widget.logic.isRunning:
            return
        timer = FakeTimer.made[-1]
        assert timer.active
        timer.slot()
    raise AssertionError("the run never ended")


def assert_idle(widget):
    ui = widget.ui
    assert ui.applyButton.text == "Segment && Calibrate" and ui.applyButton.enabled
    assert ui.inputsCollapsibleButton.enabled and ui.progressBar.called("setVisible")[-1] == (False,)
    assert not widget._preparing and not widget.logic.isRunning


# ---------------------------------------------------------------------------------------------
# the button around the package check


def test_the_button_is_disabled_before_the_package_install_starts(module, rotated_nifti):
    volume = load_volume(slicer.mrmlScene, rotated_nifti)
    widget = make_widget(module, volume)
    widget._onParameterNodeModified()
    assert widget.ui.applyButton.enabled
    seen = []

    def installing(askConfirmation=True):
        # what the panel looks like while pip runs (and processes GUI events, i.e. clicks)
        seen.append((widget.ui.applyButton.enabled, widget.ui.inputsCollapsibleButton.enabled))
        widget._onParameterNodeModified()  # e.g. the user picks another input meanwhile
        seen.append((widget.ui.applyButton.enabled, widget.ui.inputsCollapsibleButton.enabled))
        widget.onApplyButton()  # a second click during the install
        raise module.DependencyDeclined("Nothing was installed.")

    widget.logic.ensureDependencies = installing
    widget.onApplyButton()
    assert seen == [(False, False), (False, False)]  # disabled first; a second click starts nothing
    assert module.dialogs.warnings == ["Nothing was installed."]
    assert widget.ui.statusLabel.text == "Nothing was installed."
    assert widget.ui.applyButton.enabled and widget.ui.inputsCollapsibleButton.enabled
    assert not widget.logic.isRunning and not FakeTimer.made


def test_a_failed_install_restores_the_panel_with_one_line(module, rotated_nifti):
    widget = make_widget(module, load_volume(slicer.mrmlScene, rotated_nifti))

    def broken(askConfirmation=True):
        raise OSError("pip: no space left on device\nTraceback ...")

    widget.logic.ensureDependencies = broken
    widget.onApplyButton()
    assert module.dialogs.errors == ["Installing the Python packages failed: pip: no space left on device"]
    assert widget.ui.applyButton.enabled and widget.ui.inputsCollapsibleButton.enabled


def test_ensure_dependencies_refuses_an_old_torch_before_asking(module, monkeypatch):
    deps = dependencies
    monkeypatch.setattr(deps, "missing_requirements", lambda: [deps.requirement("torch")])
    monkeypatch.setattr(deps, "torch_too_old", lambda: "PyTorch 2.1.0 is installed, but ...")
    asked = []
    monkeypatch.setattr(slicer.util, "confirmOkCancelDisplay", lambda *a, **k: asked.append(a) or True)
    with pytest.raises(module.DependencyDeclined, match="PyTorch 2.1.0"):
        module.CARDSegmentLogic.ensureDependencies()
    assert not asked


def test_ensure_dependencies_pins_the_installed_torch_for_pip(module, monkeypatch):
    deps = dependencies
    monkeypatch.setattr(deps, "missing_requirements", lambda: [deps.requirement("monai"), deps.requirement("einops")])
    monkeypatch.setattr(deps, "installed_version", lambda dist: "2.5.1+cu124" if dist == "torch" else None)
    monkeypatch.setattr(deps.pip_specs, "__defaults__", (deps.installed_version,))
    installed = []
    monkeypatch.setattr(slicer.util, "pip_install", installed.append)
    with pytest.raises(RuntimeError, match="still missing"):  # the fake install installs nothing
        module.CARDSegmentLogic.ensureDependencies(askConfirmation=False)
    assert installed == [["monai>=1.5", "einops", "torch==2.5.1+cu124"]]


def test_a_missing_pytorch_extension_is_said_in_a_plain_sentence(module, rotated_nifti, monkeypatch):
    """No PyTorch extension to install torch with: the panel says what to do in its own words (a
    warning, nothing installed), not as a ``RuntimeError: ...`` failure."""
    deps = dependencies
    monkeypatch.setattr(deps, "missing_requirements", lambda: [deps.requirement("torch")])
    monkeypatch.setattr(deps, "torch_too_old", lambda: None)
    monkeypatch.setitem(sys.modules, "PyTorchUtils", None)  # import PyTorchUtils fails
    installed = []
    monkeypatch.setattr(slicer.util, "pip_install", installed.append)
    widget = make_widget(module, load_volume(slicer.mrmlScene, rotated_nifti))
    widget.onApplyButton()
    sentence = (
        "CARDSegment needs the PyTorch extension: install it with the Extensions Manager, restart Slicer and try again."
    )
    assert widget.ui.statusLabel.text == sentence and module.dialogs.warnings == [sentence]
    assert module.dialogs.errors == [] and installed == [] and not widget.logic.isRunning
    assert widget.ui.applyButton.enabled and widget.ui.inputsCollapsibleButton.enabled


def test_packages_still_missing_after_the_install_are_one_plain_line(module, rotated_nifti, monkeypatch):
    deps = dependencies
    monkeypatch.setattr(deps, "missing_requirements", lambda: [deps.requirement("einops")])
    monkeypatch.setattr(slicer.util, "pip_install", lambda specs: None)  # "installs" nothing
    widget = make_widget(module, load_volume(slicer.mrmlScene, rotated_nifti))
    widget.onApplyButton()
    line = "Installing the Python packages failed: still missing after installation: einops"
    assert module.dialogs.errors == [line] and widget.ui.statusLabel.text == line
    assert not widget.logic.isRunning and widget.ui.applyButton.enabled


# ---------------------------------------------------------------------------------------------
# the panel always returns to idle


def test_a_successful_run_through_the_panel(module, rotated_nifti, finished_run, tiny_bundle):
    volume = load_volume(slicer.mrmlScene, rotated_nifti)
    widget = make_widget(module, volume)
    widget.logic.ensureDependencies = lambda askConfirmation=True: None
    widget.logic.launcher = CopyingProcess(finished_run)
    p = widget._parameterNode
    p.bundleSource, p.bundleFolder = module.BundleSource.FOLDER, str(tiny_bundle)
    widget.onApplyButton()
    assert widget.ui.applyButton.text == "Cancel" and not widget.ui.inputsCollapsibleButton.enabled
    assert widget.ui.bundleFolderPathLineEdit.called("addCurrentPathToHistory") == [()]  # the folder box's history
    fire_until_idle(module, widget)
    assert_idle(widget)
    assert widget.ui.statusLabel.text.startswith("Done in ") and not module.dialogs.errors
    outputs = lib.find_outputs(slicer.mrmlScene, volume)
    assert outputs.segmentation is not None and outputs.review is not None
    assert widget.ui.regionsTable.called("setRowCount")[-1] == (len(lib.review_rows(outputs.review)),)
    assert not FakeTimer.made[-1].active


def test_an_unexpected_error_while_loading_leaves_the_panel_idle_with_one_line(
    module, rotated_nifti, finished_run, monkeypatch
):
    """Slicer 5.8's missing vtkSegment.SetTerminology used to escape the timer's slot: the button
    stayed "Cancel", the inputs disabled, no message. Injected here, it becomes the one-line error."""
    volume = load_volume(slicer.mrmlScene, rotated_nifti)
    before = slicer.mrmlScene.GetNumberOfNodes()

    def missing_api(segment, entry):
        raise AttributeError("'vtkSegment' object has no attribute 'SetTerminology'")

    monkeypatch.setattr(terminology, "set_segment_terminology", missing_api)
    widget = make_widget(module, volume)
    widget.logic.ensureDependencies = lambda askConfirmation=True: None
    widget.logic.launcher = CopyingProcess(finished_run)
    widget.onApplyButton()
    assert widget.logic.isRunning
    fire_until_idle(module, widget)
    assert_idle(widget)
    message = "AttributeError: 'vtkSegment' object has no attribute 'SetTerminology'"
    assert widget.ui.statusLabel.text == f"Failed: {message}"
    assert module.dialogs.errors == [f"Segmentation failed: {message}"]
    assert slicer.mrmlScene.GetNumberOfNodes() == before  # the scene is as it was
    assert not FakeTimer.made[-1].active


def test_an_error_in_the_panels_own_update_still_ends_in_one_line(module, rotated_nifti, finished_run, monkeypatch):
    volume = load_volume(slicer.mrmlScene, rotated_nifti)
    widget = make_widget(module, volume)
    widget.logic.ensureDependencies = lambda askConfirmation=True: None
    widget.logic.launcher = CopyingProcess(finished_run)

    def broken_refresh():
        raise KeyError("agreement")

    widget.onApplyButton()
    widget.refreshResults = broken_refresh  # showing the loaded results fails
    fire_until_idle(module, widget)
    assert_idle(widget)
    assert widget.ui.statusLabel.text == "Failed: KeyError: 'agreement'"


def test_cancel_through_the_panel(module, rotated_nifti):
    volume = load_volume(slicer.mrmlScene, rotated_nifti)
    widget = make_widget(module, volume)
    widget.logic.ensureDependencies = lambda askConfirmation=True: None

    class Endless(CopyingProcess):
        def __call__(self, argv, env, cwd):
            self.code = None
            return self

        def returncode(self):
            return self.code

    fake = Endless(None)
    widget.logic.launcher = fake
    widget.onApplyButton()
    FakeTimer.made[-1].slot()
    assert widget.logic.isRunning
    widget.onApplyButton()  # the button reads "Cancel"
    assert_idle(widget)  # at once: the process is ended on a background thread
    assert widget.ui.statusLabel.text == "Cancelled: the scene was not changed."
    assert widget.logic.waitForBackground(10) and fake.code == -9


def test_the_research_use_terms_are_asked_once_before_the_shipped_weights_run(module, rotated_nifti, monkeypatch):
    """The shipped (ACDC-trained) bundle: declining stops the run with a status line and is not
    remembered; agreeing starts it and is remembered, so the next run does not ask again."""
    volume = load_volume(slicer.mrmlScene, rotated_nifti)
    widget = make_widget(module, volume)
    widget.logic.ensureDependencies = lambda askConfirmation=True: None
    asked = []
    answers = iter([False, True])

    def ok_cancel(text, **kw):
        asked.append(kw.get("windowTitle"))
        return next(answers)

    monkeypatch.setattr(slicer.util, "confirmOkCancelDisplay", ok_cancel)
    started = []
    widget.logic.start = lambda *a, **k: started.append(a)
    widget.onApplyButton()
    assert len(asked) == 1 and not started and widget.ui.statusLabel.text == module.about.DECLINED_TEXT
    widget._clickGuard = lib.ClickGuard(interval_s=0)
    widget.onApplyButton()
    assert len(asked) == 2 and len(started) == 1
    widget.onApplyButton()
    assert len(asked) == 2 and len(started) == 2  # agreed once: not asked again


@pytest.mark.parametrize("config", ["[1, 2]", '{"id": {"name": "x"}, "provenance": "trained on ACDC"}'])
def test_apply_with_a_malformed_bundle_json_says_so_or_runs(module, rotated_nifti, tmp_path, config):
    """A bundle.json that is a JSON list: one line naming the file, nothing started; a provenance
    that is a string: no crash, the run starts (no research-only data set named)."""
    (tmp_path / "bundle.json").write_text(config, encoding="utf-8")
    widget = make_widget(module, load_volume(slicer.mrmlScene, rotated_nifti))
    widget.logic.ensureDependencies = lambda askConfirmation=True: None
    started = []
    widget.logic.start = lambda *a, **k: started.append(a)
    p = widget._parameterNode
    p.bundleSource, p.bundleFolder = module.BundleSource.FOLDER, str(tmp_path)
    widget.onApplyButton()
    if config.startswith("["):
        assert module.dialogs.errors == [
            f"Cannot use this bundle: {tmp_path / 'bundle.json'}: not a bundle "
            "description (a JSON list, where a JSON object was expected)"
        ]
        assert not started and widget.ui.applyButton.enabled and not widget._preparing
    else:
        assert module.dialogs.errors == [] and len(started) == 1


# ---------------------------------------------------------------------------------------------
# the bundle folder box


def test_an_unset_bundle_folder_shows_an_empty_box(module):
    widget = make_widget(module)
    box = widget.ui.bundleFolderPathLineEdit
    p = widget._parameterNode
    assert p.bundleFolder == ""
    for stored in ("", ".", None):  # "." is what scenes saved by the earlier version hold
        p.bundleFolder = stored
        box.currentPath = "something"
        widget._onParameterNodeModified()
        assert box.currentPath == ""
    widget.onBundleFolderChanged("/data/bundles/acdc")
    assert p.bundleFolder == "/data/bundles/acdc"
    widget._onParameterNodeModified()
    assert box.currentPath == "/data/bundles/acdc"
    widget.onBundleFolderChanged(".")
    assert p.bundleFolder == ""
    assert lib.folder_text(" . ") == "" and lib.folder_text("/x") == "/x"


# ---------------------------------------------------------------------------------------------
# the self-test, end to end


@pytest.mark.slow
def test_the_modules_self_test_runs_with_the_shipped_networks(module, monkeypatch):
    """CARDSegmentTest as Slicer's "Reload and Test" runs it (three engine runs: the shipped bundle's
    networks untrained, twice, then the shipped bundle itself)."""

    def load(path):
        return load_volume(slicer.mrmlScene, path, Path(path).stem)

    monkeypatch.setattr(slicer.util, "loadVolume", load)
    test = module.CARDSegmentTest()
    primary, reference = test._shippedNetworks()
    assert primary.startswith("time-swinunetr:")  # the shipped primary is MONAI's SwinUNETR
    test.runTest()
    assert "CARDSegment test passed" in test.messages
    assert "CARDSegment shipped-bundle test passed" in test.messages
