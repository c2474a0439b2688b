"""Nothing half written, nothing lost (issue 21, items 1, 2, 3 and 10's leftovers).

* A write cut short (``ulimit -f``: the real limit, in a subprocess) is one error line, exit 1,
  the earlier result untouched, no temporary left; a batch records such a case as failed.
* An output folder that is a mount point (renames out of it or across it fail, simulated) is
  filled in place without losing a file, and a stamp entry that leaves the folder is never
  followed.
* ``init-bundle --overwrite`` replaces only a bundle cardseg wrote.
* What a killed run left beside its output folder is removed by the next run in that parent
  folder, and only what carries cardseg's marker and no live lock.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import SimpleITK as sitk
from conftest import files_of

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(args, limit=None, timeout=300):
    """``cardseg ARGS`` in a subprocess, its files cut at ``limit`` bytes (RLIMIT_FSIZE)."""

    def cut():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(
        [sys.executable, "-m", "cardseg", *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
        preexec_fn=cut if limit else None,
    )
    return proc.returncode, proc.stdout, proc.stderr


def assert_write_failure(result):
    code, _, err = result
    lines = err.strip().splitlines()
    assert code == 1, (code, err)
    assert len(lines) == 1 and lines[0].startswith("cardseg: error:"), err
    assert "could not be written completely" in lines[0] and "NWAD" not in err


@pytest.fixture(scope="module")
def scan(tmp_path_factory, synthetic_volume):
    folder = tmp_path_factory.mktemp("study")
    sitk.WriteImage(synthetic_volume[0].to_image(), str(folder / "scan.nii.gz"))
    return folder / "scan.nii.gz"


@pytest.fixture(scope="module")
def sizes(tmp_path_factory, scan, tiny_bundle):
    """The size of every file a normal run writes."""
    out = tmp_path_factory.mktemp("normal") / "out"
    assert run(["segment", scan, "-o", out, "--bundle", tiny_bundle, "--backend", "torch", "--quiet"])[0] == 0
    return {p.name: p.stat().st_size for p in out.iterdir() if not p.name.startswith(".")}


def cut_limit(sizes: dict, name: str) -> int:
    """A file-size limit that ``name`` cannot be written under, whichever writer compresses it:
    ``write_image`` falls back to SimpleITK's own compressed write, whose files are a little
    smaller than the usual ones (a limit 1 byte under the usual size lets that one through)."""
    return sizes[name] * 3 // 4


# ----------------------------------------------------------------------------- item 1


@pytest.mark.parametrize("cut_in", ["segmentation.nii.gz", "segmentation.seg.nrrd", "probabilities.nii.gz"])
def test_a_write_cut_by_a_file_size_limit_fails_and_keeps_the_earlier_result(
    tmp_path, scan, tiny_bundle, sizes, cut_in
):
    """Any file cut short (at a limit under that file's size, so that file or a larger one is
    cut): exit 1, one line, nothing committed, nothing left over."""
    limit = cut_limit(sizes, cut_in)
    out = tmp_path / "out"
    assert_write_failure(
        run(["segment", scan, "-o", out, "--bundle", tiny_bundle, "--backend", "torch", "--progress", "none"], limit)
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert run(["segment", scan, "-o", out, "--bundle", tiny_bundle, "--backend", "torch", "--quiet"])[0] == 0
    before = files_of(out)
    assert_write_failure(
        run(
            [
                "segment",
                scan,
                "-o",
                out,
                "--bundle",
                tiny_bundle,
                "--backend",
                "torch",
                "--overwrite",
                "--method",
                "uc",
                "--progress",
                "none",
            ],
            limit,
        )
    )
    assert files_of(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_write_image_needs_room_for_the_compressed_file_only(tmp_path):
    """``write_image`` compresses an uncompressed NIfTI written beside the target; where that one
    does not fit under ``ulimit -f`` but the compressed file does, SimpleITK's own compressed
    write takes over: the file is written, whole, with nothing beside it. With the limit below
    the compressed size, the one error names the target."""
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import SimpleITK as sitk
        from cardseg.io.written import IncompleteWrite, write_image
        img = sitk.GetImageFromArray(np.zeros((16, 128, 128), np.float32))  # 1 MiB raw, a few KiB compressed
        try:
            write_image(img, {str(tmp_path / "x.nii.gz")!r})
        except IncompleteWrite as exc:
            print("incomplete", exc)
            sys.exit(3)
        back = sitk.GetArrayFromImage(sitk.ReadImage({str(tmp_path / "x.nii.gz")!r}))
        print("ok", back.shape, float(np.abs(back).max()))
    """)

    def limited(limit):
        def cut():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        return subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=120, preexec_fn=cut
        )

    p = limited(256 * 1024)
    assert p.returncode == 0 and "ok (16, 128, 128) 0.0" in p.stdout, p.stdout + p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == ["x.nii.gz"]
    (tmp_path / "x.nii.gz").unlink()
    p = limited(200)
    assert p.returncode == 3 and "x.nii.gz" in p.stdout and "NWAD" not in p.stderr, p.stdout + p.stderr
    assert not (tmp_path / "x.nii.gz.raw.nii").exists()


