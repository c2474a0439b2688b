"""The beating cine phantom (``cardseg.bundle.beating``, ``cardseg synth --frames``): its labels
follow the stated volume curves, end-diastole and end-systole are where it says, the wall
measured on its labels is the stated one, the static phantom is unchanged, and the 4-D NIfTI
keeps its time axis. One slow test runs the shipped model on a short cine."""

from __future__ import annotations

import json

import numpy as np
import pytest
import SimpleITK as sitk
from scipy import ndimage

from cardseg.base.errors import CardsegError
from cardseg.bundle.beating import BeatOptions, beating_cine, contraction, es_frame_of
from cardseg.bundle.phantom import HeartShape, synthetic_cine_labels, synthetic_cine_volume
from cardseg.cine.wall import thickening, wall_thickness
from cardseg.cli import main

RV, MYO, LV = 1, 2, 3


@pytest.fixture(scope="module")
def cine():
    return beating_cine(BeatOptions(frames=10, ed_frame=2), shape=(7, 192, 176), seed=3)


def test_the_labels_follow_the_stated_curves(cine):
    t = cine.truth
    ml = float(np.prod(cine.frames[0].spacing)) / 1000.0
    for k, lab in enumerate(cine.labels):
        assert t.lv_ml[k] == pytest.approx((lab == LV).sum() * ml)
        assert t.rv_ml[k] == pytest.approx((lab == RV).sum() * ml)
    assert np.allclose(t.lv_ml, t.lv_target_ml, rtol=0.01)
    assert np.allclose(t.rv_ml, t.rv_target_ml, rtol=0.01)
    # the stated curve: ejection fractions of the options, smooth: no frame-to-frame step beyond what
    # a raised cosine over systole's 4 frames takes at its steepest (pi / 2 of the stroke per 4 frames)
    opts = BeatOptions(frames=10, ed_frame=2)
    assert 1 - t.lv_target_ml[t.es_frame] / t.lv_target_ml[t.ed_frame] == pytest.approx(opts.lv_ef)
    assert 1 - t.rv_target_ml[t.es_frame] / t.rv_target_ml[t.ed_frame] == pytest.approx(opts.rv_ef)
    steps = np.abs(np.diff(np.r_[t.lv_target_ml, t.lv_target_ml[0]]))
    assert steps.max() <= np.pi / 8 * (t.lv_target_ml[t.ed_frame] - t.lv_target_ml[t.es_frame]) + 1e-9
    # the myocardium keeps about its volume through the beat
    assert np.ptp(t.myo_ml) < 0.1 * np.mean(t.myo_ml)


def test_end_diastole_and_end_systole_are_the_stated_frames(cine):
    t = cine.truth
    assert (t.ed_frame, t.es_frame) == (2, 2 + 4)
    assert int(np.argmax(t.lv_ml)) == t.ed_frame and int(np.argmin(t.lv_ml)) == t.es_frame
    assert int(np.argmax(t.rv_ml)) == t.ed_frame and int(np.argmin(t.rv_ml)) == t.es_frame
    share = contraction(BeatOptions(frames=10, ed_frame=2))
    assert share[2] == 0 and share[6] == 1 and ((share >= 0) & (share <= 1)).all()


@pytest.mark.parametrize("frames, ed, es", [(2, 0, 1), (3, 0, 1), (20, 0, 7), (20, 15, 2), (30, 0, 10)])
def test_the_end_systolic_frame_for_any_length(frames, ed, es):
    assert es_frame_of(BeatOptions(frames=frames, ed_frame=ed)) == es


def test_the_truth_derives_output_from_the_labels(cine):
    j = cine.truth.as_json()
    sv = j["lv_ml"][2] - j["lv_ml"][6]
    assert j["lv_stroke_volume_ml"] == pytest.approx(sv)
    assert j["lv_ejection_fraction"] == pytest.approx(0.58, abs=0.01)
    assert j["heart_rate_bpm"] == pytest.approx(60000.0 / 800.0)
    assert j["interval_ms"] == pytest.approx(80.0)
    assert j["cardiac_output_l_min"] == pytest.approx(sv * 75.0 / 1000.0)
    json.dumps(j, allow_nan=False)


