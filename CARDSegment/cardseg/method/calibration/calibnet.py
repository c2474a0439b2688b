"""CalibNet: image-conditioned post-hoc calibration (Ouyang et al., 2022), as the CARD paper
describes it (Sec. II): a calibration network reads the image, the logits, the logits'
response to photometric augmentations and the residual of a shape prior, and predicts a
pixel-wise temperature map."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cardseg.method.calibration.base import register
from cardseg.method.calibration.netbase import LOGIT_CLIP, LOGIT_SCALE, NetworkCalibrator

#: the augmentation set whose logit statistics CalibNet reads (the fitting pool's perturbations at
#: CalibNet's strength): augmentation j is kind ``AUGMENTATION_KINDS[j % 3]``, contrast and gamma
#: factors drawn uniformly from [0.6, 1.5], Gaussian noise of sigma 0.15 (see
#: ``cardseg_train.calibration.spatial.calibnet_augmentation``)
AUGMENTATION_KINDS = ("contrast", "gamma", "noise")
AUGMENTATION_NOISE_SIGMA = 0.15


class _ShapeDAE(nn.Module):
    """The shape prior: a denoising network of label maps, class probabilities ``(B, K, H, W)`` →
    logits of a plausible label map ``(B, K, H, W)`` (3 x 3 convolutions, ReLU, one per dilation,
    size kept). Trained on corrupted ground-truth label maps of the source domain."""

    def __init__(self, num_classes: int, hidden: int, dilations):
        super().__init__()
        self.convs = nn.ModuleList(
            [
                nn.Conv2d(num_classes if i == 0 else hidden, hidden, 3, padding=d, dilation=d)
                for i, d in enumerate(dilations)
            ]
        )
        self.out = nn.Conv2d(hidden, num_classes, 3, padding=1)

    def forward(self, p: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            p = F.relu(conv(p))
        return self.out(p)


class _CalibNetModule(nn.Module):
    """Five 3 x 3 branches (image, logits, augmentation mean, augmentation std, shape residual),
    concatenated, a squeeze-and-excitation block over the channels, a dilated 3 x 3 convolution
    and a 3 x 3 output convolution to one channel."""

    def __init__(self, num_classes: int, branch: int, hidden: int, reduction: int, dae_hidden: int, dae_dilations):
        super().__init__()
        k, width = num_classes, 5 * branch
        self.dae = _ShapeDAE(k, dae_hidden, dae_dilations)
        self.branches = nn.ModuleList([nn.Conv2d(1 if j == 0 else k, branch, 3, padding=1) for j in range(5)])
        squeeze = max(1, width // reduction)
        self.se_down = nn.Linear(width, squeeze)
        self.se_up = nn.Linear(squeeze, width)
        self.head = nn.Conv2d(width, hidden, 3, padding=2, dilation=2)
        self.out = nn.Conv2d(hidden, 1, 3, padding=1)

    def shape_residual(self, z: torch.Tensor) -> torch.Tensor:
        """``Softmax(DAE(p)) - p`` for ``p = Softmax(z)`` (``z`` the clipped logits)."""
        p = torch.softmax(z, dim=1)
        return torch.softmax(self.dae(p), dim=1) - p

    def forward(self, image, z, aug_mean, aug_std) -> torch.Tensor:
        """image ``(B, H, W)``; z, aug_mean, aug_std ``(B, K, H, W)`` clipped to ``±100`` (the
        branches read them divided by 10, the shape prior reads ``Softmax(z)``) → ``o (B, H, W)``."""
        feats = (image[:, None], z / LOGIT_SCALE, aug_mean / LOGIT_SCALE, aug_std / LOGIT_SCALE, self.shape_residual(z))
        h = torch.cat([F.relu(conv(f)) for conv, f in zip(self.branches, feats)], dim=1)
        s = torch.sigmoid(self.se_up(F.relu(self.se_down(h.mean(dim=(2, 3))))))
        h = F.relu(self.head(h * s[:, :, None, None]))
        return self.out(h)[:, 0]


@register
class CalibNet(NetworkCalibrator):
    """CalibNet: a temperature map from the image, the logits, their augmentation response and
    a shape prior's residual.

    Inputs on one grid: logits ``(B, K, H, W)``; ``image`` ``(B, H, W)`` (the normalised network
    input); ``aug_mean`` and ``aug_std`` ``(B, K, H, W)``, the mean and standard deviation of the
    primary's terminal logits over ``arch["augmentations"]`` photometric augmentations of the image
    (:data:`AUGMENTATION_KINDS`); the shape residual ``Softmax(DAE(p)) - p`` of the prediction
    ``p = Softmax(z)`` is computed inside from the stored shape prior (:class:`_ShapeDAE`).
    Logits and their statistics are clipped to ``±100`` and enter the branches divided by 10. The
    network gives ``o`` and ``T = max(o, 0.05)``; ``q = Softmax(z / T)``, log-probabilities
    ``(B, K, H, W)``. Like the original it only rescales the logits by a positive per-pixel
    temperature, so the predicted label never changes (the shape prior informs the confidence,
    not the segmentation). The squeeze-and-excitation block averages over the given slice or
    crop, so the temperature depends on the crop's extent: fit and apply it on the same crops.
    """

    name = "calibnet"
    label = "CalibNet"
    needs_inputs = ("image", "aug_mean", "aug_std")
    spatial = True
    arch_defaults = {
        "num_classes": 4,
        "branch": 4,
        "hidden": 8,
        "reduction": 4,
        "dae_hidden": 8,
        "dae_dilations": [1, 2, 4, 8],
        "augmentations": 4,
    }

    def build(self, arch: dict) -> nn.Module:
        return _CalibNetModule(
            arch["num_classes"],
            arch["branch"],
            arch["hidden"],
            arch["reduction"],
            arch["dae_hidden"],
            arch["dae_dilations"],
        )

    @property
    def augmentations(self) -> int:
        """How many augmented runs of the primary ``aug_mean`` and ``aug_std`` average over."""
        return int(self.arch["augmentations"])

    def shape_residual(self, logits: torch.Tensor) -> torch.Tensor:
        """``Softmax(DAE(p)) - p`` for ``p = Softmax(z)``: ``(B, K, H, W)``, in ``[-1, 1]``."""
        return self.net.shape_residual(self._float(logits).clamp(-LOGIT_CLIP, LOGIT_CLIP))

    def raw_output(
        self,
        logits: torch.Tensor,
        image: torch.Tensor = None,
        aug_mean: torch.Tensor = None,
        aug_std: torch.Tensor = None,
        **inputs: torch.Tensor,
    ) -> torch.Tensor:
        if (
            image.shape != logits.shape[:1] + logits.shape[2:]
            or aug_mean.shape != logits.shape
            or aug_std.shape != logits.shape
        ):
            raise ValueError(
                f"calibnet: image {tuple(image.shape)}, aug_mean {tuple(aug_mean.shape)} and aug_std "
                f"{tuple(aug_std.shape)} do not match logits {tuple(logits.shape)}"
            )
        z = self._float(logits).clamp(-LOGIT_CLIP, LOGIT_CLIP)
        return self.net(
            self._float(image),
            z,
            self._float(aug_mean).clamp(-LOGIT_CLIP, LOGIT_CLIP),
            self._float(aug_std).clamp(0.0, LOGIT_CLIP),
        )
