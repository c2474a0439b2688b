"""Slice preprocessing and the mapping between a slice's own grid and the network grid.

Training and inference share these functions, so the network always sees slices the same
way: intensities scaled per slice, then resampled to the bundle's pixel spacing on an
``N x N`` grid centred on the slice (which crops or pads as needed).

The grid is axis-aligned, so each resampling is one :func:`scipy.ndimage.affine_transform` per
map with a diagonal matrix, linear (``order=1``; nearest, ``order=0``, for label maps): onto the
network grid with zeros outside the slice (``mode="grid-constant"``), back onto the slice with the
network grid's border values repeated (``mode="nearest"``). That is what torch's ``grid_sample``
with ``align_corners=True`` and zeros or border padding computes; here it needs no torch, so the
ONNX Runtime path of ``cardseg segment`` never imports it, and every backend resamples alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import ndimage

if TYPE_CHECKING:
    import torch


def normalize_slice(img: np.ndarray, low: float = 0.5, high: float = 99.5) -> np.ndarray:
    """Per-slice robust min-max: clip to the ``[low, high]`` percentiles, scale to ``[0, 1]``.

    img: ``(Y, X)`` → float32 ``(Y, X)``; a constant slice becomes zeros.
    """
    img = np.asarray(img, dtype=np.float32)
    lo, hi = np.percentile(img, [low, high])
    if hi <= lo:
        lo, hi = float(img.min()), float(img.max())
    if hi <= lo:
        return np.zeros_like(img)
    return np.clip((img - lo) / (hi - lo), 0.0, 1.0).astype(np.float32)


def normalize_volume(vol: np.ndarray, low: float = 0.5, high: float = 99.5) -> np.ndarray:
    """:func:`normalize_slice` applied to each slice of ``(Z, Y, X)``."""
    return np.stack([normalize_slice(s, low, high) for s in vol]).astype(np.float32)


@dataclass(frozen=True)
class SliceGrid:
    """Axis-aligned map between a slice grid and the centred ``size x size`` network grid.

    slice_shape: ``(ny, nx)``; spacing: in-plane ``(sx, sy)`` in mm (SimpleITK order: i then j);
    target_spacing: network pixel size in mm; size: network side ``N``.
    """

    slice_shape: tuple
    spacing: tuple
    target_spacing: float
    size: int

    def _scale(self):
        ny, nx = self.slice_shape
        sx, sy = self.spacing
        return ny, nx, sx, sy, float(self.target_spacing), int(self.size)

    def to_network_grid(self) -> tuple:
        """Where network pixel ``(r, c)`` lies in the slice, in slice pixels: ``(scale, offset)``,
        each ``(y, x)``, so that its row is ``offset[0] + r * scale[0]`` (the centres coincide)."""
        ny, nx, sx, sy, s, n = self._scale()
        return (s / sy, s / sx), ((ny - 1) / 2 - (n - 1) / 2 * s / sy, (nx - 1) / 2 - (n - 1) / 2 * s / sx)

    def from_network_grid(self) -> tuple:
        """Where slice pixel ``(y, x)`` lies in the network grid, in network pixels:
        ``(scale, offset)``, each ``(y, x)``, the inverse of :meth:`to_network_grid`."""
        ny, nx, sx, sy, s, n = self._scale()
        return (sy / s, sx / s), ((n - 1) / 2 - (ny - 1) / 2 * sy / s, (n - 1) / 2 - (nx - 1) / 2 * sx / s)

    def field_of_view(self) -> np.ndarray:
        """Bool ``(ny, nx)``: slice pixels whose centre falls inside the network grid."""
        ny, nx, sx, sy, s, n = self._scale()
        ax = (n - 1) / 2 + (np.arange(nx) - (nx - 1) / 2) * sx / s
        ay = (n - 1) / 2 + (np.arange(ny) - (ny - 1) / 2) * sy / s
        inside_x = (ax >= -0.5) & (ax <= n - 0.5)
        inside_y = (ay >= -0.5) & (ay <= n - 0.5)
        return inside_y[:, None] & inside_x[None, :]

    def antialias_sigma(self) -> tuple:
        """Gaussian sigma (pixels, ``(y, x)``) applied before downsampling, 0 when upsampling."""
        _, _, sx, sy, s, _ = self._scale()
        return (max(0.0, s / sy - 1.0) * 0.5, max(0.0, s / sx - 1.0) * 0.5)


def _resample(maps: np.ndarray, placement: tuple, shape: tuple, order: int, mode: str) -> np.ndarray:
    """Each ``(H, W)`` map of ``maps`` ``(..., H, W)`` sampled at ``offset + index * scale``
    (``placement`` = ``(scale, offset)``, each ``(y, x)``) → float32 ``(..., *shape)``."""
    scale, offset = placement
    flat = maps.reshape((-1,) + maps.shape[-2:])
    out = np.empty((flat.shape[0],) + tuple(shape), np.float32)
    for src, dst in zip(flat, out):
        ndimage.affine_transform(src, np.asarray(scale), offset=offset, output_shape=tuple(shape), output=dst,
                                 order=order, mode=mode, cval=0.0, prefilter=False)
    return out.reshape(maps.shape[:-2] + tuple(shape))


def resample_to_network(slices: np.ndarray, grid: SliceGrid, mode: str = "bilinear") -> np.ndarray:
    """Resample slices ``(B, Y, X)`` onto the network grid → numpy ``(B, 1, N, N)`` float32 (zero outside).

    Anti-aliased (a Gaussian of :meth:`SliceGrid.antialias_sigma`) when the grid is coarser;
    ``mode="nearest"`` is for label maps (no anti-aliasing then).
    """
    if mode not in ("bilinear", "nearest"):
        raise ValueError(f"unknown resampling mode {mode!r} (bilinear or nearest)")
    arr = np.asarray(slices, dtype=np.float32)
    sigma = grid.antialias_sigma()
    if mode != "nearest" and max(sigma) > 0:
        arr = np.stack([ndimage.gaussian_filter(s, sigma=sigma, mode="nearest") for s in arr])
    n = int(grid.size)
    out = _resample(arr, grid.to_network_grid(), (n, n), 0 if mode == "nearest" else 1, "grid-constant")
    return out[:, None]


def slices_to_network(slices: np.ndarray, grid: SliceGrid, mode: str = "bilinear") -> "torch.Tensor":
    """:func:`resample_to_network` as a torch tensor ``(B, 1, N, N)`` (for training)."""
    import torch

    return torch.from_numpy(resample_to_network(slices, grid, mode))


def network_to_slices(maps: np.ndarray, grid: SliceGrid) -> np.ndarray:
    """Resample network-grid maps ``(B, C, N, N)`` (numpy, or a CPU tensor) back to the slice grid
    → numpy ``(B, C, ny, nx)`` float32.

    Bilinear, clamped at the border; callers overwrite pixels outside :meth:`SliceGrid.field_of_view`.
    """
    return _resample(np.asarray(maps, dtype=np.float32), grid.from_network_grid(), tuple(grid.slice_shape), 1,
                     "nearest")
