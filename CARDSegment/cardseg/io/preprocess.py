"""Slice preprocessing and the mapping between a slice's own grid and the network grid.

Training and inference share these functions, so the network always sees slices the same
way: intensities scaled per slice, then resampled to the bundle's pixel spacing on an
``N x N`` grid centred on the slice (which crops or pads as needed), or moved by an ``offset``
(the engine centres the grid on the heart when the centred grid cuts it off:
:mod:`cardseg.io.field_of_view`).

The grid is axis-aligned, so a resampling is separable: one interpolation matrix per axis,
``out = W_y @ map @ W_x.T`` (:func:`interpolation_matrix`), linear (nearest for label maps), onto
the network grid with zeros outside the slice, back onto the slice with the network grid's border
values repeated. The sample positions and the rounding are those of torch's ``grid_sample`` with
``align_corners=True`` and zeros or border padding (float32 positions, nearest rounds half to
even), which this module replaced: the same labels, and the same linear maps to float32 rounding.
The matrices are numpy arrays; applied to a torch tensor they move to its device, so a GPU run
resamples on the GPU and the ONNX Runtime path of ``cardseg segment`` never imports torch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import numpy as np
from scipy import ndimage

from cardseg.base import arrays

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
    """Axis-aligned map between a slice grid and the ``size x size`` network grid.

    slice_shape: ``(ny, nx)``; spacing: in-plane ``(sx, sy)`` in mm (SimpleITK order: i then j);
    target_spacing: network pixel size in mm; size: network side ``N``; offset: ``(rows, cols)``
    slice pixels from the slice's centre to the network grid's centre (``(0, 0)``: centred).
    """

    slice_shape: tuple
    spacing: tuple
    target_spacing: float
    size: int
    offset: tuple = (0.0, 0.0)

    def _scale(self):
        ny, nx = self.slice_shape
        sx, sy = self.spacing
        return ny, nx, sx, sy, float(self.target_spacing), int(self.size)

    def to_network_grid(self) -> tuple:
        """Where each network pixel lies in the slice, in slice pixels: ``(rows (N,), cols (N,))``
        float32 (the centres lie ``offset`` apart), as ``grid_sample`` computed them from its
        normalised grid."""
        ny, nx, sx, sy, s, n = self._scale()
        dy, dx = (float(o) for o in self.offset)
        a = np.arange(n, dtype=np.float64) - (n - 1) / 2
        return (
            _unnormalise((a * s / sy + dy) * 2 / max(ny - 1, 1), ny),
            _unnormalise((a * s / sx + dx) * 2 / max(nx - 1, 1), nx),
        )

    def _network_position(self) -> tuple:
        """Each slice row's and column's position on the network grid, in network pixels (float64)."""
        ny, nx, sx, sy, s, n = self._scale()
        dy, dx = (float(o) for o in self.offset)
        ax = (n - 1) / 2 + (np.arange(nx, dtype=np.float64) - (nx - 1) / 2 - dx) * sx / s
        ay = (n - 1) / 2 + (np.arange(ny, dtype=np.float64) - (ny - 1) / 2 - dy) * sy / s
        return ay, ax

    def from_network_grid(self) -> tuple:
        """Where each slice pixel lies in the network grid, in network pixels:
        ``(rows (ny,), cols (nx,))`` float32, the inverse of :meth:`to_network_grid`."""
        n = int(self.size)
        ay, ax = self._network_position()
        return _unnormalise(ay * 2 / (n - 1) - 1, n), _unnormalise(ax * 2 / (n - 1) - 1, n)

    def field_of_view(self) -> np.ndarray:
        """Bool ``(ny, nx)``: slice pixels whose centre falls inside the network grid."""
        n = int(self.size)
        ay, ax = self._network_position()
        inside_x = (ax >= -0.5) & (ax <= n - 0.5)
        inside_y = (ay >= -0.5) & (ay <= n - 0.5)
        return inside_y[:, None] & inside_x[None, :]

    def antialias_sigma(self) -> tuple:
        """Gaussian sigma (pixels, ``(y, x)``) applied before downsampling, 0 when upsampling."""
        _, _, sx, sy, s, _ = self._scale()
        return (max(0.0, s / sy - 1.0) * 0.5, max(0.0, s / sx - 1.0) * 0.5)


def _unnormalise(normalised: np.ndarray, size: int) -> np.ndarray:
    """``grid_sample``'s pixel position of a normalised coordinate in ``[-1, 1]`` (align_corners):
    ``(g + 1) * (size - 1) / 2``, in float32 as it computes it."""
    return (normalised.astype(np.float32) + np.float32(1.0)) * np.float32((size - 1) / 2)


def interpolation_matrix(positions: np.ndarray, size: int, nearest: bool = False, border: bool = False) -> np.ndarray:
    """The ``(len(positions), size)`` float32 matrix that samples a line of ``size`` pixels at
    ``positions`` (in pixels): linear (two taps, weights summing to 1) or nearest (one tap,
    rounding half to even). Taps outside ``0 .. size - 1`` count as zeros, unless ``border``, which
    first clamps the positions into the line (its end values repeated)."""
    pos = np.asarray(positions, dtype=np.float32)
    if border:
        pos = np.clip(pos, np.float32(0.0), np.float32(size - 1))
    rows = np.arange(pos.size)
    w = np.zeros((pos.size, size), np.float32)
    if nearest:
        taps = [(np.rint(pos).astype(np.int64), np.ones_like(pos))]
    else:
        lo = np.floor(pos)
        frac = pos - lo
        taps = [(lo.astype(np.int64), np.float32(1.0) - frac), (lo.astype(np.int64) + 1, frac)]
    for idx, weight in taps:
        ok = (idx >= 0) & (idx < size)
        w[rows[ok], idx[ok]] += weight[ok]
    return w


def _resample(maps, positions: tuple, sizes: tuple, nearest: bool, border: bool):
    """``maps`` ``(..., H, W)`` (numpy, or a torch tensor on any device) sampled at ``positions``
    ``(rows, cols)`` → ``(..., len(rows), len(cols))`` float32 of the same kind and device."""
    wy = arrays.like(interpolation_matrix(positions[0], sizes[0], nearest, border), maps)
    wx = arrays.like(interpolation_matrix(positions[1], sizes[1], nearest, border).T.copy(), maps)
    return wy @ maps @ wx


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
    out = _resample(
        np.ascontiguousarray(arr), grid.to_network_grid(), tuple(grid.slice_shape), mode == "nearest", border=False
    )
    return out[:, None]


def slices_to_network(slices: np.ndarray, grid: SliceGrid, mode: str = "bilinear") -> "torch.Tensor":
    """:func:`resample_to_network` as a torch tensor ``(B, 1, N, N)`` (for training)."""
    import torch

    return torch.from_numpy(resample_to_network(slices, grid, mode))


def network_to_slices(maps, grid: SliceGrid, cache: Optional[dict] = None):
    """Resample network-grid maps ``(B, C, N, N)`` back to the slice grid → ``(B, C, ny, nx)``
    float32, of the maps' kind: numpy in, numpy out; a tensor stays on its device.

    Bilinear, clamped at the border; callers overwrite pixels outside :meth:`SliceGrid.field_of_view`.
    ``cache``: a dict the caller keeps over many calls (a batch loop): the two interpolation
    matrices are then made, and moved to a device, once per grid and device instead of every call
    (on a GPU each move is a copy that waits for the host).
    """
    n = int(grid.size)
    if not arrays.is_tensor(maps):
        maps = np.asarray(maps, dtype=np.float32)
    elif maps.dtype != sys.modules["torch"].float32:
        maps = maps.float()
    key = (id(grid), str(maps.device) if arrays.is_tensor(maps) else "numpy")
    held = None if cache is None else cache.get(key)
    if held is None or held[0] is not grid:
        rows, cols = grid.from_network_grid()
        held = (
            grid,
            arrays.like(interpolation_matrix(rows, n, nearest=False, border=True), maps),
            arrays.like(np.ascontiguousarray(interpolation_matrix(cols, n, nearest=False, border=True).T), maps),
        )
        if cache is not None:
            cache[key] = held
    return held[1] @ maps @ held[2]


def blank_slices(array: np.ndarray) -> tuple:
    """The indices of the slices of ``array`` ``(Z, Y, X)`` that hold one value everywhere: no image
    to segment (normalised, a blank slice becomes zeros, on which a network still draws a heart)."""
    flat = array.reshape(array.shape[0], -1)
    return tuple(int(k) for k in np.flatnonzero(flat.max(axis=1) == flat.min(axis=1)))
