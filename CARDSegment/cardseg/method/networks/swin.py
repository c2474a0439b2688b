"""Time-conditioned 2D SwinUNETR denoiser built on MONAI's ``SwinUNETR``."""

from __future__ import annotations

import torch
from monai.networks.nets import SwinUNETR
from torch import nn

from cardseg.method.networks.embedding import FiLM, TimestepEmbedding


class TimeSwinUNETR(SwinUNETR):
    """MONAI SwinUNETR (2D) that denoises a categorical label state given an image and a step.

    Input is ``concat(image, state)``: ``image (B, C_img, H, W)`` and ``state (B, K, H, W)``;
    the step ``t (B,)`` (integers ``0 .. T-1``) goes through a sinusoidal embedding and an MLP
    (:class:`TimestepEmbedding`, width ``4 · feature_size``).

    Where the time enters: a zero-initialised FiLM (scale and shift per channel) is applied
    to the output of every UNETR convolutional stage, i.e. the five encoder blocks
    (``encoder1, 2, 3, 4, 10``) and the five decoder blocks (``decoder5 .. decoder1``), before
    those features are used as skips or upsampled. The Swin transformer itself is unchanged.

    Output: logits ``(B, K, H, W)``. H and W must be multiples of 32.
    """

    def __init__(self, num_classes: int, feature_size: int = 12, image_channels: int = 1, **kwargs):
        super().__init__(
            in_channels=image_channels + num_classes,
            out_channels=num_classes,
            feature_size=feature_size,
            spatial_dims=2,
            **kwargs,
        )
        fs = feature_size
        emb_dim = 4 * fs
        self.num_classes = num_classes
        self.image_channels = image_channels
        self.time_embed = TimestepEmbedding(emb_dim)
        # channel widths of encoder1, encoder2, encoder3, encoder4, encoder10 outputs
        self.film_enc = nn.ModuleList(FiLM(emb_dim, c) for c in (fs, fs, 2 * fs, 4 * fs, 16 * fs))
        # channel widths of decoder5, decoder4, decoder3, decoder2, decoder1 outputs
        self.film_dec = nn.ModuleList(FiLM(emb_dim, c) for c in (8 * fs, 4 * fs, 2 * fs, fs, fs))

    def forward(self, image: torch.Tensor, state: torch.Tensor, t: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x = torch.cat([image, state], dim=1)
        if not torch.jit.is_tracing():
            self._check_input_size(x.shape[2:])
        e = self.time_embed(t)
        fe, fd = self.film_enc, self.film_dec
        hidden = self.swinViT(x, self.normalize)
        enc0 = fe[0](self.encoder1(x), e)
        enc1 = fe[1](self.encoder2(hidden[0]), e)
        enc2 = fe[2](self.encoder3(hidden[1]), e)
        enc3 = fe[3](self.encoder4(hidden[2]), e)
        dec4 = fe[4](self.encoder10(hidden[4]), e)
        dec3 = fd[0](self.decoder5(dec4, hidden[3]), e)
        dec2 = fd[1](self.decoder4(dec3, enc3), e)
        dec1 = fd[2](self.decoder3(dec2, enc2), e)
        dec0 = fd[3](self.decoder2(dec1, enc1), e)
        out = fd[4](self.decoder1(dec0, enc0), e)
        return self.out(out)
