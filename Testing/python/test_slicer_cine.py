"""Issue 24, "Cine is a sequence": a volume sequence (as Slicer's DICOM plugin loads a cine series)
through CARDSegmentLib and the module panel, on real MRML (PyPI slicer-core).

A module fixture runs the real engine once on a 3-frame phantom sequence (``cardseg batch`` in a
subprocess, untrained tiny networks with a fitted-looking ``indices`` block, ED and ES found from
the LV volume curve); the other tests replay that run's output folders through a fake process.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import shutil
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import MODULE_DIR, slicer_core

slicer = slicer_core()
from vtk.util.numpy_support import vtk_to_numpy  # noqa: E402  (comes with slicer-core)

from test_slicer_module_panel import (
    FakeTimer,
    FakeWidget,
    fire_until_idle,
    make_scene,  # noqa: E402,F401
    make_widget,
)
from test_slicer_module_panel import module  # noqa: E402,F401  (a fixture)


import CARDSegmentLib as lib  # noqa: E402
from CARDSegmentLib.cine import results as cine_results  # noqa: E402
from CARDSegmentLib.install import packages as install  # noqa: E402
from CARDSegmentLib.outputs import nodes as outputs_lib  # noqa: E402
from CARDSegmentLib.outputs import volume_files  # noqa: E402
from CARDSegmentLib.cine import sequences as seqs  # noqa: E402
from CARDSegmentLib.cine.job import CineJob, case_name  # noqa: E402
from CARDSegmentLib.panel.logic import ModuleLogic  # noqa: E402
from CARDSegmentLib.outputs.review import COLUMN_NAMES, create_review_table  # noqa: E402
from CARDSegmentLib.cine.sequences import (  # noqa: E402
    AUTO,
    MIN_SLICES_FOR_INDICES,
    FrameMode,
    FramePlan,
    cine_of,
    frame_plan,
    pick_ed_es,
)

FRAMES = 3
#: slices per frame: the fewest the cardiac indices accept
SLICES = MIN_SLICES_FOR_INDICES


def register_segmentation_converters():
    """The segmentation representations Slicer's Segmentations module registers at start-up (a
    segmentation is copied into a sequence item through them)."""
    factory = slicer.vtkSegmentationConverterFactory.GetInstance()
    registered = {r.GetClassName() for r in factory.GetConverterRules()}
    for rule in (
        slicer.vtkBinaryLabelmapToClosedSurfaceConversionRule,
        slicer.vtkClosedSurfaceToBinaryLabelmapConversionRule,
    ):
        if rule.__name__ not in registered:
            factory.RegisterConverterRule(rule())


register_segmentation_converters()


# ---------------------------------------------------------------------------------------------
# a cine sequence in a scene


def write_phantom_frames(folder: Path):
    """Three phantom frames on one grid (different seeds: different LV sizes)."""
    import SimpleITK as sitk
    from cardseg.bundle.phantom import synthetic_cine_volume

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(FRAMES):
        vol, _ = synthetic_cine_volume(shape=(SLICES, 64, 56), spacing=(2.4, 2.4, 8.0), seed=20 + i)
        paths.append(folder / f"phase{i}.nrrd")
        sitk.WriteImage(vol.to_image(), str(paths[-1]))
    return paths


def add_sequence(scene, frame_paths, name="7: SAX cine"):
    """A volume sequence with its browser and proxy volume, as the DICOM image-sequence plugin makes them."""
    scene.RegisterNodeClass(slicer.vtkMRMLSequenceNode())
    scene.RegisterNodeClass(slicer.vtkMRMLSequenceBrowserNode())
    sequence = scene.AddNewNodeByClass("vtkMRMLSequenceNode", name)
    sequence.SetIndexName("time")
    sequence.SetIndexUnit("ms")
    for i, path in enumerate(frame_paths):
        frame = slicer.vtkMRMLScalarVolumeNode()
        volume_files.read_volume_file(frame, path)
        sequence.SetDataNodeAtValue(frame, str(40 * i))
    browser = scene.AddNewNodeByClass("vtkMRMLSequenceBrowserNode", f"{name} browser")
    browser.SetAndObserveMasterSequenceNodeID(sequence.GetID())
    logic = slicer.vtkSlicerSequencesLogic()
    logic.SetMRMLScene(scene)
    logic.UpdateProxyNodesFromSequences(browser)
    proxy = browser.GetProxyNode(sequence)
    proxy.SetName(name)
    return SimpleNamespace(sequence=sequence, browser=browser, proxy=proxy, logic=logic)


def show_frame(cine, frame):
    cine.browser.SetSelectedItemNumber(frame)
    cine.logic.UpdateProxyNodesFromSequences(cine.browser)


def node_ids(scene):
    c = scene.GetNodes()
    return {c.GetItemAsObject(i).GetID() for i in range(c.GetNumberOfItems())}


def frame_items(scene, volume):
    """{frame: OutputNodes of its recorded items} of every segmented frame."""
    cine = lib.cine_of(scene, volume)
    held = seqs.result_sequences(cine)
    return {f: seqs.frame_outputs(cine, f, held) for f in seqs.recorded_frames(cine, held)}


MARK = "test.run"


def mark_items(scene, volume, run: str):
    """Mark every recorded item that has no mark yet with ``run``; returns {frame: {marks}}."""
    out = {}
    for f, o in frame_items(scene, volume).items():
        for node in o.nodes():
            if node.GetAttribute(MARK) is None:
                node.SetAttribute(MARK, run)
        out[f] = {node.GetAttribute(MARK) for node in o.nodes()}
    return out


# ---------------------------------------------------------------------------------------------
# the real engine, once


@pytest.fixture(scope="module")
def cine_bundle(tmp_path_factory, tiny_bundle):
    """The tiny bundle with an ``indices`` block (made as cardseg fit-indices makes it; scales invented)."""
    from cardseg.bundle.loading import update_config

    path = tmp_path_factory.mktemp("cine-bundle") / "bundle"
    shutil.copytree(tiny_bundle, path)
    config = json.loads((path / "bundle.json").read_text(encoding="utf-8"))
    update_config(path, {"indices": invented_block(config)})
    return path


def invented_block(config: dict) -> dict:
    """An ``indices`` block made by cardseg's own make_block with invented numbers (per-index models,
    or per-family scales in the earlier form of the block)."""
    import inspect

    from cardseg.cohort import indices as ix

    if "models" in inspect.signature(ix.make_block).parameters:
        models = {
            n: {"bias": 0.01 * i, "sd": 0.1, "pivot": 1.7, "half_width": 0.17, "n": 20}
            for i, n in enumerate(ix.INDEX_NAMES)
        }
        return ix.make_block(config, models, 0.9, 0.06)
    return ix.make_block(config, {f: 1.5 + 0.1 * i for i, f in enumerate(ix.FAMILIES)}, 0.9, 0.06)


@pytest.fixture(scope="module")
def frame_paths(tmp_path_factory):
    return write_phantom_frames(tmp_path_factory.mktemp("cine-frames"))


def options_for(bundle, work_root, **kw):
    return lib.JobOptions(
        bundle_path=str(bundle),
        device="cpu",
        method="card",
        engine_dir=str(MODULE_DIR),
        python_executable=sys.executable,
        threads=1,
        work_root=str(work_root),
        **kw,
    )


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, cine_bundle, frame_paths):
    """ED and ES of the 3-frame sequence, both found from the LV curve, by the real engine in a
    subprocess; the job's folder is kept (the per-frame outputs and subjects.csv)."""
    scene = make_scene()
    cine = add_sequence(scene, frame_paths)
    show_frame(cine, 1)
    before = node_ids(scene)
    seen = []
    options = options_for(cine_bundle, tmp_path_factory.mktemp("cine-work"), frame_mode="ed_es", keep_files=True)
    logic = ModuleLogic(str(MODULE_DIR), lambda: scene, FakeTimer, contextlib.nullcontext)
    job = logic.makeJob(cine.proxy, options, seen.append)
    assert isinstance(job, CineJob) and job.plan.frames == (0, 1, 2) and job.plan.find_ed_es
    job.start()
    assert node_ids(scene) == before  # nothing changes while the engine runs
    assert job.wait(timeout=1800) == lib.SUCCEEDED, job.error
    assert len(job.runs) == 2  # the frames, then the indices on the same folder (every frame reused)
    outputs = job.finish()
    return SimpleNamespace(
        scene=scene,
        cine=cine,
        job=job,
        outputs=outputs,
        progress=seen,
        bundle=cine_bundle,
        outdir=job.output_dir,
        logic=logic,
        config=json.loads((cine_bundle / "bundle.json").read_text(encoding="utf-8")),
    )