def test_write_image_refuses_a_truncated_file_in_every_form(tmp_path, synthetic_volume):
    """The read-back check itself: a NIfTI cut anywhere, or with a bit flipped, is refused."""
    from cardseg.io.written import IncompleteWrite, verify_image, write_image

    img = synthetic_volume[0].to_image()
    path = tmp_path / "x.nii.gz"
    write_image(img, path)
    data = path.read_bytes()
    for cut in (0, 10, len(data) // 3, len(data) - 9, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(IncompleteWrite):
            verify_image(img, path)
    path.write_bytes(data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1 :])
    with pytest.raises(IncompleteWrite):
        verify_image(img, path)
    path.write_bytes(data)
    verify_image(img, path)
    with pytest.raises(IncompleteWrite):  # a file that holds another image is not this one
        verify_image(img[:, :, :2], path)


def test_a_batch_records_a_cut_case_as_failed_and_runs_it_again(tmp_path, scan, tiny_bundle, sizes):
    cases = tmp_path / "in"
    cases.mkdir()
    (cases / "c1.nii.gz").write_bytes(scan.read_bytes())
    out = tmp_path / "b"
    args = ["batch", cases, "-o", out, "--bundle", tiny_bundle, "--backend", "torch", "--quiet"]
    assert run(args, limit=cut_limit(sizes, "probabilities.nii.gz"))[0] == 1
    import csv

    from cardseg.cohort.layout import STATE_FILE

    def row():
        with open(out / "cohort.csv", newline="") as f:
            return next(r for r in csv.DictReader(f) if r["case"] == "c1")

    assert row()["status"] == "error" and "could not be written completely" in row()["error"]
    state = out / STATE_FILE
    assert not state.exists() or all(json.loads(ln).get("case") != "c1" for ln in state.read_text().splitlines())
    assert not (out / "c1").exists()
    code, _, err = run(args)  # the resume computes the case again, it does not reuse anything
    assert code == 0, err
    assert row()["status"] == "ok" and row()["reused"] == "false"
    img = sitk.ReadImage(str(out / "c1" / "probabilities.nii.gz"))
    assert img.GetSize() == sitk.ReadImage(str(scan)).GetSize()


# ----------------------------------------------------------------------------- item 2


