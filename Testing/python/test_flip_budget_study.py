"""``python -m cardseg_train.studies.flip_budget``: fewer flipped copies, or fewer steps, priced
against what the review rule fitted on their maps keeps (a tiny untrained bundle and two synthetic
volumes of two patients here, so that p_error can be held out by patient)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from cardseg_train.studies import flip_budget as fb


@pytest.fixture(scope="module")
def budget_bundle(tiny_bundle, tmp_path_factory):
    path = tmp_path_factory.mktemp("fb") / "tiny-flips"
    shutil.copytree(tiny_bundle, path)
    config = json.loads((path / "bundle.json").read_text())
    config["regions"].update({"map": "tac_flips", "flag_threshold": 0.02})
    config["regions"]["fit"] = {"validation": {"cross_validated": {"median_burden_top3": 0.3}}}
    (path / "bundle.json").write_text(json.dumps(config, indent=1))
    return path


def test_each_candidate_runs_its_own_copies_and_gets_the_rule_fit_review_would_fit(budget_bundle):
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.segment import SegmentOptions, segment_volume
    from cardseg_train.review.report import choose_rule

    bundle = load_bundle(budget_bundle, device="cpu")
    items = []
    for i, seed in enumerate((0, 1)):
        vol, labels = synthetic_cine_volume(shape=(4, 96, 88), seed=seed)
        items.append(SimpleNamespace(case=f"patient00{i}_frame01", volume=vol, labels=np.asarray(labels, np.uint8)))
    small = (fb.Candidate(("both",), (49,)), fb.Candidate(fb.ALL, (49, 0)))
    maps, seconds = fb.candidate_maps(bundle, items, small, log=lambda _t: None)
    assert small[0].calls == 1 and small[1].calls == 6 and all(s > 0 for s in seconds.values())
    # the copies' map of a candidate is the engine's own with that candidate's regions block
    engine = segment_volume(items[0].volume, fb.with_candidate(bundle, small[0]), SegmentOptions("card"))
    assert np.allclose(maps[small[0].name][0].flips, engine.flips, atol=1e-6)
    assert not np.allclose(maps[small[0].name][0].flips, maps[small[1].name][0].flips, atol=1e-4)
    assert np.array_equal(maps[small[0].name][0].pred, engine.labels)

    res = fb.run_study(bundle, items, candidates=small, log=lambda _t: None)
    assert res["volumes"] == 2 and res["burdens"]["shipped_burden"] == 0.3
    for c in small:
        row = res["candidates"][c.name]
        expected = choose_rule(maps[c.name], "tac-flips", max_burden=0.3)["validation"]["cross_validated"]
        assert row["shipped_burden"]["held_out"] == expected
        assert row["primary_calls_per_batch"] == c.calls
        for key in ("budget", "shipped_burden"):
            burden = row[key]["held_out"]["median_burden_top3"]
            assert burden is None or burden <= res["burdens"][key]
    text = fb.markdown({"bundle": "tiny", "split": "val", **res})
    assert "| both on 49 | 1 |" in text and "| rows+columns+both on 49, 0 | 6 |" in text
