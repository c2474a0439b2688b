"""Small time-conditioned U-Net denoiser (a cheap reference) on MONAI's ``DiffusionModelUNet``."""

from __future__ import annotations

from typing import Sequence

import torch
from monai.networks.nets import DiffusionModelUNet
from torch import nn


class TimeUNet(nn.Module):
    """MONAI ``DiffusionModelUNet`` (2D, no attention) as a categorical denoiser.

    ``image (B, C_img, H, W)``, ``state (B, K, H, W)``, ``t (B,)`` → logits ``(B, K, H, W)``.
    MONAI injects the sinusoidal time embedding (through its own MLP) into every residual
    block. H and W must be multiples of ``2 ** (len(channels) - 1)``.
    """

    def __init__(self, num_classes: int, channels: Sequence[int] = (16, 32, 32), image_channels: int = 1, groups: int = 8):
        super().__init__()
        self.num_classes = num_classes
        self.image_channels = image_channels
        self.net = DiffusionModelUNet(
            spatial_dims=2,
            in_channels=image_channels + num_classes,
            out_channels=num_classes,
            channels=tuple(channels),
            attention_levels=(False,) * len(channels),
            num_res_blocks=1,
            norm_num_groups=groups,
        )

    def forward(self, image: torch.Tensor, state: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([image, state], dim=1), t.long())
