"""Untrained bundles made from nothing (for tests and new tasks), and the checks of where a bundle is
written. The synthetic volume is :func:`cardseg.bundle.phantom.synthetic_cine_volume`."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import torch

from cardseg.base.errors import CardsegError
from cardseg.base.options import check_int_range
from cardseg.bundle.fields import OptionWhere, integer_value, number_value
from cardseg.bundle.loading import BundleSpec, default_config, save_bundle
from cardseg.bundle.schema import DISCRIMINATIVE_BACKBONES, INPUT_SIZE, NETWORK_SIZES, PIXEL_SPACING_MM
from cardseg.method.networks import build_network

ACDC_CLASSES = [
    {"name": "background", "color": [0.0, 0.0, 0.0]},
    {"name": "RV", "color": [0.30, 0.55, 0.90]},
    {"name": "MYO", "color": [0.95, 0.75, 0.25]},
    {"name": "LV", "color": [0.90, 0.30, 0.30]},
]


def parse_network(text: str) -> dict:
    """``"time-unet:micro"``, ``"time-swinunetr:mini"`` or, for the plain segmentors,
    ``"discriminative:swinunetr-tiny"`` / ``"discriminative:unet"`` → a network spec.

    An architecture, size or backbone the bundle schema (:data:`cardseg.bundle.schema.NETWORK_SIZES`,
    kept equal to the network registry by a test) does not know is a one-line :class:`ValueError`
    that lists the allowed values.
    """
    arch, _, size = text.partition(":")
    if arch not in NETWORK_SIZES:
        raise ValueError(f"unknown architecture {arch!r} (give ARCH:SIZE, ARCH one of {', '.join(NETWORK_SIZES)})")
    if arch == "discriminative":
        return _discriminative_spec(size or "swinunetr")
    if size and size not in NETWORK_SIZES[arch]:
        raise ValueError(f"unknown {arch} size {size!r} (choose from {', '.join(NETWORK_SIZES[arch])})")
    return {"arch": arch, "size": size or ("mini" if arch == "time-swinunetr" else "tiny")}


def _discriminative_spec(backbone_size: str) -> dict:
    """``"unet"``, ``"swinunetr"`` or ``"swinunetr-SIZE"`` → a discriminative spec."""
    from cardseg.method.networks import SWIN_SIZES

    backbone, _, width = backbone_size.partition("-")
    forms = ", ".join([*DISCRIMINATIVE_BACKBONES, *(f"swinunetr-{w}" for w in SWIN_SIZES)])
    if backbone not in DISCRIMINATIVE_BACKBONES:
        raise ValueError(f"unknown discriminative backbone {backbone!r} (choose from {forms})")
    spec = {"arch": "discriminative", "backbone": backbone}
    if backbone == "swinunetr":
        spec["feature_size"] = SWIN_SIZES.get(width or "mini", 0)
        if not spec["feature_size"]:
            raise ValueError(f"unknown SwinUNETR size {width!r} (choose from {', '.join(SWIN_SIZES)})")
    elif width:
        raise ValueError(f"discriminative:{backbone} takes no size (choose from {forms})")
    return spec


#: the seeds :func:`init_bundle` takes (as ``cardseg synth``)
MAX_SEED = 2**32 - 1


def check_init_options(
    primary: str, reference: str, input_size: int, pixel_spacing_mm: float, seed: int
) -> Dict[str, dict]:
    """Refuse, in one :class:`CardsegError` line naming the ``cardseg init-bundle`` option, what the
    bundle loader would refuse in the bundle :func:`init_bundle` writes; returns the network specs.

    The rules are the loader's own: the networks and sizes of the bundle schema, its ranges of
    ``input_size`` and ``pixel_spacing_mm`` (:mod:`cardseg.bundle.schema`), and
    :func:`cardseg.method.networks.size_multiple`, which the loader checks ``input_size`` against.
    """
    from cardseg.method.networks import size_multiple

    opts = OptionWhere()
    specs = {}
    for role, text in (("primary", primary), ("reference", reference)):
        try:
            specs[role] = parse_network(text)
        except ValueError as exc:
            raise CardsegError(f"--{role} {text}: {exc}") from None
    integer_value(opts, "--input-size", input_size, low=INPUT_SIZE[0], high=INPUT_SIZE[1])
    need = {role: size_multiple(spec) for role, spec in specs.items()}
    multiple = math.lcm(*need.values())
    if input_size % multiple:
        why = ", ".join(
            f"{role} {text} needs {need[role]}" for role, text in (("primary", primary), ("reference", reference))
        )
        opts.fail("--input-size", f"must be a multiple of {multiple} ({why}) (got {input_size})")
    number_value(opts, "--spacing", pixel_spacing_mm, low=PIXEL_SPACING_MM[0], high=PIXEL_SPACING_MM[1])
    check_int_range("--seed", seed, 0, MAX_SEED)
    return specs


@dataclass(frozen=True)
class InitOptions:
    """What :func:`init_bundle` builds.

    primary, reference: the networks as ``ARCH:SIZE`` (:func:`parse_network`); input_size: the
    network grid's side in pixels; pixel_spacing_mm: its pixel spacing in mm; seed: the seed of the
    random weights (0 to :data:`MAX_SEED`); name: the bundle's ``id.name``; sampled_steps: the
    diffusion steps the trajectory samples (``None``: the default steps of the horizon)."""

    primary: str = "time-unet:tiny"
    reference: str = "time-unet:micro"
    input_size: int = 64
    pixel_spacing_mm: float = 3.0
    seed: int = 0
    name: str = "untrained"
    sampled_steps: Optional[List[int]] = None


def init_bundle(path: os.PathLike, options: Optional[InitOptions] = None, overwrite: bool = False) -> os.PathLike:
    """Write a bundle with randomly initialised (untrained, seeded) networks and ACDC classes, as
    ``options`` say (``None``: :class:`InitOptions` defaults).

    Meant for tests and as the starting point of training on a new task: it exercises the
    whole pipeline but segments nothing meaningful. ``path`` must be new or empty; with
    ``overwrite`` it may also be a bundle folder cardseg wrote (:func:`check_bundle_destination`).
    Both the options (:func:`check_init_options`) and the destination are checked before any
    work: a refusal is one line, and nothing is written or deleted.
    """
    o = options or InitOptions()
    specs = check_init_options(o.primary, o.reference, o.input_size, o.pixel_spacing_mm, o.seed)
    check_bundle_destination(path, overwrite)
    torch.manual_seed(o.seed)
    nets = {role: build_network({**spec, "num_classes": len(ACDC_CLASSES)}) for role, spec in specs.items()}
    for net in nets.values():
        _randomize_zero_weights(net)
    config = default_config(
        BundleSpec(
            o.name,
            ACDC_CLASSES,
            specs["primary"],
            specs["reference"],
            o.pixel_spacing_mm,
            o.input_size,
            sampled_steps=o.sampled_steps,
        )
    )
    config["provenance"] = {"training": "none (randomly initialised)", "seed": o.seed}
    return save_bundle(path, config, nets["primary"], nets["reference"], fp16=False, overwrite=overwrite)


#: files an operating system drops into folders by itself
_SYSTEM_FILES = (".DS_Store", "Thumbs.db", "desktop.ini")


def check_bundle_destination(path: os.PathLike, overwrite: bool = False) -> None:
    """Refuse (one-line :class:`CardsegError`) a bundle destination that writing would lose data in.

    Accepted: a path that does not exist yet (below a folder); an empty folder; with ``overwrite``,
    a folder that holds exactly a bundle cardseg wrote: ``bundle.json`` naming its weight files,
    those files with the sha256 it records, and nothing else. Refused: a file or symbolic link at
    ``path`` or in the place of a folder above it; any other non-empty folder (with or without
    ``overwrite``); a bundle without ``overwrite``.
    """
    import json

    from cardseg.base.files import sha256_file

    dest = Path(os.path.abspath(os.fspath(path)))
    if dest.is_symlink():
        raise CardsegError(f"{dest}: is a symbolic link; give the folder itself")
    if dest.exists() and not dest.is_dir():
        raise CardsegError(f"{dest}: exists and is not a folder")
    if not dest.exists():
        above = next(p for p in dest.parents if p.exists() or p.is_symlink())
        if not above.is_dir():
            raise CardsegError(f"{dest}: cannot be made, {above} exists and is not a folder")
        return
    present = sorted(p.name for p in dest.iterdir() if p.name not in _SYSTEM_FILES)
    if not present:
        return
    try:
        config = json.loads((dest / "bundle.json").read_text(encoding="utf-8"))
        files = {spec["file"]: spec["sha256"] for spec in config["networks"].values()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        files = None
    own = (
        files is not None
        and sorted(present) == sorted({"bundle.json", *files})
        and all(not (dest / n).is_symlink() and (dest / n).is_file() for n in present)
        and all(isinstance(n, str) and sha256_file(dest / n) == h for n, h in files.items())
    )
    if not own:
        raise CardsegError(
            f"{dest}: folder is not empty and does not hold a bundle cardseg wrote; "
            "it is never replaced, choose a new or empty folder"
        )
    if not overwrite:
        raise CardsegError(f"{dest}: holds a bundle already (use --overwrite to replace it)")


def _randomize_zero_weights(net: torch.nn.Module, std: float = 0.05) -> None:
    """Give zero-initialised layers (output convolutions, FiLM) small random weights.

    Those layers make a freshly built denoiser output constant logits; an untrained test
    bundle should instead produce varied labels and disagreement so tests see real data flow.
    """
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() > 1 and not p.any():
                p.normal_(0.0, std)
