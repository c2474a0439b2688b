"""Entry point for the ``cardseg`` subcommands that live in the training package.

``cardseg train [options]`` trains one denoiser into a run folder; ``cardseg train export``
assembles a bundle from a primary run and a reference run; ``cardseg evaluate`` measures a
bundle's Dice on labelled volumes; ``cardseg fit-calibration`` fits CARD into a bundle;
``cardseg fit-indices`` fits and measures the cardiac-index intervals; ``cardseg compare``
assembles the paper's Table I from several evaluations. The engine's ``cardseg`` finds these
through the ``cardseg.commands`` entry points (:data:`COMMANDS`); it never imports this package.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

from cardseg.errors import CardsegError


#: command-line flag → TrainConfig field, for flags whose default is "the config's default"
_FLAG_FIELDS = {
    "data": "data", "data_format": "data_format", "role": "role", "size": "network", "spacing": "spacing",
    "input_size": "input_size", "steps": "steps", "batch_size": "batch_size", "lr": "lr", "warmup": "warmup",
    "lr_schedule": "lr_schedule", "p_uniform": "p_uniform", "p_uncond": "p_uncond", "seed": "seed",
    "log_interval": "log_interval", "val_interval": "val_interval", "val_volumes": "val_max_volumes",
    "val_batch_size": "val_batch_size", "val_fraction": "val_fraction", "time_budget": "time_budget_min",
    "device": "device", "threads": "threads", "acdc_h5_spacing": "acdc_h5_spacing", "num_steps": "num_steps",
    "max_train_patients": "max_train_patients", "max_train_slices": "max_train_slices",
}
_LOSS_FLAGS = {"w_kl": "kl", "w_ce": "ce", "w_dice": "dice", "w_boundary": "boundary", "boundary_radius": "boundary_radius"}


def train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cardseg train",
        description="Train a categorical-diffusion denoiser (primary or reference) into a run folder. "
                    "'cardseg train export --help' builds a bundle from two runs.")
    g = p.add_argument_group("data")
    g.add_argument("--data", metavar="PATH", help="dataset folder (ACDC HDF5 or NIfTI layout, or imagesTr/labelsTr "
                   "pairs) or 'synthetic' (default ../shared/data/acdc)")
    g.add_argument("--data-format", choices=["acdc-h5", "acdc-nifti", "pairs", "synthetic"],
                   help="layout of --data (default: detected)")
    g.add_argument("--val-fraction", type=float, metavar="F",
                   help="patients held out for validation when the data has no split files (default 0.1)")
    g.add_argument("--acdc-h5-spacing", type=float, metavar="MM",
                   help="pixel size assumed for the geometry-less ACDC HDF5 files (default 1.5)")
    g.add_argument("--classes", metavar="NAMES", help="comma-separated class names, background first "
                   "(default background,RV,MYO,LV)")
    g = p.add_argument_group("model")
    g.add_argument("--role", choices=["primary", "reference", "deterministic", "aleatoric"],
                   help="what the run is for (default primary): a diffusion denoiser of a bundle, or the plain "
                        "(deterministic) or aleatoric segmentor of the conventional baselines")
    g.add_argument("--size", metavar="ARCH:SIZE", help="network, e.g. time-swinunetr:mini (default) or time-unet:small; "
                   "plain segmentors discriminative:swinunetr-tiny (their default) or discriminative:unet")
    g.add_argument("--spacing", type=float, metavar="MM", help="network pixel size in mm (default 2.0)")
    g.add_argument("--input-size", type=int, metavar="N", help="network grid side (default 128)")
    g.add_argument("--num-steps", type=int, metavar="T", help="diffusion horizon (default 50)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, metavar="N", help="optimisation steps (default 25000)")
    g.add_argument("--batch-size", type=int, metavar="N", help="default 8")
    g.add_argument("--lr", type=float, help="Adam learning rate after warm-up (default 2e-4)")
    g.add_argument("--warmup", type=int, metavar="N", help="linear warm-up steps (default min(1000, steps/10))")
    g.add_argument("--lr-schedule", choices=["constant", "cosine"], help="after warm-up (default constant)")
    g.add_argument("--p-uniform", type=float, metavar="P",
                   help="probability of feeding the exact uniform state at t = T-1 (default 0.15)")
    g.add_argument("--p-uncond", type=float, metavar="P", help="probability of zeroing the image (default 0.2)")
    g.add_argument("--w-kl", type=float, help="weight of the variational KL term (default 1)")
    g.add_argument("--w-ce", type=float, help="weight of the cross-entropy term (default 1)")
    g.add_argument("--w-dice", type=float, help="weight of the soft Dice term (default 1)")
    g.add_argument("--w-boundary", type=float, help="weight of the boundary-band CE term (default 0.5)")
    g.add_argument("--boundary-radius", type=int, metavar="PX", help="half width of the boundary band (default 2)")
    g.add_argument("--no-augment", action="store_true", help="switch all augmentation off")
    g.add_argument("--seed", type=int, help="default 0")
    g = p.add_argument_group("run")
    g.add_argument("--out", metavar="RUN_DIR", help="run folder (keep it out of git, e.g. runs/NAME)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its last.pt")
    g.add_argument("--time-budget", type=float, metavar="MINUTES", help="stop cleanly (validate, save) once this invocation has trained this long")
    g.add_argument("--log-interval", type=int, metavar="N", help="steps per log.csv row (default 50)")
    g.add_argument("--val-interval", type=int, metavar="N", help="steps between validations (default 500)")
    g.add_argument("--val-volumes", type=int, metavar="N", help="validate on the first N volumes only")
    g.add_argument("--val-batch-size", type=int, metavar="N", help="slices per validation batch (default 16)")
    g.add_argument("--max-train-patients", type=int, metavar="N", help="train on the first N patients only")
    g.add_argument("--max-train-slices", type=int, metavar="N", help="train on N evenly chosen slices only")
    g.add_argument("--device", help="auto (default), cpu or cuda")
    g.add_argument("--amp", action="store_true", help="bfloat16 autocast on CUDA")
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch")
    g.add_argument("--smoke", action="store_true",
                   help="a few steps on a few slices with a tiny network (seconds): checks the whole path")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cardseg train export",
                                description="Assemble a bundle (safetensors, fp16) from a primary and a reference run.")
    p.add_argument("--primary", required=True, metavar="RUN", help="primary run folder")
    p.add_argument("--reference", required=True, metavar="RUN", help="reference run folder")
    p.add_argument("-o", "--output", required=True, metavar="BUNDLE_DIR")
    p.add_argument("--primary-checkpoint", default="best", choices=["best", "last"],
                   help="default best (selected by validation Dice)")
    p.add_argument("--reference-checkpoint", default="last", choices=["best", "last"],
                   help="default last (the reference's length is fixed a priori, not selected)")
    p.add_argument("--name", default="acdc")
    p.add_argument("--version", default="0.1.0")
    p.add_argument("--fp32", action="store_true", help="keep float32 weights")
    p.add_argument("--overwrite", action="store_true")
    return p


def config_from_args(a: argparse.Namespace):
    """``(TrainConfig, names of the fields set on the command line)``."""
    from .augment import AugmentConfig
    from .train import TrainConfig, class_list, smoke_config

    config = TrainConfig()
    explicit = []
    for flag, fld in _FLAG_FIELDS.items():
        v = getattr(a, flag)
        if v is not None:
            setattr(config, fld, v)
            explicit.append(fld)
    for flag, fld in _LOSS_FLAGS.items():
        v = getattr(a, flag)
        if v is not None:
            setattr(config.loss, fld, v)
            explicit.append("loss")
    if a.classes:
        config.classes = class_list([n.strip() for n in a.classes.split(",") if n.strip()])
        explicit.append("classes")
    if a.no_augment:
        config.augment = AugmentConfig.off()
        explicit.append("augment")
    if a.amp:
        config.amp = True
        explicit.append("amp")
    if a.smoke:
        smoke_config(config, explicit)
    if config.data == "synthetic":
        config.data_format = "synthetic"
    return config, explicit


def cmd_train(argv: List[str]) -> int:
    from .train import TrainConfig, train

    a = train_parser().parse_args(argv)
    if not a.out:
        raise CardsegError("--out RUN_DIR is required (a folder outside git, e.g. runs/primary)")
    config, explicit = config_from_args(a)
    if a.resume:
        # start from nothing: every unset flag means "as saved"; resumable ones default to the saved value too
        from .train import RESUMABLE, read_run_config

        saved = read_run_config(a.out)
        blank = TrainConfig(**{f: None for f in TrainConfig.__dataclass_fields__ if f not in ("loss", "augment")})
        blank.loss, blank.augment = saved.loss, saved.augment
        for fld in explicit:
            if fld not in ("loss", "augment"):
                setattr(blank, fld, getattr(config, fld))
        for fld in RESUMABLE:
            if fld not in explicit:
                setattr(blank, fld, getattr(saved, fld))
        if "loss" in explicit:
            blank.loss = config.loss
        if "augment" in explicit:
            blank.augment = config.augment
        config = blank
    summary = train(config, a.out, resume=a.resume, progress=not a.quiet)
    best = summary["best"]
    dice = "n/a" if best.get("dice") is None else f"{best['dice']:.4f} at step {best['step']}"
    print(f"{a.out}: {summary['steps_done']} steps ({summary['stopped_by']}), {summary['elapsed_s']:.0f} s, "
          f"best validation Dice {dice}")
    return 0


def cmd_export(argv: List[str]) -> int:
    from .train import export_bundle

    a = export_parser().parse_args(argv)
    path = export_bundle(a.primary, a.reference, a.output, name=a.name, version=a.version,
                         primary_checkpoint=a.primary_checkpoint, reference_checkpoint=a.reference_checkpoint,
                         overwrite=a.overwrite, fp16=not a.fp32)
    cfg = json.loads((Path(path) / "bundle.json").read_text(encoding="utf-8"))
    prov = cfg["provenance"]["training"]
    print(f"wrote bundle {path}: primary {prov['primary']['network']} (step {prov['primary']['checkpoint_step']}), "
          f"reference {prov['reference']['network']} (step {prov['reference']['checkpoint_step']})")
    return 0


def evaluate_parser() -> argparse.ArgumentParser:
    from .calibration_eval import ALL_METHODS, CONDITIONS, METHODS

    p = argparse.ArgumentParser(
        prog="cardseg evaluate",
        description="Evaluate a bundle on labelled ACDC volumes: CARD against UC/TS/ETS/HTS under the conditions "
                    "clean, bias, motion, ghost, spike (ACDC-C). Writes calibration.md/.csv/.json (ECE, SCE, ACE "
                    "per condition, NLL), dice.*, figures (NLL per condition, reliability diagrams, confidence "
                    "histograms, agreement vs Dice, a qualitative panel) into --out. Each (case, condition) is "
                    "cached as it finishes, so a rerun resumes. --dice-only gives the quick Dice table.")
    p.add_argument("--bundle", metavar="PATH", help="bundle folder (default: $CARDSEG_BUNDLE or the shipped one)")
    p.add_argument("--data", default="../shared/data/acdc", metavar="PATH", help="ACDC HDF5 folder")
    p.add_argument("--split", default="val", choices=["val", "test"],
                   help="val for development; test only to report, never to select")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--dice-only", action="store_true", help="only Dice per class per volume (dice.csv/json/md)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated, from {','.join(ALL_METHODS)} (default {','.join(METHODS)}); pts, lts and "
                        f"calibnet need them fitted (cardseg fit-calibration --baselines); lts and calibnet read the "
                        f"image around the ROI, so each case is run again once to cache its crops, and calibnet "
                        f"also runs the primary on its augmentations")
    p.add_argument("--conditions", default=",".join(CONDITIONS),
                   help=f"comma-separated (default {','.join(CONDITIONS)})")
    p.add_argument("--seed", type=int, default=0, help="corruption seed (per case and condition)")
    p.add_argument("--max-cases", type=int, metavar="N", help="only the first N volumes (quick runs)")
    p.add_argument("--panel", metavar="CASE[:CONDITION]",
                   help="qualitative panel for this case (default: the case and condition with the lowest "
                        "agreement); 'none' to skip")
    p.add_argument("--cache", default="cache/evaluate", metavar="DIR", help="per-case cache folder ('' for none)")
    p.add_argument("--review-cache", default="cache/review", metavar="DIR",
                   help="whole-volume maps for the review study ('' for none)")
    p.add_argument("--no-review", action="store_true", help="skip the flagged-region review study")
    p.add_argument("--review-only", action="store_true",
                   help="only the flagged-region review study (review.md/.json/.png), no calibration table")
    p.add_argument("--h5-spacing", type=float, default=1.5, metavar="MM",
                   help="pixel size assumed for the geometry-less HDF5 volumes (default 1.5, as in training)")
    p.add_argument("--device", default="auto")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int)
    p.add_argument("--quiet", action="store_true")
    return p


def _names(text: str, allowed, what: str) -> List[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise CardsegError(f"unknown {what} {', '.join(bad) or repr(text)} (choose from {', '.join(allowed)})")
    return names


def cmd_evaluate(argv: List[str]) -> int:
    a = evaluate_parser().parse_args(argv)
    from .calibration_eval import ALL_METHODS, CONDITIONS

    methods = _names(a.methods, ALL_METHODS, "method")
    conditions = _names(a.conditions, list(CONDITIONS), "condition")
    if a.max_cases is not None and a.max_cases < 1:
        raise CardsegError("--max-cases must be at least 1")
    panel_case, _, panel_cond = (a.panel or "").partition(":")
    if panel_cond:
        _names(panel_cond, list(CONDITIONS), "--panel condition")

    import numpy as np
    import torch

    from cardseg.bundle import load_bundle
    from cardseg.progress import make_progress
    from cardseg.segment import resolve_device

    from .calibration_eval import (CaseCache, bundle_calibrators, calibration_table, case_panel, choose_panel,
                                   conditions_figure, crop_needs, evaluation_settings, run_cases)
    from .calibration_report import write_report
    from .evaluation import acdc_h5_volumes, evaluate_dice, write_dice_table
    from .train import data_name

    if a.threads:
        torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    bundle = load_bundle(a.bundle, device=device)
    calibrators = None if a.dice_only or a.review_only else bundle_calibrators(bundle, methods)
    cases = acdc_h5_volumes(a.data, a.split, a.h5_spacing)[:a.max_cases]
    if panel_case and panel_case.lower() != "none" and not any(c.case == panel_case for c in cases):
        raise CardsegError(f"--panel: no case {panel_case!r} among the evaluated {a.split} volumes")
    out = Path(a.out)
    title = f"{bundle.ident} on ACDC {a.split}"
    if a.dice_only:
        rows = evaluate_dice(bundle, cases, device=device, batch_size=a.batch_size,
                             progress=make_progress("bar", a.quiet))
        summary = write_dice_table(rows, bundle.class_names, out, title)
        if not a.quiet:
            print(" ".join(f"{k} {v:.3f}" for k, v in summary.items()), f"-> {out}")
        return 0
    if a.review_only:
        review_section(bundle, cases, conditions, a, device, out, title)
        return 0
    settings = evaluation_settings(a.data, a.split, a.seed, a.h5_spacing, bundle)
    cache = CaseCache(Path(a.cache) if a.cache else None, CaseCache.make_key(bundle.checksums, settings))
    progress = make_progress("bar", a.quiet)
    spatial, augmentations = crop_needs(calibrators.values())
    results = run_cases(bundle, cases, conditions, cache, a.seed, device, a.batch_size, progress, spatial=spatial,
                        augmentations=augmentations)
    progress.close()
    table = calibration_table(results, calibrators, bundle.class_names, conditions,
                              segmentor=(bundle.config.get("segmentor") or {}).get("kind", "diffusion"))
    # the cache key holds the resolved data path; the written tables name the data only
    table["settings"] = {**settings, "data": data_name(a.data, "acdc-h5"), "bundle": bundle.ident,
                         "cases": [c.case for c in cases]}
    write_report(table, out, title)
    if "clean" in conditions:
        rows = [{"case": r.case, "patient": r.patient, **r.dice,
                 "mean": float(np.nanmean([r.dice[n] for n in bundle.class_names[1:]]))}
                for r in results if r.condition == "clean"]
        write_dice_table(rows, bundle.class_names, out, title)
    if not a.no_review:
        review_section(bundle, cases, conditions, a, device, out, title)
    if panel_case.lower() != "none":
        if panel_case:
            cond = panel_cond or "clean"
            item = next((c for c in cases if c.case == panel_case), None)
            if item is None:
                raise CardsegError(f"--panel: no case {panel_case!r} in the {a.split} split")
        else:
            pick = choose_panel(results)
            item, cond = next(c for c in cases if c.case == pick.case), pick.condition
        case_panel(bundle, item, cond, out / f"panel_{item.case}_{cond}.png", a.seed, device, a.batch_size)
        conditions_figure(bundle, item, conditions, out / f"conditions_{item.case}.png", a.seed)
    if not a.quiet:
        for m in methods:
            print(f"{m:5s} mean NLL {table['mean_nll'][m]:.4f}  " + "  ".join(
                f"{c} {table['pooled'][c][m]['nll']:.3f}" for c in conditions))
        print(f"lowest mean NLL: {table['lowest_mean_nll']} -> {out / 'calibration.md'}")
    return 0


def review_section(bundle, cases, conditions, a, device, out: Path, title: str) -> None:
    """The flagged-region study of ``cardseg evaluate``: review.md/.json/.png in ``out``."""
    from cardseg.progress import make_progress

    from .review_data import cache_key, collect_maps
    from .review_report import review_tables, summary_line, write_review

    key = cache_key(bundle, a.split, a.seed)
    progress = make_progress("bar", a.quiet)
    maps = collect_maps(bundle, cases, conditions, Path(a.review_cache) / key if a.review_cache else None, a.seed,
                        device, a.batch_size, progress)
    progress.close()
    t = review_tables(maps, bundle.config)
    write_review(t, out, f"Flagged-region review, {title}")
    if not a.quiet:
        print(summary_line(t, conditions))


def review_fit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cardseg fit-review",
        description="Choose how flagged regions are formed (connectivity, TAC threshold, merge radius, smallest "
                    "region) and fit the region error model p_error on the clean validation volumes, maximising the "
                    "substantial errors caught by the first 3 regions per volume (leave-one-patient-out); writes "
                    "bundle.json's regions block. Test patients are never read.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--bundle", metavar="PATH", help="bundle folder (default: $CARDSEG_BUNDLE or the shipped one)")
    p.add_argument("--data", default="../shared/data/acdc", metavar="PATH", help="ACDC HDF5 folder (val split used)")
    p.add_argument("--cache", default="cache/review", metavar="DIR", help="whole-volume map cache ('' for none)")
    p.add_argument("--out", metavar="DIR", help="also write the candidates' table (review_fit.json) here")
    p.add_argument("--dry-run", action="store_true", help="fit and print, do not write bundle.json")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int)
    return p


def cmd_fit_review(argv: List[str]) -> int:
    a = review_fit_parser().parse_args(argv)
    import torch

    from cardseg.bundle import load_bundle
    from cardseg.progress import make_progress
    from cardseg.segment import resolve_device

    from .review_report import fit_bundle_review

    if a.threads:
        torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    bundle = load_bundle(a.bundle, device=device)
    progress = make_progress("bar")
    res = fit_bundle_review(bundle, a.data, Path(a.cache) if a.cache else None, write=False, device=device,
                            batch_size=a.batch_size, progress=progress)
    progress.close()
    if a.out:  # first, so that a refused bundle write loses nothing of the fit
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "review_fit.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    if not a.dry_run:
        from cardseg.bundle import update_config

        update_config(bundle.path, {"regions": res["block"]})
    v = res["block"]["fit"]["validation"]["cross_validated"]
    print(f"regions: {json.dumps({k: res['block'][k] for k in ('connectivity', 'flag_threshold', 'merge_px', 'min_voxels', 'max_regions')})}; "
          f"validation (held out): top3 {v['caught_top3']:.2f}, all {v['caught_all']:.2f}, "
          f"{v['regions_per_volume']:.1f} regions/volume" + (" (dry run)" if a.dry_run else f" -> {bundle.path}"))
    return 0


def fit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cardseg fit-calibration",
        description="Fit CARD's temperature mapping {tau_min, tau_max, w_b, w_k} (and the TS/ETS/HTS baselines) by "
                    "mean NLL on the source-validation pool (validation volumes plus contrast, gamma and noise "
                    "perturbations), and the region/out-of-domain thresholds; writes them into bundle.json.")
    p.add_argument("--bundle", metavar="PATH", help="bundle folder to calibrate (default: $CARDSEG_BUNDLE or shipped)")
    p.add_argument("--data", default="../shared/data/acdc", metavar="PATH", help="ACDC HDF5 folder (val split used)")
    p.add_argument("--draws", type=int, default=1, help="seeded draws of each perturbation per volume (default 1)")
    p.add_argument("--max-pixels", type=int, default=30000, help="ROI pixels kept per pool item (default 30000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", default="cache/calibration", metavar="DIR", help="pool cache folder ('' for none)")
    p.add_argument("--tac-steps", default="all", choices=["all", "mid", "last", "auto"],
                   help="steps the TAC averages: all sampled steps (paper, default), the last three, the last one, "
                        "or auto: the one of these with the lowest CARD NLL on the validation pool")
    p.add_argument("--baselines", default="ts,ets,hts", metavar="NAMES",
                   help="comma-separated baselines to fit beside CARD, from ts, ets, hts, pts, lts, calibnet (default "
                        "ts,ets,hts; uc is always written). pts fits on the pool's pixels; lts and calibnet need the "
                        "image around each pixel, so the pool is built (and cached) with crops, and calibnet also "
                        "runs the primary on 4 augmentations of each pool image and trains its shape prior on the "
                        "training split's label maps")
    p.add_argument("--dry-run", action="store_true", help="fit and print, do not write bundle.json")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def cmd_fit(argv: List[str]) -> int:
    import torch

    from cardseg.bundle import resolve_bundle_path
    from cardseg.segment import resolve_device

    from cardseg.progress import make_progress

    from .calibrate import fit_bundle_calibration, parse_baselines

    a = fit_parser().parse_args(argv)
    baselines = parse_baselines(a.baselines)
    if a.threads:
        torch.set_num_threads(a.threads)
    progress = make_progress("bar", a.quiet)
    fit_bundle_calibration(str(resolve_bundle_path(a.bundle)), a.data, draws=a.draws, seed=a.seed,
                           max_pixels_per_item=a.max_pixels, cache_dir=a.cache or None,
                           device=resolve_device(a.device), batch_size=a.batch_size, write=not a.dry_run,
                           tac_steps=a.tac_steps, baselines=baselines, progress=progress)
    progress.close()
    return 0


def fit_indices_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cardseg fit-indices",
        description="Fit the intervals of the cardiac indices (LV/RV EDV, ESV, SV, EF, LV mass) on the validation "
                    "subjects (ED frame01, ES frame02): a spread from CARD's calibrated probabilities and "
                    "disagreement, one split-conformal scale per index family; writes them into bundle.json "
                    "('indices'). --measure-test OUT then measures coverage, width and errors on the test subjects "
                    "(nothing is fitted on them) into OUT/indices.md, indices.json, indices_coverage.png.")
    p.add_argument("--bundle", metavar="PATH", help="bundle folder (default: $CARDSEG_BUNDLE or the shipped one)")
    p.add_argument("--data", default="../shared/data/acdc", metavar="PATH", help="ACDC HDF5 folder")
    p.add_argument("--level", type=float, default=0.9, help="nominal coverage of the intervals (default 0.9)")
    p.add_argument("--measure-test", metavar="OUT", help="measure the fitted intervals on the test subjects into OUT")
    p.add_argument("--no-fit", action="store_true", help="with --measure-test: measure the bundle's stored fit")
    p.add_argument("--dry-run", action="store_true", help="fit and print, do not write bundle.json")
    p.add_argument("--cache", default="cache/indices", metavar="DIR", help="per-volume cache folder ('' for none)")
    p.add_argument("--h5-spacing", type=float, default=1.5, metavar="MM",
                   help="pixel size assumed for the geometry-less HDF5 volumes (default 1.5, as in training)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int)
    return p


def cmd_fit_indices(argv: List[str]) -> int:
    a = fit_indices_parser().parse_args(argv)
    if a.no_fit and not a.measure_test:
        raise CardsegError("--no-fit needs --measure-test OUT (there is nothing else to do)")
    import torch

    from cardseg.segment import resolve_device

    from .indices_fit import fit_indices

    if a.threads:
        torch.set_num_threads(a.threads)
    fit_indices(a.bundle, a.data, level=a.level, h5_spacing=a.h5_spacing, cache_dir=a.cache or None,
                device=resolve_device(a.device), batch_size=a.batch_size, write=not a.dry_run,
                measure_out=a.measure_test, fit=not a.no_fit)
    return 0


# --------------------------------------------------------------------------------------------
# the subcommands this package adds to ``cardseg`` (pyproject: entry points "cardseg.commands");
# each takes the arguments after its name, and its docstring's first line is its help
# --------------------------------------------------------------------------------------------
def command_train(argv: List[str]) -> int:
    """train a denoiser or a baseline segmentor into a run folder; 'train export' makes a bundle"""
    if argv and argv[0] == "export":
        return cmd_export(argv[1:])
    return cmd_train(argv)


def command_evaluate(argv: List[str]) -> int:
    """compare CARD and the baselines on labelled data (ACDC-C conditions)"""
    return cmd_evaluate(argv)


def command_fit_calibration(argv: List[str]) -> int:
    """fit CARD's temperature mapping and the baselines on a bundle's validation pool"""
    return cmd_fit(argv)


def command_fit_review(argv: List[str]) -> int:
    """choose the flagged-region rule and fit p_error on validation data"""
    return cmd_fit_review(argv)


def command_fit_indices(argv: List[str]) -> int:
    """fit and measure the cardiac-index intervals on a bundle"""
    return cmd_fit_indices(argv)


def _from_cli_compare(name: str):
    def run(argv: List[str]) -> int:
        from . import cli_compare

        return getattr(cli_compare, name)(argv)

    return run


COMMANDS = {"train": command_train, "evaluate": command_evaluate, "fit-calibration": command_fit_calibration,
            "fit-review": command_fit_review, "fit-indices": command_fit_indices,
            "compare": _from_cli_compare("command_compare"), "ablate": _from_cli_compare("command_ablate")}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    if command in COMMANDS:
        return COMMANDS[command](argv[1:])
    raise CardsegError(f"unknown training command {command!r}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CardsegError as exc:
        print(f"cardseg: error: {exc}", file=sys.stderr)
        sys.exit(2)
