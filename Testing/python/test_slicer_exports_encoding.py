"""The review exports (one volume's, a cine sequence's) are UTF-8 whatever the machine's encoding
(Windows Slicer's is cp1252), are written whole or not at all (an earlier export at that path is
never emptied), and the JSON is strict (no bare NaN)."""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import MODULE_DIR, slicer_core

slicer = slicer_core()


from CARDSegmentLib.cine import results as cine_results  # noqa: E402


from CARDSegmentLib.outputs import review  # noqa: E402
from CARDSegmentLib.outputs.nodes import OutputNodes  # noqa: E402

NOTE = "wall \u2265 5 mm, \u00e9paisseur"
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
        "p_error": None,
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
#: the indices of a cine run; RV EF's value is missing (NaN in the table node), as is its interval
INDICES = {
    "ed": 0,
    "es": 1,
    "nominal": 0.9,
    "error": "",
    "category": "LVEF 52-60%: normal",
    "straddles": False,
    "indices": [
        {"name": "LVEF", "value": 56.0, "low": 52.0, "high": 60.0},
        {"name": "RVEF", "value": float("nan"), "low": float("nan"), "high": float("inf")},
    ],
}


def volume_outputs(scene, note: str = NOTE) -> OutputNodes:
    """One volume's review table (region 1 corrected with ``note``) and its report text node."""
    table = review.create_review_table(scene, REGIONS)
    review.set_region_status(table, 1, "corrected", note)
    report = scene.AddNewNodeByClass("vtkMRMLTextNode", "report")
    report.SetText(json.dumps({"regions": REGIONS, "agreement": 0.91, "input": "Cine \u00e9t\u00e9"}))
    return OutputNodes(review=table, report=report)


def cine_scene():
    """A scene with an input volume, two frames' outputs and the sequence's indices table."""
    scene = slicer.vtkMRMLScene()
    volume = scene.AddNewNodeByClass("vtkMRMLScalarVolumeNode", "cine")
    frames = {0: volume_outputs(scene), 1: volume_outputs(scene, note="ok")}
    cine_results.make_indices_table(scene, volume, INDICES)
    return scene, volume, frames


def export(kind: str, path: Path) -> Path:
    """Export to ``path``: ``volume`` (one volume's review) or ``cine`` (a sequence's)."""
    if kind == "volume":
        return review.export_review(volume_outputs(slicer.vtkMRMLScene()), path)
    scene, volume, frames = cine_scene()
    return cine_results.export_cine_review(scene, volume, frames, path)


# -- encoding


CHILD = textwrap.dedent("""
    import json, locale, os, resource, signal, sys
    from pathlib import Path
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    import test_slicer_exports_encoding as t
    out, limit = Path(sys.argv[3]), int(sys.argv[4])
    if limit:  # a file size limit (as a full disk): a write past it fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    errors = {}
    for kind in ("volume", "cine"):
        for suffix in (".csv", ".json"):
            path = out / (kind + suffix)
            if limit:
                path.write_bytes(b"an earlier export\\n")
            try:
                t.export(kind, path)
            except OSError as exc:
                errors[path.name] = exc.errno
    print(json.dumps({"encoding": locale.getpreferredencoding(False), "errors": errors}))
""")


