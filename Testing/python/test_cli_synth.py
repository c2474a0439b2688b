"""`cardseg synth`: bad options and output paths are refused in one line, exit 2, before any work,
and an existing file is replaced only with --overwrite (a folder never)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import SimpleITK as sitk

from cardseg.cli import SYNTH_MAX_SLICES, main


def _snapshot(folder: Path) -> dict:
    """Every path under ``folder`` with the sha256 of the files (None for folders)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        out[str(p.relative_to(folder))] = None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _refused(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cardseg: error: "), err
    return lines[0]


@pytest.mark.parametrize("slices", [0, -1, -3, -(2**40), SYNTH_MAX_SLICES + 1, 10**9])
def test_slices_out_of_range_are_refused(tmp_path, capsys, slices):
    before = _snapshot(tmp_path)
    line = _refused(capsys, ["synth", str(tmp_path / "a.nii.gz"), "--slices", str(slices)])
    assert "--slices" in line
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("seed", [-1, 2**32, -(2**63)])
def test_seed_out_of_range_is_refused(tmp_path, capsys, seed):
    line = _refused(capsys, ["synth", str(tmp_path / "a.nii.gz"), "--seed", str(seed), "--slices", "1"])
    assert "--seed" in line and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "name", [".", "sub", "sub/", "x.nii.gz-folder/../sub", "a.txt", "a", "nodir/a.nii.gz", "dir.nii.gz"]
)
@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("as_labels", [False, True])
def test_output_that_is_not_a_new_image_file_is_refused(tmp_path, capsys, monkeypatch, name, overwrite, as_labels):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "keep.txt").write_text("mine")
    (tmp_path / "dir.nii.gz").mkdir()
    before = _snapshot(tmp_path)
    argv = ["synth", "ok.nii.gz", "--labels", name] if as_labels else ["synth", name]
    _refused(capsys, argv + ["--slices", "1"] + (["--overwrite"] if overwrite else []))
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("which", ["output", "labels"])
def test_existing_file_is_kept_without_overwrite_and_replaced_with_it(tmp_path, capsys, which):
    img, lab = tmp_path / "img.nii.gz", tmp_path / "lab.nii.gz"
    existing = img if which == "output" else lab
    existing.write_bytes(b"not written by cardseg")
    argv = ["synth", str(img), "--labels", str(lab), "--slices", "2"]
    line = _refused(capsys, argv)
    assert str(existing) in line and "--overwrite" in line
    assert existing.read_bytes() == b"not written by cardseg"
    assert not (img if which == "labels" else lab).exists()

    assert main(argv + ["--overwrite"]) == 0
    assert sitk.ReadImage(str(img)).GetSize() == (176, 192, 2)
    assert sitk.ReadImage(str(lab)).GetSize() == (176, 192, 2)
    assert sorted(os.listdir(tmp_path)) == ["img.nii.gz", "lab.nii.gz"]  # no temporary file left


def test_labels_equal_to_output_is_refused(tmp_path, capsys):
    out = tmp_path / "a.nii.gz"
    _refused(capsys, ["synth", str(out), "--labels", str(tmp_path / "." / "a.nii.gz"), "--slices", "1"])
    assert not out.exists()
    (tmp_path / "here").symlink_to(tmp_path)  # the same file through a linked folder
    _refused(capsys, ["synth", str(out), "--labels", str(tmp_path / "here" / "a.nii.gz"), "--slices", "1"])
    assert not out.exists()


@pytest.mark.parametrize("suffix", [".nii.gz", ".nii", ".nrrd", ".mha"])
def test_every_accepted_suffix_writes_a_readable_image(tmp_path, suffix):
    out = tmp_path / f"v{suffix}"
    assert main(["synth", str(out), "--slices", "1"]) == 0
    assert sitk.ReadImage(str(out)).GetSize() == (176, 192, 1)
    assert os.listdir(tmp_path) == [out.name]


def _limit_file_size():
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))  # bytes: the volume is about 120 KB or more


@pytest.mark.parametrize("suffix", [".nii.gz", ".nii", ".nrrd", ".mha"])
def test_a_write_cut_short_fails_and_keeps_the_old_file(tmp_path, suffix):
    import signal
    import subprocess
    import sys

    out = tmp_path / f"v{suffix}"
    out.write_bytes(b"old")
    r = subprocess.run(
        [sys.executable, "-m", "cardseg", "synth", str(out), "--overwrite"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_file_size,
    )
    assert r.returncode == 1 and r.returncode != -signal.SIGXFSZ, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"cardseg: error: {out}"), r.stderr
    assert out.read_bytes() == b"old"
    assert os.listdir(tmp_path) == [out.name]
