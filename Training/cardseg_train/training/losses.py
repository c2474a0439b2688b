"""Training objective: variational categorical diffusion loss plus an auxiliary clean-state loss.

Paper, Implementation Details: "a variational diffusion loss with an auxiliary clean-state
prediction loss comprising cross-entropy, Dice, and boundary terms". With ``p̂0 = softmax(logits)``
the network's predicted clean label distribution, ``x0`` the one-hot label and ``x_t`` the state
fed to the network at step ``t``:

* ``kl``: mean over pixels of ``KL(q(x_{t-1} | x_t, x0) || q(x_{t-1} | x_t, p̂0))``
  (:meth:`cardseg.method.diffusion.CategoricalSchedule.variational_kl`); zero exactly when ``p̂0 = x0``.
* ``ce``: pixel-wise cross-entropy of ``p̂0`` against ``x0``.
* ``dice``: soft Dice loss on ``p̂0`` over the foreground classes, pooled over the batch
  (MONAI ``DiceLoss``), so a class absent from one slice does not dominate.
* ``boundary``: cross-entropy restricted to a band around the label edges. The band holds the
  pixels whose ``(2r+1) x (2r+1)`` neighbourhood (``r = boundary_radius``) contains more than
  one label; the term is the mean cross-entropy over those pixels (0 if a batch has no edge).
  It is a boundary-weighted CE written as a separate term: cheap, differentiable, on-device,
  and it pushes the model where Dice and plain CE are dominated by easy interior pixels.

Total: ``w_kl·kl + w_ce·ce + w_dice·dice + w_boundary·boundary`` (weights in :class:`LossWeights`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from cardseg.method.diffusion import CategoricalSchedule, one_hot


@dataclass
class LossWeights:
    kl: float = 1.0
    ce: float = 1.0
    dice: float = 1.0
    boundary: float = 0.5
    boundary_radius: int = 2

    def to_dict(self) -> dict:
        return asdict(self)


def boundary_band(labels: torch.Tensor, radius: int = 2) -> torch.Tensor:
    """Bool ``(B, H, W)``: pixels within ``radius`` (Chebyshev) of a change of label.

    labels: integer ``(B, H, W)``. A pixel is in the band when the max and min label over its
    ``(2r+1)²`` window differ (max pooling of the label map and of its negative).
    """
    lab = labels[:, None].float()
    k = 2 * int(radius) + 1
    hi = F.max_pool2d(lab, k, stride=1, padding=radius)
    lo = -F.max_pool2d(-lab, k, stride=1, padding=radius)
    return (hi != lo)[:, 0]


def soft_dice_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Soft Dice loss over foreground classes, batch-pooled (MONAI ``DiceLoss``)."""
    from monai.losses import DiceLoss

    fn = DiceLoss(include_background=False, to_onehot_y=True, softmax=True, batch=True)
    return fn(logits.float(), labels[:, None].long())


def boundary_ce(logits: torch.Tensor, labels: torch.Tensor, radius: int = 2) -> torch.Tensor:
    """Mean cross-entropy over the :func:`boundary_band` pixels (0 when there are none)."""
    band = boundary_band(labels, radius)
    ce = F.cross_entropy(logits.float(), labels.long(), reduction="none")
    return (ce * band).sum() / band.sum().clamp_min(1)  # no host sync: 0 when the band is empty


class DiffusionLoss:
    """Compute every term and the weighted total for one batch.

    ``loss(logits (B,K,H,W), labels (B,H,W), x_t (B,K,H,W), t (B,))`` →
    ``(total scalar tensor, {name: detached scalar tensor})`` with the unweighted terms (kept
    as tensors so a GPU step does not wait on them; call ``float()`` when logging).
    """

    def __init__(self, schedule: CategoricalSchedule, weights: Optional[LossWeights] = None):
        self.schedule = schedule
        self.weights = weights or LossWeights()

    def kl_term(self, logits: torch.Tensor, labels: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        k = logits.shape[1]
        x0 = one_hot(labels, k, torch.float32)
        p0_hat = logits.float().softmax(dim=1)
        return self.schedule.variational_kl(x_t.float(), x0, p0_hat, t).mean()

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor):
        w = self.weights
        terms: Dict[str, torch.Tensor] = {}
        zero = logits.sum() * 0.0
        terms["kl"] = self.kl_term(logits, labels, x_t, t) if w.kl else zero
        terms["ce"] = F.cross_entropy(logits.float(), labels.long()) if w.ce else zero
        terms["dice"] = soft_dice_loss(logits, labels) if w.dice else zero
        terms["boundary"] = boundary_ce(logits, labels, w.boundary_radius) if w.boundary else zero
        total = w.kl * terms["kl"] + w.ce * terms["ce"] + w.dice * terms["dice"] + w.boundary * terms["boundary"]
        return total, {name: v.detach() for name, v in terms.items()}


class SegmentationLoss:
    """The deterministic segmentors' loss: the same CE, soft Dice and boundary terms and weights
    as :class:`DiffusionLoss`, without the diffusion KL. ``loss(logits (B,K,H,W), labels (B,H,W))``
    → ``(total, {name: detached scalar})``."""

    def __init__(self, weights: Optional[LossWeights] = None):
        self.weights = weights or LossWeights()

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor):
        w = self.weights
        zero = logits.sum() * 0.0
        terms = {
            "ce": F.cross_entropy(logits.float(), labels.long()) if w.ce else zero,
            "dice": soft_dice_loss(logits, labels) if w.dice else zero,
            "boundary": boundary_ce(logits, labels, w.boundary_radius) if w.boundary else zero,
        }
        total = w.ce * terms["ce"] + w.dice * terms["dice"] + w.boundary * terms["boundary"]
        return total, {name: v.detach() for name, v in terms.items()}


class AleatoricLoss(SegmentationLoss):
    """The aleatoric segmentor's loss: Kendall and Gal's sampled-logit NLL
    (:func:`cardseg.method.networks.discriminative.aleatoric_nll`) in place of the CE term, the Dice and
    boundary terms on the mean logits. ``loss(mu, log_var (B,K,H,W), labels (B,H,W))``."""

    def __init__(self, weights: Optional[LossWeights] = None, samples: int = 16):
        super().__init__(weights)
        self.samples = int(samples)

    def __call__(self, mu: torch.Tensor, log_var: torch.Tensor, labels: torch.Tensor):
        from cardseg.method.networks.discriminative import aleatoric_nll

        w = self.weights
        zero = mu.sum() * 0.0
        terms = {
            "ce": aleatoric_nll(mu.float(), log_var.float(), labels, self.samples) if w.ce else zero,
            "dice": soft_dice_loss(mu, labels) if w.dice else zero,
            "boundary": boundary_ce(mu, labels, w.boundary_radius) if w.boundary else zero,
        }
        total = w.ce * terms["ce"] + w.dice * terms["dice"] + w.boundary * terms["boundary"]
        return total, {name: v.detach() for name, v in terms.items()}