def run_exports(out: Path, env=None, limit: int = 0) -> dict:
    """Every export (volume and cine, CSV and JSON) into ``out`` by a separate Python (under ``env``,
    with a file size ``limit`` when not 0): the child's encoding and each export's OSError errno."""
    done = subprocess.run(
        [
            sys.executable,
            "-X",
            "utf8=0",
            "-c",
            CHILD,
            str(Path(__file__).parent),
            str(MODULE_DIR),
            str(out),
            str(limit),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_exports_are_utf8_under_a_non_utf8_locale(tmp_path):
    """Under the C locale without UTF-8 mode (as Windows' cp1252, a note's "≥" has no byte there)
    every export is written, as UTF-8."""
    env = {
        **os.environ,
        "LC_ALL": "C",
        "LANG": "C",
        "PYTHONCOERCECLOCALE": "0",
        "PYTHONUTF8": "0",
        "PYTHONIOENCODING": "utf-8",
    }
    result = run_exports(tmp_path, env)
    if result["encoding"].lower().replace("-", "") == "utf8":
        pytest.skip("this platform's C locale is UTF-8: nothing to check")
    assert result["errors"] == {}
    for kind in ("volume", "cine"):
        csv_text = (tmp_path / f"{kind}.csv").read_bytes().decode("utf-8")
        assert not csv_text.startswith("\ufeff")  # plain UTF-8, no byte-order mark
        notes = [row["note"] for row in csv.DictReader(io.StringIO(csv_text)) if row["note"]]
        assert notes[0] == NOTE
        doc = json.loads((tmp_path / f"{kind}.json").read_bytes().decode("utf-8"))
        regions = doc["regions"] if kind == "volume" else doc["frames"]["0"]["regions"]
        assert regions[0]["note"] == NOTE


# -- written whole or not at all


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX file size limit")
def test_a_failed_export_leaves_the_earlier_file_as_it_was(tmp_path):
    """A write that fails part way (here a 100-byte file size limit; a full disk alike) raises, and
    the earlier export at that path keeps its bytes; no temporary file is left beside it."""
    result = run_exports(tmp_path, limit=100)
    names = ["volume.csv", "volume.json", "cine.csv", "cine.json"]
    assert sorted(result["errors"]) == sorted(names) and set(result["errors"].values()) == {errno.EFBIG}
    for name in names:
        assert (tmp_path / name).read_bytes() == b"an earlier export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


@pytest.mark.parametrize("kind", ["volume", "cine"])
def test_an_export_replaces_the_earlier_file_and_leaves_nothing_else(tmp_path, kind):
    path = tmp_path / "review.csv"
    path.write_bytes(b"an earlier export\n")
    assert export(kind, path) == path
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    assert NOTE in [row["note"] for row in rows]
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain open() would have made it


# -- strict JSON


def strict_loads(text: str):
    """json.loads that refuses NaN and Infinity, as strict JSON readers do."""

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_the_cine_json_writes_a_missing_index_as_null_and_the_csv_as_nan(tmp_path):
    doc = strict_loads(export("cine", tmp_path / "cine.json").read_text(encoding="utf-8"))
    by_name = {item["name"]: item for item in doc["indices"]["indices"]}
    assert by_name["RVEF"] == {"name": "RVEF", "value": None, "low": None, "high": None}
    assert by_name["LVEF"] == {"name": "LVEF", "value": 56.0, "low": 52.0, "high": 60.0}
    assert doc["indices"]["nominal"] == 0.9
    assert [r["p_error"] for r in doc["frames"]["0"]["regions"]] == [0.81, None]
    rows = list(csv.DictReader(io.StringIO(export("cine", tmp_path / "cine.csv").read_text(encoding="utf-8"))))
    rvef = next(row for row in rows if row["index"] == "RVEF")
    assert (rvef["value"], rvef["low"], rvef["high"]) == ("nan", "nan", "inf")  # as subjects.csv writes them


def test_the_volume_json_writes_a_non_finite_report_number_as_null(tmp_path):
    outputs = volume_outputs(slicer.vtkMRMLScene())
    report = json.loads(outputs.report.GetText())
    report["regions"][1]["volume_mm3"] = float("nan")
    report["agreement"] = float("-inf")
    outputs.report.SetText(json.dumps(report))  # a report.json holding NaN (Python's json writes it)
    doc = strict_loads(review.export_review(outputs, tmp_path / "review.json").read_text(encoding="utf-8"))
    assert doc["agreement"] is None and doc["regions"][1]["volume_mm3"] is None
    assert doc["regions"][0]["volume_mm3"] == 720.0 and doc["regions"][0]["note"] == NOTE
