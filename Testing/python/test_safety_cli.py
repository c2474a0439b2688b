"""Never lose a file, never read garbage as an image: the real ``cardseg segment`` in a subprocess.

Every refusal must be one ``cardseg: error:`` line on stderr, exit code 2, nothing written and
nothing deleted; every input folder and unrelated file must survive byte for byte.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from conftest import files_of

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(*args, timeout=300):
    proc = subprocess.run(
        [sys.executable, "-m", "cardseg", "segment", *[str(a) for a in args]],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout, proc.stderr


def assert_refused(result, *expect):
    code, out, err = result
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("cardseg: error:"), err
    assert "Traceback" not in err and "WARNING" not in err
    for e in expect:
        assert e in lines[0], (e, lines[0])


@pytest.fixture()
def scan(tmp_path, synthetic_volume):
    """A folder holding a scan and an unrelated note, as a user's study folder would."""
    vol, _ = synthetic_volume
    study = tmp_path / "study"
    study.mkdir()
    sitk.WriteImage(vol.to_image(), str(study / "scan.nii.gz"))
    (study / "notes.txt").write_text("clinical notes: keep")
    return study


def write_dicom_series(folder: Path, vol, phases: int = 1, skip=(), direction=None):
    """One int16 DICOM file per slice (and phase), with positions, orientation, trigger times;
    ``direction`` (9 numbers) tilts the series as a short-axis stack is."""
    folder.mkdir(parents=True, exist_ok=True)
    img = sitk.Cast(vol.to_image(), sitk.sitkInt16)
    if direction is not None:
        img.SetDirection(direction)
    d = np.asarray(img.GetDirection()).reshape(3, 3)
    orientation = "\\".join(f"{v:.6f}" for v in [*d[:, 0], *d[:, 1]])
    writer = sitk.ImageFileWriter()
    writer.KeepOriginalImageUIDOn()
    n = 0
    for k in range(img.GetDepth()):
        for ph in range(phases):
            n += 1
            if (k, ph) in skip:
                continue
            sl = img[:, :, k] + 100 * ph
            sl.SetMetaData("0020|000e", "1.2.826.0.1.3680043.2.1125.1.4242")
            sl.SetMetaData("0020|0032", "\\".join(map(str, img.TransformIndexToPhysicalPoint((0, 0, k)))))
            sl.SetMetaData("0020|0037", orientation)
            sl.SetMetaData("0020|0013", str(n))
            sl.SetMetaData("0018|1060", str(40.0 * ph))
            sl.SetMetaData("0008|0060", "MR")
            writer.SetFileName(str(folder / f"IM{n:04d}.dcm"))
            writer.Execute(sl)
    return sorted(folder.iterdir())


# ----------------------------------------------------------------------------- data loss


def test_output_into_the_input_folder_is_refused_even_with_overwrite(scan, tiny_bundle):
    before = files_of(scan)
    assert_refused(cli(scan / "scan.nii.gz", "-o", scan, "--overwrite", "--bundle", tiny_bundle), "input")
    assert_refused(cli(scan / "scan.nii.gz", "-o", scan / "sub" / "..", "--overwrite", "--bundle", tiny_bundle))
    assert files_of(scan) == before


def test_dicom_folder_as_input_and_output_is_refused(tmp_path, synthetic_volume, tiny_bundle):
    vol, _ = synthetic_volume
    series = tmp_path / "series"
    write_dicom_series(series, vol)
    before = files_of(series)
    for out in (series, series / "results", tmp_path):
        assert_refused(cli(series, "-o", out, "--overwrite", "--bundle", tiny_bundle), "input")
    assert files_of(series) == before


def test_a_folder_cardseg_did_not_write_is_never_replaced(tmp_path, scan, tiny_bundle):
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    (home / "docs" / "thesis.tex").write_text("years of work")
    (home / ".bashrc").write_text("export X=1")
    before = files_of(home)
    assert_refused(
        cli(scan / "scan.nii.gz", "-o", home, "--overwrite", "--bundle", tiny_bundle), "not written by cardseg"
    )
    assert files_of(home) == before


