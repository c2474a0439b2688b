"""Categorical diffusion over label maps (paper Sec. III-A).

Conventions used everywhere in CARDSegment
------------------------------------------
* ``K`` classes; a *state* is an array of shape ``(B, K, H, W)`` whose class axis sums to one
  (one-hot for sampled states, the uniform vector ``u = 1/K`` for ``x_T``): a torch tensor in
  training and with the torch backend, a numpy array with ONNX Runtime (the reverse step, Eq. 3,
  takes either: :mod:`cardseg.base.arrays`; the forward process and the posterior, used in
  training only, take tensors).
* Step indices are ``t = 0 .. T-1`` (the paper's sampled steps for ``T = 50`` are
  ``[49, 37, 24, 12, 0]``). The noise level of step ``t`` is ``abar[t]``, the cosine schedule
  evaluated at diffusion time ``(t + 1) / T`` and normalised by its value at time 0, so that
  ``abar[T-1] = 0`` (``x_{T-1}`` is exactly uniform) and the clean label sits one step below
  index 0 (``abar[-1] := 1``, :meth:`CategoricalSchedule.abar_prev`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

import numpy as np

from cardseg.base import arrays

if TYPE_CHECKING:
    import torch

EPS = 1e-12


def cosine_alpha_bar(num_steps: int, s: float = 0.008) -> np.ndarray:
    """Cosine noise schedule ``abar[t]`` for ``t = 0 .. T-1`` (numpy float64, shape ``(T,)``).

    ``abar(τ) = f(τ) / f(0)`` with ``f(τ) = cos²(((τ + s) / (1 + s)) · π/2)`` evaluated at
    ``τ = (t + 1) / T``. The sequence is strictly decreasing from just below 1 to 0.
    """
    if num_steps < 2:
        raise ValueError(f"the schedule needs at least 2 steps, got {num_steps}")
    tau = np.arange(1, num_steps + 1, dtype=np.float64) / num_steps
    f = np.cos((tau + s) / (1 + s) * math.pi / 2) ** 2
    f0 = math.cos(s / (1 + s) * math.pi / 2) ** 2
    abar = np.clip(f / f0, 0.0, 1.0)
    abar[-1] = 0.0  # cos(pi/2) is 0 up to rounding: make x_{T-1} exactly uniform
    return abar


def default_sampling_steps(num_steps: int = 50, num_sampled: int = 5) -> List[int]:
    """Evenly spaced descending step indices, ``round(linspace(T-1, 0, n))``: [49, 37, 24, 12, 0]."""
    if not 1 <= num_sampled <= num_steps:
        raise ValueError(f"cannot sample {num_sampled} of {num_steps} steps")
    if num_sampled == 1:
        return [0]
    return [int(round((num_steps - 1) * (1 - i / (num_sampled - 1)))) for i in range(num_sampled)]


def uniform_state(shape: Sequence[int], num_classes: int, dtype=None, device=None, like: Any = None) -> Any:
    """The uniform categorical state ``u`` of shape ``(B, K, H, W)`` given ``shape = (B, H, W)``:
    of ``like``'s kind, dtype and device when given (a tensor or a numpy array), else a torch
    tensor (``dtype`` default float32)."""
    b, h, w = shape
    if like is not None:
        return arrays.full((b, num_classes, h, w), 1.0 / num_classes, like)
    import torch

    return torch.full((b, num_classes, h, w), 1.0 / num_classes, dtype=dtype or torch.float32, device=device)


def one_hot(labels: Any, num_classes: int, dtype=None) -> Any:
    """Integer labels ``(B, H, W)`` to a one-hot state ``(B, K, H, W)`` (float32 unless ``dtype``;
    tensor or numpy array, as given)."""
    return arrays.one_hot(labels, num_classes, dtype)


@dataclass(frozen=True)
class CategoricalSchedule:
    """A categorical diffusion process with ``num_steps`` steps and a cosine schedule."""

    num_steps: int = 50
    s: float = 0.008

    @property
    def alpha_bar(self) -> "torch.Tensor":
        """``abar[t]``, shape ``(T,)``, float64 tensor."""
        import torch

        return torch.from_numpy(cosine_alpha_bar(self.num_steps, self.s))

    def abar_prev_table(self) -> np.ndarray:
        """``abar[t-1]`` for ``t = 0 .. T-1`` with ``abar[-1] = 1`` (the clean label): numpy float64 ``(T,)``."""
        return np.concatenate([[1.0], cosine_alpha_bar(self.num_steps, self.s)[:-1]])

    def abar_prev_value(self, t: int) -> float:
        """``abar[t-1]`` of one step index, as a float (:meth:`abar_prev_table`)."""
        return float(self.abar_prev_table()[int(t)])

    def abar(self, t: torch.Tensor) -> torch.Tensor:
        """``abar[t]`` gathered for a batch of step indices ``t`` of shape ``(B,)`` → ``(B,)``."""
        return self.alpha_bar.to(t.device)[t.long()]

    def abar_prev(self, t: torch.Tensor) -> torch.Tensor:
        """``abar[t-1]`` (:meth:`abar_prev_table`) gathered for step indices ``t`` ``(B,)`` → ``(B,)``."""
        return arrays.like(self.abar_prev_table(), t)[t.long()]

    def alpha(self, t: torch.Tensor) -> torch.Tensor:
        """One-step retention ``alpha_t = abar[t] / abar[t-1]``, shape ``(B,)``."""
        return self.abar(t) / self.abar_prev(t)

    # --- Eq. 1: forward process ------------------------------------------------------------
    def forward_probs(self, x0: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Paper Eq. 1: class probabilities of ``q(x_t | x_0) = Cat(abar_t x_0 + (1 - abar_t) u)``.

        x0: ``(B, K, H, W)`` one-hot (or any distribution); t: ``(B,)`` → ``(B, K, H, W)``.
        """
        k = x0.shape[1]
        a = self.abar(t).to(x0.dtype).view(-1, 1, 1, 1)
        return a * x0 + (1 - a) / k

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Draw a one-hot ``x_t ~ q(x_t | x_0)``: ``(B, K, H, W)`` → ``(B, K, H, W)``."""
        import torch

        probs = self.forward_probs(x0, t)
        b, k, h, w = probs.shape
        flat = probs.permute(0, 2, 3, 1).reshape(-1, k)
        draw = torch.multinomial(flat, 1, generator=generator).view(b, h, w)
        return one_hot(draw, k, x0.dtype)

    # --- true posterior, for the variational loss -------------------------------------------
    def posterior(self, x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``q(x_{t-1} | x_t, x_0)`` ∝ ``(alpha_t x_t + (1-alpha_t)/K) ⊙ (abar_{t-1} x_0 + (1-abar_{t-1})/K)``.

        x_t: ``(B, K, H, W)`` state; x0: ``(B, K, H, W)`` one-hot label *or* a predicted
        distribution (then this is the model's posterior ``p_θ(x_{t-1} | x_t)``); t: ``(B,)``.
        Returns ``(B, K, H, W)`` normalised over K. For ``t = 0`` it equals ``x0``.
        """
        k = x_t.shape[1]
        alpha = self.alpha(t).to(x_t.dtype).view(-1, 1, 1, 1)
        abar_prev = self.abar_prev(t).to(x_t.dtype).view(-1, 1, 1, 1)
        theta = (alpha * x_t + (1 - alpha) / k) * (abar_prev * x0 + (1 - abar_prev) / k)
        return theta / theta.sum(dim=1, keepdim=True).clamp_min(EPS)

    def variational_kl(
        self, x_t: torch.Tensor, x0: torch.Tensor, p0_hat: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """Per-pixel ``KL(q(x_{t-1}|x_t,x_0) || q(x_{t-1}|x_t,p̂_0))``, logs clamped at 1e-12.

        x_t, x0, p0_hat: ``(B, K, H, W)``; t: ``(B,)`` → ``(B, H, W)``, zero when ``p0_hat == x0``.
        """
        q = self.posterior(x_t, x0, t)
        p = self.posterior(x_t, p0_hat, t)
        return (q * (q.clamp_min(EPS).log() - p.clamp_min(EPS).log())).sum(dim=1)

    # --- Eq. 3: reverse step ----------------------------------------------------------------
    def reverse_step(self, p_hat: Any, t: int) -> Any:
        """Paper Eq. 3 with the noise term replaced by ``u`` (Implementation Details).

        ``x_{t-1} = onehot(argmax_k [abar_{t-1} p̂_t + (1 - abar_{t-1}) u])``.
        p_hat: ``(B, K, H, W)`` predicted clean distribution at step ``t`` (tensor or numpy array)
        → one-hot ``(B, K, H, W)`` of the same kind and dtype.
        Because the uniform term is the same for every class, the argmax equals ``argmax p̂_t``:
        the schedule shapes training, and the network sees ``t`` through its time embedding.
        So ``argmax p̂_t`` is what is computed. The mixture itself, in float32, would lose the
        difference between two classes' probabilities where ``abar_{t-1}`` is small (0.00097 at
        step 48, the next state of a 50-step sampler's first step; 0.133 at step 37, the shipped
        5-step sampler's: differences under about 3e-5 at step 48 round to ties or swap), so two backends whose networks agree to 1e-6 could take different states. ``t``
        (the step) is kept for the equation's form; the result does not depend on it.
        """
        return one_hot(arrays.argmax(p_hat, axis=1), p_hat.shape[1], p_hat.dtype)