@pytest.fixture()
def mount(tmp_path, monkeypatch):
    """``tmp_path/mnt`` behaves as a mount point: it cannot be renamed, and no rename crosses
    its boundary (EBUSY, EXDEV), as on a real mount."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    real_replace, real_rename = os.replace, os.rename

    def inside(p):
        p = os.path.abspath(os.fspath(p))
        return p == str(mnt) or p.startswith(str(mnt) + os.sep)

    def guarded(real):
        def move(src, dst, *a, **k):
            if os.path.abspath(os.fspath(src)) == str(mnt) or os.path.abspath(os.fspath(dst)) == str(mnt):
                raise OSError(errno.EBUSY, "Device or resource busy", os.fspath(src))
            if inside(src) != inside(dst):
                raise OSError(errno.EXDEV, "Invalid cross-device link", os.fspath(src))
            return real(src, dst, *a, **k)

        return move

    monkeypatch.setattr(os, "replace", guarded(real_replace))
    monkeypatch.setattr(os, "rename", guarded(real_rename))
    return mnt


def segment(*args):
    from cardseg.cli import main

    return main(["segment", *map(str, args), "--backend", "torch", "--quiet"])


def test_a_mount_point_is_filled_and_replaced_in_place_without_losing_files(
    tmp_path, mount, scan, tiny_bundle, monkeypatch, capsys
):
    from cardseg import segment as seg

    inode = mount.stat().st_ino
    assert segment(scan, "-o", mount, "--bundle", tiny_bundle) == 0
    card = files_of(mount)
    assert "disagreement.nii.gz" in card and mount.stat().st_ino == inode
    real = seg.write_one

    def failing(name, path, *a):
        if name == "probabilities.nii.gz":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(name, path, *a)

    monkeypatch.setattr(seg, "write_one", failing)  # a uc run that fails half way loses nothing
    assert segment(scan, "-o", mount, "--bundle", tiny_bundle, "--overwrite", "--method", "uc") == 1
    assert files_of(mount) == card
    monkeypatch.setattr(seg, "write_one", real)
    assert segment(scan, "-o", mount, "--bundle", tiny_bundle, "--overwrite", "--method", "uc") == 0
    stamp = json.loads((mount / ".cardseg-output.json").read_text())
    assert sorted(stamp["files"]) == sorted(p.name for p in mount.iterdir() if p.name != ".cardseg-output.json")
    assert (
        "disagreement.nii.gz" not in stamp["files"]
        and json.loads((mount / "report.json").read_text())["method"] == "uc"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]
    capsys.readouterr()


@pytest.mark.parametrize("entry", ["../precious.txt", "{abs}", "sub/../../precious.txt", "link.txt", "..", ""])
def test_a_stamp_entry_that_leaves_the_folder_is_never_removed(tmp_path, mount, scan, tiny_bundle, entry):
    """Whatever the stamp lists, a run removes only plain names directly inside OUTDIR."""
    precious = tmp_path / "precious.txt"
    precious.write_text("someone else's")
    assert segment(scan, "-o", mount, "--bundle", tiny_bundle) == 0
    stamp_path = mount / ".cardseg-output.json"
    stamp = json.loads(stamp_path.read_text())
    entry = entry.format(abs=precious)
    digest = {"size": precious.stat().st_size, "sha256": hashlib.sha256(precious.read_bytes()).hexdigest()}
    stamp["files"][entry] = digest
    stamp_path.write_text(json.dumps(stamp))
    code = segment(scan, "-o", mount, "--bundle", tiny_bundle, "--overwrite", "--method", "uc")
    if entry == "link.txt":  # not there: nothing to remove; a symlink listed would be refused
        assert code == 0
        (mount / "link.txt").symlink_to(precious)
        stamp = json.loads(stamp_path.read_text())
        stamp["files"]["link.txt"] = digest
        stamp_path.write_text(json.dumps(stamp))
        assert segment(scan, "-o", mount, "--bundle", tiny_bundle, "--overwrite") == 2
        assert (mount / "link.txt").is_symlink()
    else:
        assert code == 0
    assert precious.read_text() == "someone else's"


def test_a_replacement_cut_short_can_be_replaced_again_and_is_no_finished_result(tmp_path, mount):
    """A run killed while moving files in leaves the interim stamp: it lists no finished result
    (a batch does not reuse it) and the next run with --overwrite replaces it."""
    from cardseg.base.errors import CardsegError
    from cardseg.io.outdir import OutputWriter, check_output, read_stamp

    out = check_output(mount)
    with OutputWriter(out) as w:
        w.path("a.txt").write_text("old a")
        w.path("b.txt").write_text("old b")
        w.commit()
    real = os.replace
    calls = []

    def dies_on_second_file(src, dst):
        if str(dst).endswith("b.txt"):
            raise KeyboardInterrupt  # as if killed here
        calls.append(dst)
        return real(src, dst)

    with pytest.raises(KeyboardInterrupt):
        with OutputWriter(check_output(out, True), True) as w:
            w.path("a.txt").write_text("new a")
            w.path("b.txt").write_text("new b")
            os.replace = dies_on_second_file
            try:
                w.commit()
            finally:
                os.replace = real
    assert (out / "a.txt").read_text() == "new a" and (out / "b.txt").read_text() == "old b"
    assert read_stamp(out)["files"] == {}
    with pytest.raises(CardsegError, match="--overwrite"):
        check_output(out)
    with OutputWriter(check_output(out, True), True) as w:
        w.path("c.txt").write_text("c")
        w.commit()
    assert sorted(p.name for p in out.iterdir()) == [".cardseg-output.json", "c.txt"]


# ----------------------------------------------------------------------------- item 10 (leftovers)

KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    from cardseg.io.outdir import OutputWriter, check_output
    w = OutputWriter(check_output(sys.argv[1], True), True)
    w.__enter__()
    w.path("report.json").write_text("{}")
    os.kill(os.getpid(), signal.SIGKILL)
""")


