"""``cardseg evaluate``: a bundle on labelled ACDC volumes under the ACDC-C conditions.

The measuring itself is :mod:`cardseg_train.calibration.harness` (tables, figures) and
:mod:`cardseg_train.review.report` (the flagged-region study); this file only parses and calls.
"""

from __future__ import annotations

import argparse
import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence

from cardseg.base.argparsing import CommandLineParser
from cardseg.base.errors import CardsegError

from cardseg_train.base.cli_options import (
    add_bundle_and_data,
    add_cache,
    add_compute,
    add_h5_spacing,
    add_overwrite,
    check_compute,
    comma_names,
    out_record,
)

#: the files of one ROI's calibration report (cardseg_train.calibration.report.write_report)
CALIBRATION_FILES = (
    "calibration.md",
    "calibration.csv",
    "calibration.json",
    "nll_by_condition.png",
    "reliability.png",
    "confidence_histograms.png",
    "agreement_vs_dice.png",
)
DICE_FILES = ("dice.csv", "dice.json", "dice.md")
REVIEW_FILES = ("review.md", "review.json", "review.png")


@dataclass(frozen=True)
class EvaluationRun:
    """What the writing steps of one ``cardseg evaluate`` share: the loaded bundle, the evaluated
    cases (:class:`~cardseg_train.evaluation.segmentation.LabelledVolume`), the conditions, the
    parsed command line, the device the networks run on, the results folder and the reports' title."""

    bundle: Any
    cases: Sequence[Any]
    conditions: Sequence[str]
    args: argparse.Namespace
    device: Any
    out: Path
    title: str


def evaluate_parser() -> argparse.ArgumentParser:
    from cardseg_train.calibration.harness import ALL_METHODS, CONDITIONS, METHODS

    p = CommandLineParser(
        prog="cardseg evaluate",
        description="Evaluate a bundle on labelled ACDC volumes: CARD against UC/TS/ETS/HTS under the conditions "
        "clean, bias, motion, ghost, spike (ACDC-C). Writes calibration.md/.csv/.json (ECE, SCE, ACE "
        "per condition, NLL), dice.*, figures (NLL per condition, reliability diagrams, confidence "
        "histograms, agreement vs Dice, a qualitative panel) into --out. Each (case, condition) is "
        "cached as it finishes, so a rerun resumes. --dice-only gives the quick Dice table.",
    )
    add_bundle_and_data(p)
    p.add_argument(
        "--split",
        default="val",
        choices=["val", "test"],
        help="val for development; test only to report, never to select",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="results folder; files of other names there are left alone, and one of the names this "
        "command writes that cardseg did not write there is refused (see --overwrite)",
    )
    add_overwrite(p)
    p.add_argument("--dice-only", action="store_true", help="only Dice per class per volume (dice.csv/json/md)")
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated, from {','.join(ALL_METHODS)} (default {','.join(METHODS)}); pts, lts and "
        f"calibnet need them fitted (cardseg fit-calibration --baselines); lts and calibnet read the "
        f"image around the ROI, so each case is run again once to cache its crops, and calibnet "
        f"also runs the primary on its augmentations",
    )
    p.add_argument(
        "--conditions",
        default=",".join(CONDITIONS),
        help=f"comma-separated (default {','.join(CONDITIONS)}: the in-plane corruption protocol); "
        "tio3d:bias, tio3d:motion, tio3d:ghost, tio3d:spike are the same corruptions as TorchIO's "
        "default 3D transforms (the paper's literal reading)",
    )
    p.add_argument(
        "--roi",
        default="disk10",
        help="comma-separated ROIs of the tables, the first one the main report: disk10 (default: the "
        "ground truth dilated by a disk of radius 10 px) and/or square10 (by a 10 x 10 kernel, the "
        "literal reading of the paper); each further one is written into OUT/roi-<name>/",
    )
    p.add_argument("--seed", type=int, default=0, help="corruption seed (per case and condition)")
    p.add_argument("--max-cases", type=int, metavar="N", help="only the first N volumes (quick runs)")
    p.add_argument(
        "--panel",
        metavar="CASE[:CONDITION]",
        help="qualitative panel for this case (default: the case and condition with the lowest "
        "agreement); 'none' to skip",
    )
    add_cache(p, "evaluate", "per-case cache folder")
    add_cache(p, "review", "whole-volume maps for the review study", "--review-cache")
    p.add_argument("--no-review", action="store_true", help="skip the flagged-region review study")
    p.add_argument(
        "--review-only",
        action="store_true",
        help="only the flagged-region review study (review.md/.json/.png: covered errors against burden "
        "for the bundle's rule, its previous rule and the baselines; detection AUROC/AUPRC), no "
        "calibration table",
    )
    add_h5_spacing(p)
    add_compute(p)
    return p


