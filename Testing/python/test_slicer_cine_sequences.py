"""A cine of a real study's size in the module (30 frames of 10 slices), on real MRML (PyPI
slicer-core): the results are recorded as sequences of the input's own browser, a re-run of every
frame refreshes the panel once, a frame change scans no scene, and a saved scene keeps every frame.

The engine runs once for real on one 10-slice frame (the tiny test bundle with invented index
intervals); a fake ``cardseg batch`` then hands that frame's output folder to every frame of the
30-frame sequence, with a ``subjects.csv`` of cardseg's own columns for the indices.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import MODULE_DIR, slicer_core

slicer = slicer_core()

import CARDSegmentLib as lib  # noqa: E402
import test_slicer_cine as cine_tests  # noqa: E402
from CARDSegmentLib.outputs import nodes as outputs_lib  # noqa: E402
from CARDSegmentLib.cine import sequences as rs  # noqa: E402
from CARDSegmentLib.cine.job import case_name  # noqa: E402
from CARDSegmentLib.panel.logic import ModuleLogic  # noqa: E402
from CARDSegmentLib.cine.sequences import MIN_SLICES_FOR_INDICES, FrameMode  # noqa: E402
from test_slicer_cine import CopyingBatch, add_sequence, options_for, show_frame, write_subjects  # noqa: E402
from test_slicer_module_panel import FakeTimer, fire_until_idle, make_scene, make_widget  # noqa: E402
from test_slicer_module_panel import module  # noqa: E402,F401  (a fixture)

cine_bundle = cine_tests.cine_bundle  # the tiny bundle with an indices block (a module fixture)

FRAMES, SLICES = 30, 10
#: the scene methods that walk the whole scene (what a frame change must not call)
SCANS = ("GetNodes", "GetNodesByClass", "GetNumberOfNodes", "GetNthNode", "GetNodesByName", "GetNthNodeByClass")


@pytest.fixture(scope="module")
def frame_file(tmp_path_factory) -> Path:
    import SimpleITK as sitk
    from cardseg.bundle.phantom import synthetic_cine_volume

    vol, _ = synthetic_cine_volume(shape=(SLICES, 64, 56), spacing=(2.4, 2.4, 8.0), seed=31)
    path = tmp_path_factory.mktemp("frame") / "phase.nrrd"
    sitk.WriteImage(vol.to_image(), str(path))
    return path


@pytest.fixture(scope="module")
def engine_folders(tmp_path_factory, cine_bundle, frame_file) -> Path:
    """The real engine's output folder of the 10-slice frame, copied as every frame's, and a subjects.csv."""
    scene = make_scene()
    cine = add_sequence(scene, [frame_file])
    logic = ModuleLogic(str(MODULE_DIR), lambda: scene, FakeTimer, contextlib.nullcontext)
    options = options_for(cine_bundle, tmp_path_factory.mktemp("work"), frame_mode="shown", keep_files=True)
    job = logic.makeJob(cine.proxy, options)
    job.start()
    assert job.wait(timeout=1800) == lib.SUCCEEDED, job.error
    source = tmp_path_factory.mktemp("every-frame")
    for frame in range(FRAMES):
        shutil.copytree(job.frame_dir(0), source / case_name(frame))
    write_subjects(source / "subjects.csv", (58.0, 52.6, 63.4))
    return source


@pytest.fixture
def study(engine_folders, frame_file, cine_bundle, tmp_path):
    """A 30-frame sequence (its browser on frame 4) and a Logic whose engine is the fake batch."""
    scene = make_scene()
    cine = add_sequence(scene, [frame_file] * FRAMES)
    show_frame(cine, 4)
    logic = ModuleLogic(str(MODULE_DIR), lambda: scene, FakeTimer, contextlib.nullcontext)
    logic.launcher = CopyingBatch(engine_folders)
    return SimpleNamespace(
        scene=scene,
        cine=cine,
        logic=logic,
        bundle=cine_bundle,
        options=lambda **kw: options_for(cine_bundle, tmp_path, **kw),
    )


def count_scans(scene):
    """Count the calls of the scene-walking methods (:data:`SCANS`) made through ``scene``."""
    calls = []
    for name in SCANS:
        method = getattr(scene, name)
        setattr(scene, name, lambda *a, _m=method, _n=name, **k: (calls.append(_n), _m(*a, **k))[1])
    return calls


def test_the_results_are_sequences_of_the_inputs_browser_not_nodes_per_frame(study):
    s = study
    before = s.scene.GetNumberOfNodes()
    s.logic.runSync(s.cine.proxy, s.options(frame_mode="all"))
    cine = lib.cine_of(s.scene, s.cine.proxy)
    held = rs.result_sequences(cine)
    assert set(held) >= {"segmentation", "disagreement", "temperature", "report", "review"}
    synchronized = {q.GetID() for q in rs.synchronized_sequences(s.cine.browser)}
    for role, sequence in held.items():
        assert sequence.GetID() in synchronized and sequence.GetNumberOfDataNodes() == FRAMES, role
        assert s.cine.browser.GetSaveChanges(sequence) and s.cine.browser.GetRecording(sequence), role
        assert s.cine.browser.GetProxyNode(sequence).GetName() == f"7: SAX cine {rs_name(role)}"
    assert rs.recorded_frames(cine) == list(range(FRAMES))
    added = s.scene.GetNumberOfNodes() - before
    assert added < FRAMES  # sequences, their proxies and displays, the indices: none per frame
    assert s.logic.indices(s.cine.proxy)["indices"] and s.logic.indicesText(s.cine.proxy).startswith("ED frame")


def rs_name(role: str) -> str:
    """The role's part of an output name (``CARD segmentation``, ``disagreement``...)."""
    return lib.outputs.loading.output_names("")[role].strip()


