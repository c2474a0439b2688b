"""`cardseg batch` with cine inputs: a 4D NIfTI as one subject, ED and ES from the fast pass's LV
curve, curves.csv, rates and the curve plot; the same indices as a manifest naming those frames;
--frames all; a kept curve on a rerun; frames on different grids (untrained tiny bundle, the
phantom scaled per frame)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from scipy import ndimage

from cardseg.cine.phases import FIXED, RWAVE_SHARE, choose_phases
from cardseg.cohort import batch as cohort_batch
from cardseg.cohort import cine as cohort_cine
from cardseg.cohort.batch import run_batch
from cardseg.cohort.cine_tables import WALL_COLUMNS, add_wall_cells
from cardseg.cohort.indices import frame_volumes
from cardseg.cohort.options import BatchOptions
from conftest import read_csv, run_cli_quiet

FRAMES = 5
FRAME_S = 0.04  # the NIfTI's pixdim[4], in seconds as ITK writes it
INDEX_COLUMNS = ("LVEDV_ml", "LVESV_ml", "LVEF", "RVEDV_ml", "RVESV_ml")


def write_cine(path: Path, vol, frames: int = FRAMES) -> Path:
    """The phantom as a 4D NIfTI whose anatomy is scaled in-plane about the image centre per frame
    (largest at frame 0), ``FRAME_S`` apart."""
    a = vol.array
    centre = np.array([(a.shape[1] - 1) / 2, (a.shape[2] - 1) / 2])
    out = []
    for k in range(frames):
        s = 1.0 - 0.2 * math.sin(math.pi * k / frames)
        m = np.eye(2) / s
        planes = [ndimage.affine_transform(p, m, centre - m @ centre, order=1, mode="nearest") for p in a]
        img = sitk.GetImageFromArray(np.stack(planes).astype(np.float32))
        out.append(img)
    cine = sitk.JoinSeries(out)
    cine.SetSpacing((*vol.spacing, FRAME_S))
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(cine, str(path))
    return path


def index_values(ed_dir, es_dir, config):
    """A stand-in for the fitted indices: the indices of the two segmentations, no interval."""
    from cardseg.cohort.indices import cardiac_indices, frame_volumes, read_segment_folder

    names = [c["name"] for c in config["classes"]]
    vols = []
    for folder in (ed_dir, es_dir):
        arrays, spacing, _ = read_segment_folder(Path(folder))
        vols.append(frame_volumes(arrays["labels"], spacing, names, {}))
    values = cardiac_indices(*vols)
    return {n: {"value": v, "low": v - 1.0, "high": v + 1.0} for n, v in values.items()} | {"nominal": 0.9}


def batch(**kw):
    return run_batch(BatchOptions(progress="none", quiet=True, **kw))


@pytest.fixture(scope="module")
def cine_run(tmp_path_factory, tiny_bundle, synthetic_volume):
    """One 4D input through ``--frames ed-es`` (the default), with index values from the segmentations."""
    root = tmp_path_factory.mktemp("cine")
    path = write_cine(root / "in" / "p1.nii.gz", synthetic_volume[0])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cohort_batch, "indices_function", lambda: index_values)
        result = batch(inputs=[str(path)], output=str(root / "out"), bundle=str(tiny_bundle))
    return {"root": root, "path": path, "out": root / "out", "result": result}


def test_ed_and_es_come_from_the_lv_curve(cine_run, tiny_bundle):
    out = cine_run["out"]
    names = [c["name"] for c in json.loads((tiny_bundle / "bundle.json").read_text())["classes"]]
    cohort = {r["case"]: r for r in read_csv(out / "cohort.csv")}
    assert sorted(cohort) == ["p1_ED", "p1_ES"] and all(r["status"] == "ok" for r in cohort.values())
    curve = read_csv(out / "curves.csv")
    assert [int(r["frame"]) for r in curve] == list(range(FRAMES)) and {r["subject"] for r in curve} == {"p1"}
    lv = {int(r["frame"]): float(r["LV_ml"]) for r in curve}
    choice = choose_phases(lv)
    assert int(cohort["p1_ED"]["frame"]) == choice.ed and int(cohort["p1_ES"]["frame"]) == choice.es
    # the uc pass's curve is the CARD segmentation's: equal volumes at the two frames CARD ran on
    for case, frame in (("p1_ED", choice.ed), ("p1_ES", choice.es)):
        labels = sitk.ReadImage(str(out / case / "segmentation.nii.gz"))
        volumes = frame_volumes(sitk.GetArrayFromImage(labels), labels.GetSpacing(), names, {})
        assert (volumes["LV"], volumes["RV"]) == (lv[frame], float(curve[frame]["RV_ml"]))
    assert [r["phase"] for r in curve].count("ED") == 1 and curve[choice.ed]["phase"] == "ED"
    assert [float(r["time_ms"]) for r in curve] == pytest.approx([1000 * FRAME_S * k for k in range(FRAMES)])


def test_subjects_carry_frames_rates_and_the_curve_check(cine_run):
    (row,) = read_csv(cine_run["out"] / "subjects.csv")
    lv = [float(r["LV_ml"]) for r in read_csv(cine_run["out"] / "curves.csv")]
    ed, es = int(row["ed_frame"]), int(row["es_frame"])
    assert (row["ed_case"], row["es_case"], row["frames"]) == ("p1_ED", "p1_ES", str(FRAMES))
    assert row["ed_rule"] == "largest LV" and row["es_rule"] == "smallest LV"
    hr = 60.0 / (FRAMES * FRAME_S)
    assert float(row["heart_rate_bpm"]) == pytest.approx(hr) and row["rates_source"] == "frame interval"
    assert float(row["cardiac_output_l_min"]) == pytest.approx((lv[ed] - lv[es]) * hr / 1000.0)
    assert float(row["LVEDV_ml"]) == lv[ed] and float(row["LVESV_ml"]) == lv[es]
    assert row["curve_plausible"] in ("true", "false")
    assert (row["curve_plausible"] == "false") == bool(row["curve_problems"])
    wall = pytest.importorskip("cardseg.cine.wall", reason="cardseg.cine.wall not there yet")
    assert wall is not None and all(c in row for c in WALL_COLUMNS)


def test_the_triage_page_plots_the_curves(cine_run):
    page = (cine_run["out"] / "triage.html").read_text()
    assert page.count('class="curve" data-subject="p1"') == 1  # on the ED case's row only
    assert "data:image/png;base64," in page.split('class="curve-plot"')[1][:200]
    (row,) = read_csv(cine_run["out"] / "subjects.csv")
    assert ("volume curve flagged" in page) == (row["curve_plausible"] == "false")


def test_a_manifest_naming_the_found_frames_gives_the_same_indices(cine_run, tiny_bundle, monkeypatch):
    (found,) = read_csv(cine_run["out"] / "subjects.csv")
    manifest = cine_run["root"] / "named.csv"
    manifest.write_text(
        "case,path,frame,phase,subject\n"
        f"ed,{cine_run['path']},{found['ed_frame']},ED,p1\n"
        f"es,{cine_run['path']},{found['es_frame']},ES,p1\n"
    )
    monkeypatch.setattr(cohort_batch, "indices_function", lambda: index_values)
    out = cine_run["root"] / "named"
    result = batch(manifest=str(manifest), output=str(out), bundle=str(tiny_bundle))
    assert result.failed == 0 and not (out / "curves.csv").exists()
    (named,) = read_csv(out / "subjects.csv")
    assert {c: named[c] for c in INDEX_COLUMNS} == {c: found[c] for c in INDEX_COLUMNS}


def test_a_rerun_keeps_the_curve_and_the_cases(cine_run, tiny_bundle, monkeypatch):
    def no_pass(*_a, **_k):
        raise AssertionError("the fast pass ran again")

    monkeypatch.setattr(cohort_cine, "fast_pass", no_pass)
    monkeypatch.setattr(cohort_batch, "indices_function", lambda: index_values)
    before = (cine_run["out"] / "curves.csv").read_text()
    result = batch(inputs=[str(cine_run["path"])], output=str(cine_run["out"]), bundle=str(tiny_bundle))
    assert result.reused == 2 and result.failed == 0
    assert (cine_run["out"] / "curves.csv").read_text() == before


def test_a_manifest_can_fix_one_frame(cine_run, tiny_bundle):
    (found,) = read_csv(cine_run["out"] / "subjects.csv")
    fixed = int(found["es_frame"])  # ED fixed where the curve is smallest: ES comes from the other frames
    manifest = cine_run["root"] / "fix.csv"
    manifest.write_text(
        f"case,path,frame,phase,subject\nd,{cine_run['path']},{fixed},ED,p1\ns,{cine_run['path']},,ES,p1\n"
    )
    out = cine_run["root"] / "fix"
    batch(manifest=str(manifest), output=str(out), bundle=str(tiny_bundle))
    cohort = {r["case"]: r for r in read_csv(out / "cohort.csv")}
    (row,) = read_csv(out / "subjects.csv")
    assert int(cohort["d"]["frame"]) == fixed and row["ed_rule"] == FIXED and row["es_rule"] == "smallest LV"
    lv = {int(r["frame"]): float(r["LV_ml"]) for r in read_csv(out / "curves.csv")}
    assert int(cohort["s"]["frame"]) == choose_phases(lv, ed=fixed).es != fixed


def test_frames_all_segments_every_frame_with_the_same_curve(cine_run, tiny_bundle):
    out = cine_run["root"] / "all"
    result = batch(inputs=[str(cine_run["path"])], output=str(out), bundle=str(tiny_bundle), frames="all")
    assert result.failed == 0 and result.computed == FRAMES
    cohort = read_csv(out / "cohort.csv")
    assert [r["case"] for r in cohort] == [f"p1_f{k:02d}" for k in range(FRAMES)]
    assert read_csv(out / "curves.csv") == read_csv(cine_run["out"] / "curves.csv")
    (fast,) = read_csv(cine_run["out"] / "subjects.csv")
    phases = {r["phase"]: int(r["frame"]) for r in cohort if r["phase"]}
    assert phases == {"ED": int(fast["ed_frame"]), "ES": int(fast["es_frame"])}


def test_frames_on_different_grids_are_refused(cine_run, tiny_bundle, monkeypatch):
    import cardseg.io.volume as volume_module

    real = volume_module.read_volume

    def moved(path, frame=None, spacing=None):
        vol = real(path, frame, spacing)
        if frame == 2:
            vol.origin = (vol.origin[0] + 5.0, *vol.origin[1:])
        return vol

    monkeypatch.setattr(volume_module, "read_volume", moved)
    out = cine_run["root"] / "grids"
    result = batch(inputs=[str(cine_run["path"])], output=str(out), bundle=str(tiny_bundle))
    assert result.failed == 2 and result.computed == 0
    errors = {r["error"] for r in read_csv(out / "cohort.csv")}
    assert len(errors) == 1 and "frame 2 lies on another grid than frame 0 (origin" in errors.pop()
    assert not (out / "curves.csv").exists()


def test_frame_picks_one_frame_and_frames_with_it_is_refused(cine_run, tiny_bundle, tmp_path):
    rc, err = run_cli_quiet(
        ["batch", str(cine_run["path"]), "-o", str(tmp_path / "o"), "--bundle", str(tiny_bundle), "--frame", "1",
         "--frames", "all", "--progress", "none"]
    )  # fmt: skip
    assert rc == 2 and err.strip().splitlines() == [
        "cardseg: error: give --frame N (one frame of every 4D input) or --frames, not both"
    ]
    assert not (tmp_path / "o").exists()
    result = batch(inputs=[str(cine_run["path"])], output=str(tmp_path / "one"), bundle=str(tiny_bundle), frame=1)
    assert [r["case"] for r in result.rows] == ["p1"] and result.rows[0]["frame"] == 1
    assert not (tmp_path / "one" / "curves.csv").exists()


def test_the_wall_hook_adds_its_columns_only_with_the_module(tmp_path):
    rows = [
        {"subject": "s", "ed_case": "a", "es_case": "b", "error": ""},
        {"subject": "t", "ed_case": "", "es_case": ""},
    ]
    assert add_wall_cells(rows, tmp_path, lambda case: True, None) == [] and "WT_max_mm" not in rows[0]

    class Thick:
        def __init__(self, mm):
            self.segments_mm, self.max_mm = tuple([mm] * 15 + [float("nan")]), mm

    def thickness(labels, spacing):
        return Thick(float(labels.sum()))

    def thickening(ed, es):
        return tuple((b - a) / a for a, b in zip(ed.segments_mm, es.segments_mm))

    for name, value in (("a", 1), ("b", 2)):  # "thickness" 18 at ED, 36 at ES
        (tmp_path / name).mkdir()
        image = sitk.GetImageFromArray(np.full((2, 3, 3), value, np.uint8))
        sitk.WriteImage(image, str(tmp_path / name / "segmentation.nii.gz"))
    columns = add_wall_cells(rows, tmp_path, lambda case: True, (thickness, thickening))
    assert columns == list(WALL_COLUMNS)
    assert rows[0]["WT_seg1_mm"] == 18.0 and rows[0]["WT_seg16_mm"] is None and rows[0]["WT_max_mm"] == 18.0
    assert rows[0]["WT_thickening_mean_pct"] == 100.0 and rows[1]["WT_max_mm"] is None


def test_a_dicom_cine_folder_is_one_subject_with_its_trigger_times(tmp_path, tiny_bundle, synthetic_volume):
    from test_cine_phases import write_dicom_cine

    folder = write_dicom_cine(tmp_path / "in" / "d1", synthetic_volume[0], phases=3)
    result = batch(inputs=[str(folder)], output=str(tmp_path / "out"), bundle=str(tiny_bundle))
    assert [r["case"] for r in result.rows] == ["d1_ED", "d1_ES"] and result.failed == 0
    curve = read_csv(tmp_path / "out" / "curves.csv")
    assert [float(r["time_ms"]) for r in curve] == [25.0, 70.0, 115.0]
    (row,) = read_csv(tmp_path / "out" / "subjects.csv")
    assert row["rates_source"] == "R-R interval" and float(row["heart_rate_bpm"]) == pytest.approx(60000.0 / 810.0)
    lv = [float(r["LV_ml"]) for r in curve]
    rwave = lv[0] >= (1 - RWAVE_SHARE) * max(lv)  # frame 0 has the smallest trigger time
    assert row["ed_rule"] == ("R-wave frame" if rwave else "largest LV")
    assert int(row["ed_frame"]) == (0 if rwave else lv.index(max(lv)))


def test_an_interrupt_in_the_fast_pass_leaves_the_cases_pending(cine_run, tiny_bundle, tmp_path, monkeypatch):
    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cohort_cine, "fast_pass", interrupted)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt) as caught:
        batch(inputs=[str(cine_run["path"])], output=str(out), bundle=str(tiny_bundle))
    assert {r["case"]: r["status"] for r in read_csv(out / "cohort.csv")} == {"p1_ED": "pending", "p1_ES": "pending"}
    assert not (out / "curves.csv").exists() and not (out / ".cardseg-batch-curves.jsonl").exists()
    assert "2 unfinished cases are 'pending'" in cohort_batch.interrupted_line("interrupted", caught.value)
    monkeypatch.undo()
    again = batch(inputs=[str(cine_run["path"])], output=str(out), bundle=str(tiny_bundle))
    assert again.failed == 0 and again.computed == 2 and (out / "curves.csv").is_file()
