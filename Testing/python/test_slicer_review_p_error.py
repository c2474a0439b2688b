"""The Slicer review table carries each region's p_error, in the engine's order (most likely error
first), keeps it through the export, and still reads tables saved before the column existed."""

from __future__ import annotations

import csv
import io
import math

import pytest

from conftest import slicer_core

slicer = slicer_core()


from CARDSegmentLib.outputs import review  # noqa: E402

REGIONS = [
    {
        "id": 1,
        "p_error": 0.81,
        "voxels": 40,
        "volume_mm3": 720.0,
        "mean_disagreement": 0.2,
        "max_disagreement": 0.5,
        "summed_disagreement": 8.0,
        "classes": ["MYO", "LV"],
        "centroid_lps": [1.0, 2.0, 3.0],
        "bbox_ijk": [[1, 4], [2, 6], [0, 1]],
    },
    {
        "id": 2,
        "p_error": 0.35,
        "voxels": 90,
        "volume_mm3": 1620.0,
        "mean_disagreement": 0.1,
        "max_disagreement": 0.3,
        "summed_disagreement": 9.0,
        "classes": ["RV"],
        "centroid_lps": [4.0, 5.0, 6.0],
        "bbox_ijk": [[3, 9], [2, 8], [2, 3]],
    },
]


def test_p_error_is_shown_in_rank_order_and_exported():
    scene = slicer.vtkMRMLScene()
    table = review.create_review_table(scene, REGIONS)
    rows = review.review_rows(table)
    assert [r["region"] for r in rows] == [1, 2]
    assert [r["p_error"] for r in rows] == pytest.approx([0.81, 0.35])
    assert table.GetColumnTitle("p_error") == "P(error)"
    review.set_region_status(table, 2, "rejected", "aorta, not heart")
    doc = review.review_document(table, {"regions": REGIONS})
    assert [r["p_error"] for r in doc["regions"]] == pytest.approx([0.81, 0.35])
    text = review.review_csv(table, {"regions": REGIONS})
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [float(r["p_error"]) for r in rows] == pytest.approx([0.81, 0.35])
    assert rows[1]["status"] == "rejected"


def test_regions_without_p_error_and_old_tables_read_as_unknown():
    scene = slicer.vtkMRMLScene()
    table = review.create_review_table(scene, [{**REGIONS[0], "p_error": None}])
    assert math.isnan(review.review_rows(table)[0]["p_error"])
    table.GetTable().RemoveColumnByName("p_error")  # a table saved before the column existed
    rows = review.review_rows(table)
    assert rows[0]["region"] == 1 and math.isnan(rows[0]["p_error"])
    assert review.review_document(table, None)["regions"][0]["p_error"] is None


@pytest.mark.parametrize("note", ['=HYPERLINK("http://x","y")', "+1+1", "-2", "@SUM(A1)", "\tx", "'quoted", "plain"])
def test_exported_csv_never_holds_a_formula_and_reads_back(note):
    scene = slicer.vtkMRMLScene()
    table = review.create_review_table(scene, REGIONS)
    review.set_region_status(table, 1, "accepted", note)
    rows = list(csv.DictReader(io.StringIO(review.review_csv(table, {"regions": REGIONS, "input": "=cmd|x"}))))
    for row in rows:
        for value in row.values():
            assert not value or value[0] not in "=+-@\t\r", row
    cell = rows[0]["note"]
    assert (cell[1:] if cell.startswith("'") else cell) == note  # undone by dropping the apostrophe
    assert float(rows[0]["p_error"]) == pytest.approx(0.81)  # numbers stay numbers