def panel_on(module, study, monkeypatch):
    """The module's panel on the study (the application's scene), every frame chosen."""
    monkeypatch.setattr(slicer, "mrmlScene", study.scene)
    widget = make_widget(module, study.cine.proxy)
    widget.logic.ensureDependencies = lambda askConfirmation=True: None
    widget.logic.launcher = study.logic.launcher
    p = widget._parameterNode
    p.bundleSource, p.bundleFolder = module.BundleSource.FOLDER, str(study.bundle)
    p.frameMode = FrameMode.ALL
    widget._onParameterNodeModified()
    refreshes = []
    refresh = widget.refreshResults
    widget.refreshResults = lambda table=True: (refreshes.append(table), refresh(table))[1]
    return widget, refreshes


def run_through(module, widget):
    widget.onApplyButton()
    fire_until_idle(module, widget, limit=5000)
    assert widget.ui.statusLabel.text.startswith("Done"), widget.ui.statusLabel.text


def test_segmenting_all_frames_again_refreshes_the_panel_once_per_commit(module, study, monkeypatch):
    widget, refreshes = panel_on(module, study, monkeypatch)
    run_through(module, widget)
    assert len(refreshes) == 1
    shown = widget.logic.outputs(study.cine.proxy)
    kept = {n.GetID() for n in shown.nodes()}
    run_through(module, widget)  # every frame has results: all 30 are replaced
    assert len(refreshes) == 2  # one refresh for the second commit, not one per replaced node
    assert {n.GetID() for n in widget.logic.outputs(study.cine.proxy).nodes()} >= kept - {shown.indices.GetID()}
    assert len(widget.logic.reviewRows(study.cine.proxy)) == sum(
        len(lib.review_rows(o.review)) for o in widget.logic.frameOutputs(study.cine.proxy).values()
    )


def test_the_items_a_commit_replaces_are_let_go_a_few_per_tick_after_it(module, study, monkeypatch):
    rs.release_retired(None)  # what earlier tests' panels left (their release timers never fired)
    widget, _ = panel_on(module, study, monkeypatch)
    run_through(module, widget)
    assert rs.retired_count() == 0  # the first run replaced nothing
    run_through(module, widget)  # every frame again: each role's 30 items are replaced
    cine = lib.cine_of(study.scene, study.cine.proxy)
    held = rs.result_sequences(cine)
    retired = rs.retired_count()
    assert retired == FRAMES * len(held)  # kept alive: none was deleted inside the commit
    timer = FakeTimer.made[-1]
    assert timer.active and timer.interval < 100  # the panel's release timer
    ticks = 0
    while timer.active:
        before = rs.retired_count()
        timer.slot()
        assert rs.retired_count() < before  # at least one let go per tick
        ticks += 1
    assert rs.retired_count() == 0 and 1 <= ticks <= retired
    assert rs.recorded_frames(cine) == list(range(FRAMES))
    assert all(sequence.GetNumberOfDataNodes() == FRAMES for sequence in held.values())
    assert widget.logic.outputs(study.cine.proxy).segmentation is not None


