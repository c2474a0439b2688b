"""Denoisers and the size registry.

Every network here maps ``(image (B, C_img, H, W), state (B, K, H, W), t (B,))`` to logits
``(B, K, H, W)``. A network is described by a JSON-able *spec* (stored in ``bundle.json``)::

    {"arch": "time-swinunetr", "size": "mini", "num_classes": 4}
    {"arch": "time-unet", "size": "tiny", "num_classes": 4}
    {"arch": "discriminative", "backbone": "unet", "num_classes": 4}
    {"arch": "discriminative", "backbone": "swinunetr", "feature_size": 24, "aleatoric": true, "num_classes": 4}

and built with :func:`build_network`.
"""

from __future__ import annotations

from typing import Dict

from torch import nn

#: SwinUNETR feature sizes of the paper's capacity sweep (parameter counts: ``cardseg sizes``).
SWIN_SIZES: Dict[str, int] = {"mini": 12, "tiny": 24, "small": 36, "base": 60, "large": 72}
#: channel widths of the small time-conditioned U-Nets.
UNET_SIZES: Dict[str, tuple] = {
    "micro": (8, 16, 32),
    "tiny": (16, 32, 64),
    "small": (16, 32, 64, 128),
    "medium": (32, 64, 128, 256),
}

ARCHES = ("time-swinunetr", "time-unet", "discriminative")


def build_network(spec: dict) -> nn.Module:
    """Instantiate the network a spec describes (weights random; load a state dict after)."""
    arch = spec.get("arch")
    k = int(spec["num_classes"])
    c_img = int(spec.get("image_channels", 1))
    if arch == "time-swinunetr":
        from cardseg.method.networks.swin import TimeSwinUNETR

        size = spec.get("size", "mini")
        fs = int(spec.get("feature_size", SWIN_SIZES.get(size, 0)))
        if fs <= 0 or fs % 12:
            raise ValueError(f"unknown SwinUNETR size {size!r} (choose from {', '.join(SWIN_SIZES)})")
        return TimeSwinUNETR(num_classes=k, feature_size=fs, image_channels=c_img)
    if arch == "time-unet":
        from cardseg.method.networks.unet import TimeUNet

        size = spec.get("size", "tiny")
        channels = spec.get("channels") or UNET_SIZES.get(size)
        if channels is None:
            raise ValueError(f"unknown U-Net size {size!r} (choose from {', '.join(UNET_SIZES)})")
        return TimeUNet(num_classes=k, channels=channels, image_channels=c_img)
    if arch == "discriminative":
        from cardseg.method.networks.discriminative import AleatoricSegmentor, DiscriminativeSegmentor

        if spec.get("aleatoric"):
            return AleatoricSegmentor(
                num_classes=k,
                backbone=spec.get("backbone", "swinunetr"),
                feature_size=int(spec.get("feature_size", 12)),
                image_channels=c_img,
            )
        return DiscriminativeSegmentor(
            num_classes=k,
            backbone=spec.get("backbone", "unet"),
            feature_size=int(spec.get("feature_size", 12)),
            image_channels=c_img,
        )
    raise ValueError(f"unknown network architecture {arch!r} (choose from {', '.join(ARCHES)})")


def count_parameters(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def size_multiple(spec: dict) -> int:
    """The input side length must be a multiple of this for the spec's network."""
    if spec.get("arch") == "time-swinunetr" or spec.get("backbone") == "swinunetr":
        return 32
    if spec.get("arch") == "time-unet":
        return 2 ** len(spec.get("channels") or UNET_SIZES.get(spec.get("size", "tiny"), (16, 32, 64)))
    return 2 ** (len(spec.get("channels") or (16, 32, 64, 128)) - 1)
