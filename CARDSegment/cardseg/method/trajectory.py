"""Reference-guided dual reverse diffusion and temporal aggregation (paper Sec. IV-A, IV-B).

The primary denoiser advances the categorical state along the deterministic reverse sampler;
the reference is evaluated on the very same states and never advances them. Their pixel-wise
Jensen-Shannon divergence (Eq. 6) is averaged over the sampled steps (Eq. 7, TAC).

Everything here takes torch tensors or numpy arrays alike (:mod:`cardseg.base.arrays`): the
networks are called with what the image is, and their logits must be of the same kind (torch
modules with tensors, ONNX Runtime sessions with either).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Optional, Sequence

from cardseg.base import arrays
from cardseg.method.diffusion import CategoricalSchedule, uniform_state

JS_EPS = 1e-12
LN2 = math.log(2.0)

#: trajectory modes
MODES = ("card", "uc", "no-contrast", "logit-mix")


def js_divergence(p: Any, q: Any, dim: int = 1, eps: float = JS_EPS) -> Any:
    """Paper Eq. 6: pixel-wise Jensen-Shannon divergence (natural log), in ``[0, ln 2]``.

    ``JS(p, q) = ½ KL(p || m) + ½ KL(q || m)`` with ``m = (p + q) / 2``; both inputs are clamped
    at ``eps`` and renormalised first. p, q: ``(B, K, H, W)`` probabilities (tensors or numpy
    arrays) → ``(B, H, W)`` of the same kind.
    """
    p = arrays.clamp_min(p, eps)
    p = p / arrays.total(p, dim, keepdims=True)
    q = arrays.clamp_min(q, eps)
    q = q / arrays.total(q, dim, keepdims=True)
    m = 0.5 * (p + q)
    log_m = arrays.log(m)
    js = 0.5 * arrays.total(p * (arrays.log(p) - log_m), dim) + 0.5 * arrays.total(q * (arrays.log(q) - log_m), dim)
    return arrays.clip(js, 0.0, LN2)


class TACAccumulator:
    """Paper Eq. 7, computed as it goes: ``d̄(v) = (1/|T|) Σ_{t∈T} d_t(v)``.

    ``add(t, d_t)`` takes each step's ``(B, H, W)`` divergence (tensor or numpy array); steps outside ``steps`` (when
    given, e.g. TAC-mid ``{24, 12, 0}`` or TAC-last ``{0}``) are ignored. Only the running sum
    is kept unless ``keep=True``.
    """

    def __init__(self, steps: Optional[Iterable[int]] = None, keep: bool = False):
        self.steps = None if steps is None else set(int(s) for s in steps)
        self.keep = keep
        self.total: Any = None
        self.count = 0
        self.per_step: Dict[int, Any] = {}

    def add(self, t: int, d_t: Any) -> None:
        if self.keep:
            self.per_step[int(t)] = arrays.copy(d_t)
        if self.steps is not None and int(t) not in self.steps:
            return
        self.total = arrays.copy(d_t) if self.total is None else self.total + d_t
        self.count += 1

    def mean(self) -> Any:
        if self.total is None:
            raise ValueError("no step of the trajectory fell into the TAC step set")
        return self.total / self.count


@dataclass
class TrajectoryResult:
    """What one batch's reverse trajectory yields (tensors or numpy arrays, as the image was).

    logits: ``(B, K, H, W)`` terminal primary logits (for ``logit-mix`` the mixed logits).
    tac: ``(B, H, W)`` TAC map ``d̄`` in ``[0, ln 2]``; ``None`` for ``uc`` and ``logit-mix``.
    reference_logits: ``(B, K, H, W)`` the reference's terminal logits (``None`` for ``uc``).
    per_step_js / per_step_states: ``{t: (B, H, W)}`` / ``{t: (B, K, H, W)}`` when asked for.
    """

    logits: Any
    tac: Any = None
    reference_logits: Any = None
    per_step_js: Dict[int, Any] = field(default_factory=dict)
    per_step_states: Dict[int, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrajectoryOptions:
    """What :func:`run_trajectory` measures besides the terminal logits, and how it schedules the networks.

    tac_steps: the steps the TAC average runs over (TAC-last ``[0]``, TAC-mid ``[24, 12, 0]``;
    ``None``: every sampled step); keep_steps: keep each step's JS map ``(B, H, W)`` and state
    ``(B, K, H, W)`` (:attr:`TrajectoryResult.per_step_js`, :attr:`TrajectoryResult.per_step_states`);
    on_step: called with ``t`` after each step (progress); overlap (``card`` only; for networks
    that leave Python's lock free while they run and keep their own threads, such as ONNX Runtime
    sessions): the reference runs on a worker thread while the primary and the reverse step run.
    """

    tac_steps: Optional[Iterable[int]] = None
    keep_steps: bool = False
    on_step: Optional[Callable[[int], None]] = None
    overlap: bool = False


def _without_grad(net: Callable, image: Any, *inputs: Any) -> Any:
    """``net(image, *inputs)`` with autograd off (grad mode is per thread: a worker does not inherit it)."""
    with arrays.no_grad(image):
        return net(image, *inputs)


def run_trajectory(
    primary: Callable,
    image: Any,
    steps: Sequence[int],
    num_classes: int,
    reference: Optional[Callable] = None,
    mode: str = "card",
    schedule: Optional[CategoricalSchedule] = None,
    options: Optional[TrajectoryOptions] = None,
) -> TrajectoryResult:
    """Run the deterministic reverse sampler on one batch, with the reference alongside.

    image: ``(B, C_img, H, W)``, a torch tensor or a numpy array (the states, step indices and
    outputs are then of the same kind; the networks are called as ``net(image, state, t)`` with
    ``t`` ``(B,)`` int64); steps: descending step indices, e.g. ``[49, 37, 24, 12, 0]``;
    ``x_T = u`` is the state fed at the first of them. Autograd is off throughout. Modes:

    * ``card``: primary advances the state, reference evaluated on it, JS → TAC.
    * ``uc``: primary only (no reference, no TAC).
    * ``no-contrast``: the primary on both paths (JS is then 0, the TAC map constant).
    * ``logit-mix``: primary and reference logits averaged at every step; the mix advances
      the state and is the terminal output; no TAC.

    ``options`` (:class:`TrajectoryOptions`): the TAC's step subset, per-step outputs, a
    per-step callback, and whether the reference runs beside the primary (the same calls on the
    same inputs, so the same outputs, in less wall time where the primary leaves cores idle).
    """
    if mode not in MODES:
        raise ValueError(f"unknown trajectory mode {mode!r} (choose from {', '.join(MODES)})")
    steps = [int(s) for s in steps]
    if not steps or any(a <= b for a, b in zip(steps, steps[1:])):
        raise ValueError(f"sampled steps must be strictly descending, got {steps}")
    schedule = schedule or CategoricalSchedule()
    if steps[0] >= schedule.num_steps or steps[-1] < 0:
        raise ValueError(f"sampled steps {steps} fall outside 0..{schedule.num_steps - 1}")
    if mode == "no-contrast":
        reference = primary
    if mode in ("card", "logit-mix") and reference is None:
        raise ValueError(f"mode {mode!r} needs a reference denoiser")
    with arrays.no_grad(image):
        return _run(primary, image, steps, num_classes, reference, mode, schedule, options or TrajectoryOptions())


def _run(
    primary: Callable,
    image: Any,
    steps: Sequence[int],
    num_classes: int,
    reference: Optional[Callable],
    mode: str,
    schedule: CategoricalSchedule,
    options: TrajectoryOptions,
) -> TrajectoryResult:
    """:func:`run_trajectory`'s loop, its arguments checked."""
    b, _, h, w = image.shape
    state = uniform_state((b, h, w), num_classes, like=image)
    keep_steps, on_step = options.keep_steps, options.on_step
    tac = TACAccumulator(options.tac_steps, keep=keep_steps)
    result = TrajectoryResult(logits=None)
    logits = ref_logits = None
    overlap = options.overlap and mode == "card"
    beside = ThreadPoolExecutor(1, thread_name_prefix="cardseg-reference") if overlap else None
    try:
        for t in steps:
            t_batch = arrays.full((b,), t, image, dtype="int64")
            if keep_steps:
                result.per_step_states[t] = arrays.copy(state)
            pending = beside.submit(_without_grad, reference, image, state, t_batch) if beside is not None else None
            logits = primary(image, state, t_batch)
            if mode != "uc" and pending is None:
                ref_logits = logits if reference is primary else reference(image, state, t_batch)
            if mode == "logit-mix":
                logits = 0.5 * (logits + ref_logits)
            p_hat = arrays.softmax(logits, axis=1)
            if t != steps[-1]:
                # contiguous: both networks read it, and an ONNX session then takes it without a copy
                state = arrays.contiguous(schedule.reverse_step(p_hat, t))
            if pending is not None:
                ref_logits = pending.result()
            if mode in ("card", "no-contrast"):
                tac.add(t, js_divergence(p_hat, arrays.softmax(ref_logits, axis=1)))
            if on_step is not None:
                on_step(t)
    finally:
        if beside is not None:
            beside.shutdown(wait=True, cancel_futures=True)
    result.logits = logits
    result.reference_logits = ref_logits
    if mode in ("card", "no-contrast"):
        result.tac = tac.mean()
        result.per_step_js = tac.per_step
    return result