def test_the_wall_measured_on_the_labels_is_the_stated_one(cine):
    t = cine.truth
    spacing = cine.frames[0].spacing
    ed, es = (wall_thickness(cine.labels[k], spacing) for k in (t.ed_frame, t.es_frame))
    for w, stated in ((ed, t.wall_mm[t.ed_frame]), (es, t.wall_mm[t.es_frame])):
        seg = np.array(w.segments_mm)
        assert np.isfinite(seg).all(), w.slices
        assert np.abs(seg - stated).max() < 1.0, (stated, seg)
    assert t.wall_mm[t.ed_frame] == 8.0 and t.wall_mm[t.es_frame] == 10.5
    assert np.allclose(thickening(ed, es), 2.5 / 8.0, atol=1.0 / 8.0)


def test_the_wall_is_in_image_mm_on_a_small_field_of_view():
    """A field of view under 250 mm scales the anatomy down; the stated wall stays in image mm."""
    c = beating_cine(BeatOptions(frames=3), shape=(5, 120, 112), spacing=(1.5, 1.5, 8.0), seed=1)
    seg = np.array(wall_thickness(c.labels[0], c.frames[0].spacing).segments_mm)
    assert np.nanmax(np.abs(seg - 8.0)) < 1.0


def test_only_the_heart_and_what_hugs_it_moves(cine):
    t = cine.truth
    a, b = cine.frames[t.ed_frame].array, cine.frames[t.es_frame].array
    heart = (cine.labels[t.ed_frame] > 0) | (cine.labels[t.es_frame] > 0)
    far = ndimage.distance_transform_edt(~heart, sampling=(8.0, 1.5, 1.5)) > 100.0
    assert far.mean() > 0.2
    assert np.array_equal(a[far], b[far])
    assert not np.array_equal(a, b)
    assert cine.frames[0].spacing == (1.5, 1.5, 8.0)


@pytest.mark.parametrize("kw", [{}, {"seed": 4}, {"shape": (5, 100, 90), "spacing": (2.0, 1.7, 6.0), "seed": 11}])
def test_the_static_phantom_is_unchanged_by_a_default_heart(kw):
    vol, lab = synthetic_cine_volume(**kw)
    vol2, lab2 = synthetic_cine_volume(**kw, heart=HeartShape())
    assert np.array_equal(vol.array, vol2.array) and np.array_equal(lab, lab2)
    assert np.array_equal(synthetic_cine_labels(**kw), lab)
    assert np.array_equal(synthetic_cine_labels(**kw, heart=HeartShape(0.8, 0.7, 9.0)),
                          synthetic_cine_volume(**kw, heart=HeartShape(0.8, 0.7, 9.0))[1])  # fmt: skip


def _first_cavity_pixel(img: np.ndarray, lab: np.ndarray) -> float:
    """Median signal of the LV pixels touching the myocardium (4-neighbours), from the myocardium's
    median (0) to the median of the pool more than 4 px inside (1), over the slices."""
    values = []
    for im, la in zip(img, lab):
        lv, myo = la == LV, la == MYO
        if lv.sum() < 100:
            continue
        edge = lv & ndimage.binary_dilation(myo)
        deep = ndimage.distance_transform_edt(lv) > 4
        pool, wall = np.median(im[deep]), np.median(im[myo])
        values.append((np.median(im[edge]) - wall) / (pool - wall))
    return float(np.median(values))


def test_the_trabecular_layer_darkens_the_cavity_edge_only():
    """The layer changes the image, not the labels; only pixels near a cavity; and the LV's first
    pixel sits where ACDC's median does (0.24 of the way from myocardium to pool, quartiles
    0.17-0.35), where a flat pool puts it at about 0.75."""
    kw = {"shape": (6, 192, 176), "seed": 2}
    flat, lab = synthetic_cine_volume(**kw, heart=HeartShape(wall_mm=8.0))
    trab, lab2 = synthetic_cine_volume(**kw, heart=HeartShape(wall_mm=8.0, trabecular_mm=(2.8, 1.8)))
    assert np.array_equal(lab, lab2)
    changed = np.abs(flat.array - trab.array) > 0.01  # scanner units, fat ~1000: beyond float rounding
    near = ndimage.distance_transform_edt(~np.isin(lab, (RV, LV)), sampling=(1e3, 1.5, 1.5)) <= 4 * 1.5
    assert changed.any() and not (changed & ~near).any()
    assert _first_cavity_pixel(flat.array, lab) > 0.6
    assert 0.17 <= _first_cavity_pixel(trab.array, lab) <= 0.35