def test_overwrite_replaces_only_a_pure_cardseg_result(tmp_path, scan, tiny_bundle):
    out = tmp_path / "result"
    code, stdout, err = cli(scan / "scan.nii.gz", "-o", out, "--bundle", tiny_bundle, "--progress", "none")
    assert code == 0, err
    stamp = json.loads((out / ".cardseg-output.json").read_text(encoding="utf-8"))
    assert stamp["tool"] == "cardseg" and set(stamp["files"]) == {p.name for p in out.iterdir()} - {
        ".cardseg-output.json"
    }
    assert_refused(cli(scan / "scan.nii.gz", "-o", out, "--bundle", tiny_bundle), "--overwrite")
    (out / "my-measurements.csv").write_text("LV,123\n")  # the user added a file of their own
    before = files_of(out)
    assert_refused(cli(scan / "scan.nii.gz", "-o", out, "--overwrite", "--bundle", tiny_bundle), "my-measurements.csv")
    assert files_of(out) == before
    (out / "my-measurements.csv").unlink()
    assert cli(scan / "scan.nii.gz", "-o", out, "--overwrite", "--quiet", "--bundle", tiny_bundle)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result", "study"]  # nothing left beside it


def test_outputs_have_the_users_normal_modes(tmp_path, scan, tiny_bundle):
    out = tmp_path / "a" / "b" / "result"
    proc = subprocess.run(
        f"umask 022 && {sys.executable} -m cardseg segment {scan / 'scan.nii.gz'} -o {out} "
        f"--quiet --bundle {tiny_bundle}",
        shell=True,
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    for folder in (tmp_path / "a", tmp_path / "a" / "b", out):
        assert folder.stat().st_mode & 0o777 == 0o755, folder
    for f in out.iterdir():
        assert f.stat().st_mode & 0o777 == 0o644, f


def _wait_for(pred, timeout=120.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_a_killed_run_leaves_nothing_that_the_next_run_does_not_clean(tmp_path, scan, tiny_bundle):
    out = tmp_path / "result"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cardseg",
            "segment",
            str(scan / "scan.nii.gz"),
            "-o",
            str(out),
            "--bundle",
            str(tiny_bundle),
            "--quiet",
        ],
        env=ENV,
        stderr=subprocess.DEVNULL,
    )
    tmp = tmp_path / ".result.cardseg-tmp"
    assert _wait_for(tmp.exists), "the run never started writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert ".result.cardseg-tmp" in leftovers  # what a SIGKILL leaves ...
    assert cli(scan / "scan.nii.gz", "-o", out, "--quiet", "--bundle", tiny_bundle)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result", "study"]  # ... the next run cleans


def test_the_loser_of_a_race_fails_with_one_line(tmp_path, scan, tiny_bundle):
    from cardseg.io.outdir import FileLock

    out = tmp_path / "result"
    assert cli(scan / "scan.nii.gz", "-o", out, "--quiet", "--bundle", tiny_bundle)[0] == 0
    before = files_of(out)
    lock = FileLock(tmp_path / ".result.cardseg.lock")  # another run holds the folder
    assert lock.acquire()
    try:
        assert_refused(
            cli(scan / "scan.nii.gz", "-o", out, "--overwrite", "--bundle", tiny_bundle), "another cardseg run"
        )
    finally:
        lock.release()
    assert files_of(out) == before
    # two real runs at once: each either succeeds or loses with the one line; one result stands
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cardseg",
                "segment",
                str(scan / "scan.nii.gz"),
                "-o",
                str(out),
                "--overwrite",
                "--quiet",
                "--bundle",
                str(tiny_bundle),
            ],
            env=ENV,
            text=True,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    results = [(p.wait(), p.stderr.read()) for p in procs]
    assert any(code == 0 for code, _ in results)
    for code, err in results:
        assert code == 0 or (code == 2 and len(err.strip().splitlines()) == 1 and "another cardseg run" in err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result", "study"]
    assert (out / "report.json").is_file()


def test_something_appearing_at_the_output_meanwhile_is_not_replaced(tmp_path):
    from cardseg.base.errors import CardsegError
    from cardseg.io.outdir import OutputWriter, check_output

    out = check_output(tmp_path / "result")
    with pytest.raises(CardsegError, match="not written by cardseg"):
        with OutputWriter(out) as w:
            w.path("report.json").write_text("{}")
            out.mkdir()
            (out / "precious.txt").write_text("someone else's")
            w.commit()
    assert (out / "precious.txt").read_text() == "someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result"]


