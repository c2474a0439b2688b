"""Slice preprocessing and the mapping between a slice's own grid and the network grid.

Training and inference share these functions, so the network always sees slices the same
way: intensities scaled per slice, then resampled to the bundle's pixel spacing on an
``N x N`` grid centred on the slice (which crops or pads as needed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage


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

    def to_network_grid(self) -> torch.Tensor:
        """``grid_sample`` grid ``(1, N, N, 2)`` (x, y normalised, align_corners=True) into the slice."""
        ny, nx, sx, sy, s, n = self._scale()
        a = torch.arange(n, dtype=torch.float64) - (n - 1) / 2
        gx = a * s / sx * 2 / max(nx - 1, 1)
        gy = a * s / sy * 2 / max(ny - 1, 1)
        yy, xx = torch.meshgrid(gy, gx, indexing="ij")
        return torch.stack([xx, yy], dim=-1)[None].float()

    def from_network_grid(self) -> torch.Tensor:
        """``grid_sample`` grid ``(1, ny, nx, 2)`` into the network grid, for each slice pixel."""
        ny, nx, sx, sy, s, n = self._scale()
        ax = (n - 1) / 2 + (torch.arange(nx, dtype=torch.float64) - (nx - 1) / 2) * sx / s
        ay = (n - 1) / 2 + (torch.arange(ny, dtype=torch.float64) - (ny - 1) / 2) * sy / s
        yy, xx = torch.meshgrid(ay * 2 / (n - 1) - 1, ax * 2 / (n - 1) - 1, indexing="ij")
        return torch.stack([xx, yy], dim=-1)[None].float()

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


def slices_to_network(slices: np.ndarray, grid: SliceGrid, mode: str = "bilinear") -> torch.Tensor:
    """Resample slices ``(B, Y, X)`` onto the network grid → ``(B, 1, N, N)`` float32 (zero outside).

    ``mode="nearest"`` is for label maps (no anti-aliasing then).
    """
    arr = np.asarray(slices, dtype=np.float32)
    sigma = grid.antialias_sigma()
    if mode != "nearest" and max(sigma) > 0:
        arr = np.stack([ndimage.gaussian_filter(s, sigma=sigma, mode="nearest") for s in arr])
    x = torch.from_numpy(np.ascontiguousarray(arr))[:, None]
    g = grid.to_network_grid().expand(x.shape[0], -1, -1, -1)
    return F.grid_sample(x, g, mode=mode, padding_mode="zeros", align_corners=True)


def network_to_slices(maps: torch.Tensor, grid: SliceGrid) -> torch.Tensor:
    """Resample network-grid maps ``(B, C, N, N)`` back to the slice grid → ``(B, C, ny, nx)``.

    Bilinear, clamped at the border; callers overwrite pixels outside :meth:`SliceGrid.field_of_view`.
    """
    g = grid.from_network_grid().to(maps.device, maps.dtype).expand(maps.shape[0], -1, -1, -1)
    return F.grid_sample(maps, g, mode="bilinear", padding_mode="border", align_corners=True)
