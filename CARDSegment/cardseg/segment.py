"""The segmentation pipeline: volume → slices → dual trajectory → calibrated outputs → files.

With ONNX Runtime networks (:attr:`~cardseg.bundle.loading.Bundle.takes_numpy`) every step runs on
numpy arrays and torch is never imported; with torch networks (CPU or GPU) the trajectory and the
calibration run on torch tensors. The equations are the same functions either way
(:mod:`cardseg.base.arrays`), and so is the resampling (:mod:`cardseg.io.preprocess`: interpolation
matrices, applied on the GPU to a GPU tensor).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, NamedTuple, Optional, Sequence

import numpy as np

from cardseg import __version__
from cardseg.base import arrays
from cardseg.base.devices import device_type as _device_type
from cardseg.base.errors import CardsegError
from cardseg.base.interrupt import shut_down_through_interrupts
from cardseg.base.progress import Progress
from cardseg.bundle.loading import Bundle
from cardseg.io.outdir import OutputWriter, check_output
from cardseg.io.field_of_view import keep_moved, recentre_margin, recentre_offset
from cardseg.io.preprocess import SliceGrid, network_to_slices, normalize_slice, resample_to_network, slices_to_network
from cardseg.io.preprocess import blank_slices
from cardseg.io.volume import Volume
from cardseg.io.written import IncompleteWrite, verify_seg_nrrd, write_image, write_seg_nrrd, write_text
from cardseg.method.calibration import CARD, Uncalibrated, temperature_scale
from cardseg.method.flips import STAGE as FLIP_STAGE, copies_config, flip_copies, flip_map, needs_flips
from cardseg.method.trajectory import TrajectoryOptions, TrajectoryResult, run_trajectory
from cardseg.report import agreement_of, build_report

if TYPE_CHECKING:
    import torch

METHODS = ("card", "uc")
#: logit margin that makes pixels outside the network's field of view background
OUTSIDE_MARGIN = 30.0


@dataclass
class SegmentationResult:
    """Everything one run produces on the input's own grid (arrays ``(Z, Y, X)``)."""

    labels: np.ndarray  # uint8 (Z, Y, X)
    probabilities: np.ndarray  # float32 (Z, Y, X, K), calibrated for card, softmax for uc
    logits: np.ndarray  # float32 (Z, K, Y, X) terminal primary logits on the input grid
    disagreement: Optional[np.ndarray]  # float32 (Z, Y, X) TAC map, card only
    temperature: Optional[np.ndarray]  # float32 (Z, Y, X), card only
    field_of_view: np.ndarray  # bool (Y, X)
    region_ranks: Optional[np.ndarray] = None  # uint16 (Z, Y, X), card only: rank of the flagged region (0 none)
    flips: Optional[np.ndarray] = None  # float32 (Z, Y, X): the flipped runs' disagreement (review map "tac_flips")
    report: Dict[str, object] = field(default_factory=dict)


#: output files of one case written at once (cardseg.io.written.write_image compresses without Python's lock)
WRITE_THREADS = 4


def normalized_slices(volume: Volume, bundle: Bundle) -> np.ndarray:
    """The volume's slices scaled to ``[0, 1]`` as the bundle's preprocessing says: ``(Z, Y, X)``."""
    pre = bundle.config["preprocessing"]
    return np.stack(
        [normalize_slice(s, pre.get("low_percentile", 0.5), pre.get("high_percentile", 99.5)) for s in volume.array]
    ).astype(np.float32)


def slice_grid(shape_yx: tuple, spacing_xy: tuple, bundle: Bundle, offset: tuple = (0.0, 0.0)) -> SliceGrid:
    return SliceGrid(
        tuple(shape_yx),
        tuple(map(float, spacing_xy)),
        float(bundle.config["pixel_spacing_mm"]),
        int(bundle.config["input_size"]),
        tuple(map(float, offset)),
    )


