"""Things made from nothing: untrained bundles (for tests and new tasks) and synthetic volumes."""

from __future__ import annotations

import os
from typing import Optional, Tuple

import numpy as np
import torch

from .bundle import default_config, save_bundle
from .networks import build_network
from .volume import Volume

ACDC_CLASSES = [
    {"name": "background", "color": [0.0, 0.0, 0.0]},
    {"name": "RV", "color": [0.30, 0.55, 0.90]},
    {"name": "MYO", "color": [0.95, 0.75, 0.25]},
    {"name": "LV", "color": [0.90, 0.30, 0.30]},
]


def parse_network(text: str) -> dict:
    """``"time-unet:micro"`` or ``"time-swinunetr:mini"`` → a network spec."""
    arch, _, size = text.partition(":")
    return {"arch": arch, "size": size or ("mini" if arch == "time-swinunetr" else "tiny")}


def init_bundle(path: os.PathLike, primary: str = "time-unet:tiny", reference: str = "time-unet:micro",
                input_size: int = 64, pixel_spacing_mm: float = 3.0, seed: int = 0, name: str = "untrained",
                overwrite: bool = False, sampled_steps: Optional[list] = None) -> os.PathLike:
    """Write a bundle with randomly initialised (untrained, seeded) networks and ACDC classes.

    Meant for tests and as the starting point of training on a new task: it exercises the
    whole pipeline but segments nothing meaningful.
    """
    torch.manual_seed(seed)
    specs = {"primary": parse_network(primary), "reference": parse_network(reference)}
    nets = {role: build_network({**spec, "num_classes": len(ACDC_CLASSES)}) for role, spec in specs.items()}
    for net in nets.values():
        _randomize_zero_weights(net)
    config = default_config(name, ACDC_CLASSES, specs["primary"], specs["reference"], pixel_spacing_mm, input_size,
                            sampled_steps=sampled_steps)
    config["provenance"] = {"training": "none (randomly initialised)", "seed": seed}
    return save_bundle(path, config, nets["primary"], nets["reference"], fp16=False, overwrite=overwrite)


def _randomize_zero_weights(net: torch.nn.Module, std: float = 0.05) -> None:
    """Give zero-initialised layers (output convolutions, FiLM) small random weights.

    Those layers make a freshly built denoiser output constant logits; an untrained test
    bundle should instead produce varied labels and disagreement so tests see real data flow.
    """
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() > 1 and not p.any():
                p.normal_(0.0, std)


def synthetic_cine_volume(shape: Tuple[int, int, int] = (8, 192, 176), spacing=(1.5, 1.5, 8.0), seed: int = 0,
                          noise: float = 0.04) -> Tuple[Volume, np.ndarray]:
    """A short-axis cine-like volume with its label map (0 bg, 1 RV, 2 MYO, 3 LV).

    Body ellipse of soft tissue, a bright LV blood pool in a dark myocardial ring, a bright RV
    crescent beside it, shrinking from base to apex; smooth bias field and Rician-like noise.
    Returns ``(Volume, labels (Z, Y, X) uint8)``; intensities in arbitrary scanner-like units.
    """
    rng = np.random.default_rng(seed)
    z, ny, nx = shape
    sx, sy = spacing[0], spacing[1]
    yy, xx = np.mgrid[0:ny, 0:nx].astype(np.float32)
    ymm, xmm = (yy - ny / 2) * sy, (xx - nx / 2) * sx
    img = np.zeros(shape, np.float32)
    lab = np.zeros(shape, np.uint8)
    cx, cy = 8.0 + rng.uniform(-4, 4), -6.0 + rng.uniform(-4, 4)
    for k in range(z):
        f = 1.0 - 0.6 * k / max(z - 1, 1)  # base → apex
        body = ((xmm / (0.42 * nx * sx)) ** 2 + (ymm / (0.38 * ny * sy)) ** 2) <= 1
        r_lv, wall = 22.0 * f, 9.0 + 2.0 * (1 - f)
        d_lv = np.hypot(xmm - cx, ymm - cy)
        lv = d_lv <= r_lv
        myo = (d_lv > r_lv) & (d_lv <= r_lv + wall)
        d_rv = np.hypot((xmm - cx + 1.15 * (r_lv + wall) + 8) / 1.5, (ymm - cy) / 1.1)
        rv = (d_rv <= 20.0 * f) & ~lv & ~myo & (np.hypot(xmm - cx, ymm - cy) > r_lv + wall + 1.5)
        slice_img = np.where(body, 0.35, 0.02)
        slice_img = np.where(myo, 0.18, slice_img)
        slice_img = np.where(lv | rv, 0.85, slice_img)
        lab[k][rv], lab[k][myo], lab[k][lv] = 1, 2, 3
        img[k] = slice_img
    bias = 1.0 + 0.25 * np.sin(xx / nx * np.pi + rng.uniform(0, 1)) * np.cos(yy / ny * np.pi)
    img = img * bias[None]
    n1, n2 = rng.normal(0, noise, shape), rng.normal(0, noise, shape)
    img = np.sqrt((img + n1) ** 2 + n2 ** 2).astype(np.float32) * 1000.0
    vol = Volume(array=img, spacing=tuple(float(s) for s in spacing), origin=(0.0, 0.0, 0.0),
                 direction=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0))
    return vol, lab