def killed_run(out: Path) -> None:
    """What a run for ``out`` killed while writing leaves. It runs in a folder of its own (a run
    cleans its parent folder: the leftovers made before would go) and its traces are moved over."""
    stage = out.parent.with_name(out.parent.name + "-stage")
    stage.mkdir()
    if out.is_dir():
        out.rename(stage / out.name)
    subprocess.run([sys.executable, "-c", KILLED_RUN, str(stage / out.name)], env=ENV, timeout=120)
    for p in stage.iterdir():
        p.rename(out.parent / p.name)
    stage.rmdir()


def test_what_a_killed_run_left_is_cleaned_by_the_next_run_in_that_folder(tmp_path):
    from cardseg.base.files import FileLock
    from cardseg.io.outdir import OutputWriter, check_output

    killed_run(tmp_path / "x")  # a new folder: its temporary folder and lock beside it
    (tmp_path / "y").mkdir()
    killed_run(tmp_path / "y")  # an existing folder: the temporary folder inside it
    assert (tmp_path / ".x.cardseg-tmp").is_dir() and (tmp_path / ".x.cardseg.lock").is_file()
    assert (tmp_path / "y" / ".cardseg-tmp").is_dir()
    killed_run(tmp_path / "live")
    live = FileLock(tmp_path / ".live.cardseg.lock")  # a run still writing: never touched
    assert live.acquire()
    (tmp_path / ".user.cardseg-tmp").mkdir()  # a user's folder under a cardseg-like name
    (tmp_path / ".user.cardseg-tmp" / "notes.txt").write_text("mine")
    (tmp_path / ".mine.cardseg.lock").write_text("a user's file\n")
    before = files_of(tmp_path)
    try:
        with OutputWriter(check_output(tmp_path / "z")) as w:  # another output, same parent
            w.path("report.json").write_text("{}")
            w.commit()
        assert not (tmp_path / ".x.cardseg-tmp").exists() and not (tmp_path / ".x.cardseg.lock").exists()
        assert (tmp_path / ".live.cardseg-tmp").is_dir()
        assert (tmp_path / ".user.cardseg-tmp" / "notes.txt").read_text() == "mine"
        assert (tmp_path / ".mine.cardseg.lock").read_text() == "a user's file\n"
    finally:
        live.release()
    kept = {k: v for k, v in before.items() if not k.startswith((".x.", ".y.cardseg.lock", ".live.cardseg.lock"))}
    assert {k: v for k, v in files_of(tmp_path).items() if k in kept} == kept
    with OutputWriter(check_output(tmp_path / "y")) as w:  # the folder's own leftover inside it
        w.path("report.json").write_text("{}")
        w.commit()
    assert sorted(p.name for p in (tmp_path / "y").iterdir()) == [".cardseg-output.json", "report.json"]