def test_the_real_engine_segments_every_frame_and_picks_ed_and_es_from_the_lv_curve(real_run):
    r = real_run
    assert sorted(r.outputs) == [0, 1, 2]
    lv = {
        f: json.loads((r.outdir / case_name(f) / "report.json").read_text())["class_volumes_ml"]["LV"]
        for f in range(FRAMES)
    }
    assert (r.job.ed, r.job.es) == (max(lv, key=lv.get), min(lv, key=lv.get))
    assert r.job.ed != r.job.es
    # progress counted frames
    cases = [p for p in r.progress if p.stage == "cases"]
    assert cases and cases[-1].total == FRAMES and cases[-1].done == FRAMES
    assert "Segmenting frames (3/3)" in [p.text for p in cases]
    stages = [p.stage for p in r.progress]
    assert stages.index("indices") > stages.index("cases") and stages[-1] == "loading"
    assert r.progress[-1].text == "Loading the results (3/3)"
    # per-frame nodes, named by frame, each frame's segmentation on the sequence's grid
    for f, o in r.outputs.items():
        assert o.segmentation.GetName() == f"7: SAX cine frame {f} CARD segmentation"
        assert o.segmentation.GetAttribute(outputs_lib.FRAME_ATTRIBUTE) == str(f)
        assert json.loads(o.report.GetText())["sequence_frame"] == f
    # the results are sequences synchronised with the input's browser; its proxies show frame 1's
    held = seqs.result_sequences(lib.cine_of(r.scene, r.cine.proxy))
    assert {"segmentation", "report", "review", "disagreement", "regions"} <= set(held)
    synchronized = {s.GetID() for s in seqs.synchronized_sequences(r.cine.browser)}
    for role, sequence in held.items():
        assert sequence.GetID() in synchronized and r.cine.browser.GetSaveChanges(sequence), role
        assert r.cine.browser.GetRecording(sequence) and sequence.GetNumberOfDataNodes() == FRAMES, role
        assert [sequence.GetNthIndexValue(i) for i in range(FRAMES)] == [str(40 * i) for i in range(FRAMES)]
    proxy = r.cine.browser.GetProxyNode(held["report"])
    assert json.loads(proxy.GetText())["sequence_frame"] == 1 and proxy.GetName() == "7: SAX cine CARD report"
    assert r.cine.browser.GetProxyNode(held["segmentation"]).GetDisplayNode().GetVisibility()
    proxies = {r.cine.browser.GetProxyNode(sequence).GetID() for sequence in held.values()}
    framed = {n.GetID() for n in outputs_lib.all_nodes(r.scene) if n.GetAttribute(outputs_lib.FRAME_ATTRIBUTE)}
    assert framed <= proxies  # no frame's own node stays in the scene (a proxy has its item's attributes)