def test_a_frame_change_runs_no_scene_scan(module, study, monkeypatch):
    widget, refreshes = panel_on(module, study, monkeypatch)
    run_through(module, widget)
    scans = count_scans(study.scene)
    seen = []
    for frame in (5, 6, 29, 0, 17):
        show_frame(study.cine, frame)  # the browser's ModifiedEvent reaches the panel's observer
        widget.onBrowserModified()  # (called again: nothing more to do)
        report = widget.logic.frameReport(widget._cine, frame)
        seen.append((widget._shownFrame, widget.ui.agreementLabel.text == lib.agreement_summary(report).text))
    assert scans == []
    assert seen == [(f, True) for f in (5, 6, 29, 0, 17)]
    assert len(refreshes) == 1  # the run's; a frame change refreshes no table


def test_saving_the_scene_and_reloading_it_keeps_every_frames_results(study, tmp_path):
    s = study
    s.logic.runSync(s.cine.proxy, s.options(frame_mode="all"))
    frames = s.logic.frameOutputs(s.cine.proxy)
    decided = [(f, row["region"]) for f, o in sorted(frames.items()) for row in lib.review_rows(o.review)][:2]
    assert decided, "the tiny bundle should flag a region"
    for (frame, region), status in zip(decided, ("accepted", "rejected")):
        s.logic.setRegionStatus(s.cine.proxy, region, status, "checked", frame=frame)
    indices = s.logic.indices(s.cine.proxy)

    app = slicer.vtkMRMLApplicationLogic()
    app.SetMRMLScene(s.scene)
    folder = tmp_path / "saved"
    folder.mkdir()
    assert app.SaveSceneToSlicerDataBundleDirectory(str(folder), None)
    back = load_scene(next(folder.glob("*.mrml")), tmp_path / "cache")
    proxy = back.GetNodesByClassByName("vtkMRMLScalarVolumeNode", "7: SAX cine").GetItemAsObject(0)
    cine = lib.cine_of(back, proxy)
    assert cine is not None and cine.count == FRAMES
    logic = ModuleLogic(str(MODULE_DIR), lambda: back, FakeTimer, contextlib.nullcontext)
    assert rs.recorded_frames(cine) == list(range(FRAMES))
    for frame in range(FRAMES):
        assert logic.frameReport(cine, frame)["sequence_frame"] == frame
    statuses = {(r["frame"], r["region"]): r["status"] for r in logic.reviewRows(proxy)}
    assert [statuses[key] for key in decided] == ["accepted", "rejected"]
    assert list(statuses.values()).count("pending") == len(statuses) - 2
    assert json.dumps(logic.indices(proxy), sort_keys=True) == json.dumps(indices, sort_keys=True)
    cine.show(12)  # the reloaded browser shows frame 12's results through the reloaded proxies
    shown = logic.outputs(proxy)
    assert outputs_lib.read_report(shown.report)["sequence_frame"] == 12
    assert shown.segmentation.GetSegmentation().GetNumberOfSegments() == (
        frames[12].segmentation.GetSegmentation().GetNumberOfSegments()
    )


def load_scene(mrml: Path, cache: Path):
    """A new scene read from a saved ``.mrml`` (with the cache a sequence bundle is unpacked into)."""
    scene = slicer.vtkMRMLScene()
    scene.RegisterNodeClass(slicer.vtkMRMLColorLegendDisplayNode())
    rs.sequences_logic(scene)  # as in Slicer, the Sequences logic (its node classes) is there before a load
    cache.mkdir()
    manager = slicer.vtkCacheManager()
    manager.SetRemoteCacheDirectory(str(cache))
    io = slicer.vtkDataIOManager()
    io.SetCacheManager(manager)
    scene.SetDataIOManager(io)
    scene.SetCacheManager(manager)
    scene.SetURL(str(mrml))
    scene.Import()  # reports an error for the test scene's slice nodes (no layout's orientation presets)
    return scene


