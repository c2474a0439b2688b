"""The label-preserving perturbations of the calibration pool (CalibNet's photometric set).

Applied to the engine-normalised ``[0, 1]`` slices, i.e. the network's input scale: applied
before the engine's per-slice robust min-max normalisation, a contrast factor below 1 would be
undone exactly. Images of any shape; results float32.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

#: the label-preserving perturbations of the fitting pool (CalibNet's photometric set)
PERTURBATIONS = ("contrast", "gamma", "noise")
#: pool variants per source-validation volume: the original and one of each perturbation
POOL_VARIANTS = ("clean",) + PERTURBATIONS
#: contrast factor c: ``x' = m + c (x - m)`` about the image mean m, clipped to [0, 1]
CONTRAST_RANGE = (0.6, 1.5)
#: gamma g: ``x' = x ** g``
GAMMA_RANGE = (0.6, 1.5)
#: additive Gaussian noise: sigma drawn from these levels (CalibNet used 0.15 only; the milder
#: levels keep part of the pool near the source distribution), not clipped
NOISE_SIGMAS = (0.05, 0.10, 0.15)


def perturbation_params(kind: str, rng: np.random.Generator) -> Dict[str, float]:
    """Draw one perturbation's parameters (JSON-able)."""
    if kind == "contrast":
        return {"contrast": float(rng.uniform(*CONTRAST_RANGE))}
    if kind == "gamma":
        return {"gamma": float(rng.uniform(*GAMMA_RANGE))}
    if kind == "noise":
        return {"sigma": float(NOISE_SIGMAS[rng.integers(len(NOISE_SIGMAS))])}
    raise ValueError(f"unknown perturbation {kind!r} (choose from {', '.join(PERTURBATIONS)})")


def apply_perturbation(
    img01: np.ndarray, kind: str, params: Dict[str, float], rng: Optional[np.random.Generator] = None
) -> np.ndarray:
    """Apply a perturbation to an image scaled to ``[0, 1]`` (any shape); float32 result.

    contrast: ``clip(m + c (x - m), 0, 1)`` with m the image mean; gamma: ``clip(x, 0, 1) ** g``;
    noise: ``x + N(0, sigma²)`` per pixel (noise drawn from ``rng``), not clipped.
    """
    x = np.asarray(img01, dtype=np.float32)
    if kind == "contrast":
        m = float(x.mean())
        return np.clip(m + params["contrast"] * (x - m), 0.0, 1.0).astype(np.float32)
    if kind == "gamma":
        return (np.clip(x, 0.0, 1.0) ** params["gamma"]).astype(np.float32)
    if kind == "noise":
        rng = rng if rng is not None else np.random.default_rng(0)
        return (x + rng.normal(0.0, params["sigma"], x.shape)).astype(np.float32)
    raise ValueError(f"unknown perturbation {kind!r} (choose from {', '.join(PERTURBATIONS)})")


def perturb_image(img01: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """One label-preserving perturbation (``contrast``, ``gamma`` or ``noise``) of a
    ``[0, 1]``-scaled image or volume (the engine's normalised network input), parameters
    drawn once from ``rng`` (seed it per volume, e.g. with
    :func:`cardseg_train.data.corruptions.corruption_rng`)."""
    return apply_perturbation(img01, kind, perturbation_params(kind, rng), rng)
