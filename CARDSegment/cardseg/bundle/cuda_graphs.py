"""Faster execution of the reverse trajectory on a CUDA device: the same arithmetic, scheduled
differently (paper Sec. "Computational overhead").

Nothing here changes the method: :func:`cardseg.method.trajectory.run_trajectory` stays the definition.
These are three independent ways to run it on a GPU, each checked against the eager fp32
trajectory by ``Training/cardseg_gpu/run.py`` before any figure is reported:

* :func:`run_card_two_streams`: the reference reads the same state as the primary, so at every
  step it runs on a second CUDA stream while the primary runs on the first (the small reference
  is bound by kernel launches and memory traffic, not arithmetic, so it fills the gaps).
* :class:`GraphedTrajectory`: the whole fixed-shape trajectory (5 steps, both networks, JS and
  the reverse steps) captured once as a CUDA graph and replayed, removing launch overhead.
* ``dtype=torch.bfloat16``: autocast around either of the above.

What trajectory runs is a :class:`TrajectorySpec` (steps, classes, mode, schedule, TAC steps).
:func:`run_graphed` is the engine's entry: one graph per network pair, mode and grid, kept on
the primary network. On the CPU every entry point falls back to :func:`run_trajectory` unchanged.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Optional, Sequence

import torch

from cardseg.method.diffusion import CategoricalSchedule, uniform_state
from cardseg.method.trajectory import (
    TACAccumulator,
    TrajectoryOptions,
    TrajectoryResult,
    js_divergence,
    run_trajectory,
)


@dataclass(frozen=True)
class TrajectorySpec:
    """The trajectory a batch runs: descending ``steps`` (e.g. ``(49, 37, 24, 12, 0)``),
    ``num_classes``, ``mode`` (``card`` or ``uc``; :func:`run_trajectory_fast` also takes the
    other modes of :data:`cardseg.method.trajectory.MODES`), the diffusion ``schedule`` (default
    :class:`CategoricalSchedule`) and ``tac_steps``, the steps the TAC averages (``None``: all)."""

    steps: Sequence[int]
    num_classes: int
    mode: str = "card"
    schedule: Optional[CategoricalSchedule] = None
    tac_steps: Optional[Iterable[int]] = None

    def eager(self, primary, reference, image: torch.Tensor, tac: bool = True) -> TrajectoryResult:
        """:func:`run_trajectory` of this spec on ``image`` ``(B, C_img, H, W)``; the reference
        and TAC steps only for ``card`` (``tac=False``: every step)."""
        card = self.mode == "card"
        return run_trajectory(
            primary,
            image,
            self.steps,
            self.num_classes,
            reference=reference if card else None,
            mode=self.mode,
            schedule=self.schedule,
            options=TrajectoryOptions(tac_steps=self.tac_steps if card and tac else None),
        )


def _autocast(device: torch.device, dtype: Optional[torch.dtype]):
    if dtype is None or dtype == torch.float32 or device.type != "cuda":
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=dtype)


@torch.no_grad()
def run_card_two_streams(
    primary: torch.nn.Module,
    reference: torch.nn.Module,
    image: torch.Tensor,
    steps: Sequence[int],
    num_classes: int,
    schedule: Optional[CategoricalSchedule] = None,
    tac_steps: Optional[Iterable[int]] = None,
    side_stream: Optional["torch.cuda.Stream"] = None,
) -> TrajectoryResult:
    """CARD's trajectory (mode ``card``) with the reference on a second CUDA stream.

    image: ``(B, C_img, H, W)`` on a CUDA device; steps: descending, e.g. ``[49, 37, 24, 12, 0]``.
    Returns the same :class:`TrajectoryResult` as ``run_trajectory(..., mode="card")``: logits
    ``(B, K, H, W)``, tac ``(B, H, W)``, reference_logits ``(B, K, H, W)``. On the CPU it *is*
    that call.
    """
    if image.device.type != "cuda":
        return TrajectorySpec(steps, num_classes, "card", schedule, tac_steps).eager(primary, reference, image)
    steps = [int(s) for s in steps]
    schedule = schedule or CategoricalSchedule()
    main = torch.cuda.current_stream(image.device)
    side = side_stream or torch.cuda.Stream(device=image.device)
    b, _, h, w = image.shape
    state = uniform_state((b, h, w), num_classes, dtype=image.dtype, device=image.device)
    tac = TACAccumulator(tac_steps)
    logits = ref_logits = None
    for t in steps:
        t_batch = torch.full((b,), t, dtype=torch.long, device=image.device)
        side.wait_stream(main)  # the state and t of this step are ready
        with torch.cuda.stream(side):
            ref_logits = reference(image, state, t_batch)
        logits = primary(image, state, t_batch)
        main.wait_stream(side)
        ref_logits.record_stream(main)
        tac.add(t, js_divergence(logits.softmax(dim=1), ref_logits.softmax(dim=1)))
        if t != steps[-1]:
            state.record_stream(side)
            state = schedule.reverse_step(logits.softmax(dim=1), t)
    return TrajectoryResult(logits=logits, tac=tac.mean(), reference_logits=ref_logits)


def _capture(body: Callable[[], TrajectoryResult], device: torch.device, warmup: int) -> tuple:
    """``(graph, its output)``: ``body`` run ``warmup`` times on a side stream, then captured."""
    warm = torch.cuda.Stream(device=device)
    warm.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(warm), torch.no_grad():
        for _ in range(max(1, warmup)):
            body()
    torch.cuda.current_stream(device).wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        output = body()
    return graph, output


class GraphedTrajectory:
    """A fixed-shape trajectory captured as one CUDA graph and replayed per call.

    ``GraphedTrajectory(primary, reference, example, spec)`` captures the trajectory ``spec``
    (:class:`TrajectorySpec`, mode ``card`` or ``uc``) for inputs of ``example``'s shape
    ``(B, C_img, H, W)``; ``g(image)`` copies the image into the graph's input buffer, replays,
    and returns fresh copies of logits ``(B, K, H, W)`` and tac ``(B, H, W)`` (``None`` for
    ``uc``). ``streams=True`` captures the two-stream schedule; ``dtype=torch.bfloat16`` captures
    under autocast; ``warmup``: eager passes on a side stream before the capture.
    """

    def __init__(
        self,
        primary,
        reference,
        example: torch.Tensor,
        spec: TrajectorySpec,
        *,
        streams: bool = False,
        dtype: Optional[torch.dtype] = None,
        warmup: int = 3,
    ):
        if example.device.type != "cuda":
            raise ValueError("a CUDA graph needs a CUDA device")
        if spec.mode not in ("card", "uc"):
            raise ValueError(f"graph capture supports the modes card and uc, not {spec.mode!r}")
        self.mode = spec.mode
        self.networks = (primary, reference)  # the graph reads their weights: they live as long as it
        self.input = example.detach().clone()
        tac_steps = None if spec.tac_steps is None else [int(t) for t in spec.tac_steps]
        spec = TrajectorySpec(
            spec.steps, spec.num_classes, spec.mode, spec.schedule or CategoricalSchedule(), tac_steps
        )
        side = torch.cuda.Stream(device=example.device) if streams else None

        def body() -> TrajectoryResult:
            with _autocast(example.device, dtype):
                if spec.mode == "card" and streams:
                    return run_card_two_streams(
                        primary,
                        reference,
                        self.input,
                        spec.steps,
                        spec.num_classes,
                        spec.schedule,
                        tac_steps=spec.tac_steps,
                        side_stream=side,
                    )
                return spec.eager(primary, reference, self.input)

        self.graph, self.output = _capture(body, example.device, warmup)

    @torch.no_grad()
    def __call__(self, image: torch.Tensor) -> TrajectoryResult:
        if image.shape != self.input.shape:
            raise ValueError(f"this graph was captured for {tuple(self.input.shape)}, got {tuple(image.shape)}")
        self.input.copy_(image)
        self.graph.replay()
        out = self.output
        return TrajectoryResult(
            logits=out.logits.float().clone(), tac=None if out.tac is None else out.tac.float().clone()
        )


@torch.no_grad()
def run_trajectory_fast(
    primary,
    reference,
    image: torch.Tensor,
    spec: TrajectorySpec,
    *,
    streams: bool = False,
    dtype: Optional[torch.dtype] = None,
) -> TrajectoryResult:
    """Eager trajectory ``spec`` on ``image`` ``(B, C_img, H, W)`` with the chosen schedule: two
    streams (``card`` on CUDA) and/or autocast. The TAC averages every sampled step.

    Same shapes and result as :func:`run_trajectory`; logits and tac returned as float32.
    """
    with _autocast(image.device, dtype):
        if spec.mode == "card" and streams:
            res = run_card_two_streams(primary, reference, image, spec.steps, spec.num_classes, spec.schedule)
        else:
            res = spec.eager(primary, reference, image, tac=False)
    return TrajectoryResult(
        logits=res.logits.float(),
        tac=None if res.tac is None else res.tac.float(),
        reference_logits=res.reference_logits,
    )


#: ``CARDSEG_CUDA_GRAPHS``: ``0`` (or off/false/no) runs the engine eagerly; ``always`` captures a
#: grid's graph at its first batch; anything else (the default) once the grid serves a second
#: volume of the process (:func:`run_graphed`). The outputs are the same in every case.
GRAPHS_ENV = "CARDSEG_CUDA_GRAPHS"
#: the attribute of a primary network that holds its captured graphs (they go with it):
#: ``{key: GraphedTrajectory, or None once capture failed}``
GRAPHS_ATTR = "_cardseg_cuda_graphs"
#: the attribute of a primary network that holds, per graph key not yet captured, the first volume it served
FIRST_VOLUME_ATTR = "_cardseg_graph_first_volume"


def cuda_graphs_mode() -> str:
    """``"off"``, ``"always"`` or ``"reuse"`` (the default), from :data:`GRAPHS_ENV`."""
    value = os.environ.get(GRAPHS_ENV, "1").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "off"
    return "always" if value == "always" else "reuse"


def cuda_graphs_enabled() -> bool:
    """Whether the engine may run its trajectories as CUDA graphs (default yes; see :data:`GRAPHS_ENV`)."""
    return cuda_graphs_mode() != "off"


def _attribute(net, name: str) -> Optional[dict]:
    """The dict a network holds under ``name`` (made on first use); ``None`` if it takes no attribute."""
    held = getattr(net, name, None)
    if held is None:
        held = {}
        try:
            setattr(net, name, held)
        except AttributeError:
            return None
    return held


def _graph_key(reference, image: torch.Tensor, spec: TrajectorySpec, batch_size: int, streams: bool) -> tuple:
    """What one captured graph serves: the reference (``card``), mode, grid, batch size, steps,
    TAC steps, stream schedule, device and dtype."""
    card = spec.mode == "card"
    return (
        id(reference) if card else None,
        spec.mode,
        tuple(image.shape[1:]),
        batch_size,
        tuple(int(t) for t in spec.steps),
        None if spec.tac_steps is None or not card else tuple(int(t) for t in spec.tac_steps),
        bool(streams),
        str(image.device),
        str(image.dtype),
    )


def _padded(image: torch.Tensor, batch_size: int) -> torch.Tensor:
    """``image`` ``(B, C, H, W)`` with zero images appended up to ``batch_size``."""
    if image.shape[0] >= batch_size:
        return image
    padded = image.new_zeros((batch_size,) + tuple(image.shape[1:]))
    padded[: image.shape[0]] = image
    return padded


@torch.no_grad()
def run_graphed(
    primary,
    reference,
    image: torch.Tensor,
    spec: TrajectorySpec,
    *,
    batch_size: int = 8,
    streams: bool = True,
    volume: Optional[int] = None,
    factory: Callable[..., Callable] = GraphedTrajectory,
) -> Optional[TrajectoryResult]:
    """The engine's trajectory ``spec`` on a CUDA device as a replayed CUDA graph, or ``None`` to run it eagerly.

    image: ``(B, C_img, H, W)`` with ``B <= batch_size`` on the networks' device. The batch is
    padded with zero images to ``batch_size`` (every slice is computed on its own, so the padding
    changes no real slice's result), so one graph per network pair, mode and grid serves every
    batch of every volume of a process; it is captured when first wanted (``volume`` below: a few
    eager passes, then the capture) with CARD's reference on a second stream (``streams``; the same outputs, sooner).
    Returns logits ``(B, K, H, W)`` and tac ``(B, H, W)`` (``None`` for ``uc``), float32.
    ``None`` when graphs are switched off (:data:`GRAPHS_ENV`), the batch is larger than
    ``batch_size``, capture failed (warned once; that pair then runs eagerly for the rest of the
    process), or the graph is not captured yet and should not be now (below). ``factory`` builds
    the graph, called as :class:`GraphedTrajectory` is (tests pass another).

    volume: a number naming the volume the batch belongs to (one per
    :func:`cardseg.segment.trajectory_on_slices` call). Capture costs a few eager passes (its
    warm-up) plus the capture, more than it saves over the few batches of one volume, so by
    default a graph is captured only once its key serves a second volume: a one-shot ``cardseg
    segment`` runs eagerly, a batch or the warm engine replays from its second case on. ``None``,
    or :data:`GRAPHS_ENV` ``always``: capture at first use.
    """
    graphs = cuda_graphs_mode()
    if spec.mode not in ("card", "uc") or graphs == "off" or image.shape[0] > batch_size:
        return None
    key = _graph_key(reference, image, spec, batch_size, streams)
    per_net: Optional[Dict[tuple, Optional[Callable]]] = _attribute(primary, GRAPHS_ATTR)
    if per_net is None:  # an object that takes no attribute: no cache, so no graph
        return None
    if key not in per_net and volume is not None and graphs == "reuse":
        first = _attribute(primary, FIRST_VOLUME_ATTR)
        if first is None or first.setdefault(key, volume) == volume:
            return None  # the key's first volume runs eagerly
    b = image.shape[0]
    padded = _padded(image, batch_size)
    if key not in per_net:
        card = spec.mode == "card"
        captured = TrajectorySpec(key[4], spec.num_classes, spec.mode, spec.schedule, key[5])
        try:
            per_net[key] = factory(primary, reference if card else None, padded, captured, streams=streams and card)
        except Exception as e:  # a network that cannot be captured still runs, eagerly
            per_net[key] = None
            warnings.warn(f"CUDA graph capture failed ({type(e).__name__}: {e}); running eagerly", RuntimeWarning)
    graph = per_net[key]
    if graph is None:
        return None
    res = graph(padded)
    return TrajectoryResult(logits=res.logits[:b], tac=None if res.tac is None else res.tac[:b])
