"""Flipped copies (``cardseg.method.flips``) and the flip study (``python -m cardseg_train.studies.flip``):
flips undone exactly, the flips' disagreement, the subjects' EF errors, and one run end to end on a tiny bundle."""

import json
import math

import numpy as np
import pytest

from cardseg.method import flips
from cardseg_train.studies import flip as fs

from conftest import blob_error_maps


def test_unflip_undoes_each_flip_on_every_layout():
    rng = np.random.default_rng(0)
    vol = rng.normal(size=(3, 5, 6))
    logits = rng.normal(size=(3, 4, 5, 6))
    for flip in flips.FLIPS:
        flipped = np.flip(vol, axis=flip) if flip else vol
        assert np.array_equal(flips.unflip(flipped, flip, (0, 1, 2)), vol)
        flipped = np.flip(logits, axis=tuple(a + 1 for a in flip)) if flip else logits
        assert np.array_equal(flips.unflip(flipped, flip, (0, 2, 3)), logits)
    assert not np.array_equal(flips.unflip(vol, (2,), (0, 1, 2)), vol)


def test_flip_disagreement_is_zero_when_runs_agree_and_ln_f_at_most():
    same = np.tile(fs.softmax(np.random.default_rng(1).normal(size=(1, 2, 3, 4, 4)), axis=2), (4, 1, 1, 1, 1))
    assert np.allclose(flips.flip_disagreement(same), 0.0, atol=1e-6)
    onehot = np.zeros((2, 1, 3, 1, 1))
    onehot[0, 0, 0], onehot[1, 0, 1] = 1.0, 1.0  # two runs, each sure of another class
    assert flips.flip_disagreement(onehot)[0, 0, 0] == pytest.approx(math.log(2), abs=1e-6)
    four = np.zeros((4, 1, 4, 1, 1))
    for f in range(4):
        four[f, 0, f] = 1.0
    assert flips.flip_disagreement(four)[0, 0, 0] == pytest.approx(math.log(4), abs=1e-6)


def _heart(z=3, size=40, lv=8, rv_shift=0):
    yy, xx = np.mgrid[:size, :size]
    lab = np.zeros((z, size, size), np.uint8)
    lab[:, np.hypot(yy - 20, xx - 24) < lv + 3] = 2
    lab[:, np.hypot(yy - 20, xx - 24) < lv] = 3
    lab[:, (np.hypot(yy - 20, xx - 10 - rv_shift) < 7) & (lab[0] == 0)] = 1
    return lab


def test_subject_errors_are_value_minus_truth_and_zero_for_the_truth():
    names = ["background", "RV", "MYO", "LV"]
    ed, es = _heart(lv=10), _heart(lv=6)
    smaller = _heart(lv=5)  # the segmentation misses part of the ES LV: its LVEF comes out higher
    frames = {
        "p1_frame01": {"plain": ed, "flip mean": ed, "truth": ed},
        "p1_frame02": {"plain": es, "flip mean": smaller, "truth": es},
        "p2_frame01": {"plain": ed, "flip mean": ed, "truth": ed},
    }  # no ES: left out
    block = {"volumes": {"islands": ["LV", "RV"], "gaps": ["LV", "RV"], "gap_fraction": 0.25}}
    err = fs.subject_errors(frames, block, names, lambda case: (1.5, 1.5, 10.0))
    assert list(err["plain"]) == ["p1"] and err["plain"]["p1"] == {"LVEF": 0.0, "RVEF": 0.0}
    ed_lv, es_lv = (ed == 3).sum(), (es == 3).sum()
    want = 100 * (ed_lv - (smaller == 3).sum()) / ed_lv - 100 * (ed_lv - es_lv) / ed_lv
    assert err["flip mean"]["p1"]["LVEF"] == pytest.approx(want) and want > 0


def test_the_study_end_to_end_on_a_tiny_bundle(tiny_bundle, tmp_path):
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.segment import SegmentOptions, normalized_slices, trajectory_on_slices
    from cardseg_train.evaluation.segmentation import LabelledVolume

    bundle = load_bundle(tiny_bundle)
    cases = []
    for frame, seed in (("frame01", 2), ("frame02", 5)):
        vol, lab = synthetic_cine_volume(shape=(2, 64, 56), spacing=(2.0, 2.0, 8.0), seed=seed)
        cases.append(LabelledVolume(f"s_{frame}", "s", vol, lab))
    logits, tac = fs.flipped_runs(bundle, normalized_slices(cases[0].volume, bundle), cases[0].volume.spacing[:2])
    plain = trajectory_on_slices(
        normalized_slices(cases[0].volume, bundle), cases[0].volume.spacing[:2], bundle, SegmentOptions("card")
    )
    assert logits.shape[0] == 4 and np.allclose(logits[0], np.asarray(plain.logits), atol=1e-5)
    assert np.allclose(tac[0], np.asarray(plain.tac), atol=1e-6)
    result = fs.run_study(bundle, cases, log=lambda s: None, regions=False)
    segs = result["summary"]["segmentations"]
    assert result["volumes"] == 2 and set(segs) == {"plain", "flip mean"} and segs["plain"]["subjects"] == 1
    assert set(result["summary"]["maps"]) == set(fs.MAPS)
    text = fs.markdown({"bundle": "tiny", "split": "val", **result})
    assert "| TAC (shipped) | plain |" in text and "| flip mean |" in text
    assert fs.main(["--bundle", str(tiny_bundle), "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    json.dumps(result)  # the record is plain JSON


def test_the_region_rule_fit_finds_the_blobs_held_out():
    maps = [blob_error_maps(i, f"patient{i:03d}_frame01") for i in range(4)]
    rule = fs.region_rule(maps, (0.2,))
    assert rule["flag_grid"] == [0.2] and rule["held_out"]["covered_top3"] == 1.0
    assert rule["held_out"]["median_burden_top3"] <= 0.10 and rule["settings"]["flag_threshold"] in (0.175, 0.2, 0.225)
    text = fs.markdown(
        {
            "bundle": "b",
            "split": "val",
            "volumes": 4,
            "summary": {"segmentations": {}, "maps": {}, "regions": {"TAC (shipped)": rule}},
        }
    )
    assert "| TAC (shipped) | 0.2 | flag " in text and "| 1.000 |" in text