def network_inputs(volume: Volume, bundle: Bundle) -> tuple:
    """Normalised slices on the network grid ``(Z, 1, N, N)`` (a torch tensor) and the :class:`SliceGrid` used."""
    grid = slice_grid(volume.shape[1:], volume.spacing[:2], bundle)
    return slices_to_network(normalized_slices(volume, bundle), grid), grid


@dataclass
class SliceTrajectory:
    """The dual trajectory's outputs brought back to the slices' own grid: numpy arrays when the
    bundle's networks take numpy (ONNX Runtime, :attr:`Bundle.takes_numpy`), else CPU torch tensors.

    logits: ``(Z, K, Y, X)`` terminal primary logits; tac: ``(Z, Y, X)`` TAC map (``None`` for
    ``uc``); fov: ``(Y, X)`` bool numpy, the network's field of view (outside: background, zero
    disagreement); reference_logits: ``(Z, K, Y, X)`` the reference's terminal logits, when asked
    (figures only); step_js: ``{t: (Z, Y, X)}`` each sampled step's JS map, when asked; offset: the
    grid's centre from the slice centre, ``(rows, cols)`` pixels; recentring: a moved grid's trial
    (``offset``, ``agreement_centred``, ``agreement_moved``; :mod:`cardseg.io.field_of_view`); flips:
    ``(Z, Y, X)`` numpy, the flipped runs' disagreement when the review map needs it (:mod:`cardseg.method.flips`);
    blank_slices: the slices whose input is constant (:func:`cardseg.io.preprocess.blank_slices`), made background with no disagreement."""

    logits: Any
    tac: Any
    fov: np.ndarray
    reference_logits: Any = None
    step_js: Dict[int, Any] = field(default_factory=dict)
    offset: tuple = (0.0, 0.0)
    recentring: Optional[dict] = None
    flips: Optional[np.ndarray] = None
    blank_slices: tuple = ()


@dataclass(frozen=True)
class SegmentOptions:
    """How the engine runs the networks on a volume's slices.

    method: ``card`` (calibrated, with the disagreement map) or ``uc`` (the primary alone);
    :func:`trajectory_on_slices` and :func:`run_on_grid` also take ``logit-mix`` (evaluation).
    device: where torch networks run (ONNX Runtime networks run on the CPU); batch_size: slices
    per network call; progress: where the stages are reported (``None``: nowhere)."""

    method: str = "card"
    device: "torch.device | str" = "cpu"
    batch_size: int = 8
    progress: Optional[Progress] = None


@dataclass(frozen=True)
class FileOptions:
    """How :func:`segment_file` reads its input and treats its output folder.

    frame: the frame of a 4-D (cine) input; spacing: ``(x, y, z)`` mm for an input that holds
    none; overwrite: whether a folder cardseg wrote may be replaced (:mod:`cardseg.io.outdir`)."""

    frame: Optional[int] = None
    spacing: Optional[tuple] = None
    overwrite: bool = False


class NetworkRun(NamedTuple):
    """What :func:`run_networks` returns: the trajectory on the slices' grid and the seconds of
    ``preprocess``, ``trajectory`` (and ``flips``: :mod:`cardseg.method.flips`)."""

    trajectory: SliceTrajectory
    timings: Dict[str, float]


#: numbers the volumes whose trajectories run on a CUDA device (:func:`cardseg.bundle.cuda_graphs.run_graphed`)
_VOLUME_NUMBERS = itertools.count()