@pytest.mark.parametrize("cut", ["empty stamp", "half stamp", "stamp's temporary file"])
def test_a_temporary_folder_whose_stamp_a_kill_cut_short_is_cleaned(tmp_path, cut):
    """A kill while the first stamp was written left a temporary folder holding only that cut file:
    still cardseg's (its names under cardseg's leftover name), removed by the next run; the same
    name with anything else in it stays someone else's."""
    from cardseg.io.outdir import STAMP, STAMP_PART, OutputWriter, check_output, clean_leftovers

    def leave(name: str) -> Path:
        tmp = tmp_path / f".{name}.cardseg-tmp"
        tmp.mkdir()
        if cut == "empty stamp":
            (tmp / STAMP).write_bytes(b"")
        elif cut == "half stamp":
            (tmp / STAMP).write_text('{"tool": "cardseg", "fi')
        else:
            (tmp / STAMP_PART).write_text('{"tool": "card')
        return tmp

    mine = leave("a")
    with OutputWriter(check_output(tmp_path / "a")) as w:  # the output's own leftover
        w.path("report.json").write_text("{}")
        w.commit()
    assert not mine.exists()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [STAMP, "report.json"]
    other = leave("b")
    theirs = leave("c")
    (theirs / "notes.txt").write_text("a user's")
    assert clean_leftovers(tmp_path) == [other.name]
    assert (theirs / "notes.txt").read_text() == "a user's"
    with pytest.raises(Exception, match="not made by cardseg"):
        check_output(tmp_path / "c")


def test_the_stamp_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """The stamp goes through a temporary file and a rename: a write that fails half way leaves
    the earlier stamp (or none) and no half-written one."""
    import cardseg.base.files as files
    from cardseg.io.outdir import STAMP, OutputWriter, check_output, read_stamp

    real_replace = os.replace
    with OutputWriter(check_output(tmp_path / "a")) as w:
        w.path("report.json").write_text("{}")
        first = read_stamp(w.tmp)
        assert first is not None and first["files"] == {}

        def cut(src, dst):
            if str(dst).endswith(STAMP):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_replace(src, dst)

        monkeypatch.setattr(files.os, "replace", cut)
        with pytest.raises(OSError):
            w.commit()
        assert read_stamp(w.tmp) == first  # the earlier stamp, whole
        monkeypatch.undo()
    assert not (tmp_path / "a").exists() and not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- item 3


def _foreign(kind: str, d: Path, bundle: Path) -> Path:
    import shutil

    if kind == "notes":
        (d / "sub").mkdir(parents=True)
        (d / "notes.txt").write_text("x")
    elif kind in ("extra", "edited", "renamed"):
        shutil.copytree(bundle, d)
        if kind == "extra":
            (d / "notes.txt").write_text("x")
        elif kind == "edited":
            with open(d / "primary.safetensors", "ab") as f:
                f.write(b"\0")
        else:
            (d / "reference.safetensors").rename(d / "other.safetensors")
    elif kind == "broken-json":
        d.mkdir()
        (d / "bundle.json").write_text("{")
    elif kind == "file":
        d.write_text("x")
    elif kind == "symlink":
        shutil.copytree(bundle, d.with_name("real"))
        d.symlink_to(d.with_name("real"))
    return d


