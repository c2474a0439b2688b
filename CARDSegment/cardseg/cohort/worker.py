"""The worker: the bundle loaded once, then one case after another through
:func:`cardseg.segment.segment_file` (here, in a local worker process or on a Ray actor)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

from cardseg.base.cpus import default_threads
from cardseg.base.errors import CardsegError, one_line
from cardseg.io.written import set_threads


@dataclass
class Job:
    """What a worker needs for one case (plain data: it travels to Ray workers)."""

    case: str
    path: str
    out: str
    frame: Optional[int] = None
    spacing: Optional[Tuple[float, ...]] = None
    overwrite: bool = False


class CaseWorker:
    """Runs cases one after another; the bundle is loaded at the first case and kept."""

    def __init__(
        self,
        bundle_root: os.PathLike,
        method: str = "card",
        device: str = "auto",
        batch_size: int = 8,
        threads: Optional[int] = None,
        backend: str = "torch",
        review_map: Optional[str] = None,
    ):
        self.bundle_root = Path(bundle_root)
        self.method, self.device_name, self.batch_size, self.threads = method, device, batch_size, threads
        self.backend = backend  # torch, onnx or auto (cardseg.bundle.loading.load_bundle)
        self.review_map = review_map  # the bundle's flagged-region rule to run (cardseg.bundle.review_rules)
        self.bundle = None
        self.device = None
        self.loads = 0  # how often the bundle was loaded (once)

    def load(self, progress=None, checked=None) -> None:
        """Load the bundle onto the device (once); one-line :class:`CardsegError` if it cannot.
        ``progress`` (a :class:`cardseg.base.progress.Progress`) shows a first run's ONNX export.
        As in ``cardseg segment``: on the CPU with both ONNX models cached, torch is never
        imported (:func:`cardseg.bundle.onnx_backend.settle_device`); otherwise it is, with
        ``threads`` CPU threads. ``checked``: :func:`cardseg.bundle.folder.check_bundle`'s result
        for this bundle earlier in the same run (not checked a second time)."""
        if self.bundle is not None:
            return
        from cardseg.bundle.folder import check_bundle
        from cardseg.bundle.loading import load_bundle
        from cardseg.bundle.onnx_backend import settle_device, start_cpu_lookup
        from cardseg.bundle.review_rules import with_review_map

        threads = int(self.threads or default_threads())
        set_threads(threads)  # the outputs' compression threads follow the worker's share of the CPUs
        checked = with_review_map(checked if checked is not None else check_bundle(self.bundle_root), self.review_map)
        lookup = start_cpu_lookup(checked.config, checked.weights, self.backend, self.device_name, threads)
        self.device = settle_device(self.device_name, lookup, threads)
        self.bundle = load_bundle(
            checked.root,
            device=self.device,
            backend=self.backend,
            progress=progress,
            prepared=True,
            checked=checked,
            onnx_lookup=lookup,
            threads=threads,
        )
        self.loads += 1

    def run(self, job: Job) -> dict:
        """``{"case", "status": "ok"|"error", "error", "report", "seconds"}``; never raises for a
        bad case (KeyboardInterrupt and SystemExit pass)."""
        t0 = time.perf_counter()
        try:
            self.load()
            from cardseg.base.progress import Progress
            from cardseg.segment import FileOptions, SegmentOptions, segment_file

            report = segment_file(
                job.path,
                job.out,
                self.bundle,
                SegmentOptions(method=self.method, device=self.device, batch_size=self.batch_size, progress=Progress()),
                FileOptions(frame=job.frame, spacing=job.spacing, overwrite=job.overwrite),
            )
            return {
                "case": job.case,
                "status": "ok",
                "error": "",
                "report": report,
                "seconds": time.perf_counter() - t0,
            }
        except Exception as exc:  # one bad case never stops the batch
            return failed(job, exc, t0)


def failed(job: Job, exc: BaseException, t0: float) -> dict:
    """The result of a case that raised ``exc`` (a one-line message; the batch goes on)."""
    if isinstance(exc, CardsegError):
        msg = one_line(exc)
    elif isinstance(exc, MemoryError):
        msg = "out of memory"
    else:
        msg = f"{type(exc).__name__}: {one_line(exc)}"
    return {"case": job.case, "status": "error", "error": msg, "report": None, "seconds": time.perf_counter() - t0}
