"""A volume above the size limit is refused naming the memory a run at the limit needs, and that
figure is the measured one (``Testing/benchmarks/results/peak_memory.json``)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import SimpleITK as sitk

from cardseg.io.limits import LIMIT_MEMORY_NOTE, MAX_VOLUME_VOXELS

PEAKS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "peak_memory.json"


def test_the_note_states_the_measured_peaks():
    rows = {r["run"]: r["peak_rss_gb"] for r in json.loads(PEAKS.read_text())["rows"]}
    steady, first = (float(x) for x in re.findall(r"([\d.]+) GB", LIMIT_MEMORY_NOTE))
    assert steady == round(max(rows["torch"], rows["onnx"]), 1)
    assert first == round(rows["onnx-first-run"])


def test_a_volume_above_the_limit_is_refused_with_the_note(tmp_path):
    big = sitk.Image(1024, 1024, MAX_VOLUME_VOXELS // (1024 * 1024) + 1, sitk.sitkUInt8)
    big.SetSpacing((0.3, 0.3, 5.0))
    sitk.WriteImage(big, str(tmp_path / "big.nii.gz"))
    p = subprocess.run(
        [sys.executable, "-m", "cardseg", "segment", str(tmp_path / "big.nii.gz"), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and p.stderr.strip().endswith(f"the limit is {MAX_VOLUME_VOXELS:,d} ({LIMIT_MEMORY_NOTE})")
    assert not (tmp_path / "out").exists()
