"""The review frontier on validation (``cardseg_train.studies.review_frontier``): resampled burdens,
capped variants, the frontier's choice per budget, the files it writes, and its refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cardseg_train.studies import review_frontier as rf
from cardseg_train.review.fit import volume_errors, volume_regions
from conftest import blob_error_maps

#: a small variant grid: two flags, an ml cap and two share caps, both rankings
SMALL = {
    "neighbourhood_px": (10,),
    "smooth_px": (0.0,),
    "flag_threshold": (0.1, 0.2),
    "cap": (("ml", 30.0), ("share", 0.02), ("share", 0.005)),
    "ranking": ("p_error", "p_error_per_ml"),
}


def _maps():
    return [blob_error_maps(i, f"patient{i // 2:03d}_frame0{1 + i % 2}") for i in range(6)]


def test_the_resampled_burden_reads_patients_not_volumes():
    """One patient's two volumes are drawn together; the quantile moves with how the patients differ."""
    same = rf.resampled_burden(["a", "a", "b", "b"], [0.1, 0.1, 0.1, 0.1], draws=200)
    assert same == pytest.approx(0.1)
    spread = rf.resampled_burden(["a", "a", "b", "b", "c", "c"], [0.05, 0.05, 0.1, 0.1, 0.3, 0.3], draws=2000)
    median = float(np.median([0.05, 0.05, 0.1, 0.1, 0.3, 0.3]))
    assert spread > median  # the 90% quantile lies above the plain median when one patient is heavy
    assert spread == pytest.approx(0.3)  # with three patients, the heavy one is drawn twice often enough
    low = rf.resampled_burden(
        ["a", "a", "b", "b", "c", "c"], [0.05, 0.05, 0.1, 0.1, 0.3, 0.3], draws=2000, quantile=0.1
    )
    assert low == pytest.approx(0.05)
    # a patient's volumes move together: two heavy volumes of one patient weigh as one patient's draw
    assert rf.resampled_burden(["a", "b", "b", "b"], [0.0, 1.0, 1.0, 1.0], draws=2000, quantile=0.1) == 0.0


def test_a_share_cap_follows_the_volumes_heart_and_no_region_exceeds_it():
    m = blob_error_maps(0, "patient000_frame01", decoy_tac=(0.3, 0.4))
    s = {**rf.variant_settings("tac", {**SMALL, "flag_threshold": (0.1,)})[1]}
    assert s["cap"] == ["share", 0.02]
    c = rf.capped(s, m)
    heart_ml = int((m.pred > 0).sum()) * float(np.prod(m.spacing)) / 1000.0
    assert "cap" not in c and c["max_ml"] == pytest.approx(0.02 * heart_ml)
    v = volume_regions(m, volume_errors(m), c)
    assert v.sizes.max() <= int(np.floor(0.02 * int((m.pred > 0).sum())))
    ml = rf.capped({**s, "cap": ["ml", 30.0]}, m)
    assert ml["max_ml"] == 30.0


def test_the_frontier_keeps_the_most_covered_within_each_budget():
    rows = [
        {"covered_top3": 0.5, "median_burden_top3": 0.04, "resampled_burden": 0.12, "id": 1},
        {"covered_top3": 0.7, "median_burden_top3": 0.09, "resampled_burden": 0.2, "id": 2},
        {"covered_top3": 0.7, "median_burden_top3": 0.08, "resampled_burden": 0.11, "id": 3},
        {"covered_top3": 0.9, "median_burden_top3": 0.3, "resampled_burden": 0.35, "id": 4},
    ]
    f = rf.frontier(rows, "median_burden_top3", (0.03, 0.05, 0.1, 0.5))
    assert [x["variant"] and x["variant"]["id"] for x in f] == [None, 1, 3, 4]  # a tie goes to the lighter
    assert [x["covered_top3"] for x in f] == [None, 0.5, 0.7, 0.9]
    g = rf.frontier(rows, "resampled_burden", (0.1, 0.15, 0.5))
    assert [x["variant"] and x["variant"]["id"] for x in g] == [None, 3, 4]
    covered = [x["covered_top3"] or 0 for x in rf.frontier(rows, "median_burden_top3")]
    assert covered == sorted(covered)  # never less at a larger budget


