"""Light time-conditioned U-Net denoiser (a cheap reference), built from MONAI's UNETR blocks."""

from __future__ import annotations

from typing import Sequence

import torch
from monai.networks.blocks import UnetOutBlock, UnetResBlock, UnetrUpBlock
from torch import nn

from cardseg.method.networks.embedding import FiLM, TimestepEmbedding


class TimeUNet(nn.Module):
    """Residual U-Net that works at half resolution, with FiLM time conditioning.

    ``image (B, C_img, H, W)``, ``state (B, K, H, W)``, ``t (B,)`` → logits ``(B, K, H, W)``.

    Layout (``channels = (c0, c1, ..., cL)``): a stride-2 residual stem takes
    ``concat(image, state)`` to ``c0`` channels at H/2 (most of the compute then runs on a
    quarter of the pixels, like SwinUNETR's patch embedding); each further level halves the
    resolution (MONAI ``UnetResBlock``, stride 2); the decoder mirrors it with ``UnetrUpBlock``;
    a transposed convolution returns to full resolution, where a shallow full-resolution
    branch of the input (``c0 // 2`` channels) is concatenated before the output convolution.
    The sinusoidal step embedding (MLP, width ``4 c0``) enters through a zero-initialised FiLM
    after every encoder and decoder block. H and W must be multiples of ``2 ** len(channels)``.
    """

    def __init__(self, num_classes: int, channels: Sequence[int] = (16, 32, 64), image_channels: int = 1):
        super().__init__()
        channels = tuple(int(c) for c in channels)
        self.num_classes = num_classes
        self.image_channels = image_channels
        self.channels = channels
        c_in = image_channels + num_classes
        emb = 4 * channels[0]
        norm = ("instance", {"affine": True})
        act = ("leakyrelu", {"negative_slope": 0.01, "inplace": True})
        self.time_embed = TimestepEmbedding(emb)
        self.full_res = UnetResBlock(
            2, c_in, max(channels[0] // 2, 4), kernel_size=3, stride=1, norm_name=norm, act_name=act
        )
        self.encoders = nn.ModuleList()
        prev = c_in
        for c in channels:
            self.encoders.append(UnetResBlock(2, prev, c, kernel_size=3, stride=2, norm_name=norm, act_name=act))
            prev = c
        self.enc_film = nn.ModuleList(FiLM(emb, c) for c in channels)
        self.decoders = nn.ModuleList(
            UnetrUpBlock(
                2, channels[i + 1], channels[i], kernel_size=3, upsample_kernel_size=2, norm_name=norm, res_block=True
            )
            for i in reversed(range(len(channels) - 1))
        )
        self.dec_film = nn.ModuleList(FiLM(emb, channels[i]) for i in reversed(range(len(channels) - 1)))
        self.final_up = UnetrUpBlock(
            2, channels[0], channels[0], kernel_size=3, upsample_kernel_size=2, norm_name=norm, res_block=True
        )
        # UnetrUpBlock concatenates a skip with as many channels as its output: adapt the full-res branch
        self.full_res_proj = nn.Conv2d(max(channels[0] // 2, 4), channels[0], kernel_size=1)
        self.out = UnetOutBlock(2, channels[0], num_classes)

    def forward(self, image: torch.Tensor, state: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        x = torch.cat([image, state], dim=1)
        e = self.time_embed(t)
        skips = []
        h = x
        for enc, film in zip(self.encoders, self.enc_film):
            h = film(enc(h), e)
            skips.append(h)
        h = skips.pop()
        for dec, film in zip(self.decoders, self.dec_film):
            h = film(dec(h, skips.pop()), e)
        h = self.final_up(h, self.full_res_proj(self.full_res(x)))
        return self.out(h)
