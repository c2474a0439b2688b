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

from cardseg.base.argparsing import CommandLineParser
from cardseg.base.errors import CardsegError


#: command-line flag → TrainConfig field, for flags whose default is "the config's default"
_FLAG_FIELDS = {
    "data": "data",
    "data_format": "data_format",
    "role": "role",
    "size": "network",
    "spacing": "spacing",
    "input_size": "input_size",
    "steps": "steps",
    "batch_size": "batch_size",
    "lr": "lr",
    "warmup": "warmup",
    "lr_schedule": "lr_schedule",
    "p_uniform": "p_uniform",
    "p_uncond": "p_uncond",
    "p_focus": "p_focus",
    "seed": "seed",
    "log_interval": "log_interval",
    "val_interval": "val_interval",
    "val_volumes": "val_max_volumes",
    "val_batch_size": "val_batch_size",
    "val_fraction": "val_fraction",
    "time_budget": "time_budget_min",
    "device": "device",
    "threads": "threads",
    "acdc_h5_spacing": "acdc_h5_spacing",
    "num_steps": "num_steps",
    "max_train_patients": "max_train_patients",
    "max_train_slices": "max_train_slices",
}
_LOSS_FLAGS = {
    "w_kl": "kl",
    "w_ce": "ce",
    "w_dice": "dice",
    "w_boundary": "boundary",
    "boundary_radius": "boundary_radius",
}


def _add_data_options(g) -> None:
    """The ``data`` group of ``cardseg train``: which dataset, its layout, split and classes."""
    g.add_argument(
        "--data",
        metavar="PATH",
        help="dataset folder (ACDC HDF5 or NIfTI layout, or imagesTr/labelsTr "
        "pairs) or 'synthetic' (default ../shared/data/acdc)",
    )
    g.add_argument(
        "--data-format",
        choices=["acdc-h5", "acdc-nifti", "pairs", "synthetic"],
        help="layout of --data (default: detected)",
    )
    g.add_argument(
        "--val-fraction",
        type=float,
        metavar="F",
        help="patients held out for validation when the data has no split files (default 0.1)",
    )
    g.add_argument(
        "--acdc-h5-spacing",
        type=float,
        metavar="MM",
        help="pixel size assumed for the geometry-less ACDC HDF5 files (default 1.5)",
    )
    g.add_argument(
        "--classes",
        metavar="NAMES",
        help="comma-separated class names, background first (default background,RV,MYO,LV)",
    )


def _add_model_options(g) -> None:
    """The ``model`` group: the run's role, network, grid and diffusion horizon."""
    g.add_argument(
        "--role",
        choices=["primary", "reference", "deterministic", "aleatoric"],
        help="what the run is for (default primary): a diffusion denoiser of a bundle, or the plain "
        "(deterministic) or aleatoric segmentor of the conventional baselines",
    )
    g.add_argument(
        "--size",
        metavar="ARCH:SIZE",
        help="network, e.g. time-swinunetr:mini (default) or time-unet:small; "
        "plain segmentors discriminative:swinunetr-tiny (their default) or discriminative:unet",
    )
    g.add_argument("--spacing", type=float, metavar="MM", help="network pixel size in mm (default 2.0)")
    g.add_argument("--input-size", type=int, metavar="N", help="network grid side (default 128)")
    g.add_argument("--num-steps", type=int, metavar="T", help="diffusion horizon (default 50)")


def _add_optimisation_options(g) -> None:
    """The ``optimisation`` group: steps, batch, learning rate and the diffusion recipe's draws."""
    g.add_argument("--steps", type=int, metavar="N", help="optimisation steps (default 25000)")
    g.add_argument("--batch-size", type=int, metavar="N", help="default 8")
    g.add_argument("--lr", type=float, help="Adam learning rate after warm-up (default 2e-4)")
    g.add_argument("--warmup", type=int, metavar="N", help="linear warm-up steps (default min(1000, steps/10))")
    g.add_argument("--lr-schedule", choices=["constant", "cosine"], help="after warm-up (default constant)")
    g.add_argument(
        "--p-uniform",
        type=float,
        metavar="P",
        help="probability of feeding the exact uniform state at t = T-1 (default 0.15)",
    )
    g.add_argument("--p-uncond", type=float, metavar="P", help="probability of zeroing the image (default 0.2)")
    g.add_argument(
        "--p-focus",
        type=float,
        metavar="P",
        help="probability of drawing a slice's step from the sampler's own steps (default 0)",
    )


def _add_loss_options(g) -> None:
    """The ``optimisation`` group's loss weights, augmentation switch and seed."""
    g.add_argument("--w-kl", type=float, help="weight of the variational KL term (default 1)")
    g.add_argument("--w-ce", type=float, help="weight of the cross-entropy term (default 1)")
    g.add_argument("--w-dice", type=float, help="weight of the soft Dice term (default 1)")
    g.add_argument("--w-boundary", type=float, help="weight of the boundary-band CE term (default 0.5)")
    g.add_argument("--boundary-radius", type=int, metavar="PX", help="half width of the boundary band (default 2)")
    g.add_argument("--no-augment", action="store_true", help="switch all augmentation off")
    g.add_argument("--seed", type=int, help="default 0")


