"""`cardseg batch` against hostile inputs and interruptions (issue 21, items 4, 7, 8, 9, 10, 12):
a tampered case folder is never reused, a batch never takes inputs from its own OUTDIR, an empty
segmentation is counted and ranked first, FIFOs / devices / symlink loops never hang it, SIGTERM
is handled like Ctrl-C, and no CSV cell is a spreadsheet formula."""

from __future__ import annotations

import csv
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.base.csvcells import FORMULA_START, read_cell, safe_cell
from cardseg.base.errors import CardsegError
from cardseg.cohort import triage as T
from cardseg.cohort import walk
from cardseg.cohort.batch import run_batch
from cardseg.cohort.cases import Case, cases_from_inputs, read_manifest
from cardseg.cohort.hashing import content_hash
from cardseg.cohort.layout import COHORT_CSV, STATE_FILE
from cardseg.cohort.options import BatchOptions
from cardseg.cohort.tables import cohort_row, read_table, table_columns, write_table

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def write_case(path: Path, vol, variant: int) -> Path:
    arr = np.roll(vol.array, 3 * variant, axis=2) * (1.0 + 0.05 * variant)
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(vol.to_image(arr.astype(np.float32)), str(path))
    return path


def cli(args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "cardseg", *args], env=ENV, capture_output=True, text=True, timeout=timeout
    )


def opts(inputs, out, bundle, **kw):
    return BatchOptions(
        inputs=[str(i) for i in inputs],
        output=str(out),
        bundle=str(bundle),
        progress="none",
        threads=1,
        report=False,
        **kw,
    )


# --------------------------------------------------------------------------------------------
# item 4: a case folder is reused only while it holds exactly what the batch wrote
# --------------------------------------------------------------------------------------------
def _segment_other_input(folder: Path, inputs, bundle):
    r = cli(
        [
            "segment",
            str(inputs[1]),
            "-o",
            str(folder),
            "--bundle",
            str(bundle),
            "--overwrite",
            "--progress",
            "none",
            "--threads",
            "1",
        ]
    )
    assert r.returncode == 0, r.stderr


def _edit_report(folder: Path, inputs, bundle):
    rep = json.loads((folder / "report.json").read_text())
    rep["class_volumes_ml"] = {k: v + 1.0 for k, v in rep["class_volumes_ml"].items()}
    (folder / "report.json").write_text(json.dumps(rep))


def _swap_output(folder: Path, inputs, bundle):
    (folder / "segmentation.nii.gz").write_bytes((folder / "segmentation.nii.gz").read_bytes()[:100])


def _old_state_line(folder: Path, inputs, bundle):  # a state line without the outputs' digest
    state = folder.parent / STATE_FILE
    lines = [json.loads(x) for x in state.read_text().splitlines() if x.strip()]
    for rec in lines:
        if rec["case"] == folder.name:
            rec.pop("outputs", None)
    state.write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.mark.parametrize(
    "tamper,recomputed",
    [(_segment_other_input, True), (_old_state_line, True), (_edit_report, False), (_swap_output, False)],
)
def test_tampered_case_folder_is_never_reused(tmp_path, tiny_bundle, synthetic_volume, tamper, recomputed):
    """cardseg's own output in the folder is computed again; files changed by hand are never
    reused nor deleted: the case fails in one line naming them (segment's ownership rule)."""
    vol, _ = synthetic_volume
    inputs = [write_case(tmp_path / "in" / f"c{i}.nii.gz", vol, i) for i in range(2)]
    out = tmp_path / "out"
    first = {r["case"]: r for r in run_batch(opts([tmp_path / "in"], out, tiny_bundle)).rows}
    tamper(out / "c0", inputs, tiny_bundle)
    again = {r["case"]: r for r in run_batch(opts([tmp_path / "in"], out, tiny_bundle)).rows}
    assert again["c0"]["reused"] is False and again["c1"]["reused"] is True
    if recomputed:
        assert again["c0"]["status"] == "ok"
        assert again["c0"]["volume_LV_ml"] == first["c0"]["volume_LV_ml"]  # c0's own result
        assert json.loads((out / "c0" / "report.json").read_text())["input"] == str(inputs[0])
        third = run_batch(opts([tmp_path / "in"], out, tiny_bundle))  # what it wrote now is trusted again
        assert third.computed == 0 and third.reused == 2
    else:  # no stale volume in the table, a clear line instead
        assert again["c0"]["status"] == "error" and "volume_LV_ml" not in again["c0"]
        assert "c0" in again["c0"]["error"] and "\n" not in again["c0"]["error"], again["c0"]["error"]


