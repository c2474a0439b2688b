"""`cardseg batch` at scale and when stopped: the cost per case does not grow with OUTDIR, two
workers never trip over each other's temporary folders, an interrupted run leaves no stale
subjects.csv or triage page, clashing names in one pass, a cut state line, an input hashed once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg.cohort import batch as cohort_batch
from cardseg.cohort.case_progress import CaseProgress
from cardseg.cohort.cases import Case, _case_names
from cardseg.cohort.layout import COHORT_CSV, STATE_FILE, SUBJECTS_CSV, TRIAGE_HTML
from cardseg.cohort.state import append_state, read_state
from cardseg.io import outdir
from conftest import read_csv, run_cli_quiet, sigterm_now


# ----------------------------------------------------------------------------- the writer's cost per case


def _count_listings(monkeypatch, folder: Path) -> list:
    """Every listing of ``folder`` (os.listdir, os.scandir, and Path.iterdir through them) is recorded."""
    seen = []
    real_listdir, real_scandir = os.listdir, os.scandir

    def listdir(path="."):
        if os.path.abspath(os.fspath(path)) == str(folder):
            seen.append("listdir")
        return real_listdir(path)

    def scandir(path="."):
        if os.path.abspath(os.fspath(path)) == str(folder):
            seen.append("scandir")
        return real_scandir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    return seen


def _write(out: Path) -> None:
    with outdir.OutputWriter(outdir.check_output(out)) as w:
        w.path("report.json").write_text("{}")
        w.commit()


@pytest.mark.parametrize("siblings", [20, 400])
def test_a_writer_does_not_list_a_folder_it_cleaned_lately(tmp_path, monkeypatch, siblings):
    """The case folders already in OUTDIR cost the next case nothing: after the first output, the
    writers of the following ones do not list the parent folder at all (it was listed twice per
    case, a cost that grew with every case written)."""
    parent = tmp_path / "outdir"
    parent.mkdir()
    for i in range(siblings):
        (parent / f"s{i:04d}").mkdir()
    seen = _count_listings(monkeypatch, parent)
    _write(parent / "first")  # a new folder for this process: looked through once
    first = len(seen)
    assert first >= 1
    for i in range(5):
        _write(parent / f"case{i}")
    assert len(seen) == first  # none per further case, whatever the number of siblings
    assert all((parent / f"case{i}" / "report.json").is_file() for i in range(5))


def test_a_writer_still_cleans_its_own_leftovers_and_after_a_while_the_folder(tmp_path, monkeypatch):
    """What a killed run left for the same output goes every time; other outputs' leftovers go once
    the process has not looked through the folder for :data:`CLEAN_INTERVAL_S`."""
    parent = tmp_path / "outdir"
    parent.mkdir()
    _write(parent / "a")
    (parent / ".b.cardseg-tmp").mkdir()  # as a run killed while writing b leaves it (empty, or stamped)
    (parent / ".b.cardseg.lock").write_text("12345\n")
    (parent / ".c.cardseg-tmp").mkdir()
    (parent / ".user.cardseg-tmp").mkdir()  # a user's folder under a cardseg-like name: never touched
    (parent / ".user.cardseg-tmp" / "notes.txt").write_text("mine")
    _write(parent / "b")
    assert not (parent / ".b.cardseg-tmp").exists() and not (parent / ".b.cardseg.lock").exists()
    assert (parent / ".c.cardseg-tmp").is_dir()  # looked through lately: left for the next look
    monkeypatch.setattr(outdir, "CLEAN_INTERVAL_S", 0.0)
    _write(parent / "d")
    assert not (parent / ".c.cardseg-tmp").exists()
    assert (parent / ".user.cardseg-tmp" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in parent.iterdir()) == [".user.cardseg-tmp", "a", "b", "d"]


# ----------------------------------------------------------------------------- two workers, one OUTDIR


def test_cleaning_skips_a_temporary_folder_that_another_worker_moves_into_place(tmp_path, monkeypatch):
    """Between the listing and the look inside, another worker renames its temporary folder into
    place: the entry is skipped, no FileNotFoundError (it failed a case at random with --workers 2)."""
    tmp = tmp_path / ".a.cardseg-tmp"
    tmp.mkdir()
    real_read_stamp = outdir.read_stamp

    def read_stamp(folder):
        if Path(folder) == tmp and tmp.exists():
            os.rename(tmp, tmp_path / "a")  # the other worker's commit, just now
            return None
        return real_read_stamp(folder)

    monkeypatch.setattr(outdir, "read_stamp", read_stamp)
    assert outdir.clean_leftovers(tmp_path) == []
    assert (tmp_path / "a").is_dir() and not tmp.exists()


# ----------------------------------------------------------------------------- an interrupted batch

_run, _sigterm = run_cli_quiet, sigterm_now


def test_an_interrupted_batch_leaves_no_stale_subjects_or_triage_page(
    tmp_path, tiny_bundle, synthetic_volume, monkeypatch
):
    from cardseg.cohort import triage

    vol, _ = synthetic_volume
    (tmp_path / "in").mkdir()
    for i, name in enumerate(("ed", "es", "late")):
        arr = np.roll(vol.array, 3 * i, axis=2).astype(np.float32)
        sitk.WriteImage(vol.to_image(arr), str(tmp_path / "in" / f"{name}.nii.gz"))
    two = tmp_path / "two.csv"
    two.write_text("case,path,phase,subject\ned,in/ed.nii.gz,ED,s1\nes,in/es.nii.gz,ES,s1\n")
    out = tmp_path / "out"
    monkeypatch.setattr(
        cohort_batch,
        "indices_function",
        lambda: lambda ed, es, config: {"LVEF": {"value": 50.0, "low": 40.0, "high": 60.0}},
    )
    args = ["batch", "--manifest", str(two), "-o", str(out), "--bundle", str(tiny_bundle), "--progress", "none"]
    assert _run(args)[0] == 0
    assert (out / SUBJECTS_CSV).is_file() and (out / TRIAGE_HTML).is_file()

    # SIGTERM while the report is written, every case finished: no case is 'pending'
    with monkeypatch.context() as mp:
        mp.setattr(triage, "write_report", _sigterm)
        rc, err = _run(args)
    assert rc == 143 and err.count("\n") == 1, err
    assert "'pending'" not in err and "no case is pending (cohort.csv is complete)" in err, err
    assert "triage.html was not written" in err, err
    assert "earlier run's triage.html was removed" in err and "to finish" in err, err
    assert not (out / TRIAGE_HTML).exists()  # the earlier run's page is gone, this run's table is there
    assert (out / SUBJECTS_CSV).is_file() and [r["status"] for r in read_csv(out / COHORT_CSV)] == ["ok", "ok"]
    assert _run(args)[0] == 0 and (out / TRIAGE_HTML).is_file()

    # SIGTERM while a case is pending: subjects.csv and triage.html of the earlier run go too
    three = tmp_path / "three.csv"
    three.write_text(two.read_text() + "late,in/late.nii.gz,,\n")
    with monkeypatch.context() as mp:
        mp.setattr(cohort_batch, "append_state", _sigterm)
        rc, err = _run(
            ["batch", "--manifest", str(three), "-o", str(out), "--bundle", str(tiny_bundle), "--progress", "none"]
        )
    assert rc == 143 and err.count("\n") == 1, err
    assert "1 unfinished case is 'pending' in cohort.csv" in err and "to resume" in err, err
    assert "subjects.csv and triage.html were not written" in err, err
    assert "earlier run's subjects.csv and triage.html were removed" in err, err
    assert not (out / SUBJECTS_CSV).exists() and not (out / TRIAGE_HTML).exists()
    assert [r["status"] for r in read_csv(out / COHORT_CSV)] == ["ok", "ok", "pending"]


def test_a_sigterm_during_the_state_append_agrees_with_the_state_file(
    tmp_path, tiny_bundle, synthetic_volume, monkeypatch
):
    """A case is finished exactly when its state line is in the state file: a SIGTERM that lands
    after the line was written (during its fsync) leaves the case 'ok' in cohort.csv, and one that
    lands before leaves it 'pending'; either way a second run agrees with the table."""
    vol, _ = synthetic_volume
    (tmp_path / "in").mkdir()
    sitk.WriteImage(vol.to_image(vol.array.astype(np.float32)), str(tmp_path / "in" / "a.nii.gz"))
    args = [
        "batch",
        str(tmp_path / "in"),
        "-o",
        str(tmp_path / "out"),
        "--bundle",
        str(tiny_bundle),
        "--progress",
        "none",
        "--no-report",
    ]

    def after_the_line(out, record):
        append_state(out, record)
        sigterm_now()

    with monkeypatch.context() as mp:
        mp.setattr(cohort_batch, "append_state", after_the_line)
        rc, err = _run(args)
    assert rc == 143 and "no case is pending (cohort.csv is complete)" in err, err
    assert [r["status"] for r in read_csv(tmp_path / "out" / COHORT_CSV)] == ["ok"]
    assert set(read_state(tmp_path / "out")) == {"a"}
    rc, err = _run(args)
    assert rc == 0 and [r["status"] for r in read_csv(tmp_path / "out" / COHORT_CSV)] == ["ok"]


def test_ctrl_c_says_what_the_batch_left(tmp_path):
    """The line after Ctrl-C: before OUTDIR is written, and after, as after SIGTERM."""
    exc = KeyboardInterrupt()
    assert (
        cohort_batch.interrupted_line("interrupted", exc)
        == "cardseg: interrupted before the cases ran; nothing was written into OUTDIR"
    )
    exc.batch_left = cohort_batch._Left(pending=2, table=True, missing=[SUBJECTS_CSV], removed=[])
    assert cohort_batch.interrupted_line("interrupted", exc) == (
        "cardseg: interrupted; 2 unfinished cases are 'pending' in cohort.csv, subjects.csv was not written; "
        "run the same command again to resume"
    )


# ----------------------------------------------------------------------------- names, state, hashes


def test_case_names_are_the_same_as_before():
    paths = [
        Path(p)
        for p in (
            "/d/a/x/scan.nii.gz",
            "/d/b/x/scan.nii.gz",
            "/d/c/Scan.nii.gz",
            "/d/other.nii.gz",
            "/d/e/cohort.csv",
            "/d/p1/cine_ED.nii",
            "/d/p2/cine_ED.nii",
            "/d/x y/z.mha",
        )
    ]
    assert _case_names(paths) == [
        "a_x_scan",
        "b_x_scan",
        "c_Scan",
        "other",
        "case_cohort.csv",
        "p1_cine_ED",
        "p2_cine_ED",
        "z",
    ]
    assert _case_names([Path(f"/d/s{i}.nii.gz") for i in range(3)]) == ["s0", "s1", "s2"]


class _Name(str):
    """A case name that counts how often it is compared."""

    compared = 0

    def lower(self):
        return _Name(str.lower(self))

    def __eq__(self, other):
        _Name.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_case_names_compare_each_name_a_bounded_number_of_times(monkeypatch):
    """Finding the clashes among N names takes about N steps, not N * N (20,000 inputs: 30-50 s of
    silence before the first case)."""
    from cardseg.cohort import cases

    real = cases._sanitize
    monkeypatch.setattr(cases, "_sanitize", lambda name: _Name(real(name)))
    n = 600
    _Name.compared = 0
    names = _case_names([Path(f"/d/g{i % 2}/s{i // 2}.nii.gz") for i in range(n)])  # every stem twice
    assert names[:2] == ["g0_s0", "g1_s0"] and len(set(names)) == n
    assert _Name.compared < 20 * n  # was about 2 * n * n


def test_a_state_line_cut_by_a_kill_does_not_swallow_the_next_record(tmp_path):
    (tmp_path / STATE_FILE).write_text('{"case": "a", "key": "1"}\n{"case": "b", "ke')  # killed mid-line
    append_state(tmp_path, {"case": "c", "key": "3"})
    append_state(tmp_path, {"case": "d", "key": "4"})
    assert sorted(read_state(tmp_path)) == ["a", "c", "d"]
    lines = (tmp_path / STATE_FILE).read_text().splitlines()
    assert lines[1] == '{"case": "b", "ke' and [json.loads(x)["case"] for x in lines[2:]] == ["c", "d"]
    (tmp_path / "new").mkdir()
    append_state(tmp_path / "new", {"case": "e", "key": "5"})
    assert (tmp_path / "new" / STATE_FILE).read_text() == '{"case": "e", "key": "5"}\n'  # a new file: no blank line


def test_an_input_that_several_cases_share_is_hashed_once(tmp_path, monkeypatch):
    """A 4D file used for ED and ES (two frames): read once per run, both cases get its hash."""
    cine, other = tmp_path / "cine.nii.gz", tmp_path / "other.nii.gz"
    cine.write_bytes(b"cine")
    other.write_bytes(b"other")
    calls = []
    monkeypatch.setattr(cohort_batch, "content_hash", lambda p: calls.append(str(p)) or f"h-{Path(p).name}")
    cases = [
        Case("s1_ed", str(cine), frame=0, phase="ED", subject="s1"),
        Case("s1_es", str(cine), frame=9, phase="ES", subject="s1"),
        Case("x", str(other)),
    ]
    hashes = cohort_batch._hash_inputs(cases, CaseProgress("none", True), 2)
    assert hashes == {"s1_ed": "h-cine.nii.gz", "s1_es": "h-cine.nii.gz", "x": "h-other.nii.gz"}
    assert list(hashes) == ["s1_ed", "s1_es", "x"] and sorted(calls) == sorted([str(cine), str(other)])


def test_a_batch_without_report_removes_the_earlier_runs_page(tmp_path, tiny_bundle, synthetic_volume):
    vol, _ = synthetic_volume
    (tmp_path / "in").mkdir()
    for name in ("a", "b"):
        sitk.WriteImage(vol.to_image(vol.array.astype(np.float32)), str(tmp_path / "in" / f"{name}.nii.gz"))
    out = tmp_path / "out"
    args = ["batch", str(tmp_path / "in"), "-o", str(out), "--bundle", str(tiny_bundle), "--progress", "none"]
    assert _run(args)[0] == 0 and (out / TRIAGE_HTML).is_file()
    (tmp_path / "in" / "b.nii.gz").unlink()
    assert _run(args + ["--no-report"])[0] == 0
    assert not (out / TRIAGE_HTML).exists()  # it listed case b, which this run's table no longer has
    assert [r["case"] for r in read_csv(out / COHORT_CSV)] == ["a"]
    user_page = tmp_path / "mine" / TRIAGE_HTML  # a page cardseg did not write is never removed
    user_page.parent.mkdir()
    user_page.write_text("mine")
    assert _run(
        [
            "batch",
            str(tmp_path / "in"),
            "-o",
            str(user_page.parent),
            "--bundle",
            str(tiny_bundle),
            "--progress",
            "none",
            "--no-report",
        ]
    )[0] in (0, 2)
    assert user_page.read_text() == "mine"
