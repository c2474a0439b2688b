"""The evaluation's statistics: the paired patient bootstrap of block NLL, the per-volume sums it
reads, and the two ROIs (disk of radius 10, the literal 10 x 10 kernel)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardseg.metrics.segmentation import roi_mask, roi_mask_square
from cardseg_train.base import stats as es


def _per_volume(values: dict, patients=("p1", "p1", "p2", "p2", "p3", "p3"), n=100) -> dict:
    """values[condition][method] = per-volume mean NLLs (one per entry of ``patients``)."""
    return {
        c: {
            m: [
                {"case": f"{p}_f{i}", "patient": p, "n": n, "nll_sum": v * n}
                for i, (p, v) in enumerate(zip(patients, vals))
            ]
            for m, vals in per.items()
        }
        for c, per in values.items()
    }


def test_volume_sums_group_a_patients_volumes():
    pv = _per_volume({"clean": {"card": [1, 2, 3, 4, 5, 6], "ts": [2] * 6}})
    patients, sums, counts = es.volume_nll_sums(pv, ["clean"], ["card", "ts"])
    assert patients == ["p1", "p2", "p3"]
    np.testing.assert_allclose(sums[0, 0], [300, 700, 1100])  # ED + ES of each patient
    np.testing.assert_allclose(counts[0], [200, 200, 200])


def test_bootstrap_pairs_methods_and_brackets_the_full_sample():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.6, size=12)
    patients = [f"p{i // 2}" for i in range(12)]
    pv = _per_volume(
        {
            "clean": {"card": list(base), "ts": list(base + 0.05)},
            "spike": {"card": list(base * 2), "ts": list(base * 2 + 0.05)},
        },
        patients,
    )
    out = es.bootstrap_block_nll(pv, ["clean", "spike"], ["card", "ts"], resamples=500)
    full_card = np.mean([base.mean(), 2 * base.mean()])
    lo, hi = out["block_nll"]["card"]
    assert lo <= full_card <= hi and lo < hi
    # card is lower by exactly 0.05 in every volume: the paired difference has no spread
    d = out["difference"]["ts"]
    assert d[0] == pytest.approx(-0.05) and d[1] == pytest.approx(-0.05)
    assert out["ratio"]["ts"][1] < 1.0 and out["patients"] == 6 and out["unit"] == "patient"


def test_bootstrap_difference_covers_zero_when_methods_trade_places():
    pv = _per_volume({"clean": {"card": [0.2, 0.2, 0.6, 0.6, 0.4, 0.4], "ts": [0.6, 0.6, 0.2, 0.2, 0.4, 0.4]}})
    out = es.bootstrap_block_nll(pv, ["clean"], ["card", "ts"], resamples=1000)
    lo, hi = out["difference"]["ts"]
    assert lo < 0 < hi


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(2, 6))
def test_bootstrap_of_one_resample_family_is_the_pooled_statistic(c, p):
    rng = np.random.default_rng(c * 10 + p)
    sums = rng.uniform(1, 10, size=(c, 2, p))
    counts = rng.uniform(5, 20, size=(c, p))
    boot = es.paired_bootstrap(sums, counts, resamples=300, seed=1)
    assert boot.shape == (300, 2)
    full = (sums.sum(axis=2) / counts.sum(axis=1)[:, None]).mean(axis=0)
    assert np.all(boot.min(axis=0) <= full + 1e-12) and np.all(full - 1e-12 <= boot.max(axis=0))


def test_square_kernel_roi_is_the_literal_10x10_and_inside_the_disk():
    fg = np.zeros((2, 40, 40), bool)
    fg[0, 20, 20] = True
    sq = roi_mask_square(fg, 10)
    ys, xs = np.nonzero(sq[0])
    assert sq[0].sum() == 100 and ys.max() - ys.min() == 9 and xs.max() - xs.min() == 9
    # as the docstring says: 10 // 2 - 1 = 4 pixels towards lower indices, 10 // 2 = 5 towards higher
    assert (ys.min(), ys.max(), xs.min(), xs.max()) == (16, 25, 16, 25)
    assert not sq[1].any()
    rng = np.random.default_rng(3)
    blob = rng.random((3, 48, 48)) > 0.985
    assert np.all(roi_mask_square(blob, 10) <= roi_mask(blob, 10))  # a subset of the disk of radius 10
    assert np.all(roi_mask_square(blob, 10) >= blob)


def test_calibration_table_square_roi_and_per_volume_sums(tmp_path):
    from cardseg.method.calibration import calibrator_from_dict
    from cardseg_train.calibration import harness as ce

    names = ["bg", "RV", "MYO", "LV"]
    rng = np.random.default_rng(5)
    results = []
    for i in range(4):
        lab = np.zeros((2, 40, 40), np.int64)
        lab[:, 12:26, 14:28] = rng.integers(1, 4, size=(2, 14, 14))
        logits = rng.normal(size=(2, 4, 40, 40)).astype(np.float32) + 3 * np.eye(4)[lab].transpose(0, 3, 1, 2)
        tac = rng.uniform(0, 0.3, size=(2, 40, 40)).astype(np.float32)
        results.append(
            ce.summarize_case(f"p{i // 2}_f{i}", f"p{i // 2}", "clean", ce.CaseMaps(logits, tac), lab, names)
        )
    cals = {
        "uc": calibrator_from_dict({"method": "uc"}),
        "ts": calibrator_from_dict({"method": "ts", "temperature": 2.0}),
    }
    disk = ce.calibration_table(results, cals, names, ["clean"])
    square = ce.calibration_table(results, cals, names, ["clean"], roi="square10")
    assert square["roi"] == "square10" and disk["roi"] == "disk10"
    assert square["pooled"]["clean"]["uc"]["n"] < disk["pooled"]["clean"]["uc"]["n"]
    for t in (disk, square):
        vols = t["per_volume"]["clean"]["ts"]
        pooled = sum(v["nll_sum"] for v in vols) / sum(v["n"] for v in vols)
        assert pooled == pytest.approx(t["pooled"]["clean"]["ts"]["nll"], rel=1e-5)
        assert t["bootstrap"]["patients"] == 2 and t["bootstrap"]["reference"] is None
    # the cached case keeps the square selector
    cache = ce.CaseCache(tmp_path, "k")
    cache.save(results[0])
    back = cache.load(results[0].case, "clean")
    np.testing.assert_array_equal(back.roi_square, results[0].roi_square)
    with pytest.raises(Exception, match="ROI"):
        results[0].roi_pixels("circle5")
