"""report.json writes its measures to what they mean: class volumes to 0.1 ml, a region's volume to
0.1 mm³ and its ``p_error`` to 3 decimals, ranked before rounding."""

from __future__ import annotations

import math

from cardseg.report import PROBABILITY_DECIMALS, VOLUME_MM3_DECIMALS


def _decimals(x: float) -> int:
    text = repr(float(x))
    return 0 if "." not in text or "e" in text else len(text.split(".")[1].rstrip("0"))


def test_the_report_rounds_volumes_and_probabilities():
    """The shipped bundle (a fitted p_error) on the phantom, which it flags."""
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.phantom import synthetic_cine_volume
    from cardseg.segment import SegmentOptions, segment_volume

    vol, _ = synthetic_cine_volume(shape=(6, 160, 160), seed=0)
    bundle = load_bundle(None, device="cpu")
    res = segment_volume(vol, bundle, SegmentOptions("card"))
    report = res.report
    voxel_ml = math.prod(vol.spacing) / 1000.0
    for i, name in enumerate(c["name"] for c in bundle.config["classes"]):
        if i:
            exact = float((res.labels == i).sum() * voxel_ml)
            assert (
                report["class_volumes_ml"][name] == round(exact, 1) and _decimals(report["class_volumes_ml"][name]) <= 1
            )
    assert report["regions"], "the shipped bundle flags regions on the phantom"
    for r in report["regions"]:
        assert _decimals(r["volume_mm3"]) <= VOLUME_MM3_DECIMALS
        assert 0.0 <= r["p_error"] <= 1.0 and _decimals(r["p_error"]) <= PROBABILITY_DECIMALS
