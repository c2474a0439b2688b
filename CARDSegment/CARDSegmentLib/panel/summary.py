"""What the panel says about a run: the volume's agreement score and the out-of-domain warning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass
class Summary:
    """What the panel says about a run: a line of text and whether it is a warning."""

    text: str
    warning: bool = False
    agreement: Optional[float] = None


def agreement_summary(report: Optional[dict]) -> Summary:
    """The volume's agreement score (paper Eq. 5) in words, with the out-of-domain warning."""
    if not report:
        return Summary("No results yet.")
    if report.get("method") != "card" or report.get("agreement") is None:
        if report.get("method") == "uc":
            return Summary("Uncalibrated run: no disagreement map and no agreement score.")
        return Summary("No agreement score (no foreground was segmented).", warning=True)
    agr = float(report["agreement"])
    per_slice = [v for v in (report.get("agreement_per_slice") or []) if v is not None]
    text = f"Agreement {agr:.3f}"
    if per_slice:
        low = int(np.argmin(per_slice))
        text += f" (lowest slice {low}: {per_slice[low]:.3f})"
    regions = report.get("regions") or []
    text += f"; {len(regions)} flagged region{'s' if len(regions) != 1 else ''}"
    # which of the bundle's rules cut them (report.json's review_map: e.g. the panel's Fast review ran the TAC rule)
    text += f" (from the {report['review_map']})." if report.get("review_map") else "."
    if report.get("out_of_domain"):
        text = (
            "Warning: the agreement score is below the bundle's out-of-domain threshold; this image may "
            "be unlike the training data, so check the whole segmentation. " + text
        )
        return Summary(text, warning=True, agreement=agr)
    return Summary(text, agreement=agr)
