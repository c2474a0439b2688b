"""What a batch is asked to do (:class:`BatchOptions`, from the command line or from Python), the
checks those options get before anything is read, and what a batch returns."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from cardseg.base.errors import CardsegError
from cardseg.base.options import check_run_options


@dataclass
class BatchOptions:
    inputs: Sequence[str] = ()
    manifest: Optional[str] = None
    output: str = ""
    bundle: Optional[str] = None
    method: str = "card"
    device: str = "auto"
    batch_size: int = 8
    frame: Optional[int] = None
    spacing: Optional[str] = None
    overwrite: bool = False
    quiet: bool = False
    progress: str = "bar"
    threads: Optional[int] = None
    #: what runs the networks of the local worker: torch, onnx or auto (cardseg.bundle.loading.load_bundle);
    #: Ray's workers always run torch
    backend: str = "torch"
    #: local worker processes, one model each (cardseg.cohort.local_pool); 1: the cases run in this process
    workers: int = 1
    ray: Optional[str] = None
    ray_workers: Optional[int] = None
    ray_cpus_per_worker: float = 1.0
    report: bool = True
    report_thumbnails: int = 200
    hash_threads: int = 4
    #: which of the bundle's flagged-region rules runs, by its map (cardseg.bundle.review_rules); None: the bundle's own
    review_map: Optional[str] = None
    #: what a cine input (a 4D file with no frame picked) runs: "ed-es" (the default: a fast pass over its
    #: frames finds ED and ES, then those two run) or "all" (every frame runs); see cardseg.cohort.cine
    frames: Optional[str] = None


@dataclass(frozen=True)
class WorkerOptions:
    """How each worker of a batch runs its cases (:class:`cardseg.cohort.worker.CaseWorker`).

    method: ``card`` or ``uc``; device: where torch networks run (``auto``, ``cpu``, ``cuda``...);
    batch_size: slices per network call; threads: CPU threads per worker (``None``: the worker's
    share of the CPUs); backend: what runs the networks, torch, onnx or auto
    (:func:`cardseg.bundle.loading.load_bundle`); review_map: which of the bundle's flagged-region
    rules runs (:mod:`cardseg.bundle.review_rules`; ``None``: the bundle's own)."""

    method: str = "card"
    device: str = "auto"
    batch_size: int = 8
    threads: Optional[int] = None
    backend: str = "torch"
    review_map: Optional[str] = None


@dataclass
class BatchResult:
    outdir: Path
    rows: List[dict] = field(default_factory=list)
    subjects: List[dict] = field(default_factory=list)
    files: List[str] = field(default_factory=list)
    computed: int = 0
    reused: int = 0
    failed: int = 0
    seconds: float = 0.0
    worker_loads: int = 0


def check_options(o: BatchOptions) -> None:
    from cardseg.cohort.cine import check_frames_mode

    check_run_options(o.batch_size, o.threads, o.frame)
    check_frames_mode(o.frames, o.frame)
    if o.method not in ("card", "uc"):
        raise CardsegError(f"unknown method {o.method!r} (card or uc)")
    if o.manifest and o.inputs:
        raise CardsegError("give INPUTs or --manifest, not both")
    if not o.manifest and not o.inputs:
        raise CardsegError("nothing to run: give INPUT files, folders or patterns, or --manifest CSV")
    if o.ray_workers is not None and o.ray_workers < 1:
        raise CardsegError(f"--ray-workers must be at least 1, got {o.ray_workers}")
    if o.workers < 1:
        raise CardsegError(f"--workers must be at least 1, got {o.workers}")
    if o.workers > 1 and o.ray:
        raise CardsegError("--workers is for this machine; with --ray use --ray-workers")
    if o.ray_workers is not None and not o.ray:
        raise CardsegError(
            "--ray-workers is for a Ray cluster (--ray ADDRESS or --ray local); on this machine use --workers N"
        )
    if not (math.isfinite(o.ray_cpus_per_worker) and o.ray_cpus_per_worker > 0):
        raise CardsegError(f"--ray-cpus-per-worker must be a number above 0, got {o.ray_cpus_per_worker}")
    if o.report_thumbnails < 0:
        raise CardsegError(f"--report-thumbnails must be 0 or more, got {o.report_thumbnails}")


def worker_options(o: BatchOptions, backend: Optional[str] = None) -> WorkerOptions:
    """The :class:`WorkerOptions` of a batch's workers; ``backend``: the one its check load settled on
    (default: the one asked for)."""
    return WorkerOptions(
        method=o.method,
        device=o.device,
        batch_size=o.batch_size,
        threads=o.threads,
        backend=o.backend if backend is None else backend,
        review_map=o.review_map,
    )


def options_from_args(a) -> BatchOptions:
    """The :class:`BatchOptions` of a parsed ``cardseg batch`` command line."""
    return BatchOptions(
        inputs=list(a.inputs or ()),
        manifest=a.manifest,
        output=a.output,
        bundle=a.bundle,
        method=a.method,
        device=a.device,
        batch_size=a.batch_size,
        frame=a.frame,
        spacing=a.spacing,
        overwrite=a.overwrite,
        quiet=a.quiet,
        progress=a.progress,
        threads=a.threads,
        backend=a.backend or "torch",
        workers=a.workers,
        ray=a.ray,
        ray_workers=a.ray_workers,
        ray_cpus_per_worker=a.ray_cpus_per_worker,
        report=not a.no_report,
        report_thumbnails=a.report_thumbnails,
        review_map=a.review_map,
        frames=getattr(a, "frames", None),
    )
