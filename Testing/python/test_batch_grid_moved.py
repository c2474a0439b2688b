"""`cardseg batch` with the engine's field-of-view recentring on: a case whose network grid was
moved onto the heart says so in cohort.csv (grid_moved, grid_offset_mm, from its report.json),
and the summary line counts such cases."""

from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg import segment
from cardseg.cohort.cases import Case
from cardseg.cohort.layout import COHORT_CSV, COHORT_PARQUET
from cardseg.cohort.tables import cohort_row, grid_cells
from conftest import read_csv


def test_the_cells_come_from_the_reports_field_of_view():
    moved = {"field_of_view": {"recentred": True, "offset_mm": [6.0, -8.0], "tried": None}}
    assert grid_cells(moved) == {"grid_moved": True, "grid_offset_mm": 10.0}
    centred = {"field_of_view": {"recentred": False, "offset_mm": [0.0, 0.0], "tried": {"offset_mm": [3.0, 0.0]}}}
    assert grid_cells(centred) == {"grid_moved": False, "grid_offset_mm": 0.0}  # tried, not kept: not moved
    assert grid_cells({}) == {"grid_moved": None, "grid_offset_mm": None}  # a report from before recentring
    row = cohort_row(Case("a", "/x.nii.gz"), "ok", report={"method": "uc", **moved})
    assert (row["grid_moved"], row["grid_offset_mm"]) == (True, 10.0)
    failed = cohort_row(Case("b", "/y.nii.gz"), "error", "boom")
    assert (failed["grid_moved"], failed["grid_offset_mm"]) == (None, None)


def test_a_case_on_a_moved_grid_is_marked_in_the_table_and_counted(
    tmp_path, tiny_bundle, synthetic_volume, monkeypatch
):
    from cardseg.cli import main

    vol, _ = synthetic_volume
    (tmp_path / "in").mkdir()
    for i, name in enumerate(("a", "b")):
        sitk.WriteImage(
            vol.to_image(np.roll(vol.array, 3 * i, axis=2).astype(np.float32)), str(tmp_path / "in" / f"{name}.nii.gz")
        )
    monkeypatch.setenv("CARDSEG_RECENTRE", "1")
    monkeypatch.setattr(segment, "recentre_offset", lambda *a, **k: (4.0, -3.0))  # the check fires on both
    kept = iter([True, False])  # the first case keeps the moved run, the second the centred one
    monkeypatch.setattr(segment, "keep_moved", lambda centred, moved: next(kept))
    out = tmp_path / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        rc = main(
            [
                "batch",
                str(tmp_path / "in" / "a.nii.gz"),
                str(tmp_path / "in" / "b.nii.gz"),
                "-o",
                str(out),
                "--bundle",
                str(tiny_bundle),
                "--progress",
                "none",
            ]
        )
    assert rc == 0
    rows = {r["case"]: r for r in read_csv(out / COHORT_CSV)}
    fov = {c: json.loads((out / c / "report.json").read_text())["field_of_view"] for c in rows}
    assert fov["a"]["recentred"] and not fov["b"]["recentred"] and fov["b"]["tried"] is not None
    assert rows["a"]["grid_moved"] == "true"
    offset = float(rows["a"]["grid_offset_mm"])
    assert offset > 0 and offset == pytest.approx(math.hypot(*fov["a"]["offset_mm"]), abs=1e-3)
    assert rows["b"]["grid_moved"] == "false" and float(rows["b"]["grid_offset_mm"]) == 0.0
    assert "0 out of domain, 1 on a grid moved onto the heart;" in stdout.getvalue(), stdout.getvalue()
    if (out / COHORT_PARQUET).is_file():
        import pyarrow.parquet as pq

        table = pq.read_table(str(out / COHORT_PARQUET)).to_pydict()
        assert table["grid_moved"] == [True, False] and table["grid_offset_mm"][1] == 0.0