# --------------------------------------------------------------------------------------------
# item 7: never inputs from inside OUTDIR
# --------------------------------------------------------------------------------------------
def test_glob_run_twice_does_not_take_its_own_outputs(tmp_path, tiny_bundle, synthetic_volume, monkeypatch):
    vol, _ = synthetic_volume
    write_case(tmp_path / "in" / "a.nii.gz", vol, 0)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        r = run_batch(opts(["**/*.nii.gz"], "results", tiny_bundle))
        assert [row["case"] for row in r.rows] == ["a"]
    # the folder holding OUTDIR, given as INPUT: only its own images
    assert [c.name for c in cases_from_inputs([str(tmp_path / "in")], outdir=tmp_path / "in" / "x")] == ["a"]


@pytest.mark.parametrize("how", ["file", "folder", "manifest"])
def test_input_named_inside_outdir_is_refused(tmp_path, tiny_bundle, synthetic_volume, how):
    vol, _ = synthetic_volume
    write_case(tmp_path / "in" / "a.nii.gz", vol, 0)
    out = tmp_path / "out"
    run_batch(opts([tmp_path / "in"], out, tiny_bundle))
    target = out / "a" / "segmentation.nii.gz" if how != "folder" else out / "a"
    if how == "manifest":
        (tmp_path / "m.csv").write_text(f"case,path\nx,{target}\n")
        o = BatchOptions(manifest=str(tmp_path / "m.csv"), output=str(out), bundle=str(tiny_bundle), progress="none")
    else:
        o = opts([target], out, tiny_bundle)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(CardsegError, match="inside the batch's OUTDIR"):
        run_batch(o)
    assert sorted(p.name for p in out.iterdir()) == before


# --------------------------------------------------------------------------------------------
# item 9: regular files only, a bounded walk
# --------------------------------------------------------------------------------------------
@pytest.fixture
def specials(tmp_path):
    fifo = tmp_path / "pipe.nii.gz"
    os.mkfifo(fifo)
    return {"fifo": str(fifo), "char device": "/dev/zero", "fifo link": _link(tmp_path / "l.nii.gz", fifo)}


def _link(path: Path, target: Path) -> str:
    path.symlink_to(target)
    return str(path)


