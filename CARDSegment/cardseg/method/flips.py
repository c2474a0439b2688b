"""Flipped copies of a volume: undoing a flip, and how much the runs on them disagree (numpy).

Not part of the paper's method: a measured candidate for the review map
(``Training/results/acdc-2.3.0/flip-study``). The primary is trained with row and column flips,
so the same volume flipped is an input it knows; where its terminal predictions on the flipped
copies disagree, its answer is unstable.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: the in-plane flips of a ``(Z, Y, X)`` volume: none, rows (Y), columns (X), both
FLIPS = ((), (1,), (2,), (1, 2))


def unflip(a: np.ndarray, flip: Sequence[int], spatial_axes: Sequence[int] = (0, 1, 2)) -> np.ndarray:
    """``a`` flipped along the axes of ``flip`` (axes of a ``(Z, Y, X)`` volume, found at
    ``spatial_axes`` of ``a``, e.g. ``(0, 2, 3)`` for logits ``(Z, K, Y, X)``). A flip is its own
    inverse, so this both makes a flipped copy and undoes it."""
    return np.flip(a, axis=tuple(spatial_axes[f] for f in flip)) if flip else a


def flip_disagreement(probs: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Generalised Jensen-Shannon divergence of ``F`` runs' class distributions, per voxel: the
    entropy of their mean minus their mean entropy (nats; 0 where all agree, at most ``ln F``).

    probs: ``(F, Z, K, Y, X)`` (each run's distribution on the same voxels) → ``(Z, Y, X)`` float32."""
    p = np.asarray(probs, dtype=np.float64)

    def entropy(q):
        return -(q * np.log(np.clip(q, eps, 1.0))).sum(axis=-3)  # over K

    return np.clip(entropy(p.mean(axis=0)) - entropy(p).mean(axis=0), 0.0, None).astype(np.float32)