def trajectory_on_slices(
    slices01: np.ndarray,
    spacing_xy: tuple,
    bundle: Bundle,
    options: Optional[SegmentOptions] = None,
    *,
    with_reference: bool = False,
    keep_step_js: bool = False,
    recentre: Optional[bool] = None,
) -> SliceTrajectory:
    """Run the trajectory on normalised slices and bring the results back to their grid.

    slices01: ``(Z, Y, X)`` scaled to ``[0, 1]`` (:func:`normalized_slices`, perhaps perturbed by the caller);
    spacing_xy: in-plane spacing (x, y) mm; options: :class:`SegmentOptions` (method, device, batch size,
    progress). The TAC averages the bundle's ``tac_steps`` (default: every sampled step); method
    ``logit-mix`` (the paper's ablation: both networks' logits averaged at every step, no TAC) is for
    evaluation. ``with_reference``, ``keep_step_js`` (``card`` only): :class:`SliceTrajectory`. ONNX
    Runtime networks run on numpy arrays (torch not imported), torch networks on tensors on the device.
    ``recentre`` (``None``: the bundle's ``field_of_view`` block or ``$CARDSEG_RECENTRE``): when the
    prediction nears the edge of the centred field of view where the image goes on, the volume is run again on a
    grid centred on the heart (progress stage ``trajectory-moved``) and the run whose networks agree more is
    kept (:mod:`cardseg.io.field_of_view`); ``uc`` then runs as ``card`` (the same cost) and returns no
    disagreement, so both keep the same grid and labels; ``logit-mix`` runs on the grid ``card`` keeps, after
    ``card``'s runs.
    """
    options = options or SegmentOptions()
    method = options.method
    if (with_reference or keep_step_js) and method != "card":
        raise ValueError("with_reference and keep_step_js need method 'card'")
    options = replace(options, progress=options.progress or Progress())
    margin = (
        recentre_margin(bundle.config, recentre)
        if method in METHODS + ("logit-mix",) and bundle.reference is not None
        else None
    )
    run_method = "card" if margin is not None else method  # uc, logit-mix too: card's agreement chooses the grid
    volume = next(_VOLUME_NUMBERS)  # one volume however many grids it runs on (CUDA graphs: run_graphed)

    def run(offset=(0.0, 0.0), stage="trajectory", how=run_method):
        return run_on_grid(
            slice_grid(slices01.shape[1:], spacing_xy, bundle, offset),
            slices01,
            bundle,
            replace(options, method=how),
            with_reference=with_reference,
            keep_step_js=keep_step_js,
            volume=volume,
            stage=stage,
        )

    out = run()
    offset = (
        None
        if margin is None
        else recentre_offset(arrays.to_numpy(arrays.argmax(out.logits, axis=1)), out.fov, spacing_xy, margin_mm=margin)
    )
    if offset is not None:
        centred = run_agreement(out, bundle)
        moved = run(offset, "trajectory-moved")
        score = run_agreement(moved, bundle)
        out = moved if keep_moved(centred, score) else out
        out.recentring = {"offset": offset, "agreement_centred": centred, "agreement_moved": score}
    if method == "logit-mix" and run_method != method:  # on the grid card keeps, as card's rows are measured
        out = replace(run(out.offset, "trajectory-logit-mix", method), recentring=out.recentring)
    elif run_method != method:  # uc: the same grid and labels as card, without the disagreement
        out.tac, out.step_js = None, {}
    return out


def run_agreement(traj: SliceTrajectory, bundle: Bundle) -> Optional[float]:
    """The agreement score ``report.json`` gives a ``card`` trajectory (paper Eq. 5 over its own predicted heart)."""
    return agreement_of(arrays.to_numpy(traj.tac), arrays.to_numpy(arrays.argmax(traj.logits, axis=1)), bundle)


