"""The ED/ES rule, the curve's plausibility checks, the rates and the cine headers, on hand-made
curves and small files (no network)."""

from __future__ import annotations

import gzip
import math
import shutil

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg.cine.phases import (
    FIXED,
    JUMP_SHARE,
    LARGEST,
    MIN_DEPTH_SHARE,
    RWAVE,
    RWAVE_SHARE,
    SMALLEST,
    check_curve,
    choose_phases,
)
from cardseg.cine.rates import HEART_RATE_BPM, cardiac_rates, cycle_length, frame_times_ms
from cardseg.io.cine_info import read_cine_info
from conftest import MODULE_DIR


def beat(frames: int = 20, edv: float = 150.0, esv: float = 60.0, shift: int = 0) -> dict:
    """One smooth cycle: largest at frame ``shift``, smallest half a cycle later."""
    k = np.arange(frames)
    lv = esv + (edv - esv) * 0.5 * (1 + np.cos(2 * np.pi * (k - shift) / frames))
    return dict(enumerate(lv.tolist()))


# --------------------------------------------------------------------------------------------
# the ED/ES rule
# --------------------------------------------------------------------------------------------
def test_largest_and_smallest_lv():
    lv = beat(shift=3)
    choice = choose_phases(lv)
    assert (choice.ed, choice.es) == (max(lv, key=lv.get), min(lv, key=lv.get))
    assert (choice.ed_rule, choice.es_rule) == (LARGEST, SMALLEST)


def test_ties_take_the_earlier_frame():
    choice = choose_phases({0: 50.0, 1: 90.0, 2: 90.0, 3: 40.0, 4: 40.0})
    assert (choice.ed, choice.es) == (1, 3)


def test_a_fixed_frame_is_kept_and_the_other_chosen_among_the_rest():
    lv = beat(shift=0)
    es_min = min(lv, key=lv.get)
    choice = choose_phases(lv, es=es_min)  # ES fixed where ED would have been found anyway
    assert choice.es == es_min and choice.es_rule == FIXED and choice.ed == 0
    choice = choose_phases(lv, ed=es_min)  # ED fixed on the smallest frame: ES is the smallest of the others
    assert choice.ed == es_min and choice.ed_rule == FIXED and choice.es != es_min
    others = {f: v for f, v in lv.items() if f != es_min}
    assert lv[choice.es] == min(others.values())
    both = choose_phases(lv, ed=4, es=7)
    assert (both.ed, both.es, both.ed_rule, both.es_rule) == (4, 7, FIXED, FIXED)


def test_the_r_wave_frame_is_ed_only_when_near_the_largest_volume():
    lv = beat(frames=10, shift=2)  # largest at frame 2
    near = dict(lv)
    near[0] = lv[2] * (1 - RWAVE_SHARE / 2)  # within the share
    trigger = {f: 30.0 * f for f in lv}  # frame 0 follows the R wave
    choice = choose_phases(near, trigger_ms=trigger)
    assert choice.ed == 0 and choice.ed_rule == RWAVE
    far = dict(lv)
    far[0] = lv[2] * (1 - 2 * RWAVE_SHARE)
    choice = choose_phases(far, trigger_ms=trigger)
    assert choice.ed == 2 and choice.ed_rule == LARGEST
    partial = {f: t for f, t in trigger.items() if f != 5}  # a frame without trigger time: not used
    assert choice == choose_phases(far, trigger_ms=partial)
    assert choose_phases(near, trigger_ms=None).ed == 2


def _by_hand(lv, ed, es):
    """The rule written out: ED the largest LV (earlier frame on ties), ES the smallest among the
    other frames, a fixed frame kept."""
    frames = sorted(lv)
    if ed is None:
        top = max(lv[f] for f in frames if f != es)
        ed = min(f for f in frames if f != es and lv[f] == top)
    if es is None:
        low = min(lv[f] for f in frames if f != ed)
        es = min(f for f in frames if f != ed and lv[f] == low)
    return ed, es


def test_without_trigger_times_the_rule_is_largest_and_smallest_and_the_panel_uses_it(monkeypatch):
    monkeypatch.syspath_prepend(str(MODULE_DIR))
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 12))
        lv = {int(f): float(v) for f, v in zip(rng.choice(40, n, replace=False), rng.integers(0, 5, n))}
        fixed = [None, None, *lv][int(rng.integers(0, n + 2))]
        which = rng.integers(0, 2)
        ed, es = (fixed, None) if which else (None, fixed)
        choice = choose_phases(lv, ed, es)
        assert (choice.ed, choice.es) == _by_hand(lv, ed, es)
    sequences = pytest.importorskip(
        "CARDSegmentLib.cine.sequences", reason="the Slicer module's library does not import"
    )
    lv = {0: 3.0, 1: 9.0, 2: 1.0, 3: 9.0}
    assert sequences.pick_ed_es(lv) == (choose_phases(lv).ed, choose_phases(lv).es) == (1, 2)