def test_the_indices_shown_are_cardseg_batchs_on_the_same_frames(real_run):
    """The panel's numbers are those of cardseg.cohort.indices on the ED and ES frames' folders."""
    from cardseg.cohort.ef_categories import category_label, straddles
    from cardseg.cohort.indices import indices_from_folders
    from cardseg.cohort.subjects import implausible

    r = real_run
    expected = indices_from_folders(r.outdir / case_name(r.job.ed), r.outdir / case_name(r.job.es), r.config)
    shown = r.logic.indices(r.cine.proxy)
    problems = implausible(expected, case_name(r.job.ed), case_name(r.job.es))  # a random bundle's RV may be one
    assert "LV" not in problems
    assert (shown["ed"], shown["es"], shown["error"]) == (r.job.ed, r.job.es, "; ".join(problems.values()))
    assert shown["nominal"] == pytest.approx(expected["nominal"])
    names = [i["name"] for i in shown["indices"]]
    assert names == [n for n in expected if n != "nominal"]
    for item in shown["indices"]:
        for key in ("value", "low", "high"):
            assert item[key] == pytest.approx(expected[item["name"]][key], rel=1e-9, abs=1e-9, nan_ok=True)
    text = r.logic.indicesText(r.cine.proxy).splitlines()
    assert text[0] == (
        f"ED frame {r.job.ed} ({40 * r.job.ed} ms), ES frame {r.job.es} ({40 * r.job.es} ms); "
        "90% intervals from the bundle"
    )
    ef = expected["LVEF"]
    assert f"LV EF: {ef['value']:.1f} % ({ef['low']:.1f} to {ef['high']:.1f})" in text
    mass = expected["LVM_g"]
    assert f"LV mass: {mass['value']:.1f} g ({mass['low']:.1f} to {mass['high']:.1f})" in text
    # issue 26: the category the LVEF interval implies, in cardseg's own words, under the LV EF line
    label = category_label(ef["low"], ef["high"])
    assert label.startswith("LVEF ") and (shown["category"], shown["straddles"]) == (
        label,
        straddles(ef["low"], ef["high"]),
    )
    flag = " (interval straddles a threshold)" if shown["straddles"] else ""
    assert text[text.index(f"LV EF: {ef['value']:.1f} % ({ef['low']:.1f} to {ef['high']:.1f})") + 1] == label + flag


# ---------------------------------------------------------------------------------------------
# replays of the real run (fake process)


