"""``cardseg fit-calibration``, ``cardseg fit-review`` and ``cardseg fit-indices``: what a bundle
learns on the validation split (temperature mapping and baselines, the flagged-region rule, the
cardiac-index intervals), written into its ``bundle.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import List

from cardseg.base.argparsing import CommandLineParser
from cardseg.base.errors import CardsegError

from cardseg_train.base.cli_options import (
    DEFAULT_DATA,
    add_bundle_and_data,
    add_cache,
    add_compute,
    add_h5_spacing,
    add_overwrite,
    bundle_to_rewrite,
    check_compute,
    out_record,
)


#: --bundle of the fit commands: the bundle is rewritten in place (:func:`cli_options.bundle_to_rewrite`)
REWRITTEN = (
    "bundle folder {what}; its bundle.json is rewritten in place. Needed unless $CARDSEG_BUNDLE names one "
    "(the shipped bundle is fitted only when named, or read with --dry-run)"
)


def review_fit_parser() -> argparse.ArgumentParser:
    from cardseg_train.review.report import RULES

    p = CommandLineParser(
        prog="cardseg fit-review",
        description="Choose how flagged regions are cut (from a fitted voxel error-probability map, logistic over "
        "the smoothed TAC and the prediction's geometry, from the TAC itself, or from the TAC plus the "
        "disagreement of the primary's runs on the volume's flipped copies: --rule; flag and grow "
        "thresholds, size cap) and fit the region error model p_error on the clean validation volumes, "
        "cross-fitted by patient, "
        "maximising the substantial errors covered (at least half their pixels) by the first 3 regions "
        "per volume (leave-one-patient-out) at a median burden of at most 10% of the predicted heart; "
        "writes bundle.json's regions block (the replaced rule kept as regions.previous). Test patients "
        "are never read.",
    )
    add_bundle_and_data(
        p,
        data_help=f"ACDC HDF5 folder, val split used (default {DEFAULT_DATA})",
        bundle_help=REWRITTEN.format(what="whose regions rule is fitted"),
    )
    add_cache(p, "review", "whole-volume map cache")
    p.add_argument("--out", metavar="DIR", help="also write the candidates' table (review_fit.json) here")
    add_overwrite(p)
    p.add_argument("--dry-run", action="store_true", help="fit and print, do not write bundle.json")
    p.add_argument(
        "--rule",
        default="auto",
        choices=RULES,
        help="region rule family: regions cut from a fitted voxel error map (error-map), from the TAC "
        "itself (tac), from the TAC plus the flipped runs' disagreement (tac-flips: three more primary "
        "runs a volume, here and in every run of the bundle), or all fitted and the one covering the "
        "most errors held out kept (default auto)",
    )
    p.add_argument(
        "--flip-steps",
        metavar="T,T,...",
        help="diffusion steps the flipped copies run on for the new rule (tac-flips), e.g. 49,0; written "
        "into it as regions.flip_steps (default: the bundle's rule's, else its sampled steps)",
    )
    p.add_argument(
        "--flip-copies",
        metavar="NAME,...",
        help="the flipped copies the new rule (tac-flips) runs, from rows, columns and both, e.g. both; "
        "written into it as regions.flip_copies (default: the bundle's rule's, else all three)",
    )
    p.add_argument(
        "--max-burden",
        type=float,
        metavar="SHARE",
        help="the largest median share of the predicted heart the first three regions may cover, "
        "held out (default 0.10)",
    )
    p.add_argument(
        "--p-error-pool",
        action="store_true",
        help="fit p_error (not the rule) on the validation volumes under fit-calibration's perturbations "
        "(contrast, gamma, noise) as well as clean, so that it stays calibrated under a shift; "
        "three more map runs a volume (tac and tac-flips rules)",
    )
    add_compute(p)
    return p


def parse_flip_copies(text: str) -> List[str]:
    """``--flip-copies`` as copy names (one-line refusal, exit 2)."""
    from cardseg.bundle.schema import check_copies

    return check_copies([n.strip() for n in text.split(",")], "--flip-copies")


def parse_flip_steps(text: str, bundle_arg) -> List[int]:
    """``--flip-steps`` as step indices the bundle's diffusion horizon admits (one-line refusal, exit 2)."""
    from cardseg.bundle.folder import read_config, resolve_bundle_path
    from cardseg.bundle.schema import check_steps

    try:
        steps = [int(t) for t in text.split(",")]
    except ValueError:
        raise CardsegError(f"--flip-steps must be step indices separated by commas, e.g. 49,0 (got {text!r})") from None
    return check_steps(
        steps, int(read_config(resolve_bundle_path(bundle_arg))["diffusion"]["num_steps"]), "--flip-steps"
    )


