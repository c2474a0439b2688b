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
from typing import Callable, Deque, Optional, Sequence

from cardseg.base.cpus import usable_cpus
from cardseg.cohort.worker import CaseWorker, Job, failed


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
    bundle, method, device, batch_size = worker.bundle, worker.method, worker.device, worker.batch_size
    from cardseg import segment
    from cardseg import __version__
    from cardseg.base.progress import Progress
    from cardseg.io.outdir import OutputWriter

    n_finish = max(1, int(finishers or default_finishers()))

    def read(job: Job):
        return segment.read_case(job.path, job.out, file_options=_file_options(job))

    def finish(job: Job, t0: float, computed, volume, out, writer) -> dict:
        try:
            result = segment.finish_case(
                computed,
                volume,
                bundle,
                job.path,
                options=segment.SegmentOptions(method=method, device=device, batch_size=batch_size),
                file_options=_file_options(job),
                t_start=t0,
            )
            segment.write_outputs(result, volume, bundle, out, job.overwrite, Progress(), writer=writer)
        except BaseException as exc:
            writer.__exit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, Exception):
                return failed(job, exc, t0)
            raise
        writer.__exit__(None, None, None)
        return {
            "case": job.case,
            "status": "ok",
            "error": "",
            "report": result.report,
            "seconds": time.perf_counter() - t0,
        }

    if not jobs:
        return
    behind: Deque[Future] = deque()

    def report_ready(keep: int) -> None:
        """Report finished cases in order, waiting while more than ``keep`` are behind. A case
        leaves ``behind`` only once its result is in hand (an interrupt while waiting loses none)."""
        while behind and (len(behind) > keep or behind[0].done()):
            done = behind[0].result()
            behind.popleft()
            on_result(done)

    with (
        ThreadPoolExecutor(1, thread_name_prefix="cardseg-read") as reader,
        ThreadPoolExecutor(n_finish, thread_name_prefix="cardseg-finish") as finish_pool,
    ):
        ahead: Optional[Future] = reader.submit(read, jobs[0])
        try:
            for i, job in enumerate(jobs):
                t0 = time.perf_counter()
                current, ahead = ahead, (reader.submit(read, jobs[i + 1]) if i + 1 < len(jobs) else None)
                outcome = _compute(
                    job,
                    t0,
                    current,
                    bundle,
                    method,
                    device,
                    batch_size,
                    OutputWriter,
                    __version__,
                    segment.run_networks,
                )
                if isinstance(outcome, dict):  # failed before its finishing: reported in its turn
                    fut: Future = Future()
                    fut.set_result(outcome)
                else:  # handed over before any wait, so its entered writer is always someone's to close
                    computed, volume, out, writer = outcome
                    fut = finish_pool.submit(finish, job, t0, computed, volume, out, writer)
                behind.append(fut)
                report_ready(n_finish)
            report_ready(0)
        except BaseException:
            while behind:  # finished cases are still reported (their files are complete)
                try:
                    report_ready(0)
                except BaseException:  # noqa: BLE001 - the first interruption is the one that counts
                    if behind and behind[0].done() and behind[0].exception() is not None:
                        behind.popleft()  # a case whose finishing itself raised has nothing to report
            if ahead is not None:
                ahead.cancel()
            raise


def _compute(job, t0, current, bundle, method, device, batch_size, writer_class, version, run_networks):
    """``((trajectory, timings), volume, out, entered writer)``, or the error result of a case
    that failed while being read, locked or computed (its writer has cleaned up)."""
    try:
        out, volume = current.result()
    except Exception as exc:  # noqa: BLE001 - one bad case never stops the batch
        return failed(job, exc, t0)
    try:
        writer = writer_class(out, job.overwrite, version=version).__enter__()
    except Exception as exc:  # noqa: BLE001
        return failed(job, exc, t0)
    try:
        from cardseg.base.progress import Progress
        from cardseg.segment import SegmentOptions

        computed = run_networks(volume, bundle, SegmentOptions(method, device, batch_size, Progress()))
    except BaseException as exc:
        writer.__exit__(type(exc), exc, exc.__traceback__)
        if isinstance(exc, Exception):
            return failed(job, exc, t0)
        raise
    return computed, volume, out, writer


def _file_options(job: Job):
    """The :class:`cardseg.segment.FileOptions` of ``job``."""
    from cardseg.segment import FileOptions

    return FileOptions(frame=job.frame, spacing=job.spacing, overwrite=job.overwrite)