class CopyingBatch:
    """A fake ``cardseg batch``: copies the real run's frame folders named in the manifest (and
    subjects.csv when the manifest has ED and ES), reports one progress line per frame, exits 0."""

    def __init__(self, source: Path, kill_gate: threading.Event = None):
        self.source, self.argvs, self.lines, self.code = source, [], [], None
        self.kill_gate, self.kill_started, self.kill_done = kill_gate, threading.Event(), threading.Event()

    def __call__(self, argv, env, cwd):
        self.argvs.append(argv)
        out = Path(argv[argv.index("-o") + 1])
        with open(argv[argv.index("--manifest") + 1], newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        out.mkdir(exist_ok=True)
        for row in rows:
            if not (out / row["case"]).exists():
                shutil.copytree(self.source / row["case"], out / row["case"])
        if any(row["phase"] for row in rows):
            shutil.copy(self.source / "subjects.csv", out / "subjects.csv")
        self.lines = [json.dumps({"stage": "cases", "done": i + 1, "total": len(rows)}) for i in range(len(rows))]
        self.code = 0
        return self

    def read_lines(self):
        out, self.lines = [("stderr", ln) for ln in self.lines], []
        return out

    def returncode(self):
        return None if self.lines else self.code

    def kill(self):
        self.kill_started.set()
        if self.kill_gate is not None:
            self.kill_gate.wait(10)
        self.code = -9
        self.kill_done.set()


@pytest.fixture
def replay(real_run, frame_paths, tmp_path):
    """A fresh scene with the sequence and a Logic whose engine replays the real run."""
    scene = make_scene()
    cine = add_sequence(scene, frame_paths)
    logic = ModuleLogic(str(MODULE_DIR), lambda: scene, FakeTimer, contextlib.nullcontext)
    logic.launcher = CopyingBatch(real_run.outdir)
    return SimpleNamespace(
        scene=scene,
        cine=cine,
        cine_of=lambda: lib.cine_of(scene, cine.proxy),
        logic=logic,
        real=real_run,
        options=lambda **kw: options_for(real_run.bundle, tmp_path, **kw),
    )


def test_results_of_one_frame_survive_a_run_on_another(replay):
    r, ed, es = replay, replay.real.job.ed, replay.real.job.es
    other = ({0, 1, 2} - {ed, es}).pop()
    r.logic.runSync(r.cine.proxy, r.options(frame_mode="ed_es", ed_frame=ed, es_frame=es))
    assert mark_items(r.scene, r.cine.proxy, "first") == {ed: {"first"}, es: {"first"}}
    assert len(r.logic.launcher.argvs) == 1  # ED and ES set: one engine run, the indices in it
    indices = r.logic.indices(r.cine.proxy)
    assert (indices["ed"], indices["es"]) == (ed, es) and indices["indices"]

    show_frame(r.cine, other)  # the shown frame alone: ED's and ES's results stay, untouched
    r.logic.runSync(r.cine.proxy, r.options(frame_mode="shown"))
    assert mark_items(r.scene, r.cine.proxy, "second") == {ed: {"first"}, es: {"first"}, other: {"second"}}
    assert json.dumps(r.logic.indices(r.cine.proxy), sort_keys=True) == json.dumps(indices, sort_keys=True)  # NaN too

    show_frame(r.cine, ed)  # the ED frame again: only its items are replaced; the indices were its, so they go
    r.logic.runSync(r.cine.proxy, r.options(frame_mode="shown"))
    assert mark_items(r.scene, r.cine.proxy, "third") == {ed: {"third"}, es: {"first"}, other: {"second"}}
    assert r.logic.indices(r.cine.proxy) is None
    assert frame_items(r.scene, r.cine.proxy)[ed].segmentation.GetName() == f"7: SAX cine frame {ed} CARD segmentation"
    held = seqs.result_sequences(r.cine_of())
    assert all(s.GetNumberOfDataNodes() == FRAMES for s in held.values())  # one item per frame, none doubled


def test_the_review_covers_every_segmented_frame_and_exports_with_the_indices(replay, tmp_path):
    r = replay
    r.logic.runSync(r.cine.proxy, r.options(frame_mode="all"))
    rows = r.logic.reviewRows(r.cine.proxy)
    per_frame = {f: len(lib.review_rows(o.review)) for f, o in r.logic.frameOutputs(r.cine.proxy).items()}
    assert sorted(per_frame) == [0, 1, 2] and len(rows) == sum(per_frame.values())
    headers, cells = lib.region_table(rows)
    assert headers[0] == "Frame" and {key[0] for key, _, _ in cells} == {f for f, n in per_frame.items() if n}
    # each row's P(error) is its region's p_error in that frame's report.json ("-": the tiny bundle has no model)
    reports = {
        f: {reg["id"]: reg for reg in json.loads(o.report.GetText())["regions"]}
        for f, o in r.logic.frameOutputs(r.cine.proxy).items()
    }
    column = headers.index("P(error)")
    for (f, region), values, _ in cells:
        p = reports[f][region].get("p_error")
        assert values[column] == ("-" if p is None else f"{p:.2f}")
    # a decision in one frame's review is that frame's only
    f, region = cells[-1][0]
    r.logic.setRegionStatus(r.cine.proxy, region, "rejected", "=cmd()", frame=f)
    statuses = {(row["frame"], row["region"]): row["status"] for row in r.logic.reviewRows(r.cine.proxy)}
    assert statuses[(f, region)] == "rejected" and list(statuses.values()).count("rejected") == 1
    assert r.logic.decisionsAtRisk(r.cine.proxy, r.options(frame_mode="all"))
    # CSV: region rows of every frame, then the indices
    path = Path(r.logic.exportReview(r.cine.proxy, str(tmp_path / "cine-review.csv")))
    written = list(csv.DictReader(io.StringIO(path.read_text())))
    regions = [w for w in written if w["record"] == "region"]
    assert len(regions) == len(rows)
    assert {(int(w["frame"]), int(w["region"])) for w in regions} == {key for key, _, _ in cells}
    assert next(w for w in regions if (int(w["frame"]), int(w["region"])) == (f, region))["note"] == "'=cmd()"
    exported = {w["index"]: w for w in written if w["record"] == "index"}
    shown = r.logic.indices(r.cine.proxy)
    assert list(exported) == [i["name"] for i in shown["indices"]]
    for item in shown["indices"]:
        assert float(exported[item["name"]]["value"]) == pytest.approx(item["value"])
        assert int(exported[item["name"]]["ed_frame"]) == shown["ed"]
    assert shown["category"] and exported["LVEF"]["LVEF_category"] == shown["category"]
    assert exported["LVEF"]["LVEF_straddles"] == str(shown["straddles"]).lower()
    assert {w["LVEF_category"] for n, w in exported.items() if n != "LVEF"} == {""}
    doc = json.loads(Path(r.logic.exportReview(r.cine.proxy, str(tmp_path / "cine-review.json"))).read_text())
    assert sorted(doc["frames"]) == ["0", "1", "2"] and doc["indices"]["ed"] == shown["ed"]
    assert (doc["indices"]["category"], doc["indices"]["straddles"]) == (shown["category"], shown["straddles"])


def write_subjects(path: Path, lvef, categories: bool = True) -> Path:
    """A ``subjects.csv`` as ``cardseg batch`` writes it (cardseg's own columns, cells and category
    words) for the sequence's subject, with the LVEF interval ``lvef`` = (value, low, high); without
    the category columns (``categories`` False) as runs before issue 26 wrote it."""
    from cardseg.cohort import subjects, tables

    value, low, high = lvef
    row = {
        "subject": cine_results.SUBJECT,
        "ed_case": "frame000",
        "es_case": "frame002",
        "nominal": 0.9,
        "LVEF": value,
        "LVEF_low": low,
        "LVEF_high": high,
        "LVEDV_ml": 150.0,
        "LVEDV_ml_low": 140.0,
        "LVEDV_ml_high": 160.0,
        "error": "",
        **subjects.lvef_category_cells({"low": low, "high": high}),
    }
    columns = subjects.subject_columns(["LVEDV_ml", "LVEF"])
    if not categories:
        columns = [c for c in columns if c not in subjects.CATEGORY_COLUMNS]
    tables.write_table(path, [row], columns)
    return path


@pytest.mark.parametrize(
    "lvef, categories, line",
    [
        ((42.3, 38.2, 46.4), True, "LVEF 38-46%: reduced or mildly reduced (interval straddles a threshold)"),
        ((58.0, 52.6, 63.4), True, "LVEF 53-63%: preserved"),
        ((30.0, 20.0, 40.49), True, "LVEF 20-40%: reduced"),  # 40.49 is 40 in whole percent: one category
        ((45.0, 40.5, 49.5), True, "LVEF 41-50%: mildly reduced or preserved (interval straddles a threshold)"),
        ((42.3, 38.2, 46.4), False, None),  # a subjects.csv from before the category columns
    ],
)
def test_the_panel_shows_the_lvef_category_of_subjects_csv(tmp_path, lvef, categories, line):
    """Issue 26: the panel shows the category that cardseg batch's ``subjects.csv`` gives the LVEF
    interval and flags a straddling one; the table node keeps both and the export writes them."""
    scene = make_scene()
    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "7: SAX cine")
    read = cine_results.indices_from_subjects(write_subjects(tmp_path / "subjects.csv", lvef, categories), 0, 2)
    table = cine_results.make_indices_table(scene, volume, read)
    held = cine_results.read_indices(table)
    assert held == read and [i["name"] for i in held["indices"]] == ["LVEDV_ml", "LVEF"]
    lines = cine_results.indices_lines(held)
    assert lines[2] == f"LV EF: {lvef[0]:.1f} % ({lvef[1]:.1f} to {lvef[2]:.1f})"
    exported = {w["index"]: w for w in csv.DictReader(io.StringIO(cine_results.cine_review_csv({}, held)))}
    if line is None:
        assert (held["category"], held["straddles"]) == ("", None) and len(lines) == 3
        assert exported["LVEF"]["LVEF_category"] == exported["LVEF"]["LVEF_straddles"] == ""
        return
    assert lines[3] == line and len(lines) == 4
    assert held["straddles"] is line.endswith("(interval straddles a threshold)")
    assert exported["LVEF"]["LVEF_category"] == line.split(" (")[0]
    assert exported["LVEF"]["LVEF_straddles"] == str(held["straddles"]).lower()
    assert exported["LVEDV_ml"]["LVEF_category"] == ""