def test_indices_are_refused_on_single_slice_frames_naming_the_minimum(tmp_path):
    """A per-slice-location series loads as a sequence of one-slice volumes: its indices are refused
    in one line that names the minimum; the shown frame alone may still be segmented."""
    import SimpleITK as sitk
    from cardseg.bundle.phantom import synthetic_cine_volume

    paths = []
    for i in range(3):
        vol, _ = synthetic_cine_volume(shape=(1, 64, 56), spacing=(2.4, 2.4, 8.0), seed=40 + i)
        paths.append(tmp_path / f"slice-phase{i}.nrrd")
        sitk.WriteImage(vol.to_image(), str(paths[-1]))
    scene = make_scene()
    cine = add_sequence(scene, paths)
    logic = ModuleLogic(str(MODULE_DIR), lambda: scene, FakeTimer, contextlib.nullcontext)
    outcomes = []
    for mode in ("ed_es", "all"):
        logic.start(
            cine.proxy,
            options_for(tmp_path, tmp_path, frame_mode=mode),
            onFinished=lambda state, error: outcomes.append((state, error)),
        )
    assert [state for state, _ in outcomes] == [lib.FAILED, lib.FAILED] and not logic.isRunning
    for _, error in outcomes:
        assert f"at least {MIN_SLICES_FOR_INDICES} short-axis slices (MIN_SLICES_FOR_INDICES)" in error
        assert "frames have 1" in error and "\n" not in error
    assert lib.CineJob is type(logic.makeJob(cine.proxy, options_for(tmp_path, tmp_path, frame_mode="shown")))


def _annotation(field: str) -> str:
    """The source text of ``CARDSegmentParameterNode.<field>``'s annotation in CARDSegment.py."""
    import ast

    tree = ast.parse((MODULE_DIR / "CARDSegment.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CARDSegmentParameterNode")
    return next(ast.unparse(s.annotation) for s in cls.body if isinstance(s, ast.AnnAssign) and s.target.id == field)


def test_the_ed_and_es_boxes_keep_auto_at_minus_one():
    """Slicer's spin-box connector sets a box's minimum from a ``Minimum`` annotation (else to the
    lowest int, which hid "auto" and let -2 be entered): both frames carry ``Minimum(-1)``, and the
    .ui shows "auto" at that minimum."""
    import xml.etree.ElementTree as ET

    for field in ("edFrame", "esFrame"):
        assert _annotation(field) == "Annotated[int, Minimum(-1)]", field
    ui = ET.parse(MODULE_DIR / "Resources" / "UI" / "CARDSegment.ui")
    for name in ("edFrameSpinBox", "esFrameSpinBox"):
        box = ui.find(f".//widget[@name='{name}']")
        special = box.find("property[@name='specialValueText']/string").text
        assert special.startswith("auto") and box.find("property[@name='minimum']/number").text == "-1"


@pytest.mark.skipif(not os.environ.get("SLICER_SOURCE"), reason="needs SLICER_SOURCE: a Slicer git checkout")
@pytest.mark.parametrize("tag", ["v5.8.0", "v5.10.0"])
def test_slicers_spin_box_connector_takes_the_minimum_annotation(tag):
    import subprocess

    source = subprocess.run(
        [
            "git",
            "-C",
            os.environ["SLICER_SOURCE"],
            "show",
            f"{tag}:Base/Python/slicer/parameterNodeWrapper/guiConnectors.py",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "minimum = findFirstAnnotation(annotations, validators.Minimum)" in source
    assert "self._widget.setMinimum(minimum.minimum)" in source and "self._widget.setMinimum(-(2**31))" in source


def test_the_frame_is_the_input_sequences_own_item_when_another_sequence_is_the_master(tmp_path, frame_file):
    """The browser's selected item is its master's: an input sequence synchronised with a finer
    master (here an ECG-like sequence every 20 ms) is mapped through the index value."""
    scene = make_scene()
    cine = add_sequence(scene, [frame_file] * 3)  # items at 0, 40 and 80 ms
    master = scene.AddNewNodeByClass("vtkMRMLSequenceNode", "ECG")
    master.SetIndexName("time")
    master.SetIndexUnit("ms")
    for i in range(6):
        master.SetDataNodeAtValue(slicer.vtkMRMLTextNode(), str(20 * i))
    cine.browser.SetAndObserveMasterSequenceNodeID(master.GetID())
    cine.browser.AddSynchronizedSequenceNodeID(cine.sequence.GetID())
    cine.browser.SetSelectedItemNumber(4)  # 80 ms
    cine.logic.UpdateProxyNodesFromSequences(cine.browser)
    proxy = cine.browser.GetProxyNode(cine.sequence)  # (the browser may make a new proxy for it)
    assert proxy is not None and cine.browser.GetMasterSequenceNode().GetID() == master.GetID()
    found = lib.cine_of(scene, proxy)
    assert found is not None and found.sequence.GetID() == cine.sequence.GetID() and found.count == 3
    assert found.shown == 2
    found.show(1)
    assert cine.browser.GetSelectedItemNumber() == 2 and found.shown == 1  # 40 ms
