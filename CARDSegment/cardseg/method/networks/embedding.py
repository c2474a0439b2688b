"""Timestep embedding shared by the time-conditioned denoisers."""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Transformer-style sinusoidal code of integer steps ``t`` ``(B,)`` → ``(B, dim)``."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=1)
    if dim % 2:
        emb = torch.nn.functional.pad(emb, (0, 1))
    return emb


class TimestepEmbedding(nn.Module):
    """Sinusoidal code followed by a two-layer MLP: ``(B,)`` integer steps → ``(B, dim)``."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(sinusoidal_embedding(t, self.dim))


class FiLM(nn.Module):
    """Feature-wise affine modulation ``h · (1 + γ(e)) + β(e)`` of a ``(B, C, H, W)`` map.

    Zero-initialised, so an untrained FiLM is the identity and the wrapped backbone starts
    as its plain MONAI self.
    """

    def __init__(self, embed_dim: int, channels: int):
        super().__init__()
        self.proj = nn.Sequential(nn.SiLU(), nn.Linear(embed_dim, 2 * channels))
        nn.init.zeros_(self.proj[1].weight)
        nn.init.zeros_(self.proj[1].bias)

    def forward(self, h: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.proj(emb)[:, :, None, None].chunk(2, dim=1)
        return h * (1 + gamma) + beta
