"""Pieces of one training step and of validation: the noised inputs of the diffusion recipe
(paper Eq. 1), the learning-rate schedule, and Dice with the engine's reverse sampler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from cardseg.method.diffusion import CategoricalSchedule, one_hot
from cardseg.method.trajectory import run_trajectory


def sample_noisy_state(
    schedule: CategoricalSchedule,
    labels: torch.Tensor,
    t: torch.Tensor,
    num_classes: int,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """One-hot ``x_t ~ Cat(abar_t x0 + (1 - abar_t) u)`` (paper Eq. 1) for labels ``(B, H, W)``.

    Drawn as the equivalent mixture (keep the label with probability ``abar_t``, otherwise a
    uniformly random class), with the random numbers taken from a CPU generator so that runs
    reproduce on any device. Returns ``(B, K, H, W)`` on the labels' device.
    """
    b = labels.shape[0]
    keep_u = torch.rand(labels.shape, generator=generator).to(labels.device)
    other = torch.randint(0, num_classes, labels.shape, generator=generator).to(labels.device)
    abar = schedule.abar(t.cpu()).float().to(labels.device).view(b, 1, 1)
    drawn = torch.where(keep_u < abar, labels.long(), other)
    return one_hot(drawn, num_classes)


def draw_steps(
    num_steps: int,
    b: int,
    p_focus: float = 0.0,
    focus_steps: Optional[Sequence[int]] = None,
    generator: Optional[torch.Generator] = None,
    device=None,
) -> torch.Tensor:
    """Step indices ``(B,)`` of one batch: uniform over ``0..T-1``, except that with probability
    ``p_focus`` a slice's step is drawn (uniformly) from ``focus_steps``, the steps the sampler
    calls at inference (the network is then trained more where it is used). Drawn on ``device``
    (the generator's, when one is given)."""
    t = torch.randint(0, num_steps, (b,), generator=generator, device=device)
    if p_focus > 0 and focus_steps:
        pick = torch.as_tensor(list(focus_steps), dtype=t.dtype, device=t.device)
        focused = pick[torch.randint(0, len(pick), (b,), generator=generator, device=t.device)]
        t = torch.where(torch.rand(b, generator=generator, device=t.device) < p_focus, focused, t)
    return t


@dataclass(frozen=True)
class InputRecipe:
    """The random draws of one batch's diffusion inputs (:func:`make_training_inputs`).

    p_uniform: probability that a slice gets ``t = T-1`` and the exact uniform state (what
    inference starts from); p_uncond: probability that a slice's image is zeroed; p_focus:
    probability that a slice's step is drawn from ``focus_steps`` (the sampler's own steps,
    :func:`draw_steps`) rather than uniformly; focus_steps: those steps (``None``: no focus)."""

    p_uniform: float
    p_uncond: float
    p_focus: float = 0.0
    focus_steps: Optional[Sequence[int]] = None


def make_training_inputs(
    schedule: CategoricalSchedule,
    images: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    recipe: InputRecipe,
    generator: Optional[torch.Generator] = None,
):
    """Step indices, noisy states and (possibly masked) images for one batch.

    images ``(B, 1, N, N)``, labels ``(B, N, N)`` → ``(image, x_t (B, K, N, N), t (B,))``. With
    probability ``recipe.p_uniform`` a slice gets ``t = T-1`` and the exact uniform state (what
    inference starts from); with probability ``recipe.p_uncond`` its image is zeroed. With
    probability ``recipe.p_focus`` a slice's step comes from ``recipe.focus_steps``
    (:func:`draw_steps`); a focused slice at ``T-1`` also gets the exact uniform state, as
    inference does. The random numbers come from ``generator`` (CPU).
    """
    b = labels.shape[0]
    dev = labels.device
    top = schedule.num_steps - 1
    t = draw_steps(schedule.num_steps, b, recipe.p_focus, recipe.focus_steps, generator)
    uniform = (torch.rand(b, generator=generator) < recipe.p_uniform) | ((t == top) & (recipe.p_focus > 0))
    t = torch.where(uniform, torch.full_like(t, top), t)
    x_t = sample_noisy_state(schedule, labels, t, num_classes, generator)
    u = uniform.to(dev).view(b, 1, 1, 1)
    x_t = torch.where(u, torch.full_like(x_t, 1.0 / num_classes), x_t)
    drop = (torch.rand(b, generator=generator) < recipe.p_uncond).to(dev).view(b, 1, 1, 1)
    images = torch.where(drop, torch.zeros_like(images), images)
    return images, x_t, t.to(dev)


def lr_factor(step: int, warmup: int, total: int, schedule: str = "constant") -> float:
    """Learning-rate multiplier at optimisation step ``step`` (0-based): linear warm-up, then
    constant or cosine decay to 0.1 at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "cosine":
        span = max(1, total - warmup)
        frac = min(1.0, (step - warmup) / span)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
    return 1.0


def dice_per_class(pred: torch.Tensor, label: torch.Tensor, num_classes: int) -> List[float]:
    """Dice of classes ``1 .. K-1`` for one volume (any shape); NaN where both are empty."""
    out = []
    for k in range(1, num_classes):
        a, b = pred == k, label == k
        denom = int(a.sum()) + int(b.sum())
        out.append(float("nan") if denom == 0 else 2.0 * int((a & b).sum()) / denom)
    return out


@torch.no_grad()
def validate(
    net: torch.nn.Module,
    volumes: Sequence[Tuple[str, torch.Tensor, torch.Tensor]],
    num_classes: int,
    schedule: CategoricalSchedule,
    sampled_steps: Sequence[int],
    device: torch.device,
    batch_size: int = 16,
    class_names: Optional[Sequence[str]] = None,
) -> Dict[str, float]:
    """Mean per-class Dice over volumes, with the engine's reverse sampler (mode ``uc``; one
    forward pass for a plain segmentor).

    volumes: ``[(case, images (Z, 1, N, N), labels (Z, N, N))]`` on the network grid. Returns
    ``{"dice": mean over foreground classes, "dice_<name>": ...}``; a class absent from a
    volume's label and prediction does not count for that volume.
    """
    names = list(class_names or [f"class{k}" for k in range(num_classes)])
    was_training = net.training
    net.eval()
    scores = []
    try:
        for _, images, labels in volumes:
            preds = []
            for i in range(0, images.shape[0], batch_size):
                x = images[i : i + batch_size].to(device)
                if getattr(net, "one_shot", False):  # a plain segmentor: one forward pass
                    logits = net(x)
                else:
                    logits = run_trajectory(net, x, sampled_steps, num_classes, mode="uc", schedule=schedule).logits
                preds.append(logits.argmax(dim=1).cpu())
            scores.append(dice_per_class(torch.cat(preds), labels.long(), num_classes))
    finally:
        net.train(was_training)
    arr = np.array(scores, dtype=np.float64).reshape(-1, num_classes - 1)
    with np.errstate(all="ignore"):
        per_class = np.nanmean(arr, axis=0) if len(arr) else np.full(num_classes - 1, np.nan)
    per_class = np.nan_to_num(per_class, nan=0.0)
    out = {"dice": float(per_class.mean()) if len(per_class) else 0.0}
    out.update({f"dice_{names[k]}": float(per_class[k - 1]) for k in range(1, num_classes)})
    return out