def test_too_short_or_broken_curves_are_refused():
    with pytest.raises(ValueError, match="at least two"):
        choose_phases({0: 10.0})
    with pytest.raises(ValueError, match="finite"):
        choose_phases({0: 10.0, 1: float("nan")})


# --------------------------------------------------------------------------------------------
# plausibility
# --------------------------------------------------------------------------------------------
def test_a_smooth_beat_is_plausible():
    lv = beat()
    choice = choose_phases(lv)
    assert check_curve(lv, choice.ed, choice.es) == (True, ())


def test_es_not_below_ed_is_flagged():
    lv = {0: 80.0, 1: 80.0, 2: 80.0}
    check = check_curve(lv, 0, 1)
    assert not check.plausible and "is not below ED" in check.reasons[0]


def test_two_deep_minima_are_flagged_a_shallow_dip_is_not():
    frames = 20
    k = np.arange(frames)
    two = 100 - 40 * 0.5 * (1 - np.cos(4 * np.pi * k / frames))  # two beats in one cine
    lv = dict(enumerate(two.tolist()))
    check = check_curve(lv, *choose_phases(lv)[:2])
    assert not check.plausible and any("2 minima" in r for r in check.reasons)
    one = np.array(list(beat(frames).values()))
    dip = one.copy()
    dip[2] -= 0.5 * MIN_DEPTH_SHARE * (one.max() - one.min())  # a small notch: not a second minimum
    lv = dict(enumerate(dip.tolist()))
    assert not any("minima" in r for r in check_curve(lv, *choose_phases(lv)[:2]).reasons)


def test_a_frame_jumping_from_both_neighbours_is_flagged():
    curve = beat(20)
    top = max(curve.values())
    spiked = dict(curve)
    spiked[12] = curve[12] + 1.5 * JUMP_SHARE * top
    check = check_curve(spiked, 0, 10)
    assert any(r.startswith("frame 12 ") for r in check.reasons)
    step = 1.5 * JUMP_SHARE * 100.0  # steep ejection and filling, one step a frame: no frame jumps
    steep = dict(enumerate([100.0, 100.0, 100.0 - step, 100.0 - 2 * step, 100.0 - 2 * step, 100.0 - step, 100.0]))
    assert not any("neighbours" in r for r in check_curve(steep, 0, 3).reasons)


# --------------------------------------------------------------------------------------------
# rates
# --------------------------------------------------------------------------------------------
def test_rates_from_the_frame_interval():
    r = cardiac_rates(70.0, frames=25, frame_ms=40.0)
    assert r.source == "frame interval" and r.note == ""
    assert math.isclose(r.heart_rate_bpm, 60000.0 / (25 * 40.0))
    assert math.isclose(r.cardiac_output_l_min, 70.0 * r.heart_rate_bpm / 1000.0)


def test_the_rr_interval_comes_before_trigger_times_and_they_before_the_interval():
    triggers = [0.0, 35.0, 70.0, 105.0]
    assert cycle_length(4, 50.0, triggers, 900.0) == (900.0, "R-R interval")
    assert cycle_length(4, 50.0, triggers, None) == (4 * 35.0 * 1.0, "trigger times")  # 4 frames x 35 ms
    assert cycle_length(4, 50.0, None, None) == (200.0, "frame interval")
    assert frame_times_ms(4, 50.0, triggers) == triggers
    assert frame_times_ms(3, 50.0) == [0.0, 50.0, 100.0]
    assert frame_times_ms(2) == [None, None]


def test_rates_are_empty_with_a_reason_without_temporal_resolution():
    r = cardiac_rates(70.0, frames=25)
    assert r.heart_rate_bpm is None and r.cardiac_output_l_min is None and "unknown" in r.note
    slow = cardiac_rates(70.0, frames=25, frame_ms=40000.0)  # seconds read as ms: far outside the range
    assert slow.heart_rate_bpm is None and f"{HEART_RATE_BPM[0]:g}-{HEART_RATE_BPM[1]:g}" in slow.note
    no_sv = cardiac_rates(float("nan"), frames=25, frame_ms=40.0)
    assert no_sv.heart_rate_bpm is not None and no_sv.cardiac_output_l_min is None and no_sv.note


# --------------------------------------------------------------------------------------------
# cine headers
# --------------------------------------------------------------------------------------------
def _nifti_4d(path, frames=3, dt=0.04):
    rng = np.random.default_rng(0)
    img = sitk.JoinSeries([sitk.GetImageFromArray(rng.random((2, 20, 20)).astype(np.float32)) for _ in range(frames)])
    img.SetSpacing((1.5, 1.5, 8.0, dt))
    sitk.WriteImage(img, str(path))
    return path