def test_the_trabecular_layer_rises_as_stated():
    """Inside a disc cavity the signal goes from the myocardium's at its boundary towards the pool's
    as 1 - exp(-d / depth), d from the pixel centre to the boundary."""
    from cardseg.bundle.phantom import _TISSUE, _trabecular_layer

    yy, xx = np.mgrid[0:81, 0:81]
    lab = np.where(np.hypot(yy - 40, xx - 40) <= 30, LV, MYO).astype(np.uint8)
    img = np.where(lab == LV, 0.8, _TISSUE["myo"]).astype(np.float32)
    out = _trabecular_layer(img, lab, (3.0, 0.0), (1.5, 1.5))
    d = (ndimage.distance_transform_edt(lab == LV) - 0.5) * 1.5
    inside = lab == LV
    expected = _TISSUE["myo"] + (0.8 - _TISSUE["myo"]) * (1 - np.exp(-d[inside] / 3.0))
    assert np.allclose(out[inside], expected, atol=1e-5)
    assert np.array_equal(out[~inside], img[~inside])


def test_the_beating_cine_draws_the_acdc_trabecular_layers(cine):
    from cardseg.bundle.beating import ACDC_TRABECULAR_MM

    assert BeatOptions().trabecular_mm == ACDC_TRABECULAR_MM
    k = cine.truth.ed_frame
    assert 0.17 <= _first_cavity_pixel(cine.frames[k].array, cine.labels[k]) <= 0.35


@pytest.mark.parametrize(
    "opts",
    [
        BeatOptions(frames=1),
        BeatOptions(ed_frame=20),
        BeatOptions(lv_ef=0.95),
        BeatOptions(wall_es_mm=40.0),
        BeatOptions(trabecular_mm=(-1.0, 0.0)),
        BeatOptions(trabecular_mm=(2.0,)),
    ],
)
def test_a_beat_that_cannot_be_drawn_is_refused(opts):
    with pytest.raises(CardsegError):
        beating_cine(opts, shape=(3, 64, 64))


