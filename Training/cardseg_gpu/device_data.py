"""The pack's arrays on the device, and the training recipe's random draws made there.

Images travel as uint8 ``(n, 1, N, N)`` and become float in ``[0, 1]`` per batch
(:func:`as_float`); labels are ``(n, N, N)`` class indices.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


def load_pack(pack: Path, device: torch.device) -> dict:
    """The pack's arrays on ``device``: ``train_images (n, 1, N, N) uint8``, labels ``(n, N, N)``,
    and the validation volumes ``[(case, images, labels)]`` grouped by case."""
    meta = json.loads((pack / "pack.json").read_text())
    with np.load(pack / "data.npz") as z:
        arrays = {k: z[k] for k in z.files}
    out = {
        "meta": meta,
        "train_images": torch.from_numpy(arrays["train_images"])[:, None].to(device),
        "train_labels": torch.from_numpy(arrays["train_labels"]).to(device),
    }
    vols, cases = [], arrays["val_cases"]
    for case in dict.fromkeys(cases.tolist()):
        idx = np.flatnonzero(cases == case)
        vols.append(
            (
                case,
                torch.from_numpy(arrays["val_images"][idx])[:, None].to(device),
                torch.from_numpy(arrays["val_labels"][idx]).to(device),
            )
        )
    out["val_volumes"] = vols
    return out


def as_float(images_u8: torch.Tensor) -> torch.Tensor:
    return images_u8.float() / 255.0


class DeviceAugment:
    """The training recipe's augmentation (:class:`cardseg_train.data.augment.BatchAugment`'s spatial
    map and ranges) with every random number drawn on the batch's device."""

    def __init__(self):
        from cardseg_train.data.augment import AugmentConfig, BatchAugment

        self.base = BatchAugment(AugmentConfig())
        self.c = self.base.config

    def __call__(self, image: torch.Tensor, label: torch.Tensor):
        image, label = self.base.spatial(image, label, self.base.affine(image.shape[0]))
        c, n, dev = self.c, image.shape[0], image.device

        def draw(p, lo, hi, off):
            on = torch.rand(n, 1, 1, 1, device=dev) < p
            v = lo + (hi - lo) * torch.rand(n, 1, 1, 1, device=dev)
            return torch.where(on, v, torch.full_like(v, off))

        x = image.clamp(0, 1).pow(draw(c.p_gamma, *c.gamma, 1.0))
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        x = (x - mean) * draw(c.p_contrast, *c.contrast, 1.0) + mean
        x = x + torch.randn_like(x) * draw(c.p_noise, *c.noise_std, 0.0)
        return x.clamp(0, 1), label


def noisy_inputs(
    schedule,
    images: torch.Tensor,
    labels: torch.Tensor,
    k: int,
    p_uniform: float = 0.15,
    p_uncond: float = 0.2,
    p_focus: float = 0.0,
    focus_steps=None,
):
    """The training recipe's inputs (:func:`cardseg_train.training.steps.make_training_inputs`: ``x_t``
    from paper Eq. 1, the exact uniform state with ``p_uniform``, the image zeroed with
    ``p_uncond``, the step drawn from ``focus_steps`` with ``p_focus``), drawn on the device.
    images ``(B, 1, N, N)``, labels ``(B, N, N)`` → ``(image, x_t, t)``."""
    from cardseg.method.diffusion import one_hot
    from cardseg_train.training.steps import draw_steps

    b, dev, top = labels.shape[0], labels.device, schedule.num_steps - 1
    t = draw_steps(schedule.num_steps, b, p_focus, focus_steps, device=dev)
    uniform = torch.rand(b, device=dev) < p_uniform
    if p_focus > 0 and focus_steps:
        uniform = uniform | (t == top)  # inference starts T-1 from the exact uniform state
    t = torch.where(uniform, torch.full_like(t, top), t)
    abar = schedule.alpha_bar.to(dev).float()[t].view(b, 1, 1)
    other = torch.randint(0, k, labels.shape, device=dev)
    drawn = torch.where(torch.rand(labels.shape, device=dev) < abar, labels.long(), other)
    x_t = one_hot(drawn, k)
    x_t = torch.where(uniform.view(b, 1, 1, 1), torch.full_like(x_t, 1.0 / k), x_t)
    drop = (torch.rand(b, device=dev) < p_uncond).view(b, 1, 1, 1)
    return torch.where(drop, torch.zeros_like(images), images), x_t, t