def test_an_indices_table_saved_before_the_category_shows_none(tmp_path):
    """A scene saved by an earlier version: its indices table has no category attributes."""
    scene = make_scene()
    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "7: SAX cine")
    read = cine_results.indices_from_subjects(write_subjects(tmp_path / "subjects.csv", (42.3, 38.2, 46.4)), 0, 2)
    table = cine_results.make_indices_table(scene, volume, read)
    for name in (cine_results.CATEGORY_ATTRIBUTE, cine_results.STRADDLES_ATTRIBUTE):
        table.RemoveAttribute(name)
    held = cine_results.read_indices(table)
    assert (held["category"], held["straddles"]) == ("", None)
    assert not any(ln.startswith("LVEF ") for ln in cine_results.indices_lines(held))
    assert len(cine_results.indices_lines(held)) == 3


def proxies_show(r):
    """``(frame of the report shown, segments, outline segments, overlay image or None)`` through the
    result sequences' proxies (None for the frame: the report proxy is empty)."""
    shown = r.logic.outputs(r.cine.proxy)
    text = shown.report.GetText() if shown.report is not None else ""
    image = shown.disagreement.GetImageData() if shown.disagreement is not None else None
    return (
        json.loads(text)["sequence_frame"] if text else None,
        shown.segmentation.GetSegmentation().GetNumberOfSegments(),
        shown.regions.GetSegmentation().GetNumberOfSegments() if shown.regions is not None else 0,
        vtk_to_numpy(image.GetPointData().GetScalars()).copy() if image is not None else None,
    )


def test_moving_the_frame_shows_that_frames_results_through_the_proxies(replay):
    """The browser shows each frame's results through one proxy per role (segmentation, outlines,
    overlay, report): the views keep the same nodes, set once; moving the slider changes their content."""
    from vtk.util.numpy_support import vtk_to_numpy

    r = replay
    r.logic.runSync(r.cine.proxy, r.options(frame_mode="all"))
    frames = r.logic.frameOutputs(r.cine.proxy)
    assert sorted(frames) == [0, 1, 2] and all(o.regions is not None for o in frames.values())
    assert all(o.disagreement is not None and o.temperature is not None for o in frames.values())
    shown = r.logic.outputs(r.cine.proxy)
    front = {c.GetForegroundVolumeID() for c in lib.outputs.views.slice_composite_nodes(r.scene)}
    assert front == {shown.disagreement.GetID()}  # set once, when the results were loaded
    for frame in (0, 2, 1, 0):
        show_frame(r.cine, frame)
        seen, segments, outlines, image = proxies_show(r)
        item = frames[frame]
        assert seen == frame and segments == item.segmentation.GetSegmentation().GetNumberOfSegments()
        assert outlines == item.regions.GetSegmentation().GetNumberOfSegments()
        assert np.array_equal(image, vtk_to_numpy(item.disagreement.GetImageData().GetPointData().GetScalars()))
        assert {c.GetForegroundVolumeID() for c in lib.outputs.views.slice_composite_nodes(r.scene)} == front
    r.logic.showOverlay(r.cine.proxy, "temperature", 0.5)
    assert {c.GetForegroundVolumeID() for c in lib.outputs.views.slice_composite_nodes(r.scene)} == {
        shown.temperature.GetID()
    }
    r.logic.showOverlay(r.cine.proxy, "none", 0.5)
    assert {c.GetForegroundVolumeID() for c in lib.outputs.views.slice_composite_nodes(r.scene)} == {None}


def test_a_frame_without_results_shows_nothing_of_another_frame(replay):
    """The shown frame alone segmented (frame 1); on frame 0 or 2 the proxies are empty (not frame
    1's outlines, not its map over another frame's image)."""
    r = replay
    show_frame(r.cine, 1)
    r.logic.runSync(r.cine.proxy, r.options(frame_mode="shown"))
    frames = r.logic.frameOutputs(r.cine.proxy)
    assert sorted(frames) == [1] and frames[1].regions is not None
    assert proxies_show(r)[0] == 1 and proxies_show(r)[1] > 0
    for other in (0, 2):
        show_frame(r.cine, other)
        assert proxies_show(r) == (None, 0, 0, None)
        assert r.logic.frameReport(r.cine_of(), other) is None
    show_frame(r.cine, 1)
    assert proxies_show(r)[0] == 1 and r.logic.frameReport(r.cine_of(), 1)["sequence_frame"] == 1


def test_results_load_a_frame_per_step_and_cancel_while_loading_leaves_the_scene(replay):
    """Defect 12: the timer's slot loads one frame per tick; a cancel in between removes what was made."""
    r = replay
    ids = node_ids(r.scene)
    job = r.logic.makeJob(r.cine.proxy, r.options(frame_mode="all"))
    monitor = lib.JobMonitor(job)
    assert not monitor.start()
    steps = 0
    while not monitor.step():
        steps += 1
        if job.state == lib.SUCCEEDED and job.progress.done == 2:
            break
    assert job.progress.stage == "loading" and job.progress.text == "Loading the results (2/3)"
    monitor.cancel()
    assert monitor.outcome == (lib.CANCELLED, None)
    assert node_ids(r.scene) == ids and not job.work_dir.exists()
    # and driven to the end, it takes one step per frame after the process, then one to put them in place
    job = r.logic.makeJob(r.cine.proxy, r.options(frame_mode="all"))
    monitor = lib.JobMonitor(job)
    monitor.start()
    loading = 0
    while not monitor.step():
        loading += job.state == lib.SUCCEEDED  # a tick that loaded a frame and handed back to the GUI
    assert loading == FRAMES and monitor.outcome == ("loaded", None)


