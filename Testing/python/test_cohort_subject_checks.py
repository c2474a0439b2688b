"""A study's subject table says when its numbers cannot be a heart's, and its manifest refuses a
subject whose ED and ES are one image.

* ED and ES swapped (an ESV above its EDV) or an LV empty at ED: the row keeps its numbers, names
  the problem in ``error`` and gets no LVEF category (before: a negative LVEF read "LVEF 0%:
  reduced", settled, with no error); an RV problem is named but leaves the LVEF category.
* A relative-error model gives no interval around a volume of 0 or a negative stroke volume.
* The manifest refuses ED = ES (same file, same frame) and a NUL in a path in one line, and reads
  relative paths from the manifest's own folder even when it is reached through a link.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from cardseg.base.errors import CardsegError
from cardseg.cohort import indices as ix
from cardseg.cohort.cases import Case, read_manifest
from cardseg.cohort.subjects import subject_rows

MODELS = {n: {"bias": 0.0, "half_width": 0.1 if n in ix.RELATIVE else 4.0} for n in ix.INDEX_NAMES}
BLOCK = {"models": MODELS, "nominal": 0.9}


def _rows(ed: dict, es: dict):
    """The subject table of one subject whose ED and ES volumes (ml) are ``ed`` and ``es``."""
    cases = [Case("s_ed", "/x/ed.nii.gz", None, "ED", "s"), Case("s_es", "/x/es.nii.gz", None, "ES", "s")]

    def compute(ed_dir, es_dir, config):
        return ix.subject_intervals(ix.cardiac_indices(ed, es), BLOCK)

    rows, _ = subject_rows(Path("/nowhere"), cases, {"s_ed": "ok", "s_es": "ok"}, {}, compute)
    return rows[0]


def test_a_plausible_subject_gets_its_category_and_no_error():
    row = _rows({"LV": 150.0, "RV": 160.0, "MYO": 100.0}, {"LV": 60.0, "RV": 80.0, "MYO": 100.0})
    assert row["error"] == "" and row["LVEF"] == pytest.approx(60.0)
    assert row["LVEF_category"] == "LVEF 56-64%: preserved" and row["LVEF_straddles"] is False


def test_ed_and_es_swapped_is_named_and_gets_no_category():
    row = _rows({"LV": 60.0, "RV": 80.0, "MYO": 100.0}, {"LV": 150.0, "RV": 160.0, "MYO": 100.0})
    assert row["LVEF"] == pytest.approx(-150.0)  # the numbers stay, for the record
    assert row["error"].startswith("LV ESV 150.0 ml (case s_es) exceeds EDV 60.0 ml (case s_ed): ED and ES swapped")
    assert "RV ESV 160.0 ml" in row["error"]
    assert row["LVEF_category"] == "" and row["LVEF_straddles"] == ""
    assert math.isnan(row["LVSV_ml_low"]) and math.isnan(row["LVSV_ml_high"])  # no relative interval below 0


def test_an_lv_empty_at_ed_is_named_and_its_volume_has_no_interval():
    row = _rows({"LV": 0.0, "RV": 160.0, "MYO": 100.0}, {"LV": 0.0, "RV": 80.0, "MYO": 100.0})
    assert row["error"] == "no LV at ED (case s_ed): no LVEF"
    assert math.isnan(row["LVEF"]) and row["LVEF_category"] == ""
    assert math.isnan(row["LVEDV_ml_low"]) and math.isnan(row["LVEDV_ml_high"])
    assert row["RVEF"] == pytest.approx(50.0) and row["RVEF_low"] <= 50.0 <= row["RVEF_high"]


def test_an_rv_problem_is_named_but_keeps_the_lvef_category():
    row = _rows({"LV": 150.0, "RV": 50.0, "MYO": 100.0}, {"LV": 60.0, "RV": 70.0, "MYO": 100.0})
    assert row["error"].startswith("RV ESV 70.0 ml") and "LV ESV" not in row["error"]
    assert row["LVEF_category"] == "LVEF 56-64%: preserved"


def _manifest(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "m.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "rows",
    [
        "a,img.nii.gz,,ED,s\nb,img.nii.gz,,ES,s\n",
        "a,img.nii.gz,3,ED,s\nb,./sub/../img.nii.gz,3,ES,s\n",
    ],
)
def test_a_subject_whose_ed_and_es_are_one_image_is_refused(tmp_path, rows):
    m = _manifest(tmp_path, "case,path,frame,phase,subject\n" + rows)
    with pytest.raises(CardsegError, match=r"subject 's': ED \(a, line 2\) and ES \(b, line 3\) are the same image"):
        read_manifest(m)


def test_two_frames_of_one_cine_file_are_two_phases(tmp_path):
    m = _manifest(tmp_path, "case,path,frame,phase,subject\na,cine.nii.gz,0,ED,s\nb,cine.nii.gz,9,ES,s\n")
    assert [(c.phase, c.frame) for c in read_manifest(m)] == [("ED", 0), ("ES", 9)]


def test_a_nul_in_a_path_is_one_line(tmp_path):
    m = _manifest(tmp_path, "case,path\na,im\x00g.nii.gz\n")
    with pytest.raises(CardsegError, match=r"line 2: case a: the path holds a NUL character$"):
        read_manifest(m)


def test_relative_paths_are_read_from_the_folder_the_manifest_is_reached_in(tmp_path):
    real = _manifest(tmp_path / "elsewhere" / "deep", "case,path\na,img.nii.gz\n")
    (tmp_path / "study").mkdir()
    link = tmp_path / "study" / "m.csv"
    os.symlink(real, link)
    assert read_manifest(link)[0].path == str(tmp_path / "study" / "img.nii.gz")


def test_a_batch_writes_the_problem_in_subjects_csv_and_shows_it_on_the_triage_page(
    tmp_path, tiny_bundle, synthetic_volume, monkeypatch
):
    """End to end with the indices swapped in: the page showed the numbers and no word of the problem."""
    import html

    import SimpleITK as sitk

    from cardseg.cohort import batch as cohort_batch
    from cardseg.cohort.batch import run_batch
    from cardseg.cohort.options import BatchOptions
    from conftest import read_csv

    vol, _ = synthetic_volume
    (tmp_path / "in").mkdir()
    for name in ("ed", "es"):
        sitk.WriteImage(vol.to_image(), str(tmp_path / "in" / f"{name}.nii.gz"))
    manifest = tmp_path / "m.csv"
    manifest.write_text("case,path,phase,subject\ned,in/ed.nii.gz,ED,s1\nes,in/es.nii.gz,ES,s1\n")

    def swapped(ed_dir, es_dir, config):
        return ix.subject_intervals(
            ix.cardiac_indices({"LV": 60.0, "RV": 80.0, "MYO": 90.0}, {"LV": 150.0, "RV": 60.0, "MYO": 90.0}), BLOCK
        )

    monkeypatch.setattr(cohort_batch, "indices_function", lambda: swapped)
    out = tmp_path / "out"
    run_batch(BatchOptions(manifest=str(manifest), output=str(out), bundle=str(tiny_bundle), progress="none"))
    (row,) = read_csv(out / "subjects.csv")
    assert row["error"].startswith("LV ESV 150.0 ml (case es) exceeds EDV 60.0 ml (case ed)")
    assert row["LVEF_category"] == "" and float(row["LVEF"]) == pytest.approx(-150.0)
    page = html.unescape((out / "triage.html").read_text())
    assert "ED and ES swapped, or a failed segmentation" in page and "LVEF 0%" not in page
