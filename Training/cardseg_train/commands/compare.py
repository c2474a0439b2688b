"""``cardseg compare`` and ``cardseg ablate``: the paper's Table I and Table II from evaluations.

Both only read what ``cardseg evaluate`` wrote or cached (``ablate`` runs the Logit Mix
trajectories, which no evaluation has); the tables themselves are built in
:mod:`cardseg_train.comparison.table` and :mod:`cardseg_train.comparison.ablation`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import List

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

ABLATION_FILES = ("ablation.md", "ablation.json", "ablation_ece.png")
COMPARISON_FILES = ("comparison.md", "comparison.json", "comparison_block_nll.png")


def ablate_parser() -> argparse.ArgumentParser:
    p = CommandLineParser(
        prog="cardseg ablate",
        description="The paper's component ablation (Table II) under one condition: Primary only, Logit Mix, Dual "
        "U-Net, w/o Ref. Contrast, TAC-last, TAC-mid, Proposed (ECE/SCE/ACE). Reads cardseg evaluate's "
        "cache (run evaluate first, same --split/--seed); only Logit Mix runs trajectories of its own. "
        "TAC-last/mid need the bundle fitted with fit-calibration --tac-steps auto.",
    )
    add_bundle_and_data(p, bundle_help="the CARD bundle (default: $CARDSEG_BUNDLE or the shipped one)")
    p.add_argument(
        "--dual",
        metavar="DIR",
        help="evaluate --out of the Dual U-Net bundle (its card method): pooled numbers only, no interval",
    )
    p.add_argument(
        "--dual-bundle",
        metavar="PATH",
        help="the Dual U-Net bundle itself: its card trajectories are run (or read from the cache) on the "
        "condition's cases, so its row gets the paired patient interval (instead of --dual)",
    )
    p.add_argument("--split", default="val", choices=["val", "test"])
    p.add_argument("--condition", default="spike", help="one of clean, bias, motion, ghost, spike (default spike)")
    p.add_argument("--out", required=True, metavar="DIR", help=f"writes {', '.join(ABLATION_FILES)} there")
    add_overwrite(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-cases", type=int, metavar="N", help="only the first N volumes (quick runs)")
    add_cache(p, "evaluate", "cardseg evaluate's per-case cache folder (the same as evaluate's)")
    add_h5_spacing(p)
    add_compute(p)
    return p


def cmd_ablate(argv: List[str]) -> int:
    a = ablate_parser().parse_args(argv)
    if a.dual and a.dual_bundle:
        raise CardsegError("give --dual or --dual-bundle, not both")
    from cardseg_train.calibration.harness import ALL_CONDITIONS

    comma_names(a.condition, list(ALL_CONDITIONS), "condition")
    check_compute(a)
    record = out_record(a.out, "cardseg ablate", ABLATION_FILES, a.overwrite)
    from cardseg_train.comparison.table import check_kind, evaluated_segmentor, load_table

    check_kind("--bundle", a.bundle or "(default)", bundle_kind(a.bundle), "diffusion")
    if a.dual_bundle:
        check_kind("--dual-bundle", a.dual_bundle, bundle_kind(a.dual_bundle), "dual")
    dual = None
    if a.dual:
        dual = load_table(Path(a.dual))
        check_kind("--dual", a.dual, evaluated_segmentor(dual), "dual", True)
    import torch

    from cardseg.bundle.loading import load_bundle
    from cardseg.base.progress import make_progress
    from cardseg.base.devices import resolve_device

    from cardseg_train.comparison.ablation import ablation_table, markdown, plot
    from cardseg_train.base.report_files import atomic_write
    from cardseg_train.calibration.harness import CaseCache, CaseRunOptions, evaluation_settings, run_cases
    from cardseg_train.evaluation.segmentation import acdc_h5_volumes

    if a.threads:
        torch.set_num_threads(a.threads)
    device = resolve_device(a.device)
    bundle = load_bundle(a.bundle, device=device)
    cases = acdc_h5_volumes(a.data, a.split, a.h5_spacing)[: a.max_cases]
    settings = evaluation_settings(a.data, a.split, a.seed, a.h5_spacing, bundle)
    root = Path(a.cache) if a.cache else None
    progress = make_progress("bar", a.quiet)
    card_run = CaseRunOptions(seed=a.seed, device=device, batch_size=a.batch_size)
    card_cache = CaseCache(root, CaseCache.make_key(bundle.checksums, settings))
    card = run_cases(bundle, cases, [a.condition], card_cache, card_run, progress)
    mix_key = CaseCache.make_key(bundle.checksums, {**settings, "mode": "logit-mix", "grid": "card's"})
    mix_run = CaseRunOptions(seed=a.seed, device=device, batch_size=a.batch_size, mode="logit-mix")
    mix = run_cases(bundle, cases, [a.condition], CaseCache(root, mix_key), mix_run, progress)
    dual_run = None
    if a.dual_bundle:  # the control's own trajectories, cached like evaluate's
        dual_bundle = load_bundle(a.dual_bundle, device=device)
        dual_settings = evaluation_settings(a.data, a.split, a.seed, a.h5_spacing, dual_bundle)
        dual_cache = CaseCache(root, CaseCache.make_key(dual_bundle.checksums, dual_settings))
        dual_run = (
            run_cases(dual_bundle, cases, [a.condition], dual_cache, card_run, progress),
            dual_bundle.config,
        )
    progress.close()
    table = ablation_table(card, mix, bundle.config, dual, a.condition, dual_run=dual_run)
    table["settings"] = {
        "split": a.split,
        "seed": a.seed,
        "bundle": bundle.ident,
        "dual": a.dual,
        "dual_bundle": dual_run[1].get("id") if dual_run else None,
    }
    out = Path(a.out)
    text = markdown(table, f"{bundle.ident}: component ablation on ACDC {a.split}")
    with record.writing():
        atomic_write(out / "ablation.md", text.encode("utf-8"))
        atomic_write(out / "ablation.json", (json.dumps(table, indent=1) + "\n").encode("utf-8"))
        plot(table, out / "ablation_ece.png")
    print(text)
    return 0


def bundle_kind(path) -> str:
    """The segmentor kind of the bundle at ``path`` (``--bundle`` rules), read from its ``bundle.json``
    without torch: ``diffusion`` (CARD), ``deterministic``, ``aleatoric`` or ``dual``."""
    from cardseg.bundle.folder import read_config, resolve_bundle_path

    return str((read_config(resolve_bundle_path(path)).get("segmentor") or {}).get("kind") or "diffusion")


def compare_parser() -> argparse.ArgumentParser:
    p = CommandLineParser(
        prog="cardseg compare",
        description="The paper's Table I from cardseg evaluate outputs: the conventional baselines (UC, TS, ETS, HTS, "
        "PTS, LTS, CalibNet) on a deterministic segmentor, Alea. on the aleatoric one, Primary+ETS, "
        "Primary+HTS and CARD on the diffusion primary; writes comparison.md/.json and a figure.",
    )
    p.add_argument("--card", metavar="DIR", help="evaluate --out of the CARD bundle (Primary+ETS, Primary+HTS, CARD)")
    p.add_argument(
        "--conventional",
        metavar="DIR",
        help="evaluate --out of the deterministic segmentor's plain bundle (methods uc,ts,ets,hts,pts,lts,calibnet)",
    )
    p.add_argument("--aleatoric", metavar="DIR", help="evaluate --out of the aleatoric segmentor's plain bundle (uc)")
    p.add_argument(
        "--roi",
        metavar="ROI",
        help="comma-separated ROIs to compare in, the first written into OUT, each further one into "
        "OUT/roi-<name>/ (as cardseg evaluate --roi writes them); each source's tables in that ROI "
        "are its folder or its roi-<name>/ subfolder, and a source without them is left out and "
        "named. Default: the ROI the given folders hold",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help=f"writes {', '.join(COMPARISON_FILES)} there (and into roi-<name>/ for further ROIs)",
    )
    add_overwrite(p)
    return p


def cmd_compare(argv: List[str]) -> int:
    from cardseg_train.comparison.table import (
        build_comparison,
        check_source_kinds,
        markdown,
        parse_sources,
        write_comparison_files,
    )

    a = compare_parser().parse_args(argv)
    sources = parse_sources(a.card, a.conventional, a.aleatoric)
    if not sources:
        raise CardsegError("give at least one of --card, --conventional, --aleatoric")
    check_source_kinds(sources)
    rois = [None]
    if a.roi:
        from cardseg_train.calibration.harness import ROIS

        rois = comma_names(a.roi, list(ROIS), "ROI")
        for source, folder in sources.items():
            if not (folder / "calibration.json").is_file():
                raise CardsegError(f"{folder}: no calibration.json (run cardseg evaluate --out {folder} first)")
    names = list(COMPARISON_FILES) + [f"roi-{roi}/{n}" for roi in rois[1:] for n in COMPARISON_FILES]
    record = out_record(a.out, "cardseg compare", names, a.overwrite)
    tables = [build_comparison(sources, roi) for roi in rois]  # every ROI checked before anything is written
    with record.writing():
        for i, (roi, cmp) in enumerate(zip(rois, tables)):
            write_comparison_files(cmp, Path(a.out) if i == 0 else Path(a.out) / f"roi-{roi}", roi)
            print(markdown(cmp, f"The paper's Table I on our data, ROI {roi}") if roi else markdown(cmp))
    return 0


def command_ablate(argv: List[str]) -> int:
    """the paper's component ablation (Logit Mix, Dual U-Net, TAC-last/mid, ...) under one condition"""
    return cmd_ablate(argv)


def command_compare(argv: List[str]) -> int:
    """the paper's Table I from several evaluate outputs (conventional baselines, Alea., CARD)"""
    return cmd_compare(argv)