def test_cancel_returns_before_the_process_is_ended(replay):
    """Defect 12: cancel hands the process's end (which may take seconds) to a background thread."""
    r = replay
    gate = threading.Event()
    r.logic.launcher = fake = CopyingBatch(r.real.outdir, kill_gate=gate)
    fake.returncode = lambda: None  # never ends by itself
    finished = []
    r.logic.start(r.cine.proxy, r.options(frame_mode="all"), onFinished=lambda s, e: finished.append(s))
    FakeTimer.made[-1].slot()
    job = r.logic.job
    r.logic.cancel()
    assert finished == [lib.CANCELLED] and not r.logic.isRunning
    assert fake.kill_started.wait(10) and not fake.kill_done.is_set()  # still ending when cancel returned
    gate.set()
    assert r.logic.waitForBackground(10) and fake.kill_done.is_set()
    assert not job.work_dir.exists()


# ---------------------------------------------------------------------------------------------
# frame choice and the ED/ES rule


def test_frame_plans():
    assert frame_plan(FrameMode.SHOWN, 5, 3) == FramePlan((3,))
    assert frame_plan(FrameMode.ED_ES, 5, 3, 0, 2) == FramePlan((0, 2), 0, 2, indices=True)
    assert frame_plan(FrameMode.ED_ES, 5, 3, 4, 1).frames == (1, 4)
    assert frame_plan(FrameMode.ED_ES, 5, 3, 4, AUTO) == FramePlan((0, 1, 2, 3, 4), 4, None, indices=True)
    assert frame_plan(FrameMode.ALL, 5, 3).find_ed_es and not frame_plan(FrameMode.ALL, 5, 3, 0, 1).find_ed_es
    with pytest.raises(ValueError, match="same frame"):
        frame_plan(FrameMode.ED_ES, 5, 0, 2, 2)
    with pytest.raises(ValueError, match="ES frame 9 is not in the sequence"):
        frame_plan(FrameMode.ALL, 5, 0, AUTO, 9)
    with pytest.raises(ValueError, match="at least two frames"):
        frame_plan(FrameMode.ED_ES, 1, 0)
    assert frame_plan(FrameMode.ALL, 1, 0) == FramePlan((0,))  # all of one frame: that frame, no indices


def test_ed_is_the_largest_lv_volume_and_es_the_smallest_unless_set():
    lv = {0: 120.0, 1: 150.0, 2: 60.0, 3: 60.0, 4: 90.0}
    assert pick_ed_es(lv) == (1, 2)  # ties: the earlier frame
    assert pick_ed_es(lv, ed=0) == (0, 2)
    assert pick_ed_es(lv, es=4) == (1, 4)
    assert pick_ed_es({0: 5.0, 1: 5.0}) == (0, 1)  # a flat curve still gives two frames
    with pytest.raises(ValueError):
        pick_ed_es({0: 1.0})


# ---------------------------------------------------------------------------------------------
# the panel with a sequence, and a plain volume unchanged


def test_the_panel_with_a_sequence(module, replay, monkeypatch):
    r = replay
    monkeypatch.setattr(slicer, "mrmlScene", r.scene)  # the module's Logic works on the application's scene
    widget = make_widget(module, r.cine.proxy)
    widget.logic.ensureDependencies = lambda askConfirmation=True: None
    widget.logic.launcher = r.logic.launcher
    p = widget._parameterNode
    p.bundleSource, p.bundleFolder = module.BundleSource.FOLDER, str(r.real.bundle)
    p.frameMode = FrameMode.ED_ES
    widget._onParameterNodeModified()
    assert widget.ui.cineGroupBox.visible and widget.ui.edFrameSpinBox.enabled
    assert widget.ui.esFrameSpinBox.maximum == FRAMES - 1
    widget.onApplyButton()
    fire_until_idle(module, widget)
    assert widget.ui.statusLabel.text.startswith("Done"), widget.ui.statusLabel.text
    lines = widget.ui.indicesLabel.text.splitlines()
    checked = 1 if widget.logic.indices(r.cine.proxy)["error"] else 0  # "Check these numbers: ..." (a random RV)
    assert lines == widget.logic.indicesText(r.cine.proxy).splitlines() and len(lines) == 11 + checked  # 9 + category
    assert lines[lines.index(next(ln for ln in lines if ln.startswith("LV EF: "))) + 1].startswith("LVEF ")
    table = widget.ui.regionsTable
    assert table.called("setHorizontalHeaderLabels")[-1][0][0] == "Frame"
    assert table.called("setRowCount")[-1] == (len(widget.logic.reviewRows(r.cine.proxy)),)
    # the frame slider: the proxies show frame 2; the panel's agreement line is frame 2's
    show_frame(r.cine, 2)
    widget.onBrowserModified()
    report = json.loads(widget.logic.outputs(r.cine.proxy).report.GetText())
    assert report["sequence_frame"] == 2
    assert widget.ui.agreementLabel.text == lib.agreement_summary(report).text
    # an impossible choice is one line, nothing started
    p.frameMode, p.edFrame, p.esFrame = FrameMode.ED_ES, 1, 1
    widget.onApplyButton()
    assert widget.ui.statusLabel.text == "Failed: ED and ES are the same frame (1); choose two frames"
    assert not widget.logic.isRunning and widget.ui.applyButton.text == "Segment && Calibrate"


