"""What every on-disk cache of network outputs is keyed by, beside its own settings.

A cached trajectory (``evaluate``'s cases, ``fit-calibration``'s pool, ``fit-review``'s maps, the
index evidence) is only valid for the bundle that made it: the weights, the network grid, the
preprocessing, the diffusion schedule and its sampled steps, the averaged steps, and where the grid
was placed (the field-of-view recentring of :mod:`cardseg.io.field_of_view`, from the bundle or
``$CARDSEG_RECENTRE``). Every cache key includes :func:`maps_identity`, so that changing any of
these never reuses old arrays.
"""

from __future__ import annotations


def maps_identity(bundle) -> dict:
    """A JSON-able dict of everything of ``bundle`` (and the environment) that shapes its maps."""
    from cardseg.io.field_of_view import recentre_margin
    from cardseg.report import agreement_roi_px

    c = bundle.config
    margin = recentre_margin(c)  # the grid trial keeps the run whose networks agree more (paper Eq. 5's ROI)
    fov = None if margin is None else {"margin_mm": margin, "agreement_roi_px": agreement_roi_px(bundle)}
    identity = {
        "weights": dict(bundle.checksums),
        "grid": [c.get("input_size"), c.get("pixel_spacing_mm")],
        "preprocessing": c.get("preprocessing"),
        "diffusion": c.get("diffusion"),  # schedule and sampled steps
        "tac_steps": None if bundle.tac_steps is None else [int(t) for t in bundle.tac_steps],
        "field_of_view": fov,
    }
    from cardseg.method.flips import FLIPS, flip_copies, flip_steps

    if flip_steps(c) != bundle.sampled_steps:  # the flipped copies on steps of their own (keys of others unchanged)
        identity["flip_steps"] = flip_steps(c)
    if flip_copies(c) != FLIPS[1:]:  # fewer copies than all three
        identity["flip_copies"] = [list(f) for f in flip_copies(c)]
    return identity


def calibrated_identity(bundle) -> dict:
    """:func:`maps_identity` and the calibration that turns the maps into probabilities (its
    method, parameters and averaged steps): the key of cached calibrated outputs."""
    cal = bundle.config["calibration"]
    return {
        **maps_identity(bundle),
        "calibration": {k: cal.get(k) for k in ("method", "tau_min", "tau_max", "w_b", "w_k", "tac_steps")},
    }