@pytest.mark.parametrize("kind", ["fifo", "char device", "fifo link"])
def test_batch_refuses_a_special_input_in_one_line(tmp_path, tiny_bundle, specials, kind):
    r = cli(["batch", specials[kind], "-o", str(tmp_path / "o"), "--bundle", str(tiny_bundle)], timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "not a regular file or a folder" in r.stderr and not (tmp_path / "o").exists()
    with pytest.raises(CardsegError, match="not a regular file"):
        content_hash(specials[kind])  # a manifest's case: fails alone, without opening it


def test_special_files_in_patterns_and_manifests(tmp_path, specials):
    with pytest.raises(CardsegError, match="FIFO"):
        cases_from_inputs([str(tmp_path / "*.nii.gz")])
    with pytest.raises(CardsegError, match="FIFO, not a regular file"):
        read_manifest(specials["fifo"])


def test_glob_over_symlink_loops_ends(tmp_path):
    (tmp_path / "d" / "a").mkdir(parents=True)
    (tmp_path / "d" / "a" / "x.nii.gz").write_bytes(b"x")
    (tmp_path / "d" / "a" / "up").symlink_to("..")
    (tmp_path / "d" / "a" / "self").symlink_to(".")
    (tmp_path / "d" / "a" / "root").symlink_to(tmp_path)
    found = walk.bounded_glob(str(tmp_path / "d" / "**" / "*.nii.gz"))
    assert {os.path.realpath(f) for f in found} == {str((tmp_path / "d" / "a" / "x.nii.gz").resolve())}
    assert len(found) <= 4


def test_glob_walk_is_bounded(tmp_path, monkeypatch):
    for i in range(30):
        (tmp_path / f"f{i}").write_text("")
    monkeypatch.setattr(walk, "MAX_ENTRIES", 10)
    with pytest.raises(CardsegError, match="more than 10"):
        walk.bounded_glob(str(tmp_path / "**"))


_NAMES = st.lists(
    st.sampled_from(
        ["a", "bb", ".h", "x.nii.gz", "y.nrrd", "sub/z.nii.gz", "sub/deep/w.nii.gz", "b/.hid/v.nii.gz", "b/q.mha"]
    ),
    min_size=1,
    max_size=6,
    unique=True,
)
_PATTERNS = st.sampled_from(
    ["*", "**", "**/*.nii.gz", "*/*.nii.gz", "sub/**", "**/deep/*", "?.nii.gz", "[ab]", "b/*", "**/*"]
)


@settings(max_examples=40, deadline=None)
@given(names=_NAMES, pattern=_PATTERNS)
def test_bounded_glob_equals_glob_without_loops(names, pattern):
    with tempfile.TemporaryDirectory() as d:
        for n in names:
            p = Path(d) / n
            p.parent.mkdir(parents=True, exist_ok=True)
            if not p.exists():
                p.write_text("")
        if pattern.startswith("sub/") and not (Path(d) / "sub").is_dir():
            assert walk.bounded_glob(os.path.join(d, pattern)) == []  # (glob.glob gives 'sub/' here)
            return
        want = sorted(os.path.normpath(p) for p in glob.glob(os.path.join(d, pattern), recursive=True))
        got = sorted(os.path.normpath(p) for p in walk.bounded_glob(os.path.join(d, pattern)))
        assert got == want


# --------------------------------------------------------------------------------------------
# item 8: no foreground is counted and ranked first among the cases with a result
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method,agreement", [("card", None), ("card", 0.99), ("uc", None)])
def test_no_foreground_is_counted_and_ranked_first(method, agreement):
    report = {
        "method": method,
        "agreement": agreement,
        "out_of_domain": None,
        "regions": [],
        "slices": 4,
        "class_volumes_ml": {"RV": 0.0, "MYO": 0.0, "LV": 0.0},
    }
    empty = cohort_row(Case("empty", "/x/empty.nii.gz"), "ok", report=report)
    assert empty["no_foreground"] is True and empty["out_of_domain"] is True
    good = dict(report, agreement=0.5, out_of_domain=True, class_volumes_ml={"RV": 1.0, "MYO": 2.0, "LV": 3.0})
    ood = cohort_row(Case("ood", "/x/ood.nii.gz"), "ok", report=good)
    uc = cohort_row(
        Case("uc", "/x/uc.nii.gz"), "ok", report=dict(good, method="uc", agreement=None, out_of_domain=None)
    )
    failed = cohort_row(Case("failed", "/x/f.nii.gz"), "error", "boom")
    rows = [uc, ood, empty, failed]
    assert [r["case"] for r in T.rank_cases(rows)] == ["failed", "empty", "ood", "uc"]
    assert T.reason(empty).startswith("no foreground")
    assert ood["no_foreground"] is False
    # and so from the CSV, also one written before the column existed
    with tempfile.TemporaryDirectory() as d:
        write_table(Path(d) / "t.csv", rows, table_columns(rows, ["RV", "MYO", "LV"]))
        back = read_table(Path(d) / "t.csv")
        assert [r["case"] for r in T.rank_cases(back)] == ["failed", "empty", "ood", "uc"]
        old = [{k: v for k, v in r.items() if k != "no_foreground"} for r in back]
        assert T.tier(old[2]) == 1 and T.rank_cases(old)[1]["case"] == "empty"


# --------------------------------------------------------------------------------------------
# item 10: SIGTERM is handled like Ctrl-C
# --------------------------------------------------------------------------------------------
def _children() -> dict:
    kids = {}
    for st_path in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(st_path).read_text()
        except OSError:
            continue
        pid, rest = int(text.split(" ", 1)[0]), text.rsplit(")", 1)[1].split()
        kids.setdefault(int(rest[1]), []).append(pid)
    return kids


def _descendants(pid: int) -> set:
    kids, out, todo = _children(), set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _terminate_batch(args, out: Path, tmpdir: str, min_children: int):
    env = dict(ENV, TMPDIR=tmpdir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cardseg", "batch", *args, "-o", str(out), "--progress", "none", "--threads", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if (out / STATE_FILE).is_file() and (out / STATE_FILE).read_text().count("\n") >= 1:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the batch ended before the test could stop it: " + proc.stderr.read()
        kids = _descendants(proc.pid)
        assert len(kids) >= min_children, kids
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
        deadline = time.time() + 30
        while time.time() < deadline and any(_alive(k) for k in kids):
            time.sleep(0.2)
        return proc.returncode, stderr, [k for k in kids if _alive(k)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("extra,min_children", [([], 0), (["--workers", "2"], 3)])
def test_sigterm_writes_the_pending_table_and_ends_the_workers(
    tmp_path, tiny_bundle, synthetic_volume, extra, min_children
):
    vol, _ = synthetic_volume
    for i in range(10):
        write_case(tmp_path / "in" / f"c{i}.nii.gz", vol, i)
    out = tmp_path / "out"
    rc, stderr, left = _terminate_batch(
        [str(tmp_path / "in"), "--bundle", str(tiny_bundle), *extra], out, str(tmp_path), min_children
    )
    assert rc == 143 and "terminated" in stderr and "Traceback" not in stderr, stderr
    assert left == [], f"processes still running after the batch ended: {left}"
    rows = read_table(out / COHORT_CSV)
    assert len(rows) == 10 and {r["status"] for r in rows} <= {"ok", "pending"}
    assert "pending" in {r["status"] for r in rows} and "ok" in {r["status"] for r in rows}
    again = run_batch(opts([tmp_path / "in"], out, tiny_bundle))  # resumes without a word about --overwrite
    assert [r["status"] for r in again.rows] == ["ok"] * 10 and again.reused >= 1


@pytest.mark.slow
def test_sigterm_during_ray_local_leaves_no_bundle_folder(tiny_bundle, synthetic_volume):
    pytest.importorskip("ray", reason="Ray not installed (the [cluster] extra)")
    vol, _ = synthetic_volume
    tmp = tempfile.mkdtemp(prefix="cs", dir="/tmp")  # short: Ray puts its sockets below TMPDIR
    try:
        for i in range(12):
            write_case(Path(tmp) / "in" / f"c{i}.nii.gz", vol, i)
        out = Path(tmp) / "out"
        rc, stderr, left = _terminate_batch(
            [str(Path(tmp) / "in"), "--bundle", str(tiny_bundle), "--ray", "local", "--ray-workers", "2"], out, tmp, 1
        )
        assert rc == 143 and "terminated" in stderr, stderr
        assert not glob.glob(os.path.join(tmp, "cardseg-bundle-*"))
        assert left == [], f"processes still running after the batch ended: {left}"
        assert "pending" in {r["status"] for r in read_table(out / COHORT_CSV)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# item 12: no CSV cell is a formula
# --------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=12)
    | st.sampled_from(
        ['=HYPERLINK("http://x","y")', "+1+1", "-2-3", "@SUM(A1)", "\t=1", "'=1", "-1.5", "+3", "'", "-inf"]
    )
)
def test_safe_cell_never_starts_a_formula_and_reads_back(text):
    cell = safe_cell(text)
    assert read_cell(cell) == text
    if cell.startswith(FORMULA_START):
        float(cell)  # only a plain number may start so


@pytest.mark.parametrize("subject", ['=HYPERLINK("http://evil","click")', "+cmd|' /C calc'!A0", "-1+1", "@SUM(1)"])
def test_cohort_and_subject_tables_neutralise_formulas(tmp_path, subject):
    rows = [cohort_row(Case("c0", "/in/c0.nii.gz", subject=subject, phase="ED"), "error", subject)]
    write_table(tmp_path / "cohort.csv", rows, table_columns(rows))
    write_table(tmp_path / "subjects.csv", [{"subject": subject, "error": subject}], ["subject", "error"])
    for name in ("cohort.csv", "subjects.csv"):
        with open(tmp_path / name, newline="") as f:
            cells = [c for r in csv.reader(f) for c in r]
        assert all(not c.startswith(("=", "+", "-", "@")) for c in cells), cells
        assert read_table(tmp_path / name)[0]["subject"] == subject