def run_on_grid(
    grid: SliceGrid,
    slices01: np.ndarray,
    bundle: Bundle,
    options: Optional[SegmentOptions] = None,
    *,
    with_reference: bool = False,
    keep_step_js: bool = False,
    volume: Optional[int] = None,
    stage: str = "trajectory",
) -> SliceTrajectory:
    """:func:`trajectory_on_slices` on one network grid, batch by batch: slices01 ``(Z, Y, X)``
    resampled to ``(Z, 1, N, N)``, each batch's trajectory resampled back (``volume``: its
    number for CUDA graphs; ``stage``: the progress stage's name)."""
    options = options or SegmentOptions()
    progress = options.progress or Progress()
    x = resample_to_network(slices01, grid)
    batch_size = options.batch_size
    nb = (x.shape[0] + batch_size - 1) // batch_size
    progress.stage(stage, nb * len(bundle.sampled_steps))
    runner = _BatchRunner.for_grid(bundle, options, progress, keep_step_js, graphable=not with_reference)
    if runner.graph_batch is not None:
        runner.graph_batch = min(batch_size, x.shape[0])
        runner.volume = (
            next(_VOLUME_NUMBERS) if volume is None else volume
        )  # captured once a grid serves a second volume
    outputs = _GridOutputs(grid, x.shape[0], bundle.sampled_steps if keep_step_js else ())
    for b in range(nb):
        outputs.add(b * batch_size, runner(x[b * batch_size : (b + 1) * batch_size]), with_reference)
    return outputs.trajectory(as_torch=not bundle.takes_numpy)


@dataclass
class _BatchRunner:
    """How the batches of one grid run: as a replayed CUDA graph where one serves (``graph_batch``:
    the graphs' batch size, ``None``: always eager), else eagerly (:func:`run_trajectory`)."""

    bundle: Bundle
    mode: str
    progress: Progress
    trajectory: TrajectoryOptions
    to_device: Optional[Callable[[np.ndarray], Any]] = None
    graph_batch: Optional[int] = None
    volume: Optional[int] = None

    @classmethod
    def for_grid(
        cls, bundle: Bundle, options: SegmentOptions, progress: Progress, keep_step_js: bool, graphable: bool
    ) -> "_BatchRunner":
        device = options.device
        to_device = None
        if not bundle.takes_numpy:
            import torch

            def to_device(a: np.ndarray):
                return torch.from_numpy(a).to(device)

        mode = options.method if options.method in ("card", "logit-mix") else "uc"
        # ONNX Runtime sessions run beside each other (own threads, Python's lock free): the same outputs, sooner
        overlap = bool(getattr(bundle.reference, "overlap_safe", False)) and _device_type(device) == "cpu"
        trajectory = TrajectoryOptions(
            tac_steps=bundle.tac_steps if options.method == "card" else None,
            keep_steps=keep_step_js,
            on_step=lambda t: progress.advance(1),
            overlap=overlap,
        )
        # torch networks on a GPU: a batch's whole trajectory as one replayed CUDA graph (cuda_graphs.run_graphed)
        graphed = (
            to_device is not None
            and _device_type(device) == "cuda"
            and mode in ("card", "uc")
            and graphable
            and not keep_step_js
        )
        return cls(bundle, mode, progress, trajectory, to_device, options.batch_size if graphed else None)

    def __call__(self, xb: np.ndarray) -> TrajectoryResult:
        """The trajectory of one batch ``(B, 1, N, N)`` on the network grid."""
        b = self.bundle
        xb = self.to_device(xb) if self.to_device else xb
        if self.graph_batch is not None:
            from cardseg.bundle.cuda_graphs import TrajectorySpec, run_graphed

            spec = TrajectorySpec(b.sampled_steps, b.num_classes, self.mode, b.schedule, self.trajectory.tac_steps)
            res = run_graphed(b.primary, b.reference, xb, spec, batch_size=self.graph_batch, volume=self.volume)
            if res is not None:
                self.progress.advance(len(b.sampled_steps))
                return res
        return run_trajectory(
            b.primary,
            xb,
            b.sampled_steps,
            b.num_classes,
            reference=b.reference,
            mode=self.mode,
            schedule=b.schedule,
            options=self.trajectory,
        )


