"""``python -m cardseg_train.studies.flip_steps``: the flipped copies on fewer diffusion steps against
the bundle's own, on labelled volumes (a tiny untrained bundle and the synthetic volume here)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from cardseg_train.studies import flip_steps as fss


@pytest.fixture(scope="module")
def flips_bundle(tiny_bundle, tmp_path_factory):
    path = tmp_path_factory.mktemp("fss") / "tiny-flips"
    shutil.copytree(tiny_bundle, path)
    config = json.loads((path / "bundle.json").read_text())
    config["regions"].update({"map": "tac_flips", "flag_threshold": 0.02})
    (path / "bundle.json").write_text(json.dumps(config, indent=1))
    return path


def test_the_study_compares_the_copies_steps_on_the_engine_s_own_maps(flips_bundle, synthetic_volume):
    from cardseg.bundle.loading import load_bundle
    from cardseg.review.error_map import smoothed
    from cardseg.segment import SegmentOptions, segment_volume

    vol, labels = synthetic_volume
    bundle = load_bundle(flips_bundle, device="cpu")
    item = SimpleNamespace(case="patient001_frame01", volume=vol, labels=np.asarray(labels, np.uint8))
    res = fss.run_study(bundle, [item], candidates=((49, 0), tuple(bundle.sampled_steps)), log=lambda _t: None)
    assert res["volumes"] == 1 and res["sampled_steps"] == bundle.sampled_steps
    rows = res["candidates"]
    assert list(rows) == ["49, 37, 24, 12, 0", "49, 0"]  # the bundle's own first, not twice
    assert rows["49, 0"]["network_calls_per_batch"] == 6 and rows["49, 37, 24, 12, 0"]["network_calls_per_batch"] == 15
    assert all(r["errors"] == rows["49, 0"]["errors"] and r["auroc"] is not None for r in rows.values())
    # the map of the bundle's own steps is what the engine cuts regions from (TAC + its flips, smoothed)
    engine = segment_volume(vol, bundle, SegmentOptions("card"))
    copies = segment_volume(vol, fss.with_copies_on(bundle, (49, 0)), SegmentOptions("card"))
    assert not np.allclose(engine.flips, copies.flips, atol=1e-3)
    assert np.array_equal(engine.labels, copies.labels)
    own = smoothed(engine.disagreement + engine.flips, 2.0)
    from cardseg_train.studies.reference_maps import map_quality

    assert map_quality([engine.labels], [item.labels], [own])["auroc"] == pytest.approx(
        rows["49, 37, 24, 12, 0"]["auroc"], abs=1e-6
    )
    text = fss.markdown({"bundle": "tiny", "split": "val", **res})
    assert "| 49, 0 | 6 |" in text and "| 49, 37, 24, 12, 0 | 15 |" in text