def _add_run_options(g) -> None:
    """The ``run`` group: the run folder, resuming, time budget, logging, validation, device."""
    g.add_argument("--out", metavar="RUN_DIR", help="run folder (keep it out of git, e.g. runs/NAME)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its last.pt")
    g.add_argument(
        "--time-budget",
        type=float,
        metavar="MINUTES",
        help="stop cleanly (validate, save) once this invocation has trained this long",
    )
    g.add_argument("--log-interval", type=int, metavar="N", help="steps per log.csv row (default 50)")
    g.add_argument("--val-interval", type=int, metavar="N", help="steps between validations (default 500)")
    g.add_argument("--val-volumes", type=int, metavar="N", help="validate on the first N volumes only")
    g.add_argument("--val-batch-size", type=int, metavar="N", help="slices per validation batch (default 16)")
    g.add_argument("--max-train-patients", type=int, metavar="N", help="train on the first N patients only")
    g.add_argument("--max-train-slices", type=int, metavar="N", help="train on N evenly chosen slices only")
    g.add_argument("--device", help="auto (default), cpu or cuda")
    g.add_argument("--amp", action="store_true", help="bfloat16 autocast on CUDA")
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch")
    g.add_argument(
        "--smoke",
        action="store_true",
        help="a few steps on a few slices with a tiny network (seconds): checks the whole path",
    )
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def train_parser() -> argparse.ArgumentParser:
    """The command line of ``cardseg train``, in its four option groups."""
    p = CommandLineParser(
        prog="cardseg train",
        description="Train a categorical-diffusion denoiser (primary or reference) into a run folder. "
        "'cardseg train export --help' builds a bundle from two runs.",
    )
    _add_data_options(p.add_argument_group("data"))
    _add_model_options(p.add_argument_group("model"))
    optimisation = p.add_argument_group("optimisation")
    _add_optimisation_options(optimisation)
    _add_loss_options(optimisation)
    _add_run_options(p.add_argument_group("run"))
    return p


def export_parser() -> argparse.ArgumentParser:
    p = CommandLineParser(
        prog="cardseg train export",
        description="Assemble a bundle (safetensors, fp16) from a primary and a reference run.",
    )
    p.add_argument(
        "--primary",
        required=True,
        metavar="RUN",
        help="primary run folder (a diffusion run trained with --role primary; or a plain segmentor run)",
    )
    p.add_argument(
        "--reference",
        required=True,
        metavar="RUN",
        help="reference run folder (a diffusion run trained with --role reference, warned about when it "
        "has more parameters than the primary; or a plain segmentor run)",
    )
    p.add_argument("-o", "--output", required=True, metavar="BUNDLE_DIR")
    p.add_argument(
        "--primary-checkpoint",
        default="best",
        choices=["best", "last"],
        help="default best (selected by validation Dice)",
    )
    p.add_argument(
        "--reference-checkpoint",
        default="last",
        choices=["best", "last"],
        help="default last (the reference's length is fixed a priori, not selected)",
    )
    p.add_argument("--name", default="acdc")
    p.add_argument("--version", default="0.1.0")
    p.add_argument("--fp32", action="store_true", help="keep float32 weights")
    p.add_argument("--overwrite", action="store_true")
    return p


def config_from_args(a: argparse.Namespace):
    """``(TrainConfig, names of the fields set on the command line)``."""
    from cardseg_train.data.augment import AugmentConfig
    from cardseg_train.training.config import TrainConfig, class_list, smoke_config

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
    from cardseg_train.training.loop import train
    from cardseg_train.training.config import TrainConfig

    a = train_parser().parse_args(argv)
    if not a.out:
        raise CardsegError("--out RUN_DIR is required (a folder outside git, e.g. runs/primary)")
    config, explicit = config_from_args(a)
    if a.resume:
        # start from nothing: every unset flag means "as saved"; resumable ones default to the saved value too
        from cardseg_train.training.config import RESUMABLE, read_run_config

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
    print(
        f"{a.out}: {summary['steps_done']} steps ({summary['stopped_by']}), {summary['elapsed_s']:.0f} s, "
        f"best validation Dice {dice}"
    )
    return 0


def cmd_export(argv: List[str]) -> int:
    from cardseg_train.training.export import ExportOptions, export_bundle

    a = export_parser().parse_args(argv)
    options = ExportOptions(
        name=a.name,
        version=a.version,
        primary_checkpoint=a.primary_checkpoint,
        reference_checkpoint=a.reference_checkpoint,
        overwrite=a.overwrite,
        fp16=not a.fp32,
    )
    path = export_bundle(a.primary, a.reference, a.output, options)
    cfg = json.loads((Path(path) / "bundle.json").read_text(encoding="utf-8"))
    prov = cfg["provenance"]["training"]
    print(
        f"wrote bundle {path}: primary {prov['primary']['network']} (step {prov['primary']['checkpoint_step']}), "
        f"reference {prov['reference']['network']} (step {prov['reference']['checkpoint_step']})"
    )
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


def _lazy(module: str, name: str):
    """A command of another CLI module of this package, imported only when it runs."""

    def run(argv: List[str]) -> int:
        import importlib

        return getattr(importlib.import_module(f".{module}", __package__), name)(argv)

    return run


COMMANDS = {
    "train": command_train,
    "evaluate": _lazy("evaluate", "command_evaluate"),
    "fit-calibration": _lazy("fit", "command_fit_calibration"),
    "fit-review": _lazy("fit", "command_fit_review"),
    "fit-indices": _lazy("fit", "command_fit_indices"),
    "compare": _lazy("compare", "command_compare"),
    "ablate": _lazy("compare", "command_ablate"),
}


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