def cmd_fit_review(argv: List[str]) -> int:
    a = review_fit_parser().parse_args(argv)
    check_compute(a)
    flip_steps = parse_flip_steps(a.flip_steps, a.bundle) if a.flip_steps is not None else None
    flip_copies = parse_flip_copies(a.flip_copies) if a.flip_copies is not None else None
    if a.max_burden is not None and not 0.0 < a.max_burden <= 1.0:
        raise CardsegError(f"--max-burden must be a share in (0, 1], got {a.max_burden}")
    record = out_record(a.out, "cardseg fit-review", ["review_fit.json"], a.overwrite)
    bundle_to_rewrite(a.bundle, "cardseg fit-review", writes=not a.dry_run)
    import torch

    from cardseg.bundle.loading import load_bundle
    from cardseg.base.progress import make_progress
    from cardseg.base.devices import resolve_device

    from cardseg_train.review.report import RULE_KEYS, ReviewFitOptions, fit_bundle_review

    if a.threads:
        torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    bundle = load_bundle(a.bundle, device=device)
    progress = make_progress("bar", a.quiet)
    res = fit_bundle_review(
        bundle,
        a.data,
        Path(a.cache) if a.cache else None,
        device=device,
        batch_size=a.batch_size,
        progress=progress,
        options=ReviewFitOptions(
            rule=a.rule, flip_steps=flip_steps, flip_copies=flip_copies, pool=a.p_error_pool, max_burden=a.max_burden
        ),
    )
    progress.close()
    if record:  # first, so that a refused bundle write loses nothing of the fit
        from cardseg_train.base.report_files import atomic_write

        with record.writing():
            atomic_write(Path(a.out) / "review_fit.json", (json.dumps(res, indent=1) + "\n").encode("utf-8"))
    if not a.dry_run:
        from cardseg.bundle.loading import update_config

        update_config(bundle.path, {"regions": res["block"]}, replace=("regions",))  # nothing of the old rule stays
    v = res["block"]["fit"]["validation"]["cross_validated"]
    rule = {k: res["block"][k] for k in RULE_KEYS if k in res["block"]}
    fam = res["block"]["fit"].get("families_held_out", {})
    if len(fam) > 1:
        print(
            "rule families (held out): "
            + "; ".join(f"{k} top3 {f['covered_top3']:.2f} at {f['median_burden_top3']:.3f}" for k, f in fam.items())
        )
    print(
        f"regions: {json.dumps(rule)}; validation (held out): top3 cover {v['covered_top3']:.2f} at median burden "
        f"{v['median_burden_top3']:.3f}, all {v['covered_all']:.2f}, {v['regions_per_volume']:.1f} regions/volume, "
        f"p_error ECE {v['region_ece']:.3f}" + (" (dry run)" if a.dry_run else f" -> {bundle.path}")
    )
    pool = res["block"]["fit"]["validation"].get("pool")
    if pool:
        print(
            "p_error ECE held out per condition, clean-fitted -> pool-fitted model: "
            + "; ".join(
                f"{c} {_num(pool['clean_model'][c]['region_ece'])} -> {_num(pool['pooled_model'][c]['region_ece'])}"
                for c in pool["pooled_model"]
            )
        )
    return 0


