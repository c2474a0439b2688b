"""``cardseg fit-calibration``: build the source-validation pool, fit CARD and the baselines,
write the fitted values into ``bundle.json`` (never the segmentation weights; the small
calibrator networks' weights go into ``bundle.json`` as plain lists)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from cardseg.bundle.folder import read_config
from cardseg.bundle.loading import load_bundle, merge_config, update_config
from cardseg.bundle.schema import validate_config
from cardseg.base.errors import CardsegError
from cardseg.base.progress import Progress
from cardseg.method.calibration import Calibrator

from cardseg_train.calibration.fit import NETWORK_METHODS, fit_calibrator, pool_nll
from cardseg_train.data.perturb import POOL_VARIANTS
from cardseg_train.calibration.pool import PoolItem, PoolOptions, build_pool, pool_thresholds, pool_with_tac_steps
from cardseg_train.base.cache_identity import maps_identity
from cardseg_train.calibration.spatial import CROP_MARGIN, crop_box, crop_nll, spatial_arrays, spatial_from_arrays
from cardseg_train.evaluation.segmentation import acdc_h5_volumes
from cardseg_train.training.config import data_name

if TYPE_CHECKING:
    import torch

#: the baselines fitted by default (UC, which has nothing to fit, is always written too)
BASELINES = ("uc", "ts", "ets", "hts")
#: every baseline ``--baselines`` can name, in the order they are fitted
ALL_BASELINES = BASELINES + NETWORK_METHODS
#: baselines that need the pool's spatial crops (and so a pool built with them)
SPATIAL_BASELINES = ("lts", "calibnet")
#: augmented primary runs per pool item for CalibNet's logit statistics
CALIBNET_AUGMENTATIONS = 4
#: extra keyword arguments of each network fitter (``cardseg_train.calibration.fit_nets``), e.g.
#: ``{"lts": {"max_epochs": 10}}`` for a quicker run; empty: the fitters' defaults
NET_FIT_OPTIONS: Dict[str, dict] = {}
#: TAC step sets ``--tac-steps auto`` chooses from (paper Sec. V ablation): every sampled step,
#: the last three (TAC-mid, [24, 12, 0] for the default sampler) and the last one (TAC-last)
TAC_STEP_SETS = ("all", "mid", "last")
#: how fit-calibration's own flag threshold is chosen (written only where fit-review fitted no rule)
FLAG_RULE = "0.99 quantile of clean source-validation TAC in the ground-truth ROI"


def regions_fitted(config: dict) -> bool:
    """Whether ``bundle.json``'s regions block holds a rule ``cardseg fit-review`` fitted (its
    ``fit`` record): fit-calibration then leaves the whole block as it is."""
    regions = config.get("regions")
    return isinstance(regions, dict) and regions.get("fit") is not None


def writable_changes(config: dict, changes: dict, root: Path) -> Tuple[dict, Dict[str, str]]:
    """The changes ``bundle.json`` accepts, checked against the schema without writing.

    A baseline the schema refuses is left out (its old entry, if any, stays as it was) so that
    it never costs the CARD fit; returns the changes kept and ``{baseline: the schema's one-line
    message}``. A refusal outside the baselines (CARD, thresholds) raises the schema's
    :class:`CardsegError`: nothing can be written then."""

    def problem(ch: dict) -> Optional[str]:
        try:
            validate_config(merge_config(config, ch), root)
        except CardsegError as e:
            return str(e)
        return None

    if problem(changes) is None:
        return changes, {}
    base = changes.get("baselines", {})
    refused = {m: msg for m, block in base.items() if (msg := problem({"baselines": {m: block}}))}
    kept = {**changes, "baselines": {m: b for m, b in base.items() if m not in refused}}
    msg = problem(kept)
    if msg:
        raise CardsegError(msg)
    return kept, refused


def tac_step_set(name: str, sampled_steps: Sequence[int]) -> Optional[List[int]]:
    """The steps of a named TAC step set (``None`` = every sampled step)."""
    steps = [int(t) for t in sampled_steps]
    if name == "all":
        return None
    if name == "mid":
        return steps[-3:]
    if name == "last":
        return steps[-1:]
    raise ValueError(f"unknown TAC step set {name!r} (choose from {', '.join(TAC_STEP_SETS)})")


def pool_settings(
    bundle, data, variants, draws: int, seed: int, max_pixels_per_item: int, spatial: Optional[dict] = None
) -> dict:
    """Every setting that shapes a calibration pool: the data, the perturbations, the sampling and
    everything of the bundle that shapes its maps (:mod:`cardseg_train.base.cache_identity`)."""
    settings = {
        "data": str(Path(data).resolve()),
        "split": "val",
        "variants": list(variants),
        "draws": draws,
        "seed": seed,
        "max_pixels_per_item": max_pixels_per_item,
        "step_js": True,
        "roi": "in view",
        "run": maps_identity(bundle),
    }
    if spatial is not None:  # the crops of the spatial baselines
        settings["spatial"] = spatial
    return settings


def pool_key(checksums: Dict[str, str], settings: dict) -> str:
    """Cache key of a pool: the bundle's weights and every setting that shapes the pool."""
    blob = json.dumps({"weights": checksums, **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def save_pool(pool: Sequence[PoolItem], path: Path) -> None:
    """One ``.npz`` with every item's arrays (its spatial crop's too) and a JSON index (no pickles)."""
    arrays, index = {}, []
    for i, it in enumerate(pool):
        arrays[f"logits_{i}"], arrays[f"labels_{i}"], arrays[f"tac_{i}"] = it.logits, it.labels, it.tac
        if it.step_js is not None:
            arrays[f"step_js_{i}"] = it.step_js
        meta = {
            "case": it.case,
            "variant": it.variant,
            "agreement": it.agreement,
            "steps": it.steps,
            "step_roi_js": it.step_roi_js,
            "patient": it.patient,
        }
        if it.spatial is not None:
            sp_arrays, meta["spatial"] = spatial_arrays(it.spatial, f"_{i}")
            arrays.update(sp_arrays)
        index.append(meta)
    arrays["index"] = np.frombuffer(json.dumps(index).encode(), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)


def load_pool(path: Path) -> List[PoolItem]:
    """The pool :func:`save_pool` wrote (a pool from before crops or patients loads without them)."""
    pool = []
    with np.load(path, allow_pickle=False) as f:
        index = json.loads(bytes(f["index"]).decode())
        for i, meta in enumerate(index):
            sp_meta = meta.pop("spatial", None)
            it = PoolItem(
                f[f"logits_{i}"],
                f[f"labels_{i}"],
                f[f"tac_{i}"],
                step_js=f[f"step_js_{i}"] if f"step_js_{i}" in f.files else None,
                **meta,
            )
            it.spatial = spatial_from_arrays(f, sp_meta, f"_{i}")
            pool.append(it)
    return pool


def parse_baselines(text: str) -> List[str]:
    """``--baselines``: comma-separated names of :data:`ALL_BASELINES` → the names in fitting order,
    UC included (it has nothing to fit)."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    bad = [n for n in names if n not in ALL_BASELINES]
    if bad:
        raise CardsegError(f"unknown baseline {', '.join(bad)} (choose from {', '.join(ALL_BASELINES[1:])})")
    return [m for m in ALL_BASELINES if m in names or m == "uc"]


def shape_label_maps(data: str, margin: int = CROP_MARGIN, roi_radius: int = 10) -> List[np.ndarray]:
    """Source label maps for CalibNet's shape prior: the training split's slices, each cut to its
    volume's ROI box (as the pool's crops), slices without foreground left out."""
    from cardseg.metrics.segmentation import roi_mask

    maps = []
    for case in acdc_h5_volumes(data, "train"):
        roi = roi_mask(case.labels > 0, roi_radius)
        if not roi.any():
            continue
        z0, z1, y0, y1, x0, x1 = crop_box(roi, margin)
        maps += [case.labels[z, y0:y1, x0:x1] for z in range(z0, z1) if case.labels[z].any()]
    return maps


@dataclass(frozen=True)
class CalibrationFitOptions:
    """What :func:`fit_bundle_calibration` fits and how (the ``cardseg fit-calibration`` flags).

    variants: the pool's perturbations; draws: how often each is drawn per volume;
    max_pixels_per_item: the most ROI pixels a pool item keeps (:class:`PoolOptions`); seed: seeds
    the pool and the network fitters; cache_dir: where pools are cached (``None``: nowhere); device
    / batch_size: where the networks run and how many slices per call; write: write the fit into
    ``bundle.json`` (``False``: a dry run, checked all the same); tac_steps: the TAC step set, one of
    :data:`TAC_STEP_SETS` or ``auto``; baselines: which of :data:`ALL_BASELINES` to fit."""

    variants: Sequence[str] = POOL_VARIANTS
    draws: int = 1
    seed: int = 0
    max_pixels_per_item: int = 30_000
    cache_dir: Optional[str] = None
    device: "torch.device | str" = "cpu"
    batch_size: int = 8
    write: bool = True
    tac_steps: str = "all"
    baselines: Sequence[str] = BASELINES


class BaselineFits(NamedTuple):
    """The fitted baselines, in fitting order: each calibrator, its NLL (over the pool's pixel
    vectors, or over every ROI pixel of the crops for :data:`SPATIAL_BASELINES`) and, for the
    network ones, how their fit went."""

    fitted: Dict[str, Calibrator]
    nll: Dict[str, float]
    net_info: Dict[str, dict]


class CardChoice(NamedTuple):
    """CARD over the TAC step set with the lowest pool NLL: ``chosen`` names that set, ``steps`` are
    its steps (``None``: every sampled step), ``calibrator`` its fit and ``pool`` the pool with its TAC
    over those steps; ``pool_nll`` and ``params``: every candidate set's pool NLL and fitted
    parameters (with its ``steps``)."""

    chosen: str
    steps: Optional[List[int]]
    calibrator: Calibrator
    pool: List[PoolItem]
    pool_nll: Dict[str, float]
    params: Dict[str, dict]


def pool_crops(methods: Sequence[str]) -> Optional[dict]:
    """The crop settings of the pool these baselines need (``None``: none of them reads crops)."""
    if not any(m in SPATIAL_BASELINES for m in methods):
        return None
    return {"margin": CROP_MARGIN, "augmentations": CALIBNET_AUGMENTATIONS if "calibnet" in methods else 0}


def fit_bundle_calibration(
    bundle_path: str,
    data: str,
    options: CalibrationFitOptions = CalibrationFitOptions(),
    progress: Optional[Progress] = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Fit CARD (and TS, ETS, HTS for the comparison) on the source-validation pool.

    Only ``val`` patients are used (never test, never corruptions). The pool is cached under
    ``options.cache_dir`` keyed by the bundle's checksums and the pool settings. Returns a summary;
    with ``options.write`` the bundle's ``bundle.json`` gets the CARD parameters, the out-of-domain
    agreement threshold, the fitted baselines and, only where ``cardseg fit-review`` fitted no regions
    rule (:func:`regions_fitted`), the region flag threshold; a fitted regions block stays exactly as
    it is. What would be written is checked against the schema with or without ``write``: a
    baseline it refuses is left out, the rest written, and then a one-line :class:`CardsegError`
    names that baseline (with ``write`` false: the same error, nothing written); a refused CARD
    block or threshold raises before anything is written.

    ``options.tac_steps``: ``all`` (the paper's TAC over every sampled step), ``mid``, ``last``, or
    ``auto``: CARD is fitted for each of the three and the set with the lowest pool NLL is kept (a
    choice made on the validation pool only); the choice goes into ``calibration.tac_steps``.

    ``options.baselines``: which of :data:`ALL_BASELINES` to fit (UC always; default UC, TS, ETS,
    HTS). PTS fits on the pixel vectors; LTS and CalibNet need the pool's spatial crops (and CalibNet
    :data:`CALIBNET_AUGMENTATIONS` augmented primary runs per item), so asking for them builds
    (and caches) a pool with crops; CalibNet's shape prior trains on the training split's label
    maps. Their NLL over every ROI pixel of the crops, beside every other fitted method's, goes
    into ``calibration.fit.pool_nll_crops``; how each network's fit went, into
    ``calibration.fit.baseline_fits``.
    """
    if options.tac_steps not in TAC_STEP_SETS + ("auto",):
        raise ValueError(f"unknown --tac-steps {options.tac_steps!r} (choose from {', '.join(TAC_STEP_SETS)}, auto)")
    methods = parse_baselines(",".join(options.baselines))
    crops = pool_crops(methods)
    bundle = load_bundle(bundle_path, device=options.device)
    pool, settings, pool_time = _cached_pool(bundle, data, crops, options, log)
    t0 = time.perf_counter()
    base = _fit_baselines(pool, methods, data, options.seed, progress, log)
    card = _fit_card(pool, bundle, options.tac_steps, log)
    nll_crops = None
    if crops is not None:  # every method on the same pixels (CARD only where the crops' TAC is its TAC)
        fitted = {**base.fitted, "card": card.calibrator}
        nll_crops = _crops_nll(fitted, [it.spatial for it in pool], card.steps == bundle.tac_steps, log)
    timings = {"pool": pool_time, "fit": time.perf_counter() - t0}
    summary = _fit_summary(base, card, nll_crops, settings, data, timings)
    _write_fit(bundle, summary, options.write, log)
    return summary


def _cached_pool(
    bundle, data: str, crops: Optional[dict], options: CalibrationFitOptions, log: Callable[[str], None]
) -> Tuple[List[PoolItem], dict, Optional[float]]:
    """``(pool, its settings, seconds it took to build; None: read from the cache)``: the
    source-validation pool (with ``crops``, :func:`pool_crops`), from ``options.cache_dir`` where it
    is there, else built and cached there."""
    settings = pool_settings(
        bundle, data, options.variants, options.draws, options.seed, options.max_pixels_per_item, crops
    )
    cache_dir = options.cache_dir
    cache = Path(cache_dir) / f"pool-{pool_key(bundle.checksums, settings)}.npz" if cache_dir else None
    t0 = time.perf_counter()
    if cache is not None and cache.is_file():
        pool = load_pool(cache)
        log(f"pool: {len(pool)} items from cache {cache}")
        return pool, settings, None
    cases = acdc_h5_volumes(data, "val")
    pool_options = PoolOptions(
        variants=options.variants,
        max_pixels_per_item=options.max_pixels_per_item,
        seed=options.seed,
        device=options.device,
        batch_size=options.batch_size,
        draws=options.draws,
        spatial=crops is not None,
        augmentations=crops["augmentations"] if crops else 0,
    )
    pool = build_pool(bundle, cases, pool_options, progress=log)
    pool_time = time.perf_counter() - t0
    log(f"pool: {len(pool)} items, {sum(it.labels.size for it in pool):,d} ROI pixels in {pool_time:.0f} s")
    if cache is not None:
        save_pool(pool, cache)
    return pool, settings, pool_time


def _fit_baselines(
    pool: Sequence[PoolItem],
    methods: Sequence[str],
    data: str,
    seed: int,
    progress: Optional[Progress],
    log: Callable[[str], None],
) -> BaselineFits:
    """Fit every baseline of ``methods`` on the pool (the network ones from ``seed``, with
    :data:`NET_FIT_OPTIONS`; CalibNet's shape prior on ``data``'s training split) and log each NLL."""
    fitted, nll, net_info = {}, {}, {}
    for method in methods:
        t1 = time.perf_counter()
        kwargs = {}
        if method in NETWORK_METHODS:
            net_info[method] = {}
            kwargs = {"seed": seed, "progress": progress, "info": net_info[method], **NET_FIT_OPTIONS.get(method, {})}
        if method == "calibnet":
            kwargs["shape_labels"] = shape_label_maps(data)
        fitted[method] = fit_calibrator(method, pool, **kwargs)
        if method in SPATIAL_BASELINES:
            nll[method] = crop_nll(fitted[method], [it.spatial for it in pool])
            where = "crops"
        else:
            nll[method] = pool_nll(fitted[method], pool)
            where = "pool"
        log(f"{method:8s} {where} NLL {nll[method]:.4f}  {fitted[method]!r}  ({time.perf_counter() - t1:.1f} s)")
    return BaselineFits(fitted, nll, net_info)


def _fit_card(pool: Sequence[PoolItem], bundle, tac_steps: str, log: Callable[[str], None]) -> CardChoice:
    """CARD fitted over the TAC step set ``tac_steps`` (``auto``: over each of :data:`TAC_STEP_SETS`,
    the one with the lowest pool NLL kept), each fit logged."""
    candidates = TAC_STEP_SETS if tac_steps == "auto" else (tac_steps,)
    step_set_nll, card_fits, info = {}, {}, {}
    for name in candidates:
        t1 = time.perf_counter()
        steps = tac_step_set(name, bundle.sampled_steps)
        sub = pool if name == "all" and bundle.tac_steps is None else pool_with_tac_steps(pool, steps)
        card_fits[name] = (fit_calibrator("card", sub, info=info), sub, steps)
        step_set_nll[name] = pool_nll(card_fits[name][0], sub)
        log(
            f"card  pool NLL {step_set_nll[name]:.4f}  TAC over {name} {steps or bundle.sampled_steps}  "
            f"{card_fits[name][0]!r}  ({time.perf_counter() - t1:.1f} s)"
        )
    chosen = min(step_set_nll, key=step_set_nll.get)
    calibrator, sub, steps = card_fits[chosen]
    # every set's own fit: the TAC-mid / TAC-last ablations apply them
    params = {name: {**fit[0].params(), "steps": fit[2]} for name, fit in card_fits.items()}
    return CardChoice(chosen, steps, calibrator, sub, step_set_nll, params)


def _crops_nll(
    fitted: Dict[str, Calibrator], crops: Sequence, card_ok: bool, log: Callable[[str], None]
) -> Dict[str, float]:
    """Every fitted method's NLL over every ROI pixel of the pool's crops (CARD only with
    ``card_ok``: the crops' TAC is over the bundle's steps, the TAC it was fitted on), logged."""
    nll_crops = {m: crop_nll(cal, crops) for m, cal in fitted.items() if m != "card" or card_ok}
    log("crops NLL  " + "  ".join(f"{m} {v:.4f}" for m, v in nll_crops.items()))
    return nll_crops


def _fit_summary(
    base: BaselineFits,
    card: CardChoice,
    nll_crops: Optional[Dict[str, float]],
    settings: dict,
    data: str,
    timings: Dict[str, Optional[float]],
) -> dict:
    """What :func:`fit_bundle_calibration` returns: the fits, their NLLs, the thresholds of the
    chosen pool, the pool's settings and size, the TAC step choice and ``timings`` (seconds)."""
    nll = {**base.nll, "card": card.pool_nll[card.chosen]}
    return {
        "card": card.calibrator.params(),
        "baselines": {m: cal.to_dict() for m, cal in base.fitted.items()},
        "pool_nll": {m: v for m, v in nll.items() if m not in SPATIAL_BASELINES},
        "pool_nll_crops": nll_crops,
        "baseline_fits": base.net_info,
        "thresholds": pool_thresholds(card.pool),
        # the cache key holds the resolved path; bundle.json records the data's name only
        "pool": {
            **settings,
            "data": data_name(data, "acdc-h5"),
            "items": len(card.pool),
            "pixels": int(sum(it.labels.size for it in card.pool)),
        },
        "tac_steps": {"chosen": card.chosen, "steps": card.steps, "pool_nll": card.pool_nll, "params": card.params},
        "timings_s": timings,
    }


def _bundle_changes(summary: dict) -> dict:
    """The ``bundle.json`` changes of a fit (:func:`_fit_summary`), the regions block left out."""
    return {
        "calibration": {
            "method": "card",
            **summary["card"],
            "fitted": True,
            "tac_steps": summary["tac_steps"]["steps"],
            "fit": {
                "objective": "mean NLL over ROI pixels of the source-validation pool",
                "pool": summary["pool"],
                "pool_nll": summary["pool_nll"],
                "tac_step_sets": summary["tac_steps"],
                **({"pool_nll_crops": summary["pool_nll_crops"]} if summary["pool_nll_crops"] is not None else {}),
                **({"baseline_fits": summary["baseline_fits"]} if summary["baseline_fits"] else {}),
            },
        },
        "agreement": {
            "out_of_domain_threshold": summary["thresholds"]["out_of_domain_threshold"],
            "out_of_domain_rule": "lowest clean source-validation volume agreement minus 0.01",
        },
        "baselines": summary["baselines"],
    }


def _write_fit(bundle, summary: dict, write: bool, log: Callable[[str], None]) -> None:
    """Check the fit's changes against the schema and, with ``write``, write what it accepts into
    ``bundle.json`` (the region flag threshold only where fit-review fitted no regions rule); a
    refused baseline then raises :class:`CardsegError` (see :func:`fit_bundle_calibration`)."""
    thresholds = summary["thresholds"]
    changes = _bundle_changes(summary)
    config = read_config(bundle.path)
    if regions_fitted(config):
        log(
            f"regions: kept the rule fit-review fitted (flag_threshold {config['regions'].get('flag_threshold')}); "
            f"this pool's TAC threshold {thresholds['flag_threshold']:.4g} not written"
        )
    else:
        changes["regions"] = {"flag_threshold": thresholds["flag_threshold"], "flag_rule": FLAG_RULE}
    changes, refused = writable_changes(config, changes, bundle.path)
    if write:
        update_config(bundle.path, changes)
        log(f"wrote the fitted calibration into {bundle.path / 'bundle.json'}")
    if refused:
        done = "CARD and the other blocks were written" if write else "dry run: nothing written"
        raise CardsegError("; ".join(f"baseline {m} not written: {msg}" for m, msg in refused.items()) + f" ({done})")
