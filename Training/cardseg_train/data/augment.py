"""Batch augmentation on the network grid, in torch (runs wherever the batch lives: CPU or GPU).

Spatial: random flips, a small rotation, isotropic scaling and a small shift, composed into
one affine map per slice and applied with ``affine_grid`` + ``grid_sample`` (bilinear for the
image, nearest for the labels, zeros / background outside). Intensity, on the image only:
gamma, contrast about the slice mean, additive Gaussian noise, then clipped to ``[0, 1]`` (the
range the engine's per-slice normalisation produces).

All random numbers come from one ``torch.Generator`` on the CPU (so a run is reproducible and
resumable on any device) and are moved to the batch's device.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

import torch
import torch.nn.functional as F


@dataclass
class AugmentConfig:
    """Probabilities and ranges; set a probability to 0 to switch a transform off."""

    p_flip_x: float = 0.5
    p_flip_y: float = 0.5
    p_spatial: float = 0.8  # probability of applying rotation + scaling + shift to a slice
    max_rotation_deg: float = 15.0
    scale: Tuple[float, float] = (0.85, 1.15)  # zoom factor range (>1 enlarges the anatomy)
    max_shift: float = 0.05  # fraction of the half field of view
    p_gamma: float = 0.3
    gamma: Tuple[float, float] = (0.7, 1.5)
    p_contrast: float = 0.3
    contrast: Tuple[float, float] = (0.75, 1.25)
    p_noise: float = 0.2
    noise_std: Tuple[float, float] = (0.0, 0.05)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "AugmentConfig":
        fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**fields)

    @classmethod
    def off(cls) -> "AugmentConfig":
        return cls(p_flip_x=0, p_flip_y=0, p_spatial=0, p_gamma=0, p_contrast=0, p_noise=0)


class BatchAugment:
    """Augment a batch ``image (B, 1, H, W)`` in ``[0, 1]`` with its ``label (B, H, W)`` integer map.

    ``aug(image, label, generator)`` returns new tensors of the same shapes, dtypes and device.
    """

    def __init__(self, config: Optional[AugmentConfig] = None):
        self.config = config or AugmentConfig()

    # -- random numbers ----------------------------------------------------------------------
    @staticmethod
    def _uniform(n: int, lo: float, hi: float, g: Optional[torch.Generator]) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)

    @staticmethod
    def _coin(n: int, p: float, g: Optional[torch.Generator]) -> torch.Tensor:
        return torch.rand(n, generator=g, dtype=torch.float64) < p

    # -- spatial -----------------------------------------------------------------------------
    def affine(self, n: int, g: Optional[torch.Generator] = None) -> torch.Tensor:
        """Per-slice ``(n, 2, 3)`` matrices mapping output to input normalised coordinates."""
        c = self.config
        on = self._coin(n, c.p_spatial, g)
        angle = self._uniform(n, -c.max_rotation_deg, c.max_rotation_deg, g) * math.pi / 180 * on
        zoom = torch.where(on, self._uniform(n, c.scale[0], c.scale[1], g), torch.ones(n, dtype=torch.float64))
        shift = self._uniform(2 * n, -c.max_shift, c.max_shift, g).view(n, 2) * on[:, None]
        fx = torch.where(self._coin(n, c.p_flip_x, g), -1.0, 1.0).double()
        fy = torch.where(self._coin(n, c.p_flip_y, g), -1.0, 1.0).double()
        cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
        theta = torch.zeros(n, 2, 3, dtype=torch.float64)
        # sample the input at R(angle) S(1/zoom) F p + shift: flips act on the output axes
        theta[:, 0, 0], theta[:, 0, 1] = cos * fx, -sin * fy
        theta[:, 1, 0], theta[:, 1, 1] = sin * fx, cos * fy
        theta[:, :, 2] = shift
        return theta

    def spatial(
        self, image: torch.Tensor, label: torch.Tensor, theta: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        grid = F.affine_grid(theta.to(image.device, torch.float32), list(image.shape), align_corners=False)
        img = F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        lab = F.grid_sample(label[:, None].float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
        return img, lab[:, 0].round().to(label.dtype)

    # -- intensity ---------------------------------------------------------------------------
    def intensity(self, image: torch.Tensor, g: Optional[torch.Generator] = None) -> torch.Tensor:
        c = self.config
        n = image.shape[0]
        dev = image.device

        def per_slice(v: torch.Tensor) -> torch.Tensor:
            return v.to(dev, image.dtype).view(n, 1, 1, 1)

        x = image.clamp(0.0, 1.0)
        gamma = torch.where(
            self._coin(n, c.p_gamma, g), self._uniform(n, *c.gamma, g), torch.ones(n, dtype=torch.float64)
        )
        x = x.pow(per_slice(gamma))
        k = torch.where(
            self._coin(n, c.p_contrast, g), self._uniform(n, *c.contrast, g), torch.ones(n, dtype=torch.float64)
        )
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        x = (x - mean) * per_slice(k) + mean
        sd = torch.where(
            self._coin(n, c.p_noise, g), self._uniform(n, *c.noise_std, g), torch.zeros(n, dtype=torch.float64)
        )
        noise = torch.randn(image.shape, generator=g, dtype=torch.float32).to(dev, image.dtype)
        x = x + noise * per_slice(sd)
        return x.clamp(0.0, 1.0)

    def __call__(self, image: torch.Tensor, label: torch.Tensor, generator: Optional[torch.Generator] = None):
        theta = self.affine(image.shape[0], generator)
        image, label = self.spatial(image, label, theta)
        return self.intensity(image, generator), label