def cmd_evaluate(argv: List[str]) -> int:
    a = evaluate_parser().parse_args(argv)
    from cardseg_train.calibration.harness import ALL_CONDITIONS, ALL_METHODS, ROIS

    methods = comma_names(a.methods, ALL_METHODS, "method")
    rois = comma_names(a.roi, list(ROIS), "ROI")
    conditions = comma_names(a.conditions, list(ALL_CONDITIONS), "condition")
    check_compute(a, ("cache", "review_cache"))
    panel_case, _, panel_cond = (a.panel or "").partition(":")
    if panel_cond:
        comma_names(panel_cond, list(ALL_CONDITIONS), "--panel condition")
    patients = [] if panel_case or a.dice_only or a.review_only else split_patients(a.data, a.split)
    record = out_record(a.out, "cardseg evaluate", evaluate_outputs(a, rois, conditions, patients), a.overwrite)

    import torch

    from cardseg.bundle.loading import load_bundle
    from cardseg.base.progress import make_progress
    from cardseg.base.devices import resolve_device

    from cardseg_train.calibration.harness import (
        CaseCache,
        CaseRunOptions,
        bundle_calibrators,
        crop_needs,
        evaluation_settings,
        run_cases,
    )
    from cardseg_train.evaluation.segmentation import acdc_h5_volumes, evaluate_dice, write_dice_table

    if a.threads:
        torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    bundle = load_bundle(a.bundle, device=device)
    calibrators = None if a.dice_only or a.review_only else bundle_calibrators(bundle, methods)
    cases = acdc_h5_volumes(a.data, a.split, a.h5_spacing)[: a.max_cases]
    if panel_case and panel_case.lower() != "none" and not any(c.case == panel_case for c in cases):
        raise CardsegError(f"--panel: no case {panel_case!r} among the evaluated {a.split} volumes")
    out = Path(a.out)
    title = f"{bundle.ident} on ACDC {a.split}"
    if a.dice_only:
        rows = evaluate_dice(
            bundle, cases, device=device, batch_size=a.batch_size, progress=make_progress("bar", a.quiet)
        )
        with record.writing():
            summary = write_dice_table(rows, bundle.class_names, out, title)
        if not a.quiet:
            print(" ".join(f"{k} {v:.3f}" for k, v in summary.items()), f"-> {out}")
        return 0
    run = EvaluationRun(bundle, cases, conditions, a, device, out, title)
    if a.review_only:
        review_section(run, record)
        return 0
    settings = evaluation_settings(a.data, a.split, a.seed, a.h5_spacing, bundle)
    cache = CaseCache(Path(a.cache) if a.cache else None, CaseCache.make_key(bundle.checksums, settings))
    progress = make_progress("bar", a.quiet)
    spatial, augmentations = crop_needs(calibrators.values())
    case_run = CaseRunOptions(
        seed=a.seed, device=device, batch_size=a.batch_size, spatial=spatial, augmentations=augmentations
    )
    results = run_cases(bundle, cases, conditions, cache, case_run, progress)
    progress.close()
    with record.writing():  # from the first file on, the folder's record says what this run wrote
        table = write_results(run, results, calibrators, rois, settings)
    if not a.quiet:
        for m in methods:
            print(
                f"{m:5s} mean NLL {table['mean_nll'][m]:.4f}  "
                + "  ".join(f"{c} {table['pooled'][c][m]['nll']:.3f}" for c in conditions)
            )
        print(f"lowest mean NLL: {table['lowest_mean_nll']} -> {out / 'calibration.md'}")
    return 0


