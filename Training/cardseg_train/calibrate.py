"""``cardseg fit-calibration``: build the source-validation pool, fit CARD and the baselines,
write the fitted values into ``bundle.json`` (never the weights)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from cardseg.bundle import load_bundle, update_config

from .calibration_fit import (POOL_VARIANTS, PoolItem, build_pool, fit_calibrator, pool_nll, pool_thresholds,
                              pool_with_tac_steps)
from .evaluation import acdc_h5_volumes
from .train import data_name

BASELINES = ("uc", "ts", "ets", "hts")
#: TAC step sets ``--tac-steps auto`` chooses from (paper Sec. V ablation): every sampled step,
#: the last three (TAC-mid, [24, 12, 0] for the default sampler) and the last one (TAC-last)
TAC_STEP_SETS = ("all", "mid", "last")


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


def pool_key(checksums: Dict[str, str], settings: dict) -> str:
    """Cache key of a pool: the bundle's weights and every setting that shapes the pool."""
    blob = json.dumps({"weights": checksums, **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def save_pool(pool: Sequence[PoolItem], path: Path) -> None:
    """One ``.npz`` with every item's arrays and a JSON index (no pickles)."""
    arrays, index = {}, []
    for i, it in enumerate(pool):
        arrays[f"logits_{i}"], arrays[f"labels_{i}"], arrays[f"tac_{i}"] = it.logits, it.labels, it.tac
        if it.step_js is not None:
            arrays[f"step_js_{i}"] = it.step_js
        index.append({"case": it.case, "variant": it.variant, "agreement": it.agreement, "steps": it.steps,
                      "step_roi_js": it.step_roi_js})
    arrays["index"] = np.frombuffer(json.dumps(index).encode(), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)


def load_pool(path: Path) -> List[PoolItem]:
    with np.load(path, allow_pickle=False) as f:
        index = json.loads(bytes(f["index"]).decode())
        return [PoolItem(f[f"logits_{i}"], f[f"labels_{i}"], f[f"tac_{i}"],
                         step_js=f[f"step_js_{i}"] if f"step_js_{i}" in f.files else None, **meta)
                for i, meta in enumerate(index)]


def fit_bundle_calibration(bundle_path: str, data: str, variants: Sequence[str] = POOL_VARIANTS, draws: int = 1,
                           seed: int = 0, max_pixels_per_item: int = 30_000, cache_dir: Optional[str] = None,
                           device="cpu", batch_size: int = 8, write: bool = True, tac_steps: str = "all",
                           log: Callable[[str], None] = print) -> dict:
    """Fit CARD (and TS, ETS, HTS for the comparison) on the source-validation pool.

    Only ``val`` patients are used (never test, never corruptions). The pool is cached under
    ``cache_dir`` keyed by the bundle's checksums and the pool settings. Returns a summary; with
    ``write`` the bundle's ``bundle.json`` gets the CARD parameters, the region flag threshold,
    the out-of-domain agreement threshold and the fitted baselines.

    ``tac_steps``: ``all`` (the paper's TAC over every sampled step), ``mid``, ``last``, or ``auto``:
    CARD is fitted for each of the three and the set with the lowest pool NLL is kept (a choice made
    on the validation pool only); the choice goes into ``calibration.tac_steps``.
    """
    if tac_steps not in TAC_STEP_SETS + ("auto",):
        raise ValueError(f"unknown --tac-steps {tac_steps!r} (choose from {', '.join(TAC_STEP_SETS)}, auto)")
    bundle = load_bundle(bundle_path, device=device)
    settings = {"data": str(Path(data).resolve()), "split": "val", "variants": list(variants), "draws": draws,
                "seed": seed, "max_pixels_per_item": max_pixels_per_item, "step_js": True}
    cache = Path(cache_dir) / f"pool-{pool_key(bundle.checksums, settings)}.npz" if cache_dir else None
    t0 = time.perf_counter()
    if cache is not None and cache.is_file():
        pool = load_pool(cache)
        log(f"pool: {len(pool)} items from cache {cache}")
        pool_time = None
    else:
        cases = acdc_h5_volumes(data, "val")
        pool = build_pool(bundle, cases, variants=variants, max_pixels_per_item=max_pixels_per_item, seed=seed,
                          device=device, batch_size=batch_size, draws=draws, progress=log)
        pool_time = time.perf_counter() - t0
        log(f"pool: {len(pool)} items, {sum(it.labels.size for it in pool):,d} ROI pixels in {pool_time:.0f} s")
        if cache is not None:
            save_pool(pool, cache)
    t0 = time.perf_counter()
    fitted, nll, info = {}, {}, {}
    for method in BASELINES:
        t1 = time.perf_counter()
        fitted[method] = fit_calibrator(method, pool)
        nll[method] = pool_nll(fitted[method], pool)
        log(f"{method:5s} pool NLL {nll[method]:.4f}  {fitted[method]!r}  ({time.perf_counter() - t1:.1f} s)")
    candidates = TAC_STEP_SETS if tac_steps == "auto" else (tac_steps,)
    step_set_nll, card_fits = {}, {}
    for name in candidates:
        t1 = time.perf_counter()
        steps = tac_step_set(name, bundle.sampled_steps)
        sub = pool if name == "all" and bundle.tac_steps is None else pool_with_tac_steps(pool, steps)
        card_fits[name] = (fit_calibrator("card", sub, info=info), sub, steps)
        step_set_nll[name] = pool_nll(card_fits[name][0], sub)
        log(f"card  pool NLL {step_set_nll[name]:.4f}  TAC over {name} {steps or bundle.sampled_steps}  "
            f"{card_fits[name][0]!r}  ({time.perf_counter() - t1:.1f} s)")
    chosen = min(step_set_nll, key=step_set_nll.get)
    fitted["card"], pool, chosen_steps = card_fits[chosen]
    nll["card"] = step_set_nll[chosen]
    fit_time = time.perf_counter() - t0
    thresholds = pool_thresholds(pool)
    summary = {
        "card": fitted["card"].params(),
        "baselines": {m: fitted[m].to_dict() for m in BASELINES},
        "pool_nll": nll,
        "thresholds": thresholds,
        # the cache key above holds the resolved path; bundle.json records the data's name only
        "pool": {**settings, "data": data_name(data, "acdc-h5"), "items": len(pool),
                 "pixels": int(sum(it.labels.size for it in pool))},
        "tac_steps": {"chosen": chosen, "steps": chosen_steps, "pool_nll": step_set_nll},
        "timings_s": {"pool": pool_time, "fit": fit_time},
    }
    if write:
        update_config(bundle.path, {
            "calibration": {"method": "card", **fitted["card"].params(), "fitted": True, "tac_steps": chosen_steps,
                            "fit": {"objective": "mean NLL over ROI pixels of the source-validation pool",
                                    "pool": summary["pool"], "pool_nll": nll,
                                    "tac_step_sets": summary["tac_steps"]}},
            "regions": {"flag_threshold": thresholds["flag_threshold"],
                        "flag_rule": "0.99 quantile of clean source-validation TAC in the ground-truth ROI"},
            "agreement": {"out_of_domain_threshold": thresholds["out_of_domain_threshold"],
                          "out_of_domain_rule": "lowest clean source-validation volume agreement minus 0.01"},
            "baselines": summary["baselines"],
        })
        log(f"wrote the fitted calibration into {bundle.path / 'bundle.json'}")
    return summary