# ----------------------------------------------------------------------------- garbage in


def test_truncated_and_hollow_files_are_refused(tmp_path, scan, tiny_bundle):
    data = (scan / "scan.nii.gz").read_bytes()
    half = tmp_path / "half.nii.gz"
    half.write_bytes(data[: len(data) // 2])
    assert_refused(cli(half, "-o", tmp_path / "o", "--bundle", tiny_bundle), "truncated")
    # a 1 KB file whose header declares 1024 x 1024 x 4
    small = sitk.GetImageFromArray(np.arange(4 * 16 * 16, dtype=np.int16).reshape(4, 16, 16))
    small.SetSpacing((1.5, 1.5, 8.0))
    sitk.WriteImage(small, str(tmp_path / "small.nii"))
    hdr = bytearray((tmp_path / "small.nii").read_bytes())
    hdr[40:56] = struct.pack("<8h", 3, 1024, 1024, 4, 1, 1, 1, 1)
    hollow = tmp_path / "hollow.nii.gz"
    hollow.write_bytes(gzip.compress(bytes(hdr)))
    assert hollow.stat().st_size < 4096
    assert_refused(cli(hollow, "-o", tmp_path / "o", "--bundle", tiny_bundle), "truncated", "8,388,608 bytes")
    # a header that declares 2048 x 2048 x 64: refused by the limit before any data is read
    hdr[40:56] = struct.pack("<8h", 3, 2048, 2048, 64, 1, 1, 1, 1)
    huge = tmp_path / "huge.nii"
    huge.write_bytes(bytes(hdr))
    assert_refused(cli(huge, "-o", tmp_path / "o", "--bundle", tiny_bundle), "268,435,456 voxels", "limit")
    assert not (tmp_path / "o").exists()


def test_broken_or_incomplete_dicom_series_are_refused(tmp_path, synthetic_volume, tiny_bundle):
    vol, _ = synthetic_volume
    broken = tmp_path / "broken"
    files = write_dicom_series(broken, vol)
    data = files[2].read_bytes()
    files[2].write_bytes(data[: len(data) // 2])
    assert_refused(cli(broken, "-o", tmp_path / "o", "--bundle", tiny_bundle), files[2].name)
    gap = tmp_path / "gap"
    write_dicom_series(gap, vol, skip={(1, 0)})
    assert_refused(cli(gap, "-o", tmp_path / "o", "--bundle", tiny_bundle), "uneven slice spacing", "16 mm")
    assert not (tmp_path / "o").exists()


def test_cine_dicom_series_reads_the_phase_named_by_frame(tmp_path, synthetic_volume, tiny_bundle):
    vol, _ = synthetic_volume
    cine = tmp_path / "cine"
    write_dicom_series(cine, vol, phases=3)
    assert_refused(cli(cine, "-o", tmp_path / "o", "--bundle", tiny_bundle), "cine", "3 phases", "--frame")
    from cardseg.io.volume import read_volume

    one = read_volume(cine, frame=1)
    assert one.shape == vol.shape
    assert np.allclose(one.spacing, vol.spacing, atol=1e-3)
    assert np.allclose(one.array, np.round(vol.array).astype(np.int16) + 100, atol=1)  # phase 1 = +100
    missing = tmp_path / "cine-missing"
    write_dicom_series(missing, vol, phases=3, skip={(2, 1)})
    assert_refused(cli(missing, "-o", tmp_path / "o", "--frame", "0", "--bundle", tiny_bundle), "missing")


def test_a_tilted_dicom_series_keeps_its_geometry(tmp_path, synthetic_volume, tiny_bundle):
    """Short-axis series are oblique: each file's own origin must not stop the stack."""
    vol, _ = synthetic_volume
    rot = sitk.VersorTransform((0.2, 0.9, 0.3), 0.7)
    direction = tuple(np.asarray(rot.GetMatrix()).tolist())
    write_dicom_series(tmp_path / "sax", vol, direction=direction)
    code, _, err = cli(tmp_path / "sax", "-o", tmp_path / "o", "--quiet", "--bundle", tiny_bundle)
    assert code == 0, err
    seg = sitk.ReadImage(str(tmp_path / "o" / "segmentation.nii.gz"))
    assert np.allclose(seg.GetDirection(), direction, atol=1e-4)
    assert np.allclose(seg.GetSpacing(), vol.spacing, atol=1e-3)
    ref = vol.to_image()
    ref.SetDirection(direction)
    assert np.allclose(
        seg.TransformIndexToPhysicalPoint((3, 5, 2)), ref.TransformIndexToPhysicalPoint((3, 5, 2)), atol=1e-2
    )


def _nifti_with_pixdim(tmp_path, name, value):
    img = sitk.GetImageFromArray(np.random.default_rng(0).random((4, 32, 32)).astype(np.float32))
    img.SetSpacing((1.5, 1.5, 8.0))
    path = tmp_path / name
    sitk.WriteImage(img, str(path))
    hdr = bytearray(path.read_bytes())
    hdr[88:92] = struct.pack("<f", value)  # pixdim[3]
    path.write_bytes(bytes(hdr))
    return path


@pytest.mark.parametrize("value", [0.0, 1e-30, 1e30])
def test_implausible_spacings_are_refused_naming_axis_and_value(tmp_path, tiny_bundle, value):
    path = _nifti_with_pixdim(tmp_path, "s.nii", value)
    assert_refused(cli(path, "-o", tmp_path / "o", "--bundle", tiny_bundle), "pixdim[3]", "k (slice)", f"{value:g}")
    assert not (tmp_path / "o").exists()


def test_spacing_option_supplies_a_missing_spacing(tmp_path, tiny_bundle, synthetic_volume):
    vol, _ = synthetic_volume
    png = tmp_path / "slice.png"
    a = vol.array[1]
    sitk.WriteImage(sitk.GetImageFromArray((255 * (a - a.min()) / np.ptp(a)).astype(np.uint8)), str(png))
    assert_refused(cli(png, "-o", tmp_path / "o", "--bundle", tiny_bundle), "no physical pixel spacing", "--spacing")
    code, _, err = cli(png, "-o", tmp_path / "o", "--spacing", "1.4,1.4", "--quiet", "--bundle", tiny_bundle)
    assert code == 0, err
    assert sitk.ReadImage(str(tmp_path / "o" / "segmentation.nii.gz")).GetSpacing()[:2] == pytest.approx((1.4, 1.4))
    zero = _nifti_with_pixdim(tmp_path, "z.nii", 0.0)
    code, _, err = cli(zero, "-o", tmp_path / "o2", "--spacing", "1.5,1.5,8", "--quiet", "--bundle", tiny_bundle)
    assert code == 0, err
    assert_refused(cli(png, "-o", tmp_path / "o3", "--spacing", "abc", "--bundle", tiny_bundle), "--spacing")


# ----------------------------------------------------------------------------- late and ugly failures


def test_bad_output_locations_and_options_fail_before_any_work(tmp_path, scan, tiny_bundle):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert_refused(cli(scan / "scan.nii.gz", "-o", afile / "out", "--bundle", tiny_bundle), "is a file")
    assert_refused(cli(scan / "scan.nii.gz", "-o", afile, "--bundle", tiny_bundle), "not a folder")
    assert_refused(cli(scan / "scan.nii.gz", "-o", "/proc/cardseg-out", "--bundle", tiny_bundle), "not writable")
    if os.geteuid() != 0:  # root writes into read-only folders; the /proc case covers it there
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        assert_refused(cli(scan / "scan.nii.gz", "-o", ro / "out", "--bundle", tiny_bundle), "not writable")
    for opt, val in (("--threads", "-1"), ("--threads", "0"), ("--batch-size", "0"), ("--frame", "-2")):
        assert_refused(cli(scan / "scan.nii.gz", "-o", tmp_path / "o", opt, val, "--bundle", tiny_bundle), opt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "study"]


def test_help_shows_defaults_and_text_for_every_option():
    proc = subprocess.run(
        [sys.executable, "-m", "cardseg", "segment", "--help"],
        capture_output=True,
        text=True,
        env={**ENV, "COLUMNS": "200"},
    )
    text = proc.stdout
    assert proc.returncode == 0
    assert "default: 8" in text and "default: auto" in text and "default: card" in text
    assert "DICOM" in text and "CUDA" in text and "slices per network call" in text
    from cardseg.cli import build_parser

    segment = build_parser()._subparsers._group_actions[0].choices["segment"]
    for action in segment._actions:
        assert action.help, action.dest  # every option and INPUT say what they are


def test_summary_line_and_progress_never_share_a_line_with_an_error(tmp_path, scan, tiny_bundle):
    code, out, err = cli(scan / "scan.nii.gz", "-o", tmp_path / "o", "--progress", "json", "--bundle", tiny_bundle)
    assert code == 0
    assert out.count("\n") == 1 and "4 slices" in out  # the summary goes to stdout in json mode too
    assert all(json.loads(ln) for ln in err.splitlines())
    one = tmp_path / "one.nii.gz"
    img = sitk.ReadImage(str(scan / "scan.nii.gz"))[:, :, 0:1]
    sitk.WriteImage(img, str(one))
    code, out, _ = cli(one, "-o", tmp_path / "o1", "--progress", "none", "--bundle", tiny_bundle)
    assert code == 0 and "1 slice," in out


def test_an_error_while_writing_clears_the_bar_and_leaves_nothing(tmp_path, scan, tiny_bundle, capsys, monkeypatch):
    """The progress bar is closed before the error line (never a half-drawn bar in front of it),
    and a failure in the middle of writing leaves neither OUTDIR nor its temporary folder."""
    from cardseg import segment
    from cardseg.cli import main
    from cardseg.base.errors import CardsegError

    real = segment.write_one
    calls = []

    def failing(name, path, *a):
        calls.append(name)
        if len(calls) == 3:
            raise CardsegError("disk full (simulated)")
        return real(name, path, *a)

    monkeypatch.setattr(segment, "write_one", failing)
    code = main(["segment", str(scan / "scan.nii.gz"), "-o", str(tmp_path / "out"), "--bundle", str(tiny_bundle)])
    err = capsys.readouterr().err
    assert code == 2 and len(calls) >= 3  # the files are written on several threads: others may have started
    last = err.rstrip("\n").split("\n")[-1]
    screen = []  # what a terminal shows of that line: each carriage return writes over from column 0
    for part in last.split("\r"):
        screen[: len(part)] = list(part)
    assert "".join(screen).rstrip().startswith("cardseg: error:") and "disk full" in "".join(screen)
    assert "".join(screen).rstrip().endswith("(simulated)")  # no remnant of the bar after it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study"]


def test_a_result_edited_under_the_same_name_is_never_replaced(tmp_path, scan, tiny_bundle):
    out = tmp_path / "result"
    assert cli(scan / "scan.nii.gz", "-o", out, "--quiet", "--bundle", tiny_bundle)[0] == 0
    seg = out / "segmentation.seg.nrrd"
    seg.write_bytes(seg.read_bytes() + b"\n")  # corrected in Slicer and saved back under its name
    before = files_of(out)
    assert_refused(
        cli(scan / "scan.nii.gz", "-o", out, "--overwrite", "--bundle", tiny_bundle),
        "segmentation.seg.nrrd changed after cardseg wrote it",
    )
    assert files_of(out) == before


def test_an_existing_empty_folder_is_filled_in_place_and_foreign_siblings_refused(tmp_path, scan, tiny_bundle):
    out = tmp_path / "mnt"
    out.mkdir()
    inode = out.stat().st_ino  # a mount point or the shell's current folder must stay where it is
    assert cli(scan / "scan.nii.gz", "-o", out, "--quiet", "--bundle", tiny_bundle)[0] == 0
    assert out.stat().st_ino == inode and (out / "report.json").is_file()
    (tmp_path / ".other.cardseg-tmp").write_text("a user's file that happens to have this name")
    assert_refused(cli(scan / "scan.nii.gz", "-o", tmp_path / "other", "--bundle", tiny_bundle), "not made by cardseg")
    assert (tmp_path / ".other.cardseg-tmp").read_text().startswith("a user's")


def test_a_run_stopped_between_its_two_renames_gets_its_result_back(tmp_path):
    from cardseg.base.errors import CardsegError
    from cardseg.io.outdir import OutputWriter, check_output

    out = check_output(tmp_path / "result")
    with OutputWriter(out) as w:
        w.path("report.json").write_text('{"run": 1}')
        w.commit()
    os.replace(out, tmp_path / ".result.cardseg-old")  # as if killed after the first rename
    with pytest.raises(CardsegError, match="--overwrite"):
        with OutputWriter(out):
            pass
    assert (out / "report.json").read_text() == '{"run": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result"]
