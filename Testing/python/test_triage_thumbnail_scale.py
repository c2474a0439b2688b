"""Triage thumbnails: the disagreement on the bundle's validation scale, regions from regions.nii.gz."""

from __future__ import annotations

import math

import numpy as np
import pytest

sitk = pytest.importorskip("SimpleITK")

from cardseg.cohort import triage  # noqa: E402


@pytest.fixture()
def case(tmp_path):
    labels = np.zeros((3, 20, 24), np.uint8)
    labels[:, 5:15, 6:18] = 3
    labels[1, 4:16, 5:19] = 1  # slice 1 holds the most foreground: the worst slice without per-slice agreement
    dis = np.zeros(labels.shape, np.float32)
    dis[1, 6:9, 6:9] = 0.3
    ranks = np.zeros(labels.shape, np.uint16)
    ranks[1, 6:9, 6:9] = 1
    for name, arr in (("segmentation", labels), ("disagreement", dis), ("regions", ranks)):
        sitk.WriteImage(sitk.GetImageFromArray(arr), str(tmp_path / f"{name}.nii.gz"))
    return tmp_path


def captured(monkeypatch):
    seen = {}

    def fake(image, labels, disagreement, spacing_xy, colors, vmax, regions=None, scale_note=""):
        seen.update(labels=labels, vmax=vmax, regions=regions, note=scale_note)
        return b"png"

    monkeypatch.setattr(triage, "thumbnail_png", fake)
    return seen


def test_scale_from_the_bundle_and_outlines_from_regions(case, monkeypatch):
    seen = captured(monkeypatch)
    png, z = triage.case_thumbnail(case, {"input": str(case / "missing.nii.gz")}, [(0, 0, 0)] * 4, 0.127)
    assert png == b"png" and z == 1
    assert seen["vmax"] == pytest.approx(0.127) and "0.127" in seen["note"] and "validation" in seen["note"]
    assert np.array_equal(seen["regions"] > 0, np.pad(np.ones((3, 3), bool), ((6, 11), (6, 15))))


def test_report_value_is_used_and_a_bad_one_falls_back_to_ln2(case, monkeypatch):
    seen = captured(monkeypatch)
    triage.case_thumbnail(case, {"disagreement_display_max": 0.2}, [(0, 0, 0)] * 4)
    assert seen["vmax"] == pytest.approx(0.2)
    triage.case_thumbnail(case, {"disagreement_display_max": 5.0}, [(0, 0, 0)] * 4)
    assert seen["vmax"] == pytest.approx(math.log(2.0)) and "ln 2" in seen["note"]
    (case / "regions.nii.gz").unlink()
    triage.case_thumbnail(case, {}, [(0, 0, 0)] * 4)
    assert seen["regions"] is None


def test_thumbnail_draws_outlines_and_the_scale():
    pytest.importorskip("matplotlib")
    labels = np.zeros((20, 24), np.uint8)
    labels[5:15, 6:18] = 3
    dis = np.zeros(labels.shape, np.float32)
    dis[6:9, 6:9] = 0.3
    regions = (dis > 0).astype(np.uint16)
    with_all = triage.thumbnail_png(None, labels, dis, (1.5, 1.5), [(0, 0, 0)] * 4, 0.127, regions, "TAC 0-0.127")
    bare = triage.thumbnail_png(None, labels, dis, (1.5, 1.5), [(0, 0, 0)] * 4, 0.127)
    assert with_all.startswith(b"\x89PNG") and bare.startswith(b"\x89PNG") and with_all != bare