def _num(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def fit_parser() -> argparse.ArgumentParser:
    p = CommandLineParser(
        prog="cardseg fit-calibration",
        description="Fit CARD's temperature mapping {tau_min, tau_max, w_b, w_k} (and the TS/ETS/HTS baselines) by "
        "mean NLL on the source-validation pool (validation volumes plus contrast, gamma and noise "
        "perturbations), and the region/out-of-domain thresholds; writes them into bundle.json. A "
        "regions rule fitted by fit-review (regions.fit) is kept as it is; only a bundle without one gets "
        "this command's flag threshold. What would be written is checked against bundle.json's schema "
        "first (--dry-run too): a baseline it refuses is left out, the rest written, and the command "
        "exits 2 naming it.",
    )
    add_bundle_and_data(
        p, data_help="ACDC HDF5 folder (val split used)", bundle_help=REWRITTEN.format(what="to calibrate")
    )
    p.add_argument("--draws", type=int, default=1, help="seeded draws of each perturbation per volume (default 1)")
    p.add_argument("--max-pixels", type=int, default=30000, help="ROI pixels kept per pool item (default 30000)")
    p.add_argument("--seed", type=int, default=0)
    add_cache(p, "calibration", "pool cache folder")
    p.add_argument(
        "--tac-steps",
        default="all",
        choices=["all", "mid", "last", "auto"],
        help="steps the TAC averages: all sampled steps (paper, default), the last three, the last one, "
        "or auto: the one of these with the lowest CARD NLL on the validation pool",
    )
    p.add_argument(
        "--baselines",
        default="ts,ets,hts",
        metavar="NAMES",
        help="comma-separated baselines to fit beside CARD, from ts, ets, hts, pts, lts, calibnet (default "
        "ts,ets,hts; uc is always written). pts fits on the pool's pixels; lts and calibnet need the "
        "image around each pixel, so the pool is built (and cached) with crops, and calibnet also "
        "runs the primary on 4 augmentations of each pool image and trains its shape prior on the "
        "training split's label maps",
    )
    p.add_argument("--dry-run", action="store_true", help="fit and print, do not write bundle.json")
    add_compute(p)
    return p


def cmd_fit(argv: List[str]) -> int:
    import torch

    from cardseg.bundle.folder import resolve_bundle_path
    from cardseg.base.devices import resolve_device

    from cardseg.base.progress import make_progress

    from cardseg_train.calibration.calibrate import CalibrationFitOptions, fit_bundle_calibration, parse_baselines

    a = fit_parser().parse_args(argv)
    check_compute(a)
    bundle_to_rewrite(a.bundle, "cardseg fit-calibration", writes=not a.dry_run)
    baselines = parse_baselines(a.baselines)
    if a.threads:
        torch.set_num_threads(a.threads)
    progress = make_progress("bar", a.quiet)
    options = CalibrationFitOptions(
        draws=a.draws,
        seed=a.seed,
        max_pixels_per_item=a.max_pixels,
        cache_dir=a.cache or None,
        device=resolve_device(a.device),
        batch_size=a.batch_size,
        write=not a.dry_run,
        tac_steps=a.tac_steps,
        baselines=baselines,
    )
    fit_bundle_calibration(str(resolve_bundle_path(a.bundle)), a.data, options, progress=progress)
    progress.close()
    return 0


def fit_indices_parser() -> argparse.ArgumentParser:
    p = CommandLineParser(
        prog="cardseg fit-indices",
        description="Fit the intervals of the cardiac indices (LV/RV EDV, ESV, SV, EF, LV mass) on the validation "
        "subjects (ED frame01, ES frame02): per index a location-scale pivot, bias and sd from the "
        "validation errors, the multiplier from a standardised error-shape pool (training patients "
        "in-sample); writes them into bundle.json "
        "('indices'). --measure-test OUT then measures coverage, width and errors on the test subjects "
        "(nothing is fitted on them) into OUT/indices.md, indices.json, indices_coverage.png.",
    )
    add_bundle_and_data(p, bundle_help=REWRITTEN.format(what="whose index intervals are fitted"))
    p.add_argument("--level", type=float, default=0.9, help="nominal coverage of the intervals (default 0.9)")
    p.add_argument("--measure-test", metavar="OUT", help="measure the fitted intervals on the test subjects into OUT")
    add_overwrite(p, "--measure-test")
    p.add_argument("--no-fit", action="store_true", help="with --measure-test: measure the bundle's stored fit")
    p.add_argument("--dry-run", action="store_true", help="fit and print, do not write bundle.json")
    add_cache(p, "indices", "per-volume cache folder (the validation and pool volumes in its evidence/)")
    add_h5_spacing(p)
    add_compute(p, quiet=False)
    return p


def cmd_fit_indices(argv: List[str]) -> int:
    a = fit_indices_parser().parse_args(argv)
    if a.no_fit and not a.measure_test:
        raise CardsegError("--no-fit needs --measure-test OUT (there is nothing else to do)")
    check_compute(a)
    bundle_to_rewrite(a.bundle, "cardseg fit-indices", writes=not (a.dry_run or a.no_fit))
    from cardseg_train.indices.report import MEASUREMENT_FILES

    record = out_record(a.measure_test, "cardseg fit-indices", MEASUREMENT_FILES, a.overwrite, option="--measure-test")
    import contextlib

    import torch

    from cardseg.base.devices import resolve_device

    from cardseg_train.indices.fit import IndexFitOptions, fit_indices

    if a.threads:
        torch.set_num_threads(a.threads)
    # the measurement is written last, after the fit (and its bundle.json write)
    with record.writing() if record else contextlib.nullcontext():
        options = IndexFitOptions(
            level=a.level,
            h5_spacing=a.h5_spacing,
            cache_dir=a.cache or None,
            device=resolve_device(a.device),
            batch_size=a.batch_size,
            write=not a.dry_run,
            measure_out=a.measure_test,
            fit=not a.no_fit,
        )
        fit_indices(a.bundle, a.data, options)
    return 0


def command_fit_calibration(argv: List[str]) -> int:
    """fit CARD's temperature mapping and the baselines on a bundle's validation pool"""
    return cmd_fit(argv)


def command_fit_review(argv: List[str]) -> int:
    """choose the flagged-region rule and fit p_error on validation data"""
    return cmd_fit_review(argv)


def command_fit_indices(argv: List[str]) -> int:
    """fit and measure the cardiac-index intervals on a bundle"""
    return cmd_fit_indices(argv)
