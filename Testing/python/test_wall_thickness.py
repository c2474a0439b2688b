"""Regional LV wall thickness (``cardseg.cine.wall``) on hand-made label maps: rings of a drawn
thickness, a thicker sector, the RV at a chosen angle, anisotropic pixels, the base found from
the areas, and degenerate input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.base.errors import CardsegError
from cardseg.cine.wall import LabelIds, WallThickness, segment_of, septal_midline, thickening, wall_thickness

RV, MYO, LV = 1, 2, 3


def ring_slice(shape, spacing_xy, r_in, thick, rv_deg=180.0, rv_half_deg=60.0, centre=(0.0, 0.0), extra=None):
    """One slice ``(Y, X)``: an LV cavity of radius ``r_in`` mm, a wall ``thick`` mm (plus
    ``extra = (from_deg, to_deg, mm)`` in that sector of phi = atan2(row, column)), and an RV of
    depth 15 mm on the arc ``rv_deg +- rv_half_deg`` (none when ``rv_deg`` is None)."""
    ny, nx = shape
    yy, xx = np.mgrid[0:ny, 0:nx].astype(float)
    y = (yy - (ny - 1) / 2) * spacing_xy[1] - centre[0]
    x = (xx - (nx - 1) / 2) * spacing_xy[0] - centre[1]
    d, phi = np.hypot(x, y), np.degrees(np.arctan2(y, x))
    outer = np.full(shape, r_in + thick)
    if extra is not None:
        lo, hi, mm = extra
        outer[((phi - lo) % 360) < ((hi - lo) % 360)] += mm
    lab = np.zeros(shape, np.uint8)
    lab[d <= outer] = MYO
    lab[d <= r_in] = LV
    if rv_deg is not None:
        off = (phi - rv_deg + 180) % 360 - 180
        lab[(np.abs(off) <= rv_half_deg) & (d > outer) & (d <= outer + 15)] = RV
    return lab


def ring_volume(nz=9, shape=(140, 140), spacing_xy=(1.5, 1.5), **kw):
    return np.repeat(ring_slice(shape, spacing_xy, **kw)[None], nz, axis=0)


def sp(spacing_xy):
    return (spacing_xy[0], spacing_xy[1], 8.0)


@settings(max_examples=12, deadline=None)
@given(
    thick=st.floats(4.0, 12.0),
    r_in=st.floats(12.0, 28.0),
    px=st.floats(1.0, 1.7),
    aniso=st.floats(0.65, 1.0),
    dy=st.floats(0.0, 1.0),
    dx=st.floats(0.0, 1.0),
)
def test_a_ring_of_known_thickness_measures_it_in_every_segment(thick, r_in, px, aniso, dy, dx):
    spacing_xy = (px, px * aniso)
    lab = ring_volume(spacing_xy=spacing_xy, r_in=r_in, thick=thick, centre=(dy, dx))
    w = wall_thickness(lab, sp(spacing_xy))
    seg = np.array(w.segments_mm)
    assert np.isfinite(seg).all()
    assert np.abs(seg - thick).max() < 0.5, seg
    assert w.max_mm == pytest.approx(seg.max())


def test_a_thicker_sector_thickens_only_its_segment():
    # RV on the column-0 side: segment 1 (and 7, 13) is the sector from -60 to -120 deg (towards row 0)
    lab = ring_volume(r_in=22.0, thick=7.0, extra=(240.0, 300.0, 5.0))
    seg = np.array(wall_thickness(lab, sp((1.5, 1.5))).segments_mm)
    assert seg[0] > 7.0 + 3.5 and seg[6] > 7.0 + 3.5, seg
    # apically the 90 degree segment 13 holds the 60 degree sector and thin wall on either side
    assert seg[12] > 7.0 + 1.0, seg
    others = [s for s in range(1, 17) if s not in (1, 7, 13)]
    assert np.abs(seg[np.array(others) - 1] - 7.0).max() < 0.5, seg


@pytest.mark.parametrize("rv_deg", [180.0, 130.0, 35.0, -100.0])
def test_the_rv_insertion_points_set_segment_one(rv_deg):
    """Segment 1 is the 60 degree sector that starts 60 degrees past the septal midline (towards
    increasing phi), wherever the RV sits; apically 13 covers it."""
    lab = ring_volume(r_in=20.0, thick=7.0, rv_deg=rv_deg, extra=(rv_deg + 60.0, rv_deg + 120.0, 5.0))
    seg = np.array(wall_thickness(lab, sp((1.5, 1.5))).segments_mm)
    thick = {s for s in range(1, 17) if seg[s - 1] > 8.0}
    assert thick == {1, 7, 13}, seg


def test_the_septal_midline_is_halfway_between_the_insertion_points():
    mm = (1.5, 1.5)
    lab = ring_slice((140, 140), mm, 20.0, 7.0, rv_deg=None)
    yy, xx = np.mgrid[0:140, 0:140].astype(float)
    y, x = (yy - 69.5) * 1.5, (xx - 69.5) * 1.5
    d, phi = np.hypot(x, y), np.degrees(np.arctan2(y, x))
    rv = (d > 27.0) & (d < 40.0) & (phi > 100.0) & (phi < 170.0)  # insertion points at 100 and 170 deg
    centre = np.array([69.5 * 1.5, 69.5 * 1.5])
    mid = septal_midline(lab == MYO, rv, centre, mm)
    assert math.degrees(mid) == pytest.approx(135.0, abs=4.0)
    across = (d > 27.0) & (d < 40.0) & (np.abs(phi) > 150.0)  # an arc across the +-180 deg cut
    assert abs(math.degrees(septal_midline(lab == MYO, across, centre, mm))) == pytest.approx(180.0, abs=4.0)
    assert septal_midline(lab == MYO, np.zeros_like(rv), centre, mm) is None


def test_the_standard_view_puts_segment_one_towards_row_zero():
    """RV towards column 0 (the viewer's left), anterior up: the AHA order 1 anterior, 2 anteroseptal,
    3 inferoseptal, 4 inferior, 5 inferolateral, 6 anterolateral, counterclockwise as displayed."""
    centres = {1: -90.0, 2: -150.0, 3: 150.0, 4: 90.0, 5: 30.0, 6: -30.0}
    for s, deg in centres.items():
        assert segment_of(np.radians([deg]), math.pi, "basal")[0] == s
        assert segment_of(np.radians([deg]), math.pi, "mid")[0] == s + 6
    apical = {13: -90.0, 14: 180.0, 15: 90.0, 16: 0.0}
    for s, deg in apical.items():
        assert segment_of(np.radians([deg]), math.pi, "apical")[0] == s


def test_anisotropic_pixels_use_the_spacing_in_x_y_order():
    """The same ring in mm drawn on 1.0 x 1.6 mm pixels measures as drawn; read with x and y
    swapped it does not."""
    spacing_xy = (1.0, 1.6)
    lab = ring_volume(shape=(100, 160), spacing_xy=spacing_xy, r_in=22.0, thick=8.0)
    good = np.array(wall_thickness(lab, (1.0, 1.6, 8.0)).segments_mm)
    assert np.abs(good - 8.0).max() < 0.5
    swapped = np.array(wall_thickness(lab, (1.6, 1.0, 8.0)).segments_mm)
    assert np.abs(swapped - 8.0).max() > 2.0


def cone(nz=10, flip=False):
    """A ring narrowing from slice 0 towards the last, RV only on the first 7 slices (the base first)."""
    slices = []
    for k in range(nz):
        r = 24.0 * math.sqrt(1 - (k / (nz - 1) / 1.15) ** 2)
        slices.append(ring_slice((140, 140), (1.5, 1.5), r, 8.0, rv_deg=180.0 if k < 7 else None))
    vol = np.stack(slices)
    return vol[::-1] if flip else vol


def test_thirds_run_from_the_larger_end():
    w = wall_thickness(cone(), (1.5, 1.5, 8.0))
    assert w.slices == ("basal",) * 3 + ("mid",) * 4 + ("apical",) * 3
    flipped = wall_thickness(cone(flip=True), (1.5, 1.5, 8.0))
    assert flipped.slices == w.slices[::-1]
    assert np.allclose(flipped.segments_mm, w.segments_mm, equal_nan=True)


def test_slices_without_a_ring_are_outside_the_thirds():
    vol = cone()
    vol = np.concatenate([np.zeros_like(vol[:2]), vol, np.zeros_like(vol[:1])])
    vol[2][vol[2] == LV] = MYO  # a cap of myocardium without a cavity: no ring
    w = wall_thickness(vol, (1.5, 1.5, 8.0))
    assert w.slices[:3] == ("", "", "") and w.slices[-1] == ""
    assert w.slices[3:12] == ("basal",) * 3 + ("mid",) * 3 + ("apical",) * 3


def test_apical_slices_without_rv_use_the_others_septum():
    """The RV only on basal slices, at 130 degrees: the apical thick sector still lands in 13."""
    vol = np.stack(
        [
            ring_slice((140, 140), (1.5, 1.5), 20.0, 7.0, rv_deg=130.0 if k < 3 else None, extra=(190.0, 250.0, 5.0))
            for k in range(9)
        ]
    )
    seg = np.array(wall_thickness(vol, (1.5, 1.5, 8.0)).segments_mm)
    assert {s for s in range(1, 17) if seg[s - 1] > 8.0} == {1, 7, 13}


def test_no_rv_anywhere_falls_back_to_the_standard_view_and_says_so():
    lab = ring_volume(r_in=20.0, thick=7.0, rv_deg=None, extra=(240.0, 300.0, 5.0))
    w = wall_thickness(lab, (1.5, 1.5, 8.0))
    assert {s for s in range(1, 17) if w.segments_mm[s - 1] > 8.0} == {1, 7, 13}
    assert "column 0" in w.method and "No slice shows the RV" in w.method
    assert "No slice" not in wall_thickness(ring_volume(r_in=20.0, thick=7.0), (1.5, 1.5, 8.0)).method


@pytest.mark.parametrize(
    "labels",
    [
        np.zeros((6, 40, 40), np.uint8),
        np.zeros((0, 40, 40), np.uint8),
        np.full((3, 40, 40), LV, np.uint8),  # a cavity without wall
        np.full((3, 40, 40), MYO, np.uint8),  # wall without cavity
        np.full((3, 40, 40), RV, np.int16),
    ],
)
def test_degenerate_input_gives_all_nan(labels):
    w = wall_thickness(labels, (1.5, 1.5, 8.0))
    assert isinstance(w, WallThickness)
    assert len(w.segments_mm) == 16 and np.isnan(w.segments_mm).all()
    assert math.isnan(w.max_mm)
    assert w.slices == ("",) * labels.shape[0]
    assert w.method


def test_a_ring_cut_by_the_image_border_and_a_one_pixel_cavity_do_not_crash():
    lab = ring_volume(nz=3, shape=(60, 60), r_in=20.0, thick=8.0, centre=(30.0, 30.0))
    w = wall_thickness(lab, (1.5, 1.5, 8.0))
    assert np.isfinite(w.segments_mm).any()
    tiny = np.zeros((2, 30, 30), np.uint8)
    tiny[:, 10:19, 10:19] = MYO
    tiny[:, 14, 14] = LV
    w = wall_thickness(tiny, (1.5, 1.5, 8.0))
    assert w.slices == ("basal", "apical") and np.isfinite(w.max_mm)


def test_other_label_values():
    lab = ring_volume(r_in=20.0, thick=7.0)
    remapped = np.select([lab == RV, lab == MYO, lab == LV], [7, 5, 9], 0).astype(np.uint8)
    a = wall_thickness(lab, (1.5, 1.5, 8.0))
    b = wall_thickness(remapped, (1.5, 1.5, 8.0), LabelIds(rv=7, myo=5, lv=9))
    assert a.segments_mm == b.segments_mm
    assert np.isnan(wall_thickness(remapped, (1.5, 1.5, 8.0)).segments_mm).all()


@pytest.mark.parametrize(
    "labels, spacing, words",
    [
        (np.zeros((40, 40), np.uint8), (1.5, 1.5, 8.0), "(Z, Y, X)"),
        (np.zeros((2, 40, 40), np.float32), (1.5, 1.5, 8.0), "integers"),
        (np.zeros((2, 40, 40), np.uint8), (1.5, -1.0, 8.0), "spacing"),
        (np.zeros((2, 40, 40), np.uint8), (1.5, 1.5), "spacing"),
        (np.zeros((2, 40, 40), np.uint8), (1.5, float("nan"), 8.0), "spacing"),
    ],
)
def test_bad_input_is_refused_in_one_line(labels, spacing, words):
    with pytest.raises(CardsegError) as err:
        wall_thickness(labels, spacing)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_thickening_is_relative_and_nan_where_either_phase_lacks_a_value():
    def wt(values):
        return WallThickness(tuple(values), float(np.nanmax(values)), (), "")

    ed = [8.0] * 15 + [float("nan")]
    es = [12.0] * 14 + [float("nan"), 10.0]
    out = thickening(wt(ed), wt(es))
    assert len(out) == 16
    assert out[:14] == pytest.approx([0.5] * 14)
    assert math.isnan(out[14]) and math.isnan(out[15])


def test_thickening_of_measured_phases():
    ed = wall_thickness(ring_volume(r_in=24.0, thick=8.0), (1.5, 1.5, 8.0))
    es = wall_thickness(ring_volume(r_in=16.0, thick=11.0), (1.5, 1.5, 8.0))
    assert np.allclose(thickening(ed, es), 3.0 / 8.0, atol=0.1)


def test_the_validation_study_summarises_each_segment():
    """``cardseg_train.studies.wall_thickness``: per segment the patients where both maps have it,
    those where only the truth has it, and the errors (model minus truth) over the former."""
    from cardseg_train.studies.wall_thickness import markdown, segment_errors

    nan = float("nan")
    truths = [[8.0] * 15 + [nan], [10.0] * 15 + [6.0], [9.0] * 16]
    preds = [[7.0] * 16, [11.5] * 14 + [nan, nan], [9.0] * 16]
    rows = segment_errors(truths, preds)
    assert [r["segment"] for r in rows] == list(range(1, 17))
    assert rows[0] == {
        "segment": 1,
        "n": 3,
        "truth_only": 0,
        "mae_mm": pytest.approx((1.0 + 1.5 + 0.0) / 3),
        "mean_error_mm": pytest.approx((-1.0 + 1.5 + 0.0) / 3),
        "mean_truth_mm": pytest.approx(9.0),
    }
    assert rows[14]["n"] == 2 and rows[14]["truth_only"] == 1
    assert rows[15]["n"] == 1 and rows[15]["truth_only"] == 1 and rows[15]["mae_mm"] == pytest.approx(0.0)
    assert segment_errors([], [])[3] == {
        "segment": 4, "n": 0, "truth_only": 0, "mae_mm": None, "mean_error_mm": None, "mean_truth_mm": None
    }  # fmt: skip
    acdc = {
        "volumes": 3,
        "frame": "frame01",
        "in_plane_spacing_mm": [1.5, 1.5],
        "method": "M.",
        "segments": rows,
        "max_thickness": {"n": 3, "mae_mm": 0.5, "mean_error_mm": -0.25},
        "slice_level_agreement": 0.9,
    }
    text = markdown(
        {"bundle": "b-1", "split": "val", "git": {"commit": "c0", "uncommitted_changes": False}, "acdc": acdc}
    )
    assert "| 1 | 3 | 0 | 9.00 | 0.83 | 0.17 |" in text and "| 16 | 1 | 1 |" in text
    assert "Commit c0." in text and "90.0 %" in text and "phantom" not in text
