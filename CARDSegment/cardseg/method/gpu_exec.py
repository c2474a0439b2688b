"""Faster execution of the reverse trajectory on a CUDA device: the same arithmetic, scheduled
differently (paper Sec. "Computational overhead").

Nothing here changes the method: :func:`cardseg.method.trajectory.run_trajectory` stays the definition.
These are three independent ways to run it on a GPU, each checked against the eager fp32
trajectory by ``Training/gpu/run.py`` before any figure is reported:

* :func:`run_card_two_streams`: the reference reads the same state as the primary, so at every
  step it runs on a second CUDA stream while the primary runs on the first (the small reference
  is bound by kernel launches and memory traffic, not arithmetic, so it fills the gaps).
* :class:`GraphedTrajectory`: the whole fixed-shape trajectory (5 steps, both networks, JS and
  the reverse steps) captured once as a CUDA graph and replayed, removing launch overhead.
* ``dtype=torch.bfloat16``: autocast around either of the above.

On the CPU every entry point falls back to :func:`run_trajectory` unchanged.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Callable, Dict, Iterable, Optional, Sequence

import torch

from cardseg.method.diffusion import CategoricalSchedule, uniform_state
from cardseg.method.trajectory import TACAccumulator, TrajectoryResult, js_divergence, run_trajectory


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
        return run_trajectory(
            primary, image, steps, num_classes, reference=reference, mode="card", schedule=schedule, tac_steps=tac_steps
        )
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


class GraphedTrajectory:
    """A fixed-shape trajectory captured as one CUDA graph and replayed per call.

    ``GraphedTrajectory(primary, reference, example, steps, K, mode="card")`` captures the
    trajectory for inputs of ``example``'s shape ``(B, C_img, H, W)``; ``g(image)`` copies the
    image into the graph's input buffer, replays, and returns fresh copies of logits
    ``(B, K, H, W)`` and tac ``(B, H, W)`` (``None`` for ``uc``). ``streams=True`` captures the
    two-stream schedule; ``dtype=torch.bfloat16`` captures under autocast.
    """

    def __init__(
        self,
        primary,
        reference,
        example: torch.Tensor,
        steps: Sequence[int],
        num_classes: int,
        mode: str = "card",
        schedule: Optional[CategoricalSchedule] = None,
        streams: bool = False,
        dtype: Optional[torch.dtype] = None,
        warmup: int = 3,
        tac_steps: Optional[Iterable[int]] = None,
    ):
        if example.device.type != "cuda":
            raise ValueError("a CUDA graph needs a CUDA device")
        if mode not in ("card", "uc"):
            raise ValueError(f"graph capture supports the modes card and uc, not {mode!r}")
        self.mode = mode
        self.networks = (primary, reference)  # the graph reads their weights: they live as long as it
        self.input = example.detach().clone()
        tac_steps = None if tac_steps is None else [int(t) for t in tac_steps]
        schedule = schedule or CategoricalSchedule()
        side = torch.cuda.Stream(device=example.device) if streams else None

        def body() -> TrajectoryResult:
            with _autocast(example.device, dtype):
                if mode == "card" and streams:
                    return run_card_two_streams(
                        primary,
                        reference,
                        self.input,
                        steps,
                        num_classes,
                        schedule,
                        tac_steps=tac_steps,
                        side_stream=side,
                    )
                return run_trajectory(
                    primary,
                    self.input,
                    steps,
                    num_classes,
                    reference=reference if mode == "card" else None,
                    mode=mode,
                    schedule=schedule,
                    tac_steps=tac_steps if mode == "card" else None,
                )

        warm = torch.cuda.Stream(device=example.device)
        warm.wait_stream(torch.cuda.current_stream(example.device))
        with torch.cuda.stream(warm), torch.no_grad():
            for _ in range(max(1, warmup)):
                body()
        torch.cuda.current_stream(example.device).wait_stream(warm)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.output = body()

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
    steps: Sequence[int],
    num_classes: int,
    mode: str = "card",
    schedule: Optional[CategoricalSchedule] = None,
    streams: bool = False,
    dtype: Optional[torch.dtype] = None,
) -> TrajectoryResult:
    """Eager trajectory with the chosen schedule: two streams (``card`` on CUDA) and/or autocast.

    Same shapes and result as :func:`run_trajectory`; logits and tac returned as float32.
    """
    with _autocast(image.device, dtype):
        if mode == "card" and streams:
            res = run_card_two_streams(primary, reference, image, steps, num_classes, schedule)
        else:
            res = run_trajectory(
                primary,
                image,
                steps,
                num_classes,
                reference=reference if mode == "card" else None,
                mode=mode,
                schedule=schedule,
            )
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


@torch.no_grad()
def run_graphed(
    primary,
    reference,
    image: torch.Tensor,
    steps: Sequence[int],
    num_classes: int,
    *,
    mode: str = "card",
    schedule: Optional[CategoricalSchedule] = None,
    tac_steps: Optional[Iterable[int]] = None,
    batch_size: int = 8,
    streams: bool = True,
    volume: Optional[int] = None,
    factory: Callable[..., Callable] = GraphedTrajectory,
) -> Optional[TrajectoryResult]:
    """The engine's trajectory on a CUDA device as a replayed CUDA graph, or ``None`` to run it eagerly.

    image: ``(B, C_img, H, W)`` with ``B <= batch_size`` on the networks' device. The batch is
    padded with zero images to ``batch_size`` (every slice is computed on its own, so the padding
    changes no real slice's result), so one graph per network pair, mode and grid serves every
    batch of every volume of a process; it is captured when first wanted (``volume`` below: a few
    eager passes, then the capture) with CARD's reference on a second stream (``streams``; the same outputs, sooner).
    Returns logits ``(B, K, H, W)`` and tac ``(B, H, W)`` (``None`` for ``uc``), float32.
    ``None`` when graphs are switched off (:data:`GRAPHS_ENV`), the batch is larger than
    ``batch_size``, capture failed (warned once; that pair then runs eagerly for the rest of the
    process), or the graph is not captured yet and should not be now (below). ``factory`` builds
    the graph (:class:`GraphedTrajectory`; tests pass another).

    volume: a number naming the volume the batch belongs to (one per ``trajectory_on_slices``
    call). Capture costs a few eager passes (its warm-up) plus the capture, more than it saves
    over the few batches of one volume, so by default a graph is captured only once its key
    serves a second volume: a one-shot ``cardseg segment`` runs eagerly, a batch or the warm
    engine replays from its second case on. ``None``, or :data:`GRAPHS_ENV` ``always``: capture at
    first use.
    """
    graphs = cuda_graphs_mode()
    if mode not in ("card", "uc") or graphs == "off" or image.shape[0] > batch_size:
        return None
    steps = tuple(int(t) for t in steps)
    tac_key = None if tac_steps is None or mode != "card" else tuple(int(t) for t in tac_steps)
    key = (
        id(reference) if mode == "card" else None,
        mode,
        tuple(image.shape[1:]),
        batch_size,
        steps,
        tac_key,
        bool(streams),
        str(image.device),
        str(image.dtype),
    )
    per_net: Optional[Dict[tuple, Optional[Callable]]] = _attribute(primary, GRAPHS_ATTR)
    if per_net is None:  # an object that takes no attribute: no cache, so no graph
        return None
    if key not in per_net and volume is not None and graphs == "reuse":
        first = _attribute(primary, FIRST_VOLUME_ATTR)
        if first is None or first.setdefault(key, volume) == volume:
            return None  # the key's first volume runs eagerly
    b = image.shape[0]
    padded = image
    if b < batch_size:
        padded = image.new_zeros((batch_size,) + tuple(image.shape[1:]))
        padded[:b] = image
    if key not in per_net:
        try:
            per_net[key] = factory(
                primary,
                reference if mode == "card" else None,
                padded,
                steps,
                num_classes,
                mode=mode,
                schedule=schedule,
                streams=streams and mode == "card",
                tac_steps=tac_key,
            )
        except Exception as e:  # a network that cannot be captured still runs, eagerly
            per_net[key] = None
            warnings.warn(f"CUDA graph capture failed ({type(e).__name__}: {e}); running eagerly", RuntimeWarning)
    graph = per_net[key]
    if graph is None:
        return None
    res = graph(padded)
    return TrajectoryResult(logits=res.logits[:b], tac=None if res.tac is None else res.tac[:b])