def test_a_plain_volume_works_as_before(module, real_run, tmp_path, rotated_nifti):
    """No sequence: the one-shot segment job, frameless outputs with the old names, no Frame column."""
    scene = slicer.mrmlScene
    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "cine")
    volume_files.read_volume_file(volume, rotated_nifti)
    widget = make_widget(module, volume)
    assert cine_of(scene, volume) is None
    job = widget.logic.makeJob(volume, options_for(real_run.bundle, tmp_path))
    assert isinstance(job, lib.SegmentationJob)
    widget._onParameterNodeModified()
    assert not widget.ui.cineGroupBox.visible
    assert widget.ui.indicesLabel.text == ""
    headers, cells = lib.region_table(
        [
            {
                "frame": None,
                "region": 1,
                "status": "pending",
                "volume_mm3": 1000.0,
                "mean_disagreement": 0.1,
                "classes": "LV",
                "note": "",
            }
        ]
    )
    assert headers == ("#", "Status", "P(error)", "Volume (ml)", "Mean disagr.", "Classes")
    assert cells[0][1] == ("1", "pending", "-", "1.00", "0.100", "LV")  # a row without p_error


def test_the_region_table_shows_each_regions_p_error():
    """Issue 22: the panel's table has ``p_error`` (two decimals; "-" for a region without one and
    for a review table saved before the column existed), from the review table node."""
    scene = make_scene()
    regions = [
        {"id": 1, "p_error": 0.4249, "volume_mm3": 10800.0, "mean_disagreement": 0.2, "classes": ["LV"]},
        {"id": 2, "p_error": None, "volume_mm3": 900.0, "mean_disagreement": 0.1, "classes": ["RV", "MYO"]},
        {"id": 3, "p_error": 0.996, "volume_mm3": 50.0, "mean_disagreement": 0.3, "classes": ["MYO"]},
    ]
    current = create_review_table(scene, regions, "current")
    older = create_review_table(scene, regions[:1], "older")
    older.RemoveColumn(list(COLUMN_NAMES).index("p_error"))
    assert older.GetTable().GetColumnByName("p_error") is None
    rows = [dict(row, frame=4) for row in lib.review_rows(current)] + [
        dict(row, frame=5) for row in lib.review_rows(older)
    ]
    headers, cells = lib.region_table(rows)
    assert headers == ("Frame", "#", "Status", "P(error)", "Volume (ml)", "Mean disagr.", "Classes")
    assert [values[:4] for _, values, _ in cells] == [
        ("4", "1", "pending", "0.42"),
        ("4", "2", "pending", "-"),
        ("4", "3", "pending", "1.00"),
        ("5", "1", "pending", "-"),
    ]
    # the panel's QTableWidget gets the same cells, and the Status column is still found by name
    table = FakeWidget()
    status_column, keys = lib.fill_region_table(table, rows, lambda text: text)
    assert table.called("setHorizontalHeaderLabels")[-1] == (list(headers),)
    assert (0, 3, "0.42") in table.called("setItem") and (3, 3, "-") in table.called("setItem")
    assert status_column == 2 and keys == [(4, 1), (4, 2), (4, 3), (5, 1)]


# ---------------------------------------------------------------------------------------------
# defect 5: Slicer 5.12+ shows its own install dialogs


class App:
    def __init__(self, major, minor):
        self.majorVersion, self.minorVersion = major, minor


@pytest.mark.parametrize("version, own", [((5, 8), False), ((5, 10), False), ((5, 12), True), ((6, 0), True)])
def test_pip_install_leaves_slicers_own_dialogs_alone(monkeypatch, version, own):
    cursors = []

    class Cursor:
        def __enter__(self):
            cursors.append("on")

        def __exit__(self, *exc):
            cursors.append("off")

    def failing_pip(specs):
        assert cursors == ([] if own else ["on"])  # no wait cursor over 5.12's modal progress dialog
        raise RuntimeError("pip install failed: no matching distribution for monai>=1.5\ntraceback ...")

    monkeypatch.setattr(slicer.util, "WaitCursor", Cursor)
    monkeypatch.setattr(slicer.util, "pip_install", failing_pip)
    monkeypatch.setattr(install, "_APPLICATION", App(*version))
    with pytest.raises(install.InstallFailed) as failed:
        install._pip_install(["monai>=1.5"])
    assert failed.value.shown is own
    assert str(failed.value) == "pip install failed: no matching distribution for monai>=1.5"
    assert install.slicer_shows_install_dialogs(install.slicer_version()) is own
    assert install.slicer_version() == version and install.slicer_version(object()) is None


@pytest.mark.parametrize("shown", [True, False])
def test_the_panel_adds_no_second_error_dialog_to_slicers(module, rotated_nifti, shown):
    volume = slicer.mrmlScene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "cine")
    volume_files.read_volume_file(volume, rotated_nifti)
    widget = make_widget(module, volume)

    def failing(askConfirmation=True):
        raise install.InstallFailed("pip install failed: network unreachable", shown=shown)

    widget.logic.ensureDependencies = failing
    widget.onApplyButton()
    message = "Installing the Python packages failed: pip install failed: network unreachable"
    assert widget.ui.statusLabel.text == message
    assert module.dialogs.errors == ([] if shown else [message])
    assert widget.ui.applyButton.enabled and not widget.logic.isRunning


def test_the_module_hands_the_application_to_the_installer():
    source = (MODULE_DIR / "CARDSegment.py").read_text(encoding="utf-8")
    assert 'use_application(getattr(slicer, "app", None))' in source


