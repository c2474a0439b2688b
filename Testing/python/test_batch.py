"""`cardseg batch`: manifest and INPUT handling, a failing case in the middle, the cohort table,
subjects.csv, OUTDIR ownership, and resume after a kill (untrained tiny bundle, synthetic volumes)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg.base.errors import CardsegError
from cardseg.cohort import batch as cohort_batch
from cardseg.cohort.batch import run_batch
from cardseg.cohort.case_progress import CaseProgress
from cardseg.cohort.cases import cases_from_inputs, read_manifest
from cardseg.cohort.hashing import content_hash
from cardseg.cohort.layout import BATCH_STAMP, COHORT_CSV, SEGMENT_LEFTOVER, STATE_FILE
from cardseg.cohort.options import BatchOptions
from cardseg.cohort.subjects import subject_rows
from cardseg.cli import main
from conftest import read_csv

REPO = Path(__file__).resolve().parents[2]


def write_case(path: Path, vol, variant: int) -> Path:
    """The synthetic volume, changed a little per variant (another content, another result)."""
    arr = np.roll(vol.array, 3 * variant, axis=2) * (1.0 + 0.05 * variant)
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(vol.to_image(arr.astype(np.float32)), str(path))
    return path


def run_cli(args, env_stderr=False):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def fake_indices(ed_dir, es_dir, config):
    """A stand-in for cardseg.cohort.indices.indices_from_folders: values from the two reports, so that the
    test sees which folders were used for ED and ES."""
    ed = json.loads((Path(ed_dir) / "report.json").read_text())["class_volumes_ml"]
    es = json.loads((Path(es_dir) / "report.json").read_text())["class_volumes_ml"]
    edv, esv = ed["LV"], es["LV"]
    return {
        "LVEDV_ml": {"value": edv, "low": edv - 1.0, "high": edv + 1.0},
        "LVESV_ml": {"value": esv, "low": esv - 1.0, "high": esv + 1.0},
        "LVEF": {"value": 100.0 * (edv - esv) / edv, "low": 1.0, "high": 99.0},
        "nominal": 0.9,
    }


# --------------------------------------------------------------------------------------------
# the manifest and INPUTs: refused before any work, one line, exit 2
# --------------------------------------------------------------------------------------------
MANIFEST_ERRORS = {
    "no path column": ("case,file\na,x.nii.gz\n", "line 1: the manifest has no path column"),
    "no case column": ("path\nx.nii.gz\n", "line 1: the manifest has no case column"),
    "unknown column": ("case,path,phse\na,x.nii.gz,ED\n", "line 1: unknown manifest column(s) 'phse'"),
    "header after blank lines": ("\n\ncase,path,phse\na,x.nii.gz,ED\n", "line 3: unknown manifest column(s)"),
    "row after blank lines": ("\ncase,path,frame\na,x.nii.gz,two\n", "line 3: frame 'two' is not a whole number"),
    "bad phase": ("case,path,phase,subject\na,x.nii.gz,EDD,s1\n", "line 2: phase 'EDD' must be ED or ES"),
    "bad frame": ("case,path,frame\na,x.nii.gz,two\n", "line 2: frame 'two' is not a whole number"),
    "negative frame": ("case,path,frame\na,x.nii.gz,-1\n", "line 2: frame '-1'"),
    "duplicate case": ("case,path\na,x.nii.gz\nA,y.nii.gz\n", "case 'A' is listed twice (lines 2 and 3)"),
    "case not a folder name": ("case,path\n../a,x.nii.gz\n", "cannot be a folder name"),
    "reserved case name": ("case,path\ncohort.csv,x.nii.gz\n", "is reserved"),
    "empty path": ("case,path\na,\n", "line 2: case a: empty path"),
    "phase without subject": (
        "case,path,phase,subject\na,x.nii.gz,ED,\n",
        "line 2: phase ED without a subject; the cardiac indices pair",
    ),
    "two ED for one subject": (
        "case,path,phase,subject\na,x.nii.gz,ED,s1\nb,y.nii.gz,ed,s1\n",
        "subject 's1' has two ED cases",
    ),
    "duplicate column": ("case,path,path\na,x,y\n", "line 1: manifest column(s) path appear more than once"),
    "header only": ("case,path\n", "lists no case"),
    "empty file": ("", "empty manifest"),
}


@pytest.mark.parametrize("name", list(MANIFEST_ERRORS))
def test_manifest_refusals(tmp_path, tiny_bundle, name):
    text, expected = MANIFEST_ERRORS[name]
    manifest = tmp_path / "cases.csv"
    manifest.write_text(text)
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(
        ["batch", "--manifest", str(manifest), "-o", str(out), "--bundle", str(tiny_bundle), "--progress", "none"]
    )
    assert rc == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cardseg: error: "), stderr
    assert expected in lines[0]
    assert not out.exists()  # nothing written


def test_manifest_parsing(tmp_path):
    (tmp_path / "data").mkdir()
    manifest = tmp_path / "data" / "m.csv"
    manifest.write_text(
        "\ufeffsubject, path ,case,phase,frame\n"  # BOM (Excel), spaces, any column order
        "s1,a.nii.gz,s1_ed,ed,\n"
        "s1,/abs/b.nii.gz,s1_es,ES,7\n"
        "\n"
        ",c.nii.gz,other,,\n",
        encoding="utf-8",
    )
    cases = read_manifest(manifest, default_frame=2)
    assert [c.name for c in cases] == ["s1_ed", "s1_es", "other"]
    assert cases[0].path == str(tmp_path / "data" / "a.nii.gz")  # relative to the manifest's folder
    assert cases[1].path == "/abs/b.nii.gz"
    assert [c.phase for c in cases] == ["ED", "ES", None]
    assert [c.frame for c in cases] == [2, 7, 2]  # --frame is the default, the column overrides
    assert [c.subject for c in cases] == ["s1", "s1", None]


def test_inputs_files_folders_globs(tmp_path, synthetic_volume):
    vol, _ = synthetic_volume
    for sub in ("p1", "p2"):
        write_case(tmp_path / "study" / sub / "sa.nii.gz", vol, 0)
    write_case(tmp_path / "flat" / "x_ED.nii.gz", vol, 0)
    (tmp_path / "flat" / "notes.txt").write_text("not an image")
    cases = cases_from_inputs([str(tmp_path / "study" / "*" / "sa.nii.gz"), str(tmp_path / "flat")])
    assert [c.name for c in cases] == ["p1_sa", "p2_sa", "x_ED"]  # clashing names get their folder
    with pytest.raises(CardsegError, match="matches no file"):
        cases_from_inputs([str(tmp_path / "nothing*.nii.gz")])
    with pytest.raises(CardsegError, match="no such file"):
        cases_from_inputs([str(tmp_path / "missing.nii.gz")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CardsegError, match="holds no image"):
        cases_from_inputs([str(tmp_path / "empty")])


def test_refuses_foreign_outdir(tmp_path, tiny_bundle, synthetic_volume):
    vol, _ = synthetic_volume
    inp = write_case(tmp_path / "in" / "a.nii.gz", vol, 0)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.docx").write_text("precious")
    rc, _, stderr = run_cli(["batch", str(inp), "-o", str(out), "--bundle", str(tiny_bundle), "--progress", "none"])
    assert rc == 2 and "not written by cardseg batch" in stderr
    assert sorted(p.name for p in out.iterdir()) == ["thesis.docx"]
    rc, _, stderr = run_cli(["batch", str(inp), "-o", str(out), "--bundle", str(tiny_bundle), "--overwrite"])
    assert rc == 2 and (out / "thesis.docx").read_text() == "precious"


def test_ray_is_not_imported_without_ray():
    code = "import sys, cardseg.cli, cardseg.cohort.batch, cardseg.cohort.triage; print('ray' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"


def test_case_progress_bar_shows_rate(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    p = CaseProgress("bar")
    p.start(3)
    for ok in (True, False, True):
        p.advance(ok)
    p.close()
    text = err.getvalue()
    assert "3/3" in text and "cases/min" in text and "1 failed" in text


# --------------------------------------------------------------------------------------------
# one batch from a manifest, with a failing case in the middle and subjects
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cohort(tmp_path_factory, tiny_bundle, synthetic_volume):
    vol, _ = synthetic_volume
    root = tmp_path_factory.mktemp("cohort")
    write_case(root / "in" / "p1_ed.nii.gz", vol, 0)
    write_case(root / "in" / "p1_es.nii.gz", vol, 1)
    (root / "in" / "broken.nii.gz").write_bytes(b"\x1f\x8b not really gzip")
    write_case(root / "in" / "p2_es.nii.gz", vol, 2)
    manifest = root / "cases.csv"
    manifest.write_text(
        "case,path,phase,subject\n"
        "p1_ed,in/p1_ed.nii.gz,ED,p1\n"
        "p1_es,in/p1_es.nii.gz,ES,p1\n"
        "p2_ed,in/broken.nii.gz,ED,p2\n"
        "p2_es,in/p2_es.nii.gz,ES,p2\n"
        "p3_ed,in/p3_missing.nii.gz,ED,p3\n"
    )
    out = root / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cohort_batch, "indices_function", lambda: fake_indices)
        t0 = time.perf_counter()
        rc, stdout, stderr = run_cli(
            ["batch", "--manifest", str(manifest), "-o", str(out), "--bundle", str(tiny_bundle), "--progress", "json"]
        )
        seconds = time.perf_counter() - t0
    return {
        "root": root,
        "out": out,
        "rc": rc,
        "stdout": stdout,
        "stderr": stderr,
        "manifest": manifest,
        "seconds": seconds,
        "bundle": tiny_bundle,
    }


def test_failing_case_does_not_stop_the_batch(cohort):
    assert cohort["rc"] == 1  # some case failed
    rows = {r["case"]: r for r in read_csv(cohort["out"] / "cohort.csv")}
    assert list(rows) == ["p1_ed", "p1_es", "p2_ed", "p2_es", "p3_ed"]  # manifest order
    assert [rows[c]["status"] for c in rows] == ["ok", "ok", "error", "ok", "error"]
    bad = rows["p2_ed"]
    assert "broken.nii.gz" in bad["error"] and "\n" not in bad["error"] and bad["output"] == ""
    assert "p3_missing.nii.gz: no such file or folder" in rows["p3_ed"]["error"]
    for c in ("p1_ed", "p1_es", "p2_es"):  # the ones after the failure finished too
        assert (cohort["out"] / c / "report.json").is_file()
        assert rows[c]["output"] == f"{c}/"
    assert not (cohort["out"] / "p2_ed").exists()
    assert "5 cases, 3 ok, 2 failed" in cohort["stdout"]


def test_cohort_table_columns(cohort):
    with open(cohort["out"] / "cohort.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == [
        "case",
        "subject",
        "phase",
        "frame",
        "status",
        "error",
        "volume_RV_ml",
        "volume_MYO_ml",
        "volume_LV_ml",
        "agreement",
        "out_of_domain",
        "no_foreground",
        "flagged_regions",
        "flagged_volume_ml",
        "region1_ml",
        "region1_p_error",
        "region2_ml",
        "region2_p_error",
        "region3_ml",
        "region3_p_error",
        "grid_moved",
        "grid_offset_mm",
        "input",
        "input_digest",
        "reused",
        "output",
        "method",
        "slices",
        "time_total_s",
        "time_preprocess_s",
        "time_trajectory_s",
        "time_postprocess_s",
    ]
    rows = {r["case"]: r for r in read_csv(cohort["out"] / "cohort.csv")}
    r = rows["p1_es"]
    report = json.loads((cohort["out"] / "p1_es" / "report.json").read_text())
    assert float(r["agreement"]) == report["agreement"]
    assert int(r["flagged_regions"]) == len(report["regions"])
    assert float(r["flagged_volume_ml"]) == round(sum(x["volume_mm3"] for x in report["regions"]) / 1000, 1)
    for k in (1, 2, 3):  # the first regions in review order, one by one ('' where there are fewer)
        reg = report["regions"][k - 1] if k <= len(report["regions"]) else None
        assert r[f"region{k}_ml"] == ("" if reg is None else repr(round(reg["volume_mm3"] / 1000.0, 1)))
        assert r[f"region{k}_p_error"] == ("" if reg is None or reg["p_error"] is None else repr(reg["p_error"]))
    assert float(r["volume_LV_ml"]) == report["class_volumes_ml"]["LV"]
    assert float(r["time_total_s"]) == report["timings_s"]["total"]
    assert r["subject"] == "p1" and r["phase"] == "ES" and r["reused"] == "false" and r["method"] == "card"
    assert r["out_of_domain"] == ""  # the untrained bundle has no out-of-domain threshold
    assert r["no_foreground"] == "false"
    assert r["grid_moved"] == "false" and float(r["grid_offset_mm"]) == 0.0  # recentring is off: the centred grid
    assert r["input_digest"] == content_hash(cohort["root"] / "in" / "p1_es.nii.gz")
    assert r["input"] == str(cohort["root"] / "in" / "p1_es.nii.gz")


def test_cohort_parquet_matches_csv(cohort):
    pa = pytest.importorskip("pyarrow.parquet", reason="pyarrow not installed: no Parquet table")
    table = pa.read_table(cohort["out"] / "cohort.parquet").to_pylist()
    rows = read_csv(cohort["out"] / "cohort.csv")
    assert [t["case"] for t in table] == [r["case"] for r in rows]
    assert table[0]["agreement"] == float(rows[0]["agreement"])
    assert table[2]["status"] == "error" and table[2]["agreement"] is None
    assert table[0]["reused"] is False and table[0]["flagged_regions"] == int(rows[0]["flagged_regions"])


def test_progress_json_lines(cohort):
    events = [json.loads(line) for line in cohort["stderr"].splitlines() if line.startswith("{")]
    cases = [e for e in events if e["stage"] == "cases"]
    assert cases[0] == {"stage": "cases", "done": 0, "total": 4}  # the missing file fails before
    assert cases[-1]["done"] == 4


def test_subjects_table(cohort):
    rows = {r["subject"]: r for r in read_csv(cohort["out"] / "subjects.csv")}
    with open(cohort["out"] / "subjects.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == [
        "subject",
        "ed_case",
        "es_case",
        "nominal",
        "LVEDV_ml",
        "LVEDV_ml_low",
        "LVEDV_ml_high",
        "LVESV_ml",
        "LVESV_ml_low",
        "LVESV_ml_high",
        "LVEF",
        "LVEF_low",
        "LVEF_high",
        "LVEF_category",
        "LVEF_straddles",
        "error",
    ]
    assert list(rows) == ["p1", "p2", "p3"]
    ed = json.loads((cohort["out"] / "p1_ed" / "report.json").read_text())["class_volumes_ml"]["LV"]
    es = json.loads((cohort["out"] / "p1_es" / "report.json").read_text())["class_volumes_ml"]["LV"]
    p1 = rows["p1"]
    assert (p1["ed_case"], p1["es_case"], p1["error"]) == ("p1_ed", "p1_es", "")
    assert float(p1["LVEDV_ml"]) == ed and float(p1["LVESV_ml"]) == es  # ED and ES folders not swapped
    assert float(p1["LVEDV_ml_low"]) == ed - 1.0 and float(p1["nominal"]) == 0.9
    assert rows["p2"]["error"] == "case p2_ed failed" and rows["p2"]["LVEF"] == ""
    assert rows["p3"]["error"] == "no ES case"


def test_subjects_with_the_real_indices_module(cohort):
    indices = pytest.importorskip("cardseg.cohort.indices", reason="cardseg.cohort.indices not there yet")
    from cardseg.bundle.folder import check_bundle_folder

    _, config = check_bundle_folder(cohort["bundle"])
    cases = read_manifest(cohort["manifest"])
    status = {r["case"]: r["status"] for r in read_csv(cohort["out"] / "cohort.csv")}
    rows, _ = subject_rows(cohort["out"], cases, status, config, indices.indices_from_folders)
    p1 = rows[0]
    if "indices" in config:
        assert p1["error"] == "" and p1["LVEF"] is not None
    else:  # an untrained bundle has no fitted intervals: one line, in the table
        assert p1["error"] and "\n" not in p1["error"]


def test_batch_stamp_and_settings_change(cohort, tiny_bundle):
    stamp = json.loads((cohort["out"] / BATCH_STAMP).read_text())
    assert stamp["tool"] == "cardseg-batch" and stamp["settings"]["method"] == "card"
    before = sorted(p.name for p in cohort["out"].iterdir())
    rc, _, stderr = run_cli(
        [
            "batch",
            "--manifest",
            str(cohort["manifest"]),
            "-o",
            str(cohort["out"]),
            "--bundle",
            str(tiny_bundle),
            "--method",
            "uc",
            "--progress",
            "none",
        ]
    )
    assert rc == 2 and "use --overwrite" in stderr and len(stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in cohort["out"].iterdir()) == before


def test_rerun_retries_only_the_failed_cases(cohort, tiny_bundle):
    mtimes = {c: (cohort["out"] / c / "report.json").stat().st_mtime_ns for c in ("p1_ed", "p1_es", "p2_es")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cohort_batch, "indices_function", lambda: fake_indices)
        result = run_batch(
            BatchOptions(
                manifest=str(cohort["manifest"]),
                output=str(cohort["out"]),
                bundle=str(tiny_bundle),
                progress="none",
                report=False,
            )
        )
    assert result.computed == 0 and result.reused == 3
    assert [(r["case"], r["status"], r["reused"]) for r in result.rows] == [
        ("p1_ed", "ok", True),
        ("p1_es", "ok", True),
        ("p2_ed", "error", False),
        ("p2_es", "ok", True),
        ("p3_ed", "error", False),
    ]
    assert "broken.nii.gz" in result.rows[2]["error"]
    assert {c: (cohort["out"] / c / "report.json").stat().st_mtime_ns for c in mtimes} == mtimes
    assert [r["subject"] for r in result.subjects] == ["p1", "p2", "p3"]


# --------------------------------------------------------------------------------------------
# resume after a kill
# --------------------------------------------------------------------------------------------
def test_resume_after_kill(tmp_path, tiny_bundle, synthetic_volume):
    vol, _ = synthetic_volume
    inputs = [write_case(tmp_path / "in" / f"c{i}.nii.gz", vol, i) for i in range(4)]
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cardseg",
            "batch",
            str(tmp_path / "in"),
            "-o",
            str(out),
            "--bundle",
            str(tiny_bundle),
            "--progress",
            "none",
            "--threads",
            "1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    state = out / STATE_FILE
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            if state.is_file() and state.read_text().count("\n") >= 1:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the batch ended before the test could kill it: " + proc.stderr.read().decode()
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    done = [json.loads(line)["case"] for line in state.read_text().splitlines() if line.strip()]
    assert 1 <= len(done) < 4
    first = done[0]
    mtime = (out / first / "report.json").stat().st_mtime_ns
    assert not (out / COHORT_CSV).exists()  # killed before the table

    result = run_batch(
        BatchOptions(
            inputs=[str(tmp_path / "in")], output=str(out), bundle=str(tiny_bundle), progress="none", report=False
        )
    )
    rows = {r["case"]: r for r in result.rows}
    assert [(r["case"], r["status"], r.get("error")) for r in result.rows] == [(f"c{i}", "ok", "") for i in range(4)]
    assert (out / first / "report.json").stat().st_mtime_ns == mtime  # not recomputed
    assert rows[first]["reused"] is True
    assert result.computed == 4 - len(done) and result.reused == len(done)
    assert not [p.name for p in out.iterdir() if SEGMENT_LEFTOVER.match(p.name)]  # killed run's leftovers gone
    assert rows[first]["agreement"] == json.loads((out / first / "report.json").read_text())["agreement"]

    # a third run computes nothing and does not even load the model
    again = run_batch(
        BatchOptions(
            inputs=[str(tmp_path / "in")], output=str(out), bundle=str(tiny_bundle), progress="none", report=False
        )
    )
    assert again.computed == 0 and again.reused == 4 and again.worker_loads == 0
    table = read_csv(out / COHORT_CSV)
    assert [r["reused"] for r in table] == ["true"] * 4

    # the key is the content: a changed input is recomputed, the others are not
    write_case(inputs[2], vol, 9)
    mtimes = {c: (out / c / "report.json").stat().st_mtime_ns for c in ("c0", "c1", "c3")}
    third = run_batch(
        BatchOptions(
            inputs=[str(tmp_path / "in")], output=str(out), bundle=str(tiny_bundle), progress="none", report=False
        )
    )
    assert third.computed == 1 and [r["reused"] for r in third.rows] == [True, True, False, True]
    assert {c: (out / c / "report.json").stat().st_mtime_ns for c in mtimes} == mtimes
    assert third.rows[2]["input_digest"] == content_hash(inputs[2])


def test_a_parquet_table_that_cannot_be_written_names_its_file(tmp_path, monkeypatch):
    """pyarrow's own error names no file ('Error writing bytes to file ...'): the error says which,
    and no temporary file stays behind."""
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow not installed: no Parquet table")
    from cardseg.cohort.tables import write_parquet

    def full_disk(table, where, **kwargs):
        where.write(b"PAR1")  # a part written (to the file made for it), then the limit
        where.flush()
        raise OSError("Error writing bytes to file. Detail: [errno 27] File too large")

    monkeypatch.setattr(pq, "write_table", full_disk)
    path = tmp_path / "cohort.parquet"
    with pytest.raises(OSError) as exc:
        write_parquet(path, [{"case": "a"}], ["case"])
    assert exc.value.filename == str(path) and "File too large" in exc.value.strerror
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------
# a resume whose cases have no subject any more: the earlier subjects.csv goes, the report follows
# --------------------------------------------------------------------------------------------
def test_resume_without_subjects_drops_the_batchs_own_subjects_table(
    tmp_path, tiny_bundle, synthetic_volume, monkeypatch
):
    import re

    from cardseg.cohort.triage import write_report

    vol, _ = synthetic_volume
    write_case(tmp_path / "in" / "ed.nii.gz", vol, 0)
    write_case(tmp_path / "in" / "es.nii.gz", vol, 1)
    with_subjects, without = tmp_path / "m1.csv", tmp_path / "m2.csv"
    with_subjects.write_text("case,path,phase,subject\ned,in/ed.nii.gz,ED,s1\nes,in/es.nii.gz,ES,s1\n")
    without.write_text("case,path\ned,in/ed.nii.gz\nes,in/es.nii.gz\n")
    out = tmp_path / "out"
    monkeypatch.setattr(cohort_batch, "indices_function", lambda: fake_indices)  # LVEF interval 1-99 %: straddles

    def straddling() -> str:
        return re.search(r'id="n-straddling">([^<]*)<', (out / "triage.html").read_text()).group(1)

    first = run_batch(
        BatchOptions(manifest=str(with_subjects), output=str(out), bundle=str(tiny_bundle), progress="none")
    )
    assert "subjects.csv" in first.files and (out / "subjects.csv").is_file() and straddling() == "1"
    # the report counts only the subjects of the rows it shows, whatever subjects.csv still holds
    rows = [dict(r, subject="", phase="") for r in read_csv(out / "cohort.csv")]
    write_report(out, rows=rows)
    assert straddling() == "0"

    second = run_batch(BatchOptions(manifest=str(without), output=str(out), bundle=str(tiny_bundle), progress="none"))
    assert second.reused == 2 and "subjects.csv" not in second.files and second.subjects == []
    assert not (out / "subjects.csv").exists() and straddling() == "0"

    # no indices module: an earlier subjects.csv would describe an earlier run, so it goes as well
    run_batch(BatchOptions(manifest=str(with_subjects), output=str(out), bundle=str(tiny_bundle), progress="none"))
    assert (out / "subjects.csv").is_file()
    monkeypatch.setattr(cohort_batch, "indices_function", lambda: None)
    run_batch(BatchOptions(manifest=str(with_subjects), output=str(out), bundle=str(tiny_bundle), progress="none"))
    assert not (out / "subjects.csv").exists()

    # a new folder holding only what a user put there is never a batch's: nothing of it is deleted
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "subjects.csv").write_text("my own table\n")
    with pytest.raises(CardsegError, match="not written by cardseg batch"):
        run_batch(BatchOptions(manifest=str(without), output=str(mine), bundle=str(tiny_bundle), progress="none"))
    assert (mine / "subjects.csv").read_text() == "my own table\n"
