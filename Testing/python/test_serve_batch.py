"""``cardseg serve``'s ``batch`` request: ``cardseg batch --manifest`` in the warm engine, on the
bundle it keeps loaded (real engine processes, the tiny test bundle).

The request runs the code ``cardseg batch`` runs: the same case folders, cohort table and
``subjects.csv`` as the one-shot command, the same progress lines, resume on a second request, a
failed case answered as ``cardseg batch`` exits (code 1), and a wrong request refused in one line
with the engine going on.
"""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import numpy as np
import pytest

from test_serve import CARDSEG, ENV, Serve, image


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> Path:
    """Three small phantom frames and a manifest marking ED and ES of one subject."""
    folder = tmp_path_factory.mktemp("frames")
    for i in range(3):
        subprocess.run(
            CARDSEG + ["synth", str(folder / f"f{i}.nrrd"), "--slices", "6", "--seed", str(i)],
            check=True,
            capture_output=True,
            timeout=120,
            env=ENV,
        )
    rows = ["frame-000,f0.nrrd,ED,s", "frame-001,f1.nrrd,,", "frame-002,f2.nrrd,ES,s"]
    (folder / "manifest.csv").write_text("case,path,phase,subject\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return folder


def table(path: Path, drop=("seconds", "time", "finished")) -> list:
    """A CSV's rows without its timing cells."""
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: v for k, v in row.items() if not any(d in k for d in drop)} for row in csv.DictReader(f)]


def test_a_batch_request_gives_the_one_shot_batchs_results_on_the_loaded_bundle(tmp_path, frames, tiny_bundle):
    one_shot = tmp_path / "one-shot"
    subprocess.run(
        CARDSEG
        + ["batch", "--manifest", str(frames / "manifest.csv"), "-o", str(one_shot), "--bundle", str(tiny_bundle)]
        + ["--device", "cpu", "--threads", "1", "--no-report", "--progress", "none"],
        check=True,
        capture_output=True,
        timeout=600,
        env=ENV,
    )
    engine = Serve("--bundle", str(tiny_bundle), "--device", "cpu", "--threads", "1")
    try:
        assert engine.event()["event"] == "ready"
        warm = tmp_path / "warm"
        request = {"id": 1, "op": "batch", "manifest": str(frames / "manifest.csv"), "output": str(warm)}
        result = engine.ask({**request, "report": False})
        assert result["ok"] and result["id"] == 1, result
        assert (result["cases"], result["computed"], result["failed"]) == (3, 3, 0)
        assert not result["loaded_bundle"]  # the bundle loaded at start served it
        assert {"cohort.csv", "subjects.csv"} <= set(result["files"]) and "triage.html" not in result["files"]
        stages = [p["stage"] for p in engine.progress]
        assert stages[0] == "hashing" and stages[-1] == "cases" and engine.progress[-1]["done"] == 3
        for case in ("frame-000", "frame-001", "frame-002"):
            same = image(warm / case / "segmentation.nii.gz") == image(one_shot / case / "segmentation.nii.gz")
            assert np.all(same), case
        assert table(warm / "cohort.csv") == table(one_shot / "cohort.csv")
        assert table(warm / "subjects.csv") == table(one_shot / "subjects.csv")
        # the same request again resumes: every case reused
        again = engine.ask({**request, "id": 2, "report": False})
        assert again["ok"] and (again["computed"], again["reused"]) == (0, 3)
        # a wrong request: one line, the engine goes on
        wrong = engine.ask({**request, "id": 3, "input": "x.nrrd"})
        assert not wrong["ok"] and wrong["code"] == 2 and "unknown request field 'input'" in wrong["error"]
        wrong = engine.ask({**request, "id": 4, "report": "no"})
        assert not wrong["ok"] and wrong["error"] == "'report' must be true or false, got \"no\""
        assert engine.ask({"id": 5, "op": "status"})["requests"] == 4
    finally:
        engine.close()


def test_a_batch_request_with_a_failed_case_is_answered_as_cardseg_batch_exits(tmp_path, frames, tiny_bundle):
    (tmp_path / "broken.nrrd").write_bytes(b"NRRD0004\nnot an image\n")
    manifest = tmp_path / "manifest.csv"
    rows = [f"frame-000,{frames / 'f0.nrrd'},,", f"frame-001,{tmp_path / 'broken.nrrd'},,"]
    manifest.write_text("case,path,phase,subject\n" + "\n".join(rows) + "\n", encoding="utf-8")
    engine = Serve("--bundle", str(tiny_bundle), "--device", "cpu", "--threads", "1", "--no-preload")
    try:
        assert engine.event()["event"] == "ready"
        result = engine.ask({"id": "c", "op": "batch", "manifest": str(manifest), "output": str(tmp_path / "out")})
        assert not result["ok"] and result["code"] == 1 and result["failed"] == 1 and result["loaded_bundle"]
        assert result["error"] == "1 of 2 cases failed (cohort.csv says why)"
        rows = {r["case"]: r for r in table(tmp_path / "out" / "cohort.csv")}
        assert rows["frame-000"]["status"] == "ok" and rows["frame-001"]["status"] == "error"
        assert "triage.html" in result["files"]  # report: true by default, as cardseg batch
    finally:
        engine.close()
