"""Things made from nothing: untrained bundles (for tests and new tasks) and synthetic volumes."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from scipy import ndimage

from cardseg.base.errors import CardsegError
from cardseg.base.options import check_int_range
from cardseg.bundle.fields import OptionWhere, integer_value, number_value
from cardseg.bundle.loading import default_config, save_bundle
from cardseg.bundle.schema import DISCRIMINATIVE_BACKBONES, INPUT_SIZE, NETWORK_SIZES, PIXEL_SPACING_MM
from cardseg.io.volume import Volume
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


def init_bundle(
    path: os.PathLike,
    primary: str = "time-unet:tiny",
    reference: str = "time-unet:micro",
    input_size: int = 64,
    pixel_spacing_mm: float = 3.0,
    seed: int = 0,
    name: str = "untrained",
    overwrite: bool = False,
    sampled_steps: Optional[list] = None,
) -> os.PathLike:
    """Write a bundle with randomly initialised (untrained, seeded) networks and ACDC classes.

    Meant for tests and as the starting point of training on a new task: it exercises the
    whole pipeline but segments nothing meaningful. ``path`` must be new or empty; with
    ``overwrite`` it may also be a bundle folder cardseg wrote (:func:`check_bundle_destination`).
    Both the options (:func:`check_init_options`) and the destination are checked before any
    work: a refusal is one line, and nothing is written or deleted.
    """
    specs = check_init_options(primary, reference, input_size, pixel_spacing_mm, seed)
    check_bundle_destination(path, overwrite)
    torch.manual_seed(seed)
    nets = {role: build_network({**spec, "num_classes": len(ACDC_CLASSES)}) for role, spec in specs.items()}
    for net in nets.values():
        _randomize_zero_weights(net)
    config = default_config(
        name,
        ACDC_CLASSES,
        specs["primary"],
        specs["reference"],
        pixel_spacing_mm,
        input_size,
        sampled_steps=sampled_steps,
    )
    config["provenance"] = {"training": "none (randomly initialised)", "seed": seed}
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


#: relative signal of each tissue in the synthetic bSSFP slice (fat, the brightest, is 1)
_TISSUE = {
    "fat": 1.0,  # subcutaneous rim
    "epi_fat": 0.95,  # epicardial/pericardial fat patches around the heart
    "muscle": 0.17,  # chest wall and back muscles, just inside the fat rim
    "soft": 0.21,  # mediastinum and other soft tissue inside the thorax
    "liver": 0.30,
    "lung": 0.035,  # nearly black ...
    "vessel": 0.30,  # ... with a few pulmonary vessels
    "spine": 0.45,  # vertebral body (fatty marrow)
    "aorta": 0.72,  # descending aorta, bright flowing blood
    "pericardium": 0.12,  # thin dark line around the heart
    "rv_wall": 0.17,  # RV free wall (not labelled, as in ACDC)
    "myo": 0.19,  # LV myocardium, septum included (label 2)
    "lv": 0.80,  # LV blood pool (label 3), +-6 % per seed
    "papillary": 0.25,  # dark spots in the LV pool, labelled LV as in ACDC
}
_RV_TO_LV = 0.88  # RV blood (label 1) relative to LV blood
_CHEST_MM = 250.0  # smaller fields of view get the anatomy scaled down to fit


def _ellipse(x, y, cx, cy, a, b):
    """Normalised elliptic radius: < 1 inside the ellipse centred (cx, cy) with semi-axes (a, b)."""
    return np.hypot((x - cx) / a, (y - cy) / b)


def _heart_slice(x, y, u, subj, mm_per_px):
    """The heart in one slice: ``(labels, masks, r_epi, t_rv)``.

    labels: uint8 (0 bg, 1 RV, 2 MYO, 3 LV); masks: the unlabelled heart tissue (``rv_wall``,
    ``pericardium``, ``epi_fat``) and the papillary muscles; r_epi: LV epicardial radius and t_rv:
    RV depth (mm), which the surrounding organs follow. x, y: in-plane coordinates (mm); u: 0 at the
    base .. 1 at the apex; subj: the seeded subject parameters; mm_per_px: (row, column) pixel size.
    """
    r_lv = subj["r_lv"] * np.sqrt(max(1.0 - (u / 1.12) ** 2, 0.0))  # LV cavity narrows to the apex
    r_epi = r_lv + subj["wall"] + 2.0 * u  # wall looks thicker apically
    t_rv = subj["t_rv"] * max(1.0 - u / 0.82, 0.0) ** 0.5  # RV ends before the LV
    d_lv = np.hypot(x - subj["hx"], y - subj["hy"])
    lab = np.zeros(x.shape, np.uint8)
    lab[d_lv <= r_epi] = 2
    lab[d_lv <= r_lv] = 3
    rv = np.zeros(x.shape, bool)
    if t_rv > 1.0:
        # RV: an ellipse reaching t_rv beyond the LV epicardium, minus the LV -> a crescent on the septum
        a, b, ang = 0.5 * (r_epi + t_rv), 1.35 * r_epi, subj["rv_dir"]
        c = r_epi + t_rv - a
        dx, dy = x - subj["hx"] - c * np.cos(ang), y - subj["hy"] - c * np.sin(ang)
        along, across = dx * np.cos(ang) + dy * np.sin(ang), -dx * np.sin(ang) + dy * np.cos(ang)
        rv = (np.hypot(along / a, across / b) <= 1.0) & (d_lv > r_epi)
        lab[rv] = 1
    rv_wall = np.zeros(x.shape, bool)
    if rv.any():
        rv_wall = (ndimage.distance_transform_edt(~rv, sampling=mm_per_px) <= 4.0) & (lab == 0)
    # epicardial/pericardial fat: a patchy band whose width varies around the heart
    out = ndimage.distance_transform_edt((lab == 0) & ~rv_wall, sampling=mm_per_px)
    phi, ph = np.arctan2(y - subj["hy"], x - subj["hx"]), subj["fat_phase"]
    fat_w = 4 * np.sin(2 * phi + ph[0]) + 2.5 * np.cos(3 * phi + ph[1]) + 2.5 * np.sin(5 * phi + ph[2]) + 1
    pericardium = (out > 0) & (out <= 1.5)
    fat = (out > 1.5) & (out <= 1.5 + fat_w)  # no fat where fat_w <= 0
    papillary = np.zeros(x.shape, bool)
    if u < 0.8:  # two papillary muscles on the free-wall side of the LV pool
        for da in (-0.9, 0.9):
            a = subj["rv_dir"] + np.pi + da
            px, py = subj["hx"] + 0.62 * r_lv * np.cos(a), subj["hy"] + 0.62 * r_lv * np.sin(a)
            papillary |= np.hypot(x - px, y - py) <= 0.16 * r_lv
    masks = {"rv_wall": rv_wall, "pericardium": pericardium, "epi_fat": fat, "papillary": papillary & (lab == 3)}
    return lab, masks, r_epi, t_rv


def synthetic_cine_volume(
    shape: Tuple[int, int, int] = (8, 192, 176), spacing=(1.5, 1.5, 8.0), seed: int = 0, noise: float = 0.03
) -> Tuple[Volume, np.ndarray]:
    """A procedural short-axis bSSFP cine-like stack with its label map (0 bg, 1 RV, 2 MYO, 3 LV).

    Slice 0 is the base, the last slice the apex. Each slice, in mm around the image centre
    (anatomy scaled down only when the field of view is under 250 mm), with signal relative to fat:

    * outside the body: air (0, noise only); body: an ellipse with a bright subcutaneous fat rim
      (1.0, 5-15 mm) over a dark-grey muscle layer (0.17); inside the thorax mid-grey soft tissue (0.21);
    * lungs (0.035, a few vessels at 0.3) hugging the heart laterally and anteriorly, the liver (0.30)
      below, rising towards the apex, a vertebral body (0.45) and the descending aorta (0.72);
    * LV: a round bright blood pool (0.80 +-6 %, label 3) with two dark papillary muscles (0.25,
      labelled LV) inside a dark-grey myocardial ring (0.19, label 2) 7.5-9 mm thick at the base;
    * RV: a crescent of blood (0.88 x LV, label 1) wrapped around the septal side of the LV, sharing
      the septum with the LV myocardium, behind an unlabelled 4 mm free wall (0.17);
    * a thin dark pericardial line (0.12) and patchy epicardial/pericardial fat (0.95) around the heart.

    From base to apex the LV narrows, its wall looks thicker, and the RV thins out and is gone in
    the apical ~20 % of slices. Heart position, size, RV direction, fat pattern and blood signal
    vary with ``seed``. Then: smooth tissue texture (+-6 %), a Gaussian point-spread blur
    (0.7 px, partial-volume edges), a coil-like bias field (linear gradient up to +-18 %, 12 %
    central-to-peripheral fall-off) and Rician noise of standard deviation ``noise`` (fraction of
    the fat signal). Deterministic per seed.

    Returns ``(Volume, labels (Z, Y, X) uint8)``; intensities in scanner-like units (fat ~ 1000).
    """
    rng = np.random.default_rng(seed)
    nz, ny, nx = shape
    sx, sy = float(spacing[0]), float(spacing[1])
    scale = min(1.0, nx * sx / _CHEST_MM, ny * sy / _CHEST_MM)
    yy, xx = np.mgrid[0:ny, 0:nx].astype(np.float32)
    xmm, ymm = (xx - (nx - 1) / 2) * sx / scale, (yy - (ny - 1) / 2) * sy / scale
    rot = np.deg2rad(rng.uniform(-8, 8))  # the whole chest, slightly rotated
    x, y = np.cos(rot) * xmm + np.sin(rot) * ymm, -np.sin(rot) * xmm + np.cos(rot) * ymm
    subj = {
        "hx": rng.uniform(-6, 10),
        "hy": rng.uniform(-14, 2),  # LV centre (mm)
        "r_lv": rng.uniform(23, 27),
        "wall": rng.uniform(7.5, 9.0),  # basal LV radius, wall
        "t_rv": rng.uniform(18, 24),
        "rv_dir": np.deg2rad(rng.uniform(150, 170)),  # RV depth, side
        "fat_phase": rng.uniform(0, 2 * np.pi, 3),
    }
    rim_phase = rng.uniform(0, 2 * np.pi)
    lv_blood = _TISSUE["lv"] * rng.uniform(0.94, 1.06)
    vessel_xy = rng.uniform(-1, 1, (14, 2)) * (110, 90)
    tissue = dict(_TISSUE, lv=lv_blood, rv=lv_blood * _RV_TO_LV)

    body = _ellipse(x, y, 0, 12, 150, 128)
    thorax = _ellipse(x, y, 0, 10, 118, 100) < 1
    fat_rim = (body < 1) & (body > 1 - (9 + 4 * np.sin(2 * np.arctan2(y, x) + rim_phase)) / 128)
    vessels = np.zeros(x.shape, bool)
    for vx, vy in vessel_xy:
        vessels |= np.hypot(x - vx, y - vy) < 2.5
    hx, hy = subj["hx"], subj["hy"]
    spine = _ellipse(x, y, hx + 20, hy + 95, 20, 16) < 1
    aorta = np.hypot(x - hx - 28, y - hy - 62) < 11
    img = np.zeros(shape, np.float32)
    lab = np.zeros(shape, np.uint8)
    for k in range(nz):
        u = k / max(nz - 1, 1)
        lab[k], heart, r_epi, t_rv = _heart_slice(x, y, u, subj, (sy / scale, sx / scale))
        lungs = thorax & (
            (_ellipse(x, y, hx + r_epi + 46, hy - 5, 44, 72) < 1)
            | (_ellipse(x, y, hx - 60, hy - 45 - 0.3 * t_rv, 55, 38) < 1)
        )
        liver = thorax & (_ellipse(x, y, -55, 95 - 20 * u, 95, 55) < 1)
        layers = [
            (body < 1, "muscle"),
            (fat_rim, "fat"),
            (thorax, "soft"),
            (lungs, "lung"),
            (lungs & vessels, "vessel"),
            (liver, "liver"),
            (spine, "spine"),
            (aorta, "aorta"),
            (lab[k] == 2, "myo"),
            (lab[k] == 1, "rv"),
            (lab[k] == 3, "lv"),
        ]
        layers += [(heart[name], name) for name in ("epi_fat", "pericardium", "rv_wall", "papillary")]
        for mask, name in layers:  # later layers paint over earlier ones
            img[k][mask] = tissue[name]
    texture = ndimage.gaussian_filter(rng.normal(0, 1, shape).astype(np.float32), (0, 3, 3))
    img *= 1 + 0.06 * texture / max(float(texture.std()), 1e-6)
    img = ndimage.gaussian_filter(img, (0, 0.7, 0.7))
    g = rng.uniform(-1, 1, 2)
    bias = 1 + 0.18 * (g[0] * xmm + g[1] * ymm) / 150 - 0.12 * (xmm**2 + ymm**2) / 150**2
    img *= bias[None].astype(np.float32)
    n1, n2 = rng.normal(0, noise, shape), rng.normal(0, noise, shape)
    img = np.sqrt((img + n1) ** 2 + n2**2).astype(np.float32) * 1000.0
    vol = Volume(
        array=img,
        spacing=tuple(float(s) for s in spacing),
        origin=(0.0, 0.0, 0.0),
        direction=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0),
    )
    return vol, lab