def write_results(run: EvaluationRun, results, calibrators, rois: Sequence[str], settings: dict) -> dict:
    """The tables, the review study and the figures of a full evaluation into ``run.out``; returns
    the first ROI's table."""
    import numpy as np

    from cardseg_train.calibration.harness import calibration_table
    from cardseg_train.evaluation.segmentation import write_dice_table
    from cardseg_train.calibration.report import write_report
    from cardseg_train.calibration.figures import case_panel, choose_panel, conditions_figure
    from cardseg_train.training.config import data_name

    bundle, a, out = run.bundle, run.args, run.out
    panel_case, _, panel_cond = (a.panel or "").partition(":")
    segmentor = (bundle.config.get("segmentor") or {}).get("kind", "diffusion")
    for i, roi in enumerate(rois):
        table_roi = calibration_table(
            results, calibrators, bundle.class_names, run.conditions, segmentor=segmentor, roi=roi
        )
        # the cache key holds the resolved data path; the written tables name the data only
        table_roi["settings"] = {
            **settings,
            "data": data_name(a.data, "acdc-h5"),
            "bundle": bundle.ident,
            "cases": [c.case for c in run.cases],
            "roi": roi,
        }
        write_report(table_roi, out if i == 0 else out / f"roi-{roi}", f"{run.title}, ROI {roi}")
        if i == 0:
            table = table_roi
    if "clean" in run.conditions:
        rows = [
            {
                "case": r.case,
                "patient": r.patient,
                **r.dice,
                "mean": float(np.nanmean([r.dice[n] for n in bundle.class_names[1:]])),
            }
            for r in results
            if r.condition == "clean"
        ]
        write_dice_table(rows, bundle.class_names, out, run.title)
    if not a.no_review:
        review_section(run)
    if panel_case.lower() != "none":
        if panel_case:
            cond = panel_cond or "clean"
            item = next((c for c in run.cases if c.case == panel_case), None)
            if item is None:
                raise CardsegError(f"--panel: no case {panel_case!r} in the {a.split} split")
        else:
            pick = choose_panel(results)
            item, cond = next(c for c in run.cases if c.case == pick.case), pick.condition
        case_panel(bundle, item, cond, out / f"panel_{item.case}_{cond}.png", a.seed, run.device, a.batch_size)
        conditions_figure(bundle, item, run.conditions, out / f"conditions_{item.case}.png", a.seed)
    return table


def split_patients(data: str, split: str) -> List[str]:
    """The patients of ``split`` in the ACDC HDF5 folder ``data`` (its ``<split>_patients.txt``):
    the cases a default qualitative panel may show; none without the list (the run is refused
    for it as it reads the data)."""
    from cardseg_train.data.datasets import split_lists

    return split_lists(data).get(split, [])


def evaluate_outputs(
    a: argparse.Namespace, rois: List[str], conditions: List[str], patients: Sequence[str] = ()
) -> List[str]:
    """What ``cardseg evaluate`` with these options writes into ``--out``. Without ``--panel``
    the panel's case is chosen from the results: then every name it may take, for a case of one of
    ``patients`` (``<patient>_frameNN``) under one of ``conditions``, and no other."""
    if a.dice_only:
        return list(DICE_FILES)
    if a.review_only:
        return list(REVIEW_FILES)
    names = list(CALIBRATION_FILES) + [f"roi-{roi}/{n}" for roi in rois[1:] for n in CALIBRATION_FILES]
    names += list(DICE_FILES) if "clean" in conditions else []
    names += [] if a.no_review else list(REVIEW_FILES)
    panel_case, _, panel_cond = (a.panel or "").partition(":")
    if panel_case.lower() != "none":
        names += (
            [f"panel_{panel_case}_{panel_cond or 'clean'}.png", f"conditions_{panel_case}.png"]
            if panel_case
            else [
                f"{kind}_{glob.escape(p)}_*{end}"
                for p in patients
                for kind, end in [("conditions", ".png")] + [("panel", f"_{glob.escape(c)}.png") for c in conditions]
            ]
        )
    return names


def review_section(run: EvaluationRun, record: Optional[Any] = None) -> None:
    """The flagged-region study of ``cardseg evaluate``: review.md/.json/.png in ``run.out``
    (within ``record``'s writing when given, else within the caller's)."""
    from cardseg.base.progress import make_progress

    from cardseg_train.review.data import MapOptions, cache_key, collect_maps
    from cardseg_train.review.report import review_tables, summary_line, write_review

    bundle, a = run.bundle, run.args
    key = cache_key(bundle, a.split, a.seed)
    progress = make_progress("bar", a.quiet)
    regions = bundle.config["regions"]
    flips = "tac_flips" in (regions.get("map"), (regions.get("previous") or {}).get("map"))  # a rule cut from it
    maps = collect_maps(
        bundle,
        run.cases,
        run.conditions,
        Path(a.review_cache) / key if a.review_cache else None,
        MapOptions(a.seed, run.device, a.batch_size, flips),
        progress,
        calibrator=bundle.calibrator,
    )
    progress.stage("review study", len(maps) * (2 if bundle.config["regions"].get("previous") else 1))
    t = review_tables(maps, bundle.config, a.seed, progress)
    progress.close()
    if record is None:  # within a full evaluation's writing
        write_review(t, run.out, f"Flagged-region review, {run.title}")
    else:
        with record.writing():
            write_review(t, run.out, f"Flagged-region review, {run.title}")
    if not a.quiet:
        print(summary_line(t, run.conditions))


def command_evaluate(argv: List[str]) -> int:
    """compare CARD and the baselines on labelled data (ACDC-C conditions)"""
    return cmd_evaluate(argv)
