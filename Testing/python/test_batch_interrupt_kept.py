"""`cardseg batch` stopped before any case of the run finished: the earlier run's subjects.csv and
triage.html still describe the case folders (none changed), so they stay, and the one line says
so; once a case folder changed (a case finished, or was written but not yet reported) they go."""

from __future__ import annotations


import numpy as np
import SimpleITK as sitk

from cardseg.cohort import batch as cohort_batch
from cardseg.cohort import pipeline
from cardseg.cohort.layout import COHORT_CSV, SUBJECTS_CSV, TRIAGE_HTML
from conftest import read_csv, run_cli_quiet, sigterm_now


_run, _sigterm = run_cli_quiet, sigterm_now


def _earlier_batch(tmp_path, tiny_bundle, synthetic_volume, monkeypatch):
    """Two cases of one subject, finished, with subjects.csv and triage.html; a third input besides."""
    vol, _ = synthetic_volume
    (tmp_path / "in").mkdir()
    for i, name in enumerate(("ed", "es", "late")):
        arr = np.roll(vol.array, 3 * i, axis=2).astype(np.float32)
        sitk.WriteImage(vol.to_image(arr), str(tmp_path / "in" / f"{name}.nii.gz"))
    two = tmp_path / "two.csv"
    two.write_text("case,path,phase,subject\ned,in/ed.nii.gz,ED,s1\nes,in/es.nii.gz,ES,s1\n")
    three = tmp_path / "three.csv"
    three.write_text(two.read_text() + "late,in/late.nii.gz,,\n")
    monkeypatch.setattr(
        cohort_batch,
        "indices_function",
        lambda: lambda ed, es, config: {"LVEF": {"value": 50.0, "low": 40.0, "high": 60.0}},
    )
    out = tmp_path / "out"
    common = ["-o", str(out), "--bundle", str(tiny_bundle), "--progress", "none"]
    assert _run(["batch", "--manifest", str(two), *common])[0] == 0
    earlier = {n: (out / n).read_bytes() for n in (SUBJECTS_CSV, TRIAGE_HTML)}
    return out, ["batch", "--manifest", str(three), *common], earlier


def test_an_interrupt_before_any_case_finished_keeps_the_earlier_subjects_and_page(
    tmp_path, tiny_bundle, synthetic_volume, monkeypatch
):
    out, args, earlier = _earlier_batch(tmp_path, tiny_bundle, synthetic_volume, monkeypatch)
    with monkeypatch.context() as mp:  # SIGTERM as the first case of this run starts
        mp.setattr(pipeline, "run_overlapped", _sigterm)
        rc, err = _run(args)
    assert rc == 143 and err.count("\n") == 1, err
    assert "1 unfinished case is 'pending' in cohort.csv" in err and "to resume" in err, err
    assert "the earlier run's subjects.csv and triage.html are kept (no case of this run finished" in err, err
    assert "removed" not in err and "not written" not in err, err
    assert {n: (out / n).read_bytes() for n in earlier} == earlier  # untouched
    assert [r["status"] for r in read_csv(out / COHORT_CSV)] == ["ok", "ok", "pending"]
    assert not (out / "late").exists()
    assert _run(args)[0] == 0  # and the next run finishes it
    assert [r["status"] for r in read_csv(out / COHORT_CSV)] == ["ok", "ok", "ok"]


def test_a_case_written_but_not_yet_reported_counts_as_a_change(tmp_path, tiny_bundle, synthetic_volume, monkeypatch):
    """SIGTERM after the new case's folder was written, as its result is recorded: its row is still
    'pending', but the folders changed, so the earlier run's files go (as before)."""
    out, args, _ = _earlier_batch(tmp_path, tiny_bundle, synthetic_volume, monkeypatch)
    with monkeypatch.context() as mp:
        mp.setattr(cohort_batch, "append_state", _sigterm)
        rc, err = _run(args)
    assert rc == 143 and err.count("\n") == 1, err
    assert "earlier run's subjects.csv and triage.html were removed" in err and "kept" not in err, err
    assert not (out / SUBJECTS_CSV).exists() and not (out / TRIAGE_HTML).exists()
    assert (out / "late" / "report.json").is_file()


def test_the_line_names_what_was_kept():
    exc = KeyboardInterrupt()
    exc.batch_left = cohort_batch._Left(pending=1, table=True, missing=[], removed=[], kept=[SUBJECTS_CSV])
    assert cohort_batch.interrupted_line("interrupted", exc) == (
        "cardseg: interrupted; 1 unfinished case is 'pending' in cohort.csv, the earlier run's subjects.csv is kept "
        "(no case of this run finished: it still describes the case folders); run the same command again to resume"
    )


def test_with_ray_an_interrupt_never_keeps_the_earlier_tables(tmp_path, tiny_bundle, synthetic_volume, monkeypatch):
    """Ray's killed workers may still write a case after the interrupt is handled, so the folders'
    stamps prove nothing there: the earlier subjects.csv and triage.html go (the cluster faked)."""
    from cardseg.cohort import cluster

    out, args, _ = _earlier_batch(tmp_path, tiny_bundle, synthetic_volume, monkeypatch)
    with monkeypatch.context() as mp:
        mp.setattr(cluster, "connect", lambda address: False)
        mp.setattr(cluster, "check_capacity", lambda *a: None)
        mp.setattr(cluster, "disconnect", lambda started: None)
        mp.setattr(cluster, "run_jobs", _sigterm)
        rc, err = _run([*args, "--ray", "local"])
    assert rc == 143 and err.count("\n") == 1, err
    assert "earlier run's subjects.csv and triage.html were removed" in err and "kept" not in err, err
    assert not (out / SUBJECTS_CSV).exists() and not (out / TRIAGE_HTML).exists()


def test_an_interrupt_removes_them_when_this_run_dropped_an_earlier_case(
    tmp_path, tiny_bundle, synthetic_volume, monkeypatch
):
    """The earlier subjects.csv and triage.html list the case 'es', which this run's cohort.csv no
    longer lists: even with no case folder changed they would describe another cohort, so they go."""
    out, args, _ = _earlier_batch(tmp_path, tiny_bundle, synthetic_volume, monkeypatch)
    dropped = tmp_path / "dropped.csv"
    dropped.write_text("case,path,phase,subject\ned,in/ed.nii.gz,ED,s1\nlate,in/late.nii.gz,,\n")
    with monkeypatch.context() as mp:
        mp.setattr(pipeline, "run_overlapped", _sigterm)
        rc, err = _run(["batch", "--manifest", str(dropped), *args[3:]])
    assert rc == 143 and err.count("\n") == 1, err
    assert "earlier run's subjects.csv and triage.html were removed" in err and "kept" not in err, err
    assert not (out / SUBJECTS_CSV).exists() and not (out / TRIAGE_HTML).exists()
    assert [r["case"] for r in read_csv(out / COHORT_CSV)] == ["ed", "late"]
