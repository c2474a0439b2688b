"""ECE of a yes/no probability (a flagged region's ``p_error``) and what a perfectly calibrated one
shows on as few regions as an evaluation has (``binary_ece_consistency``), per condition and
pooled, also from results written with their bins only."""

import json

import numpy as np
import pytest

from cardseg.metrics.calibration import binary_ece, binary_ece_consistency
from cardseg_train.review.measure import pooled_reliability, regions_of, reliability
from cardseg_train.review.report import p_error_lines, write_p_error_consistency


def test_binary_ece_by_hand():
    assert binary_ece([0.05, 0.95], [0, 1]) == pytest.approx(0.05)
    # one bin [0.3, 0.4): mean p 0.35, observed 2 of 4 -> gap 0.15; bin [0.9, 1]: 0.9 vs 0
    assert binary_ece([0.3, 0.35, 0.35, 0.4 - 1e-9, 0.9], [1, 1, 0, 0, 0]) == pytest.approx(0.8 * 0.15 + 0.2 * 0.9)
    assert np.isnan(binary_ece([], []))
    with pytest.raises(ValueError, match="p has 2 values, y 1"):
        binary_ece([0.1, 0.2], [1])


def test_a_calibrated_p_is_consistent_and_its_floor_shrinks_with_more_regions():
    rng = np.random.default_rng(1)
    floors = []
    small_p = []
    for n in (55, 300, 3000):
        p = rng.uniform(0.05, 0.95, n)
        y = rng.random(n) < p  # calibrated by construction
        r = binary_ece_consistency(p, y, draws=2000, seed=2)
        floors.append(r["calibrated_median"])
        small_p.append(r["consistency_p"])
        assert r["n"] == n and r["ece"] == pytest.approx(binary_ece(p, y))
        assert r["calibrated_median"] <= r["calibrated_q90"]
    assert floors[0] > 0.08 and floors[0] > floors[1] > floors[2] and floors[2] < 0.03
    assert min(small_p) > 0.01


def test_an_overconfident_p_is_found_out_and_the_draws_are_seeded():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.7, 0.95, 300)
    y = rng.random(300) < p - 0.2  # holds errors 20 points less often than said
    r = binary_ece_consistency(p, y, seed=4)
    assert r["consistency_p"] < 0.01 and r["ece"] > r["calibrated_q90"]
    assert binary_ece_consistency(p, y, seed=4) == r
    assert np.isnan(binary_ece_consistency([], [])["calibrated_median"])


def test_bins_alone_give_back_the_ece_and_conditions_pool():
    rng = np.random.default_rng(5)
    p = np.repeat([0.15, 0.45, 0.85], 20)  # one p per bin: the bins hold everything
    y = rng.random(60) < p
    full = reliability(p, y)
    old = {k: full[k] for k in ("count", "mean_p", "observed", "ece")}  # as written before the values were kept
    q, h = regions_of(old)
    np.testing.assert_allclose(np.sort(q), np.sort(p))
    assert h.sum() == y.sum()
    again = reliability(q, h)
    assert again["ece"] == pytest.approx(full["ece"])
    assert again["calibrated_median"] == pytest.approx(full["calibrated_median"])
    pooled = pooled_reliability({"a": {"reliability": full}, "b": {"reliability": old}})
    assert sum(pooled["count"]) == 120 and pooled["ece"] == pytest.approx(full["ece"])
    assert pooled_reliability({"a": {"reliability": None}}) is None
    assert sum(pooled_reliability({"a": {"reliability": None}, "b": {"reliability": old}})["count"]) == 60


def test_the_consistency_file_and_table_from_a_written_review(tmp_path):
    rng = np.random.default_rng(6)

    def summary(shift):
        p = rng.uniform(0.05, 0.95, 80)
        rel = reliability(p, rng.random(80) < np.clip(p + shift, 0, 1))
        return {"reliability": {k: rel[k] for k in ("count", "mean_p", "observed", "ece")}}

    t = {"bundle": {"clean": summary(-0.3), "spike": summary(-0.3)}, "previous": {"clean": summary(0.0)}}
    src = tmp_path / "review.json"
    src.write_text(json.dumps(t))
    out = json.loads(write_p_error_consistency(str(src), str(tmp_path / "c.json")).read_text())
    assert out["from_bins"] is True
    assert (
        set(out["bundle"]) == {"clean", "spike", "all conditions"} and out["bundle"]["all conditions"]["regions"] == 160
    )
    assert out["bundle"]["all conditions"]["consistency_p"] < 0.01
    assert out["previous"]["clean"]["ece"] == pytest.approx(t["previous"]["clean"]["reliability"]["ece"])
    table = "\n".join(p_error_lines({"bundle": t["bundle"]}))
    assert "| all conditions | 160 |" in table and "| spike | 80 |" in table


def test_an_evaluation_keeps_its_regions_values_and_reports_them_pooled():
    """``review_tables`` with the shipped rule on hand-made volumes under two conditions: each
    condition's reliability keeps the regions' ``p_error`` and outcomes, and the report's table
    pools them."""
    from scipy import ndimage

    from cardseg.bundle.folder import BUNDLES_DIR, DEFAULT_NAME, read_config
    from cardseg_train.review.data import VolumeMaps
    from cardseg_train.review.report import markdown, review_tables

    config = read_config(BUNDLES_DIR / DEFAULT_NAME)
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[:96, :96]
    maps = []
    for i, cond in enumerate(("clean", "clean", "spike", "spike")):
        pred = np.zeros((4, 96, 96), np.uint8)
        pred[:, (yy - 48) ** 2 + (xx - 40) ** 2 < 15**2] = 2
        pred[:, (yy - 48) ** 2 + (xx - 40) ** 2 < 9**2] = 3
        pred[:, (yy - 48) ** 2 + (xx - 66) ** 2 < 10**2] = 1
        truth = pred.copy()
        truth[1:3, 30:44, 60 + i : 76 + i] = 1  # a missed piece of RV
        tac = ndimage.gaussian_filter(rng.random((4, 96, 96)).astype(np.float32), (0, 3, 3)) * 0.3
        tac[1:3, 28:46, 58:78] += 0.15
        flips = rng.uniform(0.0, 0.01, tac.shape).astype(np.float32)  # the shipped rule cuts TAC + flips
        flips[1:3, 28:46, 58:78] += 0.2
        maps.append(VolumeMaps(f"patient00{i}_frame01", cond, pred, truth, tac, (1.5, 1.5, 10.0), flips=flips))
    t = review_tables(maps, config)
    for cond in ("clean", "spike"):
        rel = t["bundle"][cond]["reliability"]
        assert rel is not None and len(rel["p"]) == len(rel["holds"]) == sum(rel["count"]) > 0
        assert "consistency_p" in rel
    pooled = pooled_reliability(t["bundle"])
    assert sum(pooled["count"]) == sum(sum(t["bundle"][c]["reliability"]["count"]) for c in ("clean", "spike"))
    text = markdown(t, "hand-made")
    assert f"| all conditions | {sum(pooled['count'])} |" in text
