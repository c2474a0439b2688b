"""Plain (non-diffusion) segmentors for the discriminative controls (Dual U-Net, UC/TS/ETS)."""

from __future__ import annotations

import torch
from monai.networks.nets import SwinUNETR, UNet
from torch import nn


class DiscriminativeSegmentor(nn.Module):
    """One-shot segmentor ``image (B, C_img, H, W)`` → logits ``(B, K, H, W)``.

    It accepts (and ignores) ``state`` and ``t`` so that the same inference code can run it as
    a one-step "trajectory"; ``backbone`` is ``"swinunetr"`` or ``"unet"`` (MONAI).
    """

    def __init__(self, num_classes: int, backbone: str = "unet", feature_size: int = 12, image_channels: int = 1,
                 channels=(16, 32, 64, 128)):
        super().__init__()
        self.num_classes = num_classes
        self.image_channels = image_channels
        if backbone == "swinunetr":
            self.net = SwinUNETR(in_channels=image_channels, out_channels=num_classes, feature_size=feature_size,
                                 spatial_dims=2)
        elif backbone == "unet":
            self.net = UNet(spatial_dims=2, in_channels=image_channels, out_channels=num_classes,
                            channels=tuple(channels), strides=(2,) * (len(channels) - 1), num_res_units=1)
        else:
            raise ValueError(f"unknown discriminative backbone {backbone!r}")

    def forward(self, image: torch.Tensor, state: torch.Tensor | None = None, t: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(image)
