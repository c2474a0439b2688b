"""What ``cardseg segment`` reports about one run (``report.json``): pure, from the arrays of a
:class:`cardseg.segment.SegmentationResult` and the bundle."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np

from cardseg.bundle.loading import Bundle
from cardseg.io.field_of_view import offset_mm
from cardseg.io.volume import Volume
from cardseg.metrics.segmentation import agreement_report
from cardseg.review.regions import flagged_regions


#: what report.json's ``review_map`` calls the map the flagged regions are cut from (``regions.map``)
REVIEW_MAP_NAMES = {
    "tac": "TAC",
    "tac_flips": "TAC + flip disagreement",
    "error_probability": "voxel error probability",
}


#: how report.json writes a flagged region's measures: its volume in mm³ to 0.1 mm³, ``p_error`` to 3
#: decimals; the ranking is computed before rounding
VOLUME_MM3_DECIMALS = 1
PROBABILITY_DECIMALS = 3


def agreement_roi_px(bundle: Bundle) -> int:
    """The radius (pixels, per slice) by which the predicted heart is dilated for the agreement score."""
    return int(bundle.config.get("agreement", {}).get("roi_dilation_px", 10))


def agreement_of(tac, labels, bundle: Bundle) -> Optional[float]:
    """The volume's agreement score (paper Eq. 5) over its predicted heart dilated by the bundle's ROI radius:
    tac and labels ``(Z, Y, X)`` numpy; ``None`` without a predicted heart."""
    return agreement_report(tac, labels, agreement_roi_px(bundle), bundle.class_names)["agreement"]


def prepared_checksums(bundle) -> dict:
    """``{role: sha256}`` of the prepared models the networks ran as (ONNX Runtime models), so a
    report names what ran as well as the bundle's weights it was made from; empty for torch."""
    nets = {"primary": bundle.primary, "reference": bundle.reference}
    return {role: net.sha256 for role, net in nets.items() if isinstance(getattr(net, "sha256", None), str)}


def build_report(
    result: Any,
    volume: Volume,
    bundle: Bundle,
    method: str,
    device,
    timings,
    grid_offset: tuple = (0.0, 0.0),
    recentring: Optional[dict] = None,
) -> dict:
    """``report.json`` of one run (the keys: the documentation's output reference) from ``result``, a
    :class:`cardseg.segment.SegmentationResult` (not imported: ``segment`` imports this module):
    volumes, agreement, flagged regions (which also fills ``result.region_ranks``), the calibration, where the network grid lay
    (``field_of_view``: its centre's offset from the slice centre, mm along i and j, whether it was
    moved onto the heart, and the moved grid's trial: :mod:`cardseg.io.field_of_view`), timings and
    the bundle. The regions' volumes and ``p_error`` are rounded as :data:`VOLUME_MM3_DECIMALS` and
    :data:`PROBABILITY_DECIMALS` say, after they are ranked."""
    names = bundle.class_names
    voxel_ml = float(np.prod(volume.spacing)) / 1000.0
    counts = np.bincount(result.labels.ravel(), minlength=len(names))
    report: Dict[str, object] = {
        "method": method,
        # label value i of segmentation.nii.gz is classes[i], and so is component i of probabilities.nii.gz
        "classes": list(names),
        "agreement": None,
        "agreement_per_slice": None,
        "agreement_per_class": None,
        "out_of_domain": None,
        "regions": [],
        "class_volumes_ml": {n: round(float(counts[i] * voxel_ml), 1) for i, n in enumerate(names) if i > 0},
        "shape_zyx": list(volume.shape),
        "spacing_xyz": [float(s) for s in volume.spacing],
        "field_of_view": {
            "recentred": any(float(o) != 0.0 for o in grid_offset),
            "offset_mm": offset_mm(grid_offset, volume.spacing[:2]),
            "tried": None
            if recentring is None
            else {
                "offset_mm": offset_mm(recentring["offset"], volume.spacing[:2]),
                "agreement_centred": recentring["agreement_centred"],
                "agreement_moved": recentring["agreement_moved"],
            },
        },
        "timings_s": timings,
        "device": str(device),
        "backend": getattr(bundle, "backend", "torch"),
        "bundle": {
            "id": bundle.ident,
            "path": str(Path(bundle.path).resolve()),
            "checksums": bundle.checksums,
            "prepared_sha256": prepared_checksums(bundle),
        },
    }
    if method == "card":
        _add_card_fields(report, result, volume, bundle)
    return report


def _add_card_fields(report: dict, result: Any, volume: Volume, bundle: Bundle) -> None:
    """A card run's part of ``report.json``: agreement, out-of-domain test, flagged regions (which
    also fills ``result.region_ranks``; their volumes and ``p_error`` rounded after ranking), the
    review map, the ranking and the calibration."""
    cfg, names = bundle.config, bundle.class_names
    report.update(agreement_report(result.disagreement, result.labels, agreement_roi_px(bundle), names))
    threshold = cfg.get("agreement", {}).get("out_of_domain_threshold")
    if threshold is not None and report["agreement"] is not None:
        report["out_of_domain"] = bool(report["agreement"] < float(threshold))
    report["regions"], result.region_ranks = flagged_regions(
        result.disagreement,
        result.labels,
        cfg["regions"],
        volume.ijk_to_lps(),
        volume.spacing,
        names,
        result.field_of_view,
        result.flips,
    )
    for region in report["regions"]:
        region["volume_mm3"] = round(region["volume_mm3"], VOLUME_MM3_DECIMALS)
        if region.get("p_error") is not None:
            region["p_error"] = round(region["p_error"], PROBABILITY_DECIMALS)
    kind = cfg["regions"].get("map", "tac")
    report["review_map"] = REVIEW_MAP_NAMES.get(kind, kind)
    # without a region model regions are ranked by the review map summed inside them ("summed_map",
    # as the bundle's rule names it; for the TAC rule that is each region's summed_disagreement)
    report["region_ranking"] = cfg["regions"].get("ranking", "p_error") if cfg["regions"].get("model") else "summed_map"
    # the disagreement the overlays show brightest: what the bundle's validation volumes reach
    report["disagreement_display_max"] = cfg["regions"].get("display_max_disagreement")
    report["calibration"] = bundle.calibrator.to_dict()