@pytest.mark.parametrize("version, own", [((5, 10), False), ((5, 12), True)])
def test_torch_is_installed_without_a_wait_cursor_over_slicers_dialog(monkeypatch, version, own):
    cursors = []

    class Cursor:
        def __enter__(self):
            cursors.append("on")

        def __exit__(self, *exc):
            return False

    class TorchLogic:
        def torchInstalled(self):
            return False

        def installTorch(self, askConfirmation, torchVersionRequirement):
            assert cursors == ([] if own else ["on"])
            return object()

    monkeypatch.setattr(slicer.util, "WaitCursor", Cursor)
    monkeypatch.setitem(sys.modules, "PyTorchUtils", SimpleNamespace(PyTorchUtilsLogic=TorchLogic))
    monkeypatch.setattr(install, "_APPLICATION", App(*version))
    install._install_torch()
    assert cursors == ([] if own else ["on"])


@pytest.mark.skipif(not os.environ.get("SLICER_SOURCE"), reason="needs SLICER_SOURCE: a Slicer git checkout")
def test_slicer_5_12_is_the_first_whose_pip_install_shows_its_own_dialogs():
    """The version rule of defect 5, checked against Slicer's source (tags v5.10.0 and v5.12.0)."""

    def show(tag, path):
        return subprocess.run(
            ["git", "-C", os.environ["SLICER_SOURCE"], "show", f"{tag}:{path}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    old = show("v5.10.0", "Base/Python/slicer/util.py")
    assert "def pip_install(requirements):" in old and "show_progress" not in old
    new = show("v5.12.0", "Base/Python/slicer/packaging.py")
    assert "show_progress: bool = True" in new and "blocking: bool = True" in new
    assert "When show_progress=True, an error dialog with the full log is shown before raising." in new
    assert install.OWN_DIALOGS_FROM == (5, 12)


def test_one_highlighted_region_across_frames_and_none_once_the_selection_is_cleared(replay):
    """The outlines are one proxy: selecting a region of another frame moves the browser there and
    highlights that region alone; a frame change or a cleared selection leaves no highlight."""
    from CARDSegmentLib.outputs.region_outlines import SELECTED_ATTRIBUTE, region_segment_ids

    r = replay
    r.logic.runSync(r.cine.proxy, r.options(frame_mode="all"))
    frames = r.logic.frameOutputs(r.cine.proxy)
    with_regions = [f for f, o in frames.items() if lib.review_rows(o.review)]
    assert len(with_regions) >= 2, "the test bundle should flag regions in two frames"
    outlines = r.logic.outputs(r.cine.proxy).regions

    def overridden():
        display = outlines.GetDisplayNode()
        return {s for s in region_segment_ids(outlines).values() if display.GetSegmentOverrideColor(s).GetX() >= 0}

    first, second = with_regions[:2]
    region = lib.review_rows(frames[first].review)[0]["region"]
    r.logic.showRegion(r.cine.proxy, region, frame=first)
    assert r.cine_of().shown == first and outlines.GetAttribute(SELECTED_ATTRIBUTE) == str(region)
    other = lib.review_rows(frames[second].review)[-1]["region"]
    r.logic.showRegion(r.cine.proxy, other, frame=second)
    assert r.cine_of().shown == second and outlines.GetAttribute(SELECTED_ATTRIBUTE) == str(other)
    assert overridden() == {region_segment_ids(outlines)[other]}
    r.logic.clearRegionHighlight(r.cine.proxy)
    assert outlines.GetAttribute(SELECTED_ATTRIBUTE) is None and overridden() == set()
    r.logic.clearRegionHighlight(None)  # no input volume selected: nothing to do


def test_a_subject_the_engine_found_implausible_shows_its_numbers_with_the_problem(tmp_path):
    """subjects.csv keeps an implausible subject's numbers with its error: the panel shows both
    (before: 'No cardiac indices'); without numbers (no fitted intervals) it says so."""
    path = tmp_path / "subjects.csv"
    path.write_text(
        "subject,ed_case,es_case,nominal,RVEF,RVEF_low,RVEF_high,LVEF,LVEF_low,LVEF_high,"
        "LVEF_category,LVEF_straddles,error\n"
        f"{cine_results.SUBJECT},frame-000,frame-001,0.9,-5.0,-9.0,-1.0,60.0,56.0,64.0,"
        "LVEF 56-64%: preserved,false,RV ESV 80.0 ml (case frame-001) exceeds EDV 76.2 ml\n"
    )
    shown = cine_results.indices_from_subjects(path, 0, 1)
    assert [i["name"] for i in shown["indices"]] == ["RVEF", "LVEF"] and shown["category"].startswith("LVEF 56-64%")
    lines = cine_results.indices_lines(shown)
    assert "LV EF: 60.0 % (56.0 to 64.0)" in lines and "LVEF 56-64%: preserved" in lines
    assert lines[-1] == "Check these numbers: RV ESV 80.0 ml (case frame-001) exceeds EDV 76.2 ml"
    path.write_text(
        "subject,ed_case,es_case,nominal,LVEF,LVEF_low,LVEF_high,error\n"
        f"{cine_results.SUBJECT},frame-000,frame-001,,,,,the bundle has no fitted intervals\n"
    )
    assert cine_results.indices_lines(cine_results.indices_from_subjects(path, 0, 1))[1:] == [
        "No cardiac indices: the bundle has no fitted intervals"
    ]


def test_outputs_are_named_from_the_sequence_not_from_the_renamed_proxy(replay):
    """MultiVolumeImporter renames the proxy on every frame ("name [time = 80ms]"): the outputs,
    the indices and the export take the sequence's name."""
    r = replay
    show_frame(r.cine, 2)
    r.cine.proxy.SetName("7: SAX cine [time = 80ms]")
    r.logic.runSync(r.cine.proxy, r.options(frame_mode="all"))
    assert r.logic.outputs(r.cine.proxy).segmentation.GetName() == "7: SAX cine CARD segmentation"
    assert frame_items(r.scene, r.cine.proxy)[2].segmentation.GetName() == "7: SAX cine frame 2 CARD segmentation"
    assert r.logic.outputs(r.cine.proxy).indices.GetName() == "7: SAX cine CARD indices"
    assert r.logic.baseName(r.cine.proxy) == "7: SAX cine"
