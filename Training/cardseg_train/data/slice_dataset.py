"""Labelled slices on the network grid, mapped exactly as inference maps them.

:class:`SliceDataset` turns :class:`~cardseg_train.data.datasets.SliceRecord` items into tensors on
the network grid with the engine's own preprocessing
(:func:`cardseg.io.preprocess.normalize_slice`, then :class:`~cardseg.io.preprocess.SliceGrid`
and :func:`~cardseg.io.preprocess.slices_to_network`; labels with ``mode="nearest"``), computed
once and kept in memory.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from cardseg.base.errors import CardsegError
from cardseg.io.preprocess import SliceGrid, normalize_slice, slices_to_network

from cardseg_train.data.datasets import SliceRecord


def map_to_network(
    images: np.ndarray,
    labels: np.ndarray,
    spacing: Tuple[float, float],
    target_spacing: float,
    size: int,
    low: float = 0.5,
    high: float = 99.5,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Slices ``(B, Y, X)`` of one shape and spacing → network grid, exactly as inference maps them.

    Returns image ``(B, 1, N, N)`` float32 (per-slice percentile normalisation, anti-aliased
    bilinear resampling, zero outside) and label ``(B, N, N)`` uint8 (nearest neighbour,
    background outside).
    """
    images = np.asarray(images)
    grid = SliceGrid(tuple(images.shape[1:]), tuple(float(s) for s in spacing), float(target_spacing), int(size))
    norm = np.stack([normalize_slice(s, low, high) for s in images])
    x = slices_to_network(norm, grid)
    y = slices_to_network(np.asarray(labels, dtype=np.float32), grid, mode="nearest")[:, 0]
    return x, y.round().to(torch.uint8)


class SliceDataset(Dataset):
    """Labelled slices on the network grid, precomputed once and held in memory.

    ``ds[i]`` is ``(image (1, N, N) float32, label (N, N) int64)``. Also exposes the whole
    tensors as ``images`` ``(n, 1, N, N)`` and ``labels`` ``(n, N, N)`` uint8 (the trainer
    samples batches from them directly), and ``cases`` (each slice's case id).
    """

    def __init__(
        self,
        records: Sequence[SliceRecord],
        target_spacing: float,
        size: int,
        low: float = 0.5,
        high: float = 99.5,
        num_classes: Optional[int] = None,
    ):
        if not records:
            raise CardsegError("no labelled slices to train or validate on")
        self.target_spacing, self.size = float(target_spacing), int(size)
        self.low, self.high = float(low), float(high)
        n = len(records)
        self.images = torch.zeros((n, 1, size, size), dtype=torch.float32)
        self.labels = torch.zeros((n, size, size), dtype=torch.uint8)
        # one resampling call per (shape, spacing) group: same result, far fewer calls
        groups: Dict[tuple, List[int]] = {}
        for i, r in enumerate(records):
            if r.image.shape != r.label.shape or r.image.ndim != 2:
                raise CardsegError(f"{r.case} slice {r.index}: image {r.image.shape} and label {r.label.shape} differ")
            groups.setdefault((r.image.shape, tuple(r.spacing)), []).append(i)
        for (shape, sp), idx in groups.items():
            for j in range(0, len(idx), 64):
                part = idx[j : j + 64]
                x, y = map_to_network(
                    np.stack([records[i].image for i in part]),
                    np.stack([records[i].label for i in part]),
                    sp,
                    self.target_spacing,
                    self.size,
                    self.low,
                    self.high,
                )
                self.images[part] = x
                self.labels[part] = y
        self.cases = [r.case for r in records]
        self.patients = sorted({r.patient for r in records})
        found = int(max(int(r.label.max()) for r in records)) + 1
        self.num_classes = int(num_classes) if num_classes else found
        if found > self.num_classes:
            raise CardsegError(f"labels go up to {found - 1}, more than {self.num_classes} classes allow")

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i].long()

    def volumes(self) -> List[Tuple[str, torch.Tensor, torch.Tensor]]:
        """``[(case, images (Z, 1, N, N), labels (Z, N, N)), ...]`` grouped by case, for validation."""
        groups: "OrderedDict[str, List[int]]" = OrderedDict()
        for i, c in enumerate(self.cases):
            groups.setdefault(c, []).append(i)
        return [(c, self.images[idx], self.labels[idx]) for c, idx in groups.items()]

    def subset(self, indices: Sequence[int]) -> "SliceDataset":
        """A view-like copy holding only ``indices`` (smoke runs)."""
        out = object.__new__(SliceDataset)
        out.__dict__.update(self.__dict__)
        idx = list(indices)
        out.images, out.labels = self.images[idx].clone(), self.labels[idx].clone()
        out.cases = [self.cases[i] for i in idx]
        return out
