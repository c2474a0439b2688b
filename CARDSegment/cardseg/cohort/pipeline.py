"""Cases one after another with their input and output work overlapped with the computation.

``cardseg batch`` with one worker used to run :func:`cardseg.segment.segment_file` case after
case: read, compute, write, then the next read. Here the same steps
(:func:`~cardseg.segment.read_case`, :func:`~cardseg.segment.run_networks`,
:func:`~cardseg.segment.finish_case` and :func:`~cardseg.segment.write_outputs`) form a pipeline:

* a reader thread reads and checks case *i + 1* while the networks compute case *i*;
* the main thread runs only the networks (the GPU's or ONNX Runtime's share of a case);
* ``finishers`` threads finish the cases computed before: labels, calibrated probabilities,
  agreement, flagged regions and the report, then the compressed volumes, the Slicer
  segmentation and their read-back checks (each case's files written beside each other);
* ``on_result`` is called for each case in the order of ``jobs``, always from the main thread,
  once its files are committed (so the resume state only ever names complete outputs).

At most one case is read ahead and ``finishers + 1`` are finished behind, so memory stays at
``finishers + 3`` cases. A case that fails at any stage is reported as an error and the others
go on, exactly as with :meth:`cardseg.cohort.worker.CaseWorker.run`. On Ctrl-C or SIGTERM
(raised in the main thread), the case being computed is abandoned (its writer removes its
temporary folder), the cases being finished are finished and reported, and the interrupt goes on up.

The threads overlap where the work releases Python's lock: torch and ONNX Runtime kernels, numpy
and SciPy on whole arrays, SimpleITK's readers, zlib. On a GPU the networks take a small share of
a case, so the finishing runs on several threads (``default_finishers``); on 2 CPU cores one.
``Testing/benchmarks/batch_overlap.py`` measures the effect.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Deque, NamedTuple, Optional, Sequence

from cardseg.base.cpus import usable_cpus
from cardseg.cohort.worker import CaseWorker, Job, failed

if TYPE_CHECKING:  # the engine's modules are imported where a batch runs cases
    from cardseg.io.outdir import OutputWriter
    from cardseg.io.volume import Volume
    from cardseg.segment import NetworkRun, SegmentOptions


def default_finishers(cpus: Optional[int] = None) -> int:
    """Threads that finish cases beside the computation: one per 4 usable CPUs, 1 to 4."""
    cpus = cpus if cpus is not None else usable_cpus()
    return max(1, min(4, cpus // 4))


def run_overlapped(
    worker: CaseWorker, jobs: Sequence[Job], on_result: Callable[[dict], None], finishers: Optional[int] = None
) -> None:
    """Run ``jobs`` with ``worker``'s bundle (loaded here if it is not yet) and settings, calling
    ``on_result`` once per job, in order, always from this thread (see the module docstring).
    ``finishers``: threads finishing and writing cases (default :func:`default_finishers`)."""
    worker.load()
    from cardseg.segment import SegmentOptions

    bundle = worker.bundle
    options = SegmentOptions(method=worker.method, device=worker.device, batch_size=worker.batch_size)
    n_finish = max(1, int(finishers or default_finishers()))
    if not jobs:
        return
    behind: Deque[Future] = deque()
    with (
        ThreadPoolExecutor(1, thread_name_prefix="cardseg-read") as reader,
        ThreadPoolExecutor(n_finish, thread_name_prefix="cardseg-finish") as finish_pool,
    ):
        ahead: Optional[Future] = reader.submit(_read, jobs[0])
        try:
            for i, job in enumerate(jobs):
                t0 = time.perf_counter()
                current, ahead = ahead, (reader.submit(_read, jobs[i + 1]) if i + 1 < len(jobs) else None)
                outcome = _compute(job, t0, current, bundle, options)
                if isinstance(outcome, dict):  # failed before its finishing: reported in its turn
                    fut: Future = Future()
                    fut.set_result(outcome)
                else:  # handed over before any wait, so its entered writer is always someone's to close
                    fut = finish_pool.submit(_finish, job, t0, outcome, bundle, options)
                behind.append(fut)
                _report_ready(behind, n_finish, on_result)
            _report_ready(behind, 0, on_result)
        except BaseException:
            _report_finished(behind, on_result)
            if ahead is not None:
                ahead.cancel()
            raise


def _report_ready(behind: Deque[Future], keep: int, on_result: Callable[[dict], None]) -> None:
    """Report finished cases in order, waiting while more than ``keep`` are behind. A case
    leaves ``behind`` only once its result is in hand (an interrupt while waiting loses none)."""
    while behind and (len(behind) > keep or behind[0].done()):
        done = behind[0].result()
        behind.popleft()
        on_result(done)


def _report_finished(behind: Deque[Future], on_result: Callable[[dict], None]) -> None:
    """After an interrupt: the cases behind are still reported as they finish (their files are
    complete); a case whose finishing itself raised has nothing to report."""
    while behind:
        try:
            _report_ready(behind, 0, on_result)
        except BaseException:  # noqa: BLE001 - the first interruption is the one that counts
            if behind and behind[0].done() and behind[0].exception() is not None:
                behind.popleft()


class _Computed(NamedTuple):
    """A case whose networks ran: their result (:func:`cardseg.segment.run_networks`), the volume
    read, its output folder and the entered writer of that folder."""

    networks: "NetworkRun"
    volume: "Volume"
    out: Path
    writer: "OutputWriter"


def _read(job: Job):
    """``(out, volume)`` of ``job`` (:func:`cardseg.segment.read_case`)."""
    from cardseg import segment

    return segment.read_case(job.path, job.out, file_options=_file_options(job))


def _compute(job: Job, t0: float, current: Future, bundle, options: "SegmentOptions") -> "_Computed | dict":
    """The case's :class:`_Computed`, or the error result of a case that failed while being read
    (``current``: its :func:`_read`), locked or computed (its writer has cleaned up). ``options``:
    the :class:`cardseg.segment.SegmentOptions` the networks run with (a fresh progress each case)."""
    from cardseg import __version__, segment
    from cardseg.base.progress import Progress
    from cardseg.io.outdir import OutputWriter

    try:
        out, volume = current.result()
    except Exception as exc:  # noqa: BLE001 - one bad case never stops the batch
        return failed(job, exc, t0)
    try:
        writer = OutputWriter(out, job.overwrite, version=__version__).__enter__()
    except Exception as exc:  # noqa: BLE001
        return failed(job, exc, t0)
    try:
        computed = segment.run_networks(volume, bundle, replace(options, progress=Progress()))
    except BaseException as exc:
        writer.__exit__(type(exc), exc, exc.__traceback__)
        if isinstance(exc, Exception):
            return failed(job, exc, t0)
        raise
    return _Computed(computed, volume, out, writer)


def _finish(job: Job, t0: float, c: _Computed, bundle, options: "SegmentOptions") -> dict:
    """Finish and write a computed case (on a finishing thread) and close its writer: the case's
    result, ok or the error it failed with."""
    from cardseg import segment
    from cardseg.base.progress import Progress

    try:
        result = segment.finish_case(
            c.networks, c.volume, bundle, job.path, options=options, file_options=_file_options(job), t_start=t0
        )
        segment.write_outputs(result, c.volume, bundle, c.out, job.overwrite, Progress(), writer=c.writer)
    except BaseException as exc:
        c.writer.__exit__(type(exc), exc, exc.__traceback__)
        if isinstance(exc, Exception):
            return failed(job, exc, t0)
        raise
    c.writer.__exit__(None, None, None)
    return {
        "case": job.case,
        "status": "ok",
        "error": "",
        "report": result.report,
        "seconds": time.perf_counter() - t0,
    }


def _file_options(job: Job):
    """The :class:`cardseg.segment.FileOptions` of ``job``."""
    from cardseg.segment import FileOptions

    return FileOptions(frame=job.frame, spacing=job.spacing, overwrite=job.overwrite)