class _GridOutputs:
    """The batches' outputs brought back from the network grid to the slices' grid ``(Y, X)``, as
    numpy arrays filled batch by batch (no list of parts and concatenated copy for the logits)."""

    def __init__(self, grid: SliceGrid, slices: int, js_steps: Sequence[int]):
        self.grid, self.slices = grid, slices
        self.weights: dict = {}  # the grid's interpolation matrices, made (and moved to the device) once
        self.logits: Optional[np.ndarray] = None  # (Z, K, Y, X)
        self.tac: list = []
        self.reference: list = []
        self.js: Dict[int, list] = {t: [] for t in js_steps}

    def back(self, maps) -> np.ndarray:
        """``(B, C, N, N)`` on the network grid -> ``(B, C, Y, X)`` numpy (a GPU tensor is resampled on the GPU)."""
        return arrays.to_numpy(network_to_slices(maps, self.grid, self.weights))

    def add(self, start: int, res: TrajectoryResult, with_reference: bool) -> None:
        """One batch's trajectory, its first slice ``start``."""
        if res.tac is None:
            part = self.back(res.logits)
        else:  # logits and TAC resampled and brought to the host together: one matmul pair, one copy
            part = self.back(arrays.concatenate([arrays.float32(res.logits), arrays.float32(res.tac)[:, None]], axis=1))
            self.tac.append(part[:, -1].copy())  # a copy: the batch's logits are not kept twice
            part = part[:, :-1]
        if self.logits is None:
            self.logits = np.empty((self.slices,) + part.shape[1:], dtype=np.float32)
        self.logits[start : start + part.shape[0]] = part
        del part
        if with_reference:
            self.reference.append(self.back(res.reference_logits))
        for t in self.js:
            self.js[t].append(self.back(res.per_step_js[t][:, None])[:, 0])

    def trajectory(self, as_torch: bool) -> SliceTrajectory:
        """The whole volume's :class:`SliceTrajectory`, outside the field of view background and no
        disagreement (``as_torch``: CPU tensors sharing the arrays' memory)."""
        fov = self.grid.field_of_view()
        outside = ~fov
        out = SliceTrajectory(_outside_to_background(self.logits, outside), None, fov, offset=tuple(self.grid.offset))
        if self.tac:
            out.tac = np.concatenate(self.tac)
            out.tac[:, outside] = 0.0
        if self.reference:
            out.reference_logits = _outside_to_background(np.concatenate(self.reference), outside)
        for t, parts in self.js.items():
            out.step_js[t] = np.concatenate(parts)
            out.step_js[t][:, outside] = 0.0
        if as_torch:
            import torch

            out.logits, out.tac, out.reference_logits = (
                None if v is None else torch.from_numpy(v) for v in (out.logits, out.tac, out.reference_logits)
            )
            out.step_js = {t: torch.from_numpy(v) for t, v in out.step_js.items()}
        return out


def _outside_to_background(logits: np.ndarray, outside: np.ndarray) -> np.ndarray:
    """Pixels outside the field of view become confident background (in place)."""
    logits[:, :, outside] = -OUTSIDE_MARGIN
    logits[:, 0][:, outside] = 0.0
    return logits


def run_networks(volume: Volume, bundle: Bundle, options: Optional[SegmentOptions] = None) -> NetworkRun:
    """The networks' half of :func:`segment_volume` (on ``options.device``): normalised slices,
    the trajectory, the flipped copies' map where the review needs it. :func:`finish_case` does
    the rest on the CPU (``cardseg batch``: on other threads while the networks run the next case,
    :mod:`cardseg.cohort.pipeline`)."""
    options = options or SegmentOptions()
    if options.method not in METHODS:
        raise CardsegError(f"unknown method {options.method!r} (choose from {', '.join(METHODS)})")
    if options.batch_size < 1:
        raise CardsegError(f"--batch-size must be at least 1, got {options.batch_size}")
    t0 = time.perf_counter()
    slices01 = normalized_slices(volume, bundle)
    timings: Dict[str, float] = {"preprocess": time.perf_counter() - t0}
    t0 = time.perf_counter()
    traj = trajectory_on_slices(slices01, volume.spacing[:2], bundle, options)
    timings["trajectory"] = time.perf_counter() - t0
    if needs_flips(bundle.config, options.method):
        t0 = time.perf_counter()
        traj.flips = flip_disagreement_map(slices01, volume.spacing[:2], bundle, traj, options)
        timings["flips"] = time.perf_counter() - t0
    _blank_to_background(traj, blank_slices(volume.array))
    return NetworkRun(traj, timings)


