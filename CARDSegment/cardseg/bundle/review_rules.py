"""The flagged-region rules a bundle carries, and choosing one of them for a run (``--review-map``).

A bundle's ``regions`` block is the rule its release chose on validation; a refit keeps the rule
it replaced as ``regions.previous`` (and that one its own, and so on). Each rule is cut from one
review map (:data:`cardseg.review.regions.MAPS`): the shipped ``acdc`` bundle cuts its regions
from the TAC plus the flipped copies' disagreement (``tac_flips``), which needs three more runs
of the primary (on two diffusion steps each: about 1.1x the trajectory on a CPU); its previous
rule, cut from the TAC alone (``tac``), needs none. ``cardseg segment --review-map tac`` (and ``batch``, ``serve``, the Slicer
panel's *Fast review*) runs with that rule: the same segmentation, TAC, temperature and
probabilities, regions from the earlier rule.

Pure: no file is read here, nothing is imported from torch.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

from cardseg.base.errors import CardsegError


def review_rules(config: dict) -> Dict[str, dict]:
    """``{map name: regions block}`` of the rules ``config`` carries, newest first along the
    ``previous`` chain; where two rules share a map, the newer one. Blocks are returned as they
    are (not copied)."""
    rules: Dict[str, dict] = {}
    block = config.get("regions")
    seen = set()
    while isinstance(block, dict) and id(block) not in seen:
        seen.add(id(block))
        rules.setdefault(str(block.get("map", "tac")), block)
        block = block.get("previous")
    return rules


def choose_review_map(config: dict, name: Optional[str], label: str = "the bundle") -> dict:
    """``config`` with its ``regions`` block replaced by the newest rule on the map ``name``.

    ``name`` None or the current rule's map: ``config`` itself. Otherwise a shallow copy whose
    ``regions`` is that rule (checked against the schema: an earlier rule is not checked when the
    bundle loads), with the current block's overlay display maximum when the rule has none (the
    overlays show the same TAC whatever the rule). A map no rule uses is a one-line
    :class:`CardsegError` that names the maps there are (``label`` names the bundle)."""
    if name is None:
        return config
    rules = review_rules(config)
    if name not in rules:
        have = ", ".join(rules) or "none"
        raise CardsegError(f"{label} has no flagged-region rule on the map {name!r} (--review-map: {have})")
    current = config.get("regions") or {}
    chosen = rules[name]
    if chosen is current:
        return config
    from cardseg.bundle.schema import check_regions

    block = dict(chosen)
    if block.get("display_max_disagreement") is None and current.get("display_max_disagreement") is not None:
        block["display_max_disagreement"] = current["display_max_disagreement"]
    check_regions(block, f"{label} (its earlier rule on the map {name!r})")
    out = dict(config)
    out["regions"] = block
    return out


def with_review_map(bundle, name: Optional[str]):
    """``bundle`` (a loaded :class:`cardseg.bundle.loading.Bundle`, or the
    :class:`cardseg.bundle.folder.CheckedBundle` that loads it) with the rule on the map ``name``
    (:func:`choose_review_map`); networks and verified weights are shared, not loaded again.
    ``name`` None, or the bundle's own map: ``bundle`` itself."""
    if name is None:
        return bundle
    label = f"bundle {bundle_label(bundle.config)}"
    root = getattr(bundle, "root", None) or getattr(bundle, "path", None)
    if root is not None:
        label += f" ({root})"
    config = choose_review_map(bundle.config, name, label)
    return bundle if config is bundle.config else dataclasses.replace(bundle, config=config)


def check_review_map(path, name: Optional[str]) -> None:
    """Refuse in one line a map no rule of the bundle at ``path`` (``--bundle``'s value: see
    :func:`cardseg.bundle.folder.resolve_bundle_path`) uses, from its ``bundle.json`` alone:
    before anything is loaded (``cardseg serve`` checks a request so)."""
    if name is None:
        return
    from cardseg.bundle.folder import read_config, resolve_bundle_path

    root = resolve_bundle_path(path)
    config = read_config(root)
    choose_review_map(config, name, f"bundle {bundle_label(config)} ({root})")


def bundle_label(config: dict) -> str:
    """``name-version`` of a bundle's configuration, for messages."""
    ident = config.get("id") or {}
    return f"{ident.get('name', '?')}-{ident.get('version', '?')}"


#: the help line of ``--review-map`` (segment, batch, serve)
REVIEW_MAP_HELP = (
    "which of the bundle's flagged-region rules to run, by the map its regions are cut from "
    "(default: the bundle's own). The shipped bundle: tac_flips (TAC + the flipped copies' "
    "disagreement); tac, its earlier rule, skips the three flipped runs (a card run about 3.6x "
    "faster on a CPU) and caught fewer errors on validation; a uc run has no regions to cut and "
    "ignores it"
)
