"""The README's main-job command, ``bash Testing/run-demo.sh``: on a copy of the checkout with no
environment yet it makes one and segments the phantom, and it can be run again; it leaves a
``demo.nii.gz`` that is not its phantom alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "Testing" / "run-demo.sh"


def _checkout_copy(dest: Path) -> Path:
    """The files a fresh clone holds (tracked, and new files git does not ignore), copied to ``dest``."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        src = REPO / os.fsdecode(raw)
        if src.is_file() and not src.is_symlink():
            target = dest / os.fsdecode(raw)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def _run(root: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(
        ["bash", str(root / "Testing" / "run-demo.sh"), "--progress", "none", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _linked_env(tmp_path: Path) -> Path:
    """A folder laid out like the checkout whose .venv is this checkout's (nothing to install)."""
    if not (REPO / ".venv" / "bin" / "cardseg").exists():
        pytest.skip("no .venv with cardseg in this checkout")
    (tmp_path / "Testing").mkdir()
    shutil.copy2(SCRIPT, tmp_path / "Testing" / "run-demo.sh")
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    return tmp_path


def test_a_demo_file_that_is_not_the_phantom_is_left_alone(tmp_path):
    root = _linked_env(tmp_path)
    mine = root / "demo.nii.gz"
    mine.write_bytes(b"my own scan, not the phantom")
    r = _run(root)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "demo.nii.gz exists and is not the phantom" in r.stderr
    assert mine.read_bytes() == b"my own scan, not the phantom"
    assert not (root / "demo-out").exists()


@pytest.mark.slow
def test_the_main_job_runs_on_a_fresh_copy_twice(tmp_path):
    """No .venv at first: the script makes it (the runtime packages under constraints.txt, pip's
    own cache reused), writes the phantom and segments it; the second run refreshes demo-out."""
    root = _checkout_copy(tmp_path / "clone")
    assert not (root / ".venv").exists()
    first = _run(root)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "making .venv" in first.stdout
    report = json.loads((root / "demo-out" / "report.json").read_text(encoding="utf-8"))
    assert all(v > 0 for v in report["class_volumes_ml"].values())
    assert report["out_of_domain"] is False
    stamp = json.loads((root / "demo-out" / ".cardseg-output.json").read_text(encoding="utf-8"))
    second = _run(root)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "making .venv" not in second.stdout
    again = json.loads((root / "demo-out" / "report.json").read_text(encoding="utf-8"))
    assert again["class_volumes_ml"] == report["class_volumes_ml"]
    restamped = json.loads((root / "demo-out" / ".cardseg-output.json").read_text(encoding="utf-8"))
    assert set(restamped["files"]) == set(stamp["files"])  # the same files, written again
    # the environment holds the runtime packages only: no test tools
    check = subprocess.run([str(root / ".venv" / "bin" / "python"), "-c", "import pytest"], capture_output=True)
    assert check.returncode != 0