def _blank_to_background(traj: SliceTrajectory, blank: tuple) -> None:
    """Blank slices become confident background with no disagreement (in place), as outside the
    field of view, and are listed in :attr:`SliceTrajectory.blank_slices` (``report.json``)."""
    if not blank:
        return
    idx = list(blank)
    traj.logits[idx] = -OUTSIDE_MARGIN
    traj.logits[idx, 0] = 0.0
    for maps in (traj.tac, traj.flips):
        if maps is not None:
            maps[idx] = 0.0
    traj.blank_slices = tuple(blank)


def flip_disagreement_map(
    slices01: np.ndarray,
    spacing_xy: tuple,
    bundle: Bundle,
    traj: SliceTrajectory,
    options: Optional[SegmentOptions] = None,
) -> np.ndarray:
    """:func:`cardseg.method.flips.flip_map` of ``traj``: the primary alone on each flipped copy of ``slices01``
    ``(Z, Y, X)``, on its own steps (``copies_config``; one volume for CUDA graphs: a one-shot run's copies do
    not capture one), with ``options``' device and batch size. Returns ``(Z, Y, X)``."""
    options = options or SegmentOptions()
    volume, bundle = next(_VOLUME_NUMBERS), replace(bundle, config=copies_config(bundle.config))

    def run_copy(s, offset, prog):
        grid = slice_grid(s.shape[1:], spacing_xy, bundle, offset)
        copy_options = replace(options, method="uc", progress=prog)
        return run_on_grid(grid, s, bundle, copy_options, volume=volume, stage=FLIP_STAGE).logits

    steps_per_run = -(-slices01.shape[0] // options.batch_size) * len(bundle.sampled_steps)
    return flip_map(slices01, traj, run_copy, steps_per_run, options.progress, flip_copies(bundle.config))


def _finish_volume(run: NetworkRun, volume: Volume, bundle: Bundle, options: SegmentOptions) -> SegmentationResult:
    """Labels ``(Z, Y, X)``, probabilities ``(Z, Y, X, K)`` (``card``: calibrated, temperature Eq. 8 and
    Eq. 4; ``uc``: softmax), disagreement, temperature and the report, from :func:`run_networks`' output."""
    traj, timings, method = run.trajectory, run.timings, options.method
    logits, tac, fov = traj.logits, traj.tac, traj.fov
    t0 = time.perf_counter()
    labels = arrays.to_numpy(arrays.argmax(logits, axis=1)).astype(np.uint8)
    disagreement = temperature = None
    if method == "card":
        cal = bundle.calibrator
        if not isinstance(cal, CARD):
            raise CardsegError(f"bundle calibration method is {cal.name!r}; --method card needs 'card'")
        tau = cal.temperature(tac, outside=~fov)
        logp = temperature_scale(logits, tau)
        disagreement = arrays.to_numpy(tac).astype(np.float32)
        temperature = arrays.to_numpy(tau).astype(np.float32)
    else:
        logp = Uncalibrated().log_probs(logits)
    # in place and without a second copy: at the voxel limit each (Z, K, Y, X) float32 copy is 256 MB
    probs = arrays.to_numpy(logp).astype(np.float32, copy=False)
    del logp
    probs = np.ascontiguousarray(np.exp(probs, out=probs).transpose(0, 2, 3, 1))
    timings["postprocess"] = time.perf_counter() - t0

    result = SegmentationResult(
        labels=labels,
        probabilities=probs,
        logits=arrays.to_numpy(logits),
        flips=traj.flips,
        disagreement=disagreement,
        temperature=temperature,
        field_of_view=fov,
    )
    result.report = build_report(result, volume, bundle, method, options.device, timings, traj.offset, traj.recentring)
    result.report["blank_slices"] = list(traj.blank_slices)
    return result


def segment_volume(volume: Volume, bundle: Bundle, options: Optional[SegmentOptions] = None) -> SegmentationResult:
    """The engine's way in for a volume already read: run the method (``options``: :class:`SegmentOptions`)
    on every slice of ``volume`` ``(Z, Y, X)`` and bring the results back to its grid
    (:class:`SegmentationResult`; numpy throughout with ONNX Runtime networks, torch tensors inside with
    torch networks). Nothing is written (:func:`segment_file` writes a case's folder)."""
    options = options or SegmentOptions()
    return _finish_volume(run_networks(volume, bundle, options), volume, bundle, options)


def write_outputs(
    result: SegmentationResult,
    volume: Volume,
    bundle: Bundle,
    outdir: os.PathLike,
    overwrite: bool = False,
    progress: Optional[Progress] = None,
    writer: Optional[OutputWriter] = None,
) -> Path:
    """Write every output into a temporary folder, then move it into ``outdir`` in one step.

    The folder rules (stamp, what ``overwrite`` may replace, lock, clean-up) are
    :mod:`cardseg.io.outdir`'s; pass an entered ``writer`` to reuse one taken before the work.
    """
    progress = progress or Progress()
    files = output_files(result)
    if writer is None:
        out = check_output(outdir, overwrite)
        with OutputWriter(out, overwrite, version=__version__) as w:
            return write_outputs(result, volume, bundle, out, overwrite, progress, writer=w)
    progress.stage("write", len(files))
    # written beside each other: compressing the float maps releases Python's lock (written.write_image)
    pool = ThreadPoolExecutor(max(1, min(WRITE_THREADS, len(files))), thread_name_prefix="cardseg-write-file")
    futures = []  # filled one by one: an interrupt between two submissions still waits for the first
    try:
        for name in files:
            futures.append(pool.submit(write_one, name, writer.path(name), result, volume, bundle))
        for fut in as_completed(futures):
            if fut.exception() is not None:
                break  # the files not started yet are not written (cancelled below)
            progress.advance(1)
    finally:
        # files being written finish before the writer may remove its folder, even through a second Ctrl-C
        shut_down_through_interrupts(pool)
    for name, fut in zip(files, futures):  # the first failed file in the usual order is the one reported
        if fut.cancelled():
            continue
        exc = fut.exception()
        if isinstance(exc, IncompleteWrite):  # name the file where the user will look for it
            raise IncompleteWrite(writer.out / name, exc.strerror) from None
        if isinstance(exc, OSError):  # e.g. EFBIG or ENOSPC raised by a Python writer
            raise IncompleteWrite(
                writer.out / name, f"could not be written completely ({exc.strerror or exc})"
            ) from None
        if exc is not None:
            raise exc
    return writer.commit()


def segment_file(
    input_path: os.PathLike,
    out: os.PathLike,
    bundle: Bundle,
    options: Optional[SegmentOptions] = None,
    file_options: Optional[FileOptions] = None,
    *,
    volume: Optional[Volume] = None,
    t_start: Optional[float] = None,
) -> dict:
    """The engine's way in for a file, the one path every run takes (``cardseg segment``, ``cardseg
    batch``, ``cardseg serve``, Slicer): check the output folder, read and check the input (unless
    ``volume`` was read already), take the folder's lock, segment (``options``), write atomically.
    Returns the report (its total seconds counted from ``t_start``, default now); raises
    :class:`CardsegError` (one line) with nothing written on bad input.

    Its stages, :func:`read_case`, :func:`run_networks` and :func:`finish_case` under an entered
    :class:`~cardseg.io.outdir.OutputWriter`, and :func:`write_outputs`, are what ``cardseg
    batch`` overlaps across cases (:mod:`cardseg.cohort.pipeline`)."""
    t_start = time.perf_counter() if t_start is None else t_start
    options, file_options = options or SegmentOptions(), file_options or FileOptions()
    out, volume = read_case(input_path, out, file_options=file_options, volume=volume)
    with OutputWriter(out, file_options.overwrite, version=__version__) as writer:
        run = run_networks(volume, bundle, options)
        result = finish_case(
            run, volume, bundle, input_path, options=options, file_options=file_options, t_start=t_start
        )
        write_outputs(result, volume, bundle, out, file_options.overwrite, options.progress, writer=writer)
    return result.report


def read_case(
    input_path: os.PathLike,
    out: os.PathLike,
    file_options: Optional[FileOptions] = None,
    volume: Optional[Volume] = None,
):
    """``(out, volume)``: the output folder checked (:func:`cardseg.io.outdir.check_output`) and the
    input read and checked (unless ``volume`` is given); nothing is written."""
    from cardseg.io.volume import read_volume

    file_options = file_options or FileOptions()
    out = check_output(out, file_options.overwrite, inputs=[input_path])
    if volume is None:
        volume = read_volume(input_path, file_options.frame, file_options.spacing)
    return out, volume


def finish_case(
    run: NetworkRun,
    volume: Volume,
    bundle: Bundle,
    input_path: os.PathLike,
    *,
    options: Optional[SegmentOptions] = None,
    file_options: Optional[FileOptions] = None,
    t_start: float,
) -> SegmentationResult:
    """The CPU half of a case after :func:`run_networks`: what :func:`segment_volume` returns, its
    report also holding the input's fields (path, frame, slices, given spacing, reader notes, total
    seconds since ``t_start``)."""
    options, file_options = options or SegmentOptions(), file_options or FileOptions()
    result = _finish_volume(run, volume, bundle, options)
    result.report["input"] = os.path.abspath(input_path)
    result.report["frame"] = file_options.frame
    result.report["slices"] = int(volume.shape[0])
    if file_options.spacing:
        result.report["spacing_given_mm"] = list(file_options.spacing)
    result.report.update(volume.notes)  # e.g. where one DICOM slice's spacing came from
    result.report["timings_s"]["total"] = time.perf_counter() - t_start
    return result


def output_files(result: SegmentationResult) -> list:
    files = ["segmentation.nii.gz", "segmentation.seg.nrrd", "probabilities.nii.gz"]
    if result.disagreement is not None:
        files += ["disagreement.nii.gz", "temperature.nii.gz", "regions.nii.gz"]
    return files + ["report.json"]


def write_one(name: str, path: Path, result: SegmentationResult, volume: Volume, bundle: Bundle) -> None:
    """Write one output and prove it complete (:mod:`cardseg.io.written`): a short write raises
    :class:`~cardseg.io.written.IncompleteWrite` instead of leaving a truncated file behind."""
    images = {
        "segmentation.nii.gz": lambda: volume.to_image(result.labels),
        "probabilities.nii.gz": lambda: volume.to_image(result.probabilities, is_vector=True),
        "disagreement.nii.gz": lambda: volume.to_image(result.disagreement),
        "temperature.nii.gz": lambda: volume.to_image(result.temperature),
        "regions.nii.gz": lambda: volume.to_image(result.region_ranks),
    }
    if name in images:
        write_image(images[name](), path)
    elif name == "segmentation.seg.nrrd":
        write_seg_nrrd(path, result.labels, volume, bundle.config["classes"])
        verify_seg_nrrd(path, result.labels.shape[::-1])
    elif name == "report.json":
        write_text(path, json.dumps(result.report, indent=2) + "\n")
    else:  # pragma: no cover - output_files and this function list the same names
        raise AssertionError(name)
