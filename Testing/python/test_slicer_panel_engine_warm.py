"""The panel's "Keep engine warm" box (issue 25) in CARDSegment.py, driven with the stand-ins of
``test_slicer_module_panel`` (fake Qt and settings, real Logic and engine client with a fake
process): entering the module warms the engine, unticking closes it and makes the runs one-shot,
ticking starts it again; the .ui has the box, on by default and bound to no scene parameter."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from test_slicer_module_panel import FakeSettings, load_volume, make_widget, module  # noqa: F401

import slicer  # noqa: E402  (slicer-core, checked by test_slicer_module_panel)
from CARDSegmentLib.runs import jobs  # noqa: E402
from CARDSegmentLib.runs.engine import Engine  # noqa: E402

from conftest import MODULE_DIR  # noqa: E402
from test_slicer_engine_choice import FakeServe  # noqa: E402  (a serve process that is ready, then waits)


def test_entering_warms_the_engine_and_the_box_switches_it(module, rotated_nifti, tiny_bundle, monkeypatch):
    monkeypatch.setattr(jobs, "missing_requirements", lambda: [])  # the packages are installed
    volume = load_volume(slicer.mrmlScene, rotated_nifti)
    widget = make_widget(module, volume)
    p = widget._parameterNode
    p.bundleSource, p.bundleFolder = module.BundleSource.FOLDER, str(tiny_bundle)  # no research-use terms
    widget.logic.getParameterNode = lambda: p
    launched = []

    def launcher(argv, env, cwd):
        launched.append(FakeServe(argv))
        return launched[-1]

    widget.logic.engine = Engine(launcher=launcher)
    try:
        widget.enter()  # the module opens, the setting is on by default: the engine starts
        assert len(launched) == 1 and widget.logic.engine.alive
        assert launched[0].argv[launched[0].argv.index("--bundle") + 1] == str(tiny_bundle)
        widget.exit()
        widget.enter()
        assert len(launched) == 1  # the same engine, still warm

        widget.onKeepEngineWarm(False)  # unticked: closed now, remembered for the next session
        assert widget.logic.engine is None and launched[0].code == -9
        assert FakeSettings.store[jobs.KEEP_ENGINE_WARM_KEY] is False
        started = []
        widget.logic.ensureDependencies = lambda askConfirmation=True: None
        widget.logic.start = lambda volume, options, **kw: started.append(options)
        widget.onApplyButton()
        assert started and started[0].keep_engine_warm is False  # the click runs one-shot
        widget.enter()
        assert widget.logic.engine is None and len(launched) == 1  # off: entering starts nothing

        widget.logic.engine = Engine(launcher=launcher)
        widget.onKeepEngineWarm(True)  # ticked again: started at once
        assert len(launched) == 2 and widget.logic.engine.alive
        assert FakeSettings.store[jobs.KEEP_ENGINE_WARM_KEY] is True
        widget.onApplyButton()
        assert started[-1].keep_engine_warm is True
    finally:
        widget.logic.closeEngine()


def test_the_box_is_in_the_ui_on_by_default_and_bound_to_no_scene_parameter():
    root = ET.parse(MODULE_DIR / "Resources" / "UI" / "CARDSegment.ui").getroot()
    box = root.find(".//widget[@name='keepEngineWarmCheckBox']")
    assert box is not None and box.get("class") == "QCheckBox"
    props = {q.get("name"): q for q in box.findall("property")}
    assert props["checked"].find("bool").text == "true" and props["text"].find("string").text == "Keep engine warm"
    assert "SlicerParameterName" not in props  # an application setting (QSettings), not the scene's
    inputs = root.find(".//widget[@name='inputsCollapsibleButton']")
    assert inputs.find(".//widget[@name='keepEngineWarmCheckBox']") is not None  # disabled while a run goes