@pytest.mark.parametrize("kind", ["notes", "extra", "edited", "renamed", "broken-json", "file", "symlink"])
def test_init_bundle_overwrite_replaces_only_a_bundle_cardseg_wrote(tmp_path, tiny_bundle, kind, capsys):
    from cardseg.cli import main

    d = _foreign(kind, tmp_path / "d", tiny_bundle)
    before = files_of(tmp_path)
    assert main(["init-bundle", str(d), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cardseg: error:") and str(d) in err[0]
    assert files_of(tmp_path) == before


def test_init_bundle_overwrite_replaces_its_own_bundle(tmp_path, capsys):
    from cardseg.cli import main

    d = tmp_path / "b"
    assert main(["init-bundle", str(d)]) == 0
    first = files_of(d)
    assert main(["init-bundle", str(d)]) == 2  # without --overwrite: kept
    assert main(["init-bundle", str(d), "--overwrite", "--seed", "5"]) == 0
    assert files_of(d) != first and sorted(files_of(d)) == sorted(first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    capsys.readouterr()


def test_a_batch_cleans_what_a_killed_run_left_beside_its_outdir(tmp_path, tiny_bundle, rotated_nifti):
    killed_run(tmp_path / "x")
    assert (tmp_path / ".x.cardseg-tmp").is_dir() and (tmp_path / ".x.cardseg.lock").is_file()
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.nii.gz").write_bytes(rotated_nifti.read_bytes())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cardseg",
            "batch",
            str(inputs),
            "-o",
            str(tmp_path / "cohort"),
            "--bundle",
            str(tiny_bundle),
            "--progress",
            "none",
            "--backend",
            "torch",
            "--no-report",
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert not (tmp_path / ".x.cardseg-tmp").exists() and not (tmp_path / ".x.cardseg.lock").exists()


def test_a_second_interrupt_while_files_are_written_waits_for_them_and_leaves_nothing(
    tmp_path, scan, tiny_bundle, monkeypatch
):
    """Ctrl-C while a case's files are written (more files than write threads, so some are
    cancelled unstarted), then Ctrl-C again while the writer waits for the files already started:
    the interrupt still ends the run, but only once no write thread is left, so the temporary
    folder is removed whole (before, the second interrupt let the clean-up race the threads still
    writing into it)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from cardseg import segment as seg
    from cardseg.bundle.loading import load_bundle

    bundle = load_bundle(tiny_bundle, backend="torch")
    real_write = seg.write_one
    running, started, shutdowns = [], threading.Event(), []

    def slow_write(name, path, *a):
        running.append(name)
        started.set()
        time.sleep(0.3)
        try:
            return real_write(name, path, *a)
        finally:
            running.remove(name)

    def first_interrupt(futures):  # Ctrl-C while the main thread waits for the first file
        started.wait(5)
        raise KeyboardInterrupt

    class Pool(ThreadPoolExecutor):
        def shutdown(self, wait=True, *, cancel_futures=False):
            shutdowns.append(len(running))
            if len(shutdowns) == 1:  # again while the writes already started finish
                super().shutdown(wait=False, cancel_futures=cancel_futures)
                raise KeyboardInterrupt
            return super().shutdown(wait=wait, cancel_futures=cancel_futures)

    monkeypatch.setattr(seg, "write_one", slow_write)
    monkeypatch.setattr(seg, "as_completed", first_interrupt)
    monkeypatch.setattr(seg, "ThreadPoolExecutor", Pool)
    assert len(seg.output_files(seg.segment_volume(seg.read_case(scan, tmp_path / "x")[1], bundle))) > seg.WRITE_THREADS
    with pytest.raises(KeyboardInterrupt):
        seg.segment_file(scan, tmp_path / "out", bundle, seg.SegmentOptions("card"))
    assert shutdowns[0] >= 1 and len(shutdowns) == 2  # the second interrupt came while files were being written
    assert running == []  # and the run ended only after they were
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no output, no temporary folder, no lock


def test_an_interrupt_between_two_file_submissions_waits_for_the_first(tmp_path, scan, tiny_bundle, monkeypatch):
    """Ctrl-C after the first file was handed to a write thread and before the second was: the
    run ends with the interrupt (not another error) once that first write is over, and leaves no
    temporary folder."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from cardseg import segment as seg
    from cardseg.bundle.loading import load_bundle

    bundle = load_bundle(tiny_bundle, backend="torch")
    real_write, running, submitted = seg.write_one, [], []

    def slow_write(name, path, *a):
        running.append(name)
        time.sleep(0.3)
        try:
            return real_write(name, path, *a)
        finally:
            running.remove(name)

    class InterruptedPool(ThreadPoolExecutor):
        def submit(self, *a, **k):
            if submitted:
                raise KeyboardInterrupt
            submitted.append(a[1])
            return super().submit(*a, **k)

    monkeypatch.setattr(seg, "write_one", slow_write)
    monkeypatch.setattr(seg, "ThreadPoolExecutor", InterruptedPool)
    with pytest.raises(KeyboardInterrupt):
        seg.segment_file(scan, tmp_path / "out", bundle, seg.SegmentOptions("card"))
    assert len(submitted) == 1 and running == []
    assert sorted(p.name for p in tmp_path.iterdir()) == []