def test_the_study_scores_each_variant_and_the_frontier_takes_the_lightest_that_covers():
    """Each volume: two 64-pixel errors under 100-pixel patches of strong disagreement (the
    decoys stay below every flag). Uncapped (30 ml), both regions cover their errors at
    200 / 3136 of the heart; a cap of 2% of the heart keeps 62 pixels of each patch, still over
    half of its error; a cap of 0.5% keeps 15, under half: nothing covered."""
    maps = _maps()
    t = rf.study(maps, "tac", SMALL, draws=100)
    assert len(t["variants"]) == 2 * 3 * 2 and t["patients"] == 3 and t["substantial_errors"] == 12
    by_cap = {}
    for r in t["variants"]:
        by_cap.setdefault(tuple(r["cap"]), []).append(r)
    heart = int((maps[0].pred > 0).sum())
    assert all(
        r["covered_top3"] == 1.0 and r["median_burden_top3"] == pytest.approx(200 / heart) for r in by_cap[("ml", 30.0)]
    )
    assert all(
        r["covered_top3"] == 1.0 and r["median_burden_top3"] == pytest.approx(2 * 62 / heart)
        for r in by_cap[("share", 0.02)]
    )
    assert all(r["covered_top3"] == 0.0 and r["median_burden_top3"] <= 3 * 0.005 for r in by_cap[("share", 0.005)])
    assert all(r["resampled_burden"] == pytest.approx(r["median_burden_top3"]) for r in t["variants"])  # alike volumes
    fm = {f["budget"]: f for f in t["frontier"]["median"]}
    assert fm[0.05]["covered_top3"] == 1.0 and fm[0.05]["variant"]["cap"] == ["share", 0.02]
    assert fm[0.2]["variant"]["cap"] == ["share", 0.02]  # a tie in coverage goes to the lighter variant
    w = t["within_target_burden"]
    assert w["cap=ml"] == {"covered_top3": 1.0, "median_burden_top3": pytest.approx(200 / heart)}
    assert w["cap=share"] == {"covered_top3": 1.0, "median_burden_top3": pytest.approx(2 * 62 / heart)}
    assert set(w) == {
        "neighbourhood_px=10",
        "smooth_px=0",
        "cap=ml",
        "cap=share",
        "ranking=p_error",
        "ranking=p_error_per_ml",
    }
    md = rf.markdown(t, "t")
    assert "| cap=share | 100.0% | 4.0% |" in md
    assert "| 5.0% | 100.0% | flag 0.1, smooth 0 px, neighbourhood 10 px, cap 2% of the heart, by p_error |" in md
    assert "No test patient was read" in md


def test_the_command_writes_its_three_files(tmp_path, monkeypatch):
    import dataclasses

    maps = [dataclasses.replace(m, flips=np.zeros_like(m.tac)) for m in _maps()]
    monkeypatch.setattr(rf, "VARIANTS", SMALL)
    import cardseg_train.evaluation.segmentation as ev
    import cardseg_train.review.data as rd

    monkeypatch.setattr(ev, "acdc_h5_volumes", lambda data, split: ["x"] if split == "val" else pytest.fail(split))
    monkeypatch.setattr(rd, "collect_maps", lambda *a, **k: maps)
    out = tmp_path / "f"
    assert rf.main(["--out", str(out), "--draws", "50", "--cache", ""]) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "frontier.json",
        "frontier.md",
        "frontier.png",
    ]
    rec = json.loads((out / "frontier.json").read_text())
    assert rec["map"] == "tac_flips" and len(rec["variants"]) == 12  # the shipped bundle's rule map
    assert rec["shipped_rule_held_out"]["covered_top3"] is not None
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_draws_are_refused_in_one_line(tmp_path, capsys):
    assert rf.main(["--out", str(tmp_path / "f"), "--draws", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--draws" in err
    assert not (tmp_path / "f").exists()