def test_nifti_frames_and_interval_follow_xyzt_units(tmp_path):
    path = _nifti_4d(tmp_path / "c.nii", frames=3, dt=0.04)
    info = read_cine_info(path)
    units = path.read_bytes()[123]
    assert info.frames == 3
    if units & 0x38 == 8:  # ITK writes seconds
        assert math.isclose(info.frame_ms, 40.0, rel_tol=1e-5)
    raw = bytearray(path.read_bytes())
    raw[123] = (raw[123] & 0x07) | 16  # the same pixdim[4] in milliseconds
    (tmp_path / "ms.nii").write_bytes(bytes(raw))
    assert math.isclose(read_cine_info(tmp_path / "ms.nii").frame_ms, 0.04, rel_tol=1e-5)
    raw[123] = raw[123] & 0x07  # no time unit: the interval is unknown
    (tmp_path / "none.nii").write_bytes(bytes(raw))
    none = read_cine_info(tmp_path / "none.nii")
    assert none.frames == 3 and none.frame_ms is None
    with open(tmp_path / "none.nii", "rb") as f, gzip.open(tmp_path / "none.nii.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    assert read_cine_info(tmp_path / "none.nii.gz") == none


def test_a_3d_image_and_junk_are_one_frame(tmp_path, phantom_file):
    assert read_cine_info(phantom_file).frames == 1
    (tmp_path / "junk.nii.gz").write_bytes(b"not an image")
    assert read_cine_info(tmp_path / "junk.nii.gz").frames == 1


def test_nrrd_time_axis_index_values_and_units(tmp_path):
    data = np.zeros((4, 2, 8, 8), dtype=np.int16)  # frames, z, y, x: the list axis fastest in the file
    header = [
        "NRRD0004",
        "type: short",
        "dimension: 4",
        "space: left-posterior-superior",
        "sizes: 4 8 8 2",
        "space directions: none (1.5,0,0) (0,1.5,0) (0,0,8)",
        "kinds: list domain domain domain",
        'labels: "time" "" "" ""',
        'units: "ms" "" "" ""',
        "endian: little",
        "encoding: raw",
        "space origin: (0,0,0)",
        "axis 0 index type:=numeric",
        "axis 0 index values:=0 33 66 99",
    ]
    path = tmp_path / "seq.nrrd"
    path.write_bytes(("\n".join(header) + "\n\n").encode() + np.moveaxis(data, 0, -1).tobytes())
    info = read_cine_info(path)
    assert info.frames == 4 and info.trigger_ms == (0.0, 33.0, 66.0, 99.0) and info.frame_ms == 33.0
    path.write_bytes(path.read_bytes().replace(b'units: "ms" "" "" ""\n', b""))
    bare = read_cine_info(path)
    assert bare.frames == 4 and bare.trigger_ms is None and bare.frame_ms is None


def write_dicom_cine(folder, vol, phases: int = 3, rr_ms: str = "810"):
    """One int16 DICOM file per slice and phase, phases 45 ms apart from 25 ms, ``NominalInterval`` ``rr_ms``."""
    img = sitk.Cast(vol.to_image(), sitk.sitkInt16)
    folder.mkdir(parents=True)
    writer = sitk.ImageFileWriter()
    writer.KeepOriginalImageUIDOn()
    n = 0
    for k in range(img.GetDepth()):
        for ph in range(phases):
            n += 1
            sl = img[:, :, k] + 20 * ph
            sl.SetMetaData("0020|000e", "1.2.826.0.1.3680043.2.1125.1.99")
            sl.SetMetaData("0020|0032", "\\".join(map(str, img.TransformIndexToPhysicalPoint((0, 0, k)))))
            sl.SetMetaData("0020|0037", "1\\0\\0\\0\\1\\0")
            sl.SetMetaData("0008|0060", "MR")  # an MR image: GDCM writes PixelSpacing (0028,0030)
            sl.SetMetaData("0020|0013", str(n))
            sl.SetMetaData("0018|1060", str(25.0 + 45.0 * ph))
            sl.SetMetaData("0018|1062", rr_ms)
            writer.SetFileName(str(folder / f"im{n:03d}.dcm"))
            writer.Execute(sl)
    return folder


def test_dicom_cine_trigger_times_and_rr_interval(tmp_path, synthetic_volume):
    folder = write_dicom_cine(tmp_path / "cine", synthetic_volume[0], phases=3)
    info = read_cine_info(folder)
    assert info.frames == 3 and info.trigger_ms == (25.0, 70.0, 115.0)
    assert info.frame_ms == 45.0 and info.rr_ms == 810.0
    r = cardiac_rates(50.0, info.frames, info.frame_ms, info.trigger_ms, info.rr_ms)
    assert r.source == "R-R interval" and math.isclose(r.heart_rate_bpm, 60000.0 / 810.0)
