"""Plain (non-diffusion) segmentors: the conventional baselines' deterministic SwinUNETR, the
Dual U-Net control, and the aleatoric ("Alea.") segmentor with a class-wise log-variance head."""

from __future__ import annotations

import math

import torch
from monai.networks.nets import SwinUNETR, UNet
from torch import nn


class DiscriminativeSegmentor(nn.Module):
    """One-shot segmentor ``image (B, C_img, H, W)`` → logits ``(B, K, H, W)``.

    It accepts (and ignores) ``state`` and ``t`` so that the same inference code can run it as
    a one-step "trajectory"; ``backbone`` is ``"swinunetr"`` or ``"unet"`` (MONAI).
    """

    #: one forward pass gives the prediction (no reverse trajectory needed)
    one_shot = True

    def __init__(
        self,
        num_classes: int,
        backbone: str = "unet",
        feature_size: int = 12,
        image_channels: int = 1,
        channels=(16, 32, 64, 128),
        out_channels: int | None = None,
    ):
        super().__init__()
        self.num_classes = num_classes
        self.image_channels = image_channels
        out_channels = out_channels or num_classes
        if backbone == "swinunetr":
            self.net = SwinUNETR(
                in_channels=image_channels, out_channels=out_channels, feature_size=feature_size, spatial_dims=2
            )
        elif backbone == "unet":
            self.net = UNet(
                spatial_dims=2,
                in_channels=image_channels,
                out_channels=out_channels,
                channels=tuple(channels),
                strides=(2,) * (len(channels) - 1),
                num_res_units=1,
            )
        else:
            raise ValueError(f"unknown discriminative backbone {backbone!r}")

    def forward(
        self, image: torch.Tensor, state: torch.Tensor | None = None, t: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.net(image)


class AleatoricSegmentor(DiscriminativeSegmentor):
    """Segmentor with heteroscedastic (aleatoric) logits, after Kendall and Gal (2017).

    The backbone predicts ``2K`` channels: mean logits ``mu (B, K, H, W)`` and a class-wise
    log-variance ``log_var (B, K, H, W)``; a sampled logit is ``mu + exp(log_var / 2) * eps`` with
    ``eps ~ N(0, 1)``. Training minimises :func:`aleatoric_nll` over ``heads(image)``; ``forward``
    returns the predictive logits ``log mean_s softmax(mu + sigma * eps_s)`` over ``samples`` draws
    from a fixed seed, so the same image always gives the same prediction.
    """

    def __init__(
        self,
        num_classes: int,
        backbone: str = "swinunetr",
        feature_size: int = 12,
        image_channels: int = 1,
        channels=(16, 32, 64, 128),
        samples: int = 16,
        seed: int = 0,
    ):
        super().__init__(num_classes, backbone, feature_size, image_channels, channels, out_channels=2 * num_classes)
        self.samples = int(samples)
        self.seed = int(seed)

    def heads(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """image ``(B, C_img, H, W)`` → ``(mu, log_var)``, each ``(B, K, H, W)``; log-variance clamped to [-10, 10]."""
        out = self.net(image)
        mu, log_var = out[:, : self.num_classes], out[:, self.num_classes :]
        return mu, log_var.clamp(-10.0, 10.0)

    def forward(
        self, image: torch.Tensor, state: torch.Tensor | None = None, t: torch.Tensor | None = None
    ) -> torch.Tensor:
        mu, log_var = self.heads(image)
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        eps = torch.randn((self.samples, *mu.shape), generator=gen).to(mu.device, mu.dtype)
        return predictive_logits(mu, log_var, eps)


def predictive_logits(mu: torch.Tensor, log_var: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """``log((1/S) sum_s softmax(mu + exp(log_var/2) eps_s))``: mu, log_var ``(B, K, H, W)``,
    eps ``(S, B, K, H, W)`` → log-probabilities ``(B, K, H, W)`` (valid logits)."""
    sampled = mu.unsqueeze(0) + torch.exp(0.5 * log_var).unsqueeze(0) * eps
    return torch.logsumexp(torch.log_softmax(sampled, dim=2), dim=0) - math.log(eps.shape[0])


def aleatoric_nll(mu: torch.Tensor, log_var: torch.Tensor, labels: torch.Tensor, samples: int = 16) -> torch.Tensor:
    """Kendall and Gal's classification loss: ``-log((1/S) sum_s softmax(mu + sigma eps_s)_y)``,
    averaged over pixels. mu, log_var ``(B, K, H, W)``; labels ``(B, H, W)`` int → scalar."""
    eps = torch.randn((samples, *mu.shape), device=mu.device, dtype=mu.dtype)
    logp = predictive_logits(mu, log_var, eps)
    return torch.nn.functional.nll_loss(logp, labels.long())