def _refused(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cardseg: error: "), err
    return err[0]


def test_synth_frames_writes_a_4d_nifti_with_its_time_axis(tmp_path, capsys):
    img, lab = tmp_path / "cine.nii.gz", tmp_path / "cine_labels.nii"
    argv = ["synth", str(img), "--labels", str(lab), "--frames", "4", "--slices", "3", "--seed", "5", "--truth"]
    assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cine.nii.gz", "cine.truth.json", "cine_labels.nii"]
    back = sitk.ReadImage(str(img))
    assert back.GetDimension() == 4 and back.GetSize() == (176, 192, 3, 4)
    assert back.GetSpacing()[:3] == (1.5, 1.5, 8.0)
    assert back.GetSpacing()[3] == pytest.approx(0.2)  # seconds: 800 ms over 4 frames
    for path in (img, lab):  # the header as NIfTI readers see it: pixdim[4] in the unit of xyzt_units
        header = _nifti_header(path)
        assert header["dim"][:5] == [4, 176, 192, 3, 4]
        assert header["pixdim"][4] == pytest.approx(0.2)
        assert header["xyzt_units"] == 2 | 8  # mm, seconds
    truth = json.loads((tmp_path / "cine.truth.json").read_text())
    assert truth["image"] == "cine.nii.gz" and truth["labels"] == "cine_labels.nii" and truth["seed"] == 5
    assert truth["frames"] == 4 and truth["interval_ms"] == pytest.approx(200.0)
    labels = sitk.GetArrayFromImage(sitk.ReadImage(str(lab)))  # (T, Z, Y, X)
    ml = 1.5 * 1.5 * 8.0 / 1000.0
    assert truth["lv_ml"] == pytest.approx([(labels[k] == LV).sum() * ml for k in range(4)])
    assert (truth["ed_frame"], truth["es_frame"]) == (0, 1)
    from cardseg.io.inputs import read_image

    frame = read_image(img, frame=2)  # the engine's own reader takes one frame of it
    assert frame.GetSize() == (176, 192, 3) and frame.GetSpacing() == (1.5, 1.5, 8.0)
    assert np.array_equal(sitk.GetArrayFromImage(frame), sitk.GetArrayFromImage(back)[2])


def _nifti_header(path) -> dict:
    """dim, pixdim and xyzt_units of a NIfTI-1 file, read from its first 348 bytes."""
    import gzip

    raw = (gzip.open if str(path).endswith(".gz") else open)(path, "rb").read(348)
    assert int(np.frombuffer(raw[:4], "<i4")[0]) == 348
    return {
        "dim": [int(v) for v in np.frombuffer(raw[40:56], "<i2")],
        "pixdim": [float(v) for v in np.frombuffer(raw[76:108], "<f4")],
        "xyzt_units": raw[123],
    }


def test_nibabel_reads_the_time_axis(tmp_path):
    nib = pytest.importorskip("nibabel")
    img = tmp_path / "c.nii.gz"
    assert main(["synth", str(img), "--frames", "5", "--slices", "2"]) == 0
    header = nib.load(str(img)).header
    assert header.get_xyzt_units() == ("mm", "sec")
    assert header.get_zooms()[3] == pytest.approx(0.16)
    assert not (tmp_path / "c.truth.json").exists()


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--truth"], "--truth needs --frames"),
        (["--frames", "1"], "--frames"),
        (["--frames", "101"], "--frames"),
        (["--frames", "100", "--slices", "30"], "voxels"),
    ],
)
def test_bad_cine_options_are_refused_before_any_work(tmp_path, capsys, extra, words):
    line = _refused(capsys, ["synth", str(tmp_path / "c.nii.gz")] + extra)
    assert words in line
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name, labels", [("c.nrrd", None), ("c.nii.gz", "l.mha")])
def test_a_cine_is_written_only_as_nifti(tmp_path, capsys, name, labels):
    argv = ["synth", str(tmp_path / name), "--frames", "3"] + (["--labels", str(tmp_path / labels)] if labels else [])
    assert "NIfTI" in _refused(capsys, argv)
    assert not list(tmp_path.iterdir())


def test_an_existing_truth_file_is_kept_without_overwrite(tmp_path, capsys):
    truth = tmp_path / "c.truth.json"
    truth.write_text("mine")
    argv = ["synth", str(tmp_path / "c.nii.gz"), "--frames", "2", "--slices", "2", "--truth"]
    line = _refused(capsys, argv)
    assert str(truth) in line and "--overwrite" in line
    assert truth.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["c.truth.json"]
    assert main(argv + ["--overwrite"]) == 0
    assert json.loads(truth.read_text())["frames"] == 2


@pytest.mark.slow
def test_the_shipped_model_finds_the_beat():
    """The primary alone (``uc``) on each frame of a short cine: end-diastole and end-systole from its
    LV curve are the phantom's, and its wall thickens from one to the other in every segment. (Its
    volumes and thickness against the truth: Training/results/beating-phantom.)"""
    from cardseg.bundle.loading import load_bundle
    from cardseg.segment import SegmentOptions, segment_volume

    bundle = load_bundle()
    c = beating_cine(BeatOptions(frames=5), shape=(8, 192, 176), seed=0)
    ml = float(np.prod(c.frames[0].spacing)) / 1000.0
    results = [segment_volume(v, bundle, SegmentOptions(method="uc")).labels for v in c.frames]
    lv = [(r == LV).sum() * ml for r in results]
    assert int(np.argmax(lv)) == c.truth.ed_frame and int(np.argmin(lv)) == c.truth.es_frame
    ed, es = (wall_thickness(results[k], c.frames[0].spacing) for k in (c.truth.ed_frame, c.truth.es_frame))
    assert (np.array(thickening(ed, es)) > 0).all(), thickening(ed, es)
