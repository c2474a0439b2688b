"""Cases one after another with their input and output work overlapped with the computation.

``cardseg batch`` with one worker used to run :func:`cardseg.segment.segment_file` case after
case: read, compute, write, then the next read. Here the same three steps
(:func:`~cardseg.segment.read_case`, :func:`~cardseg.segment.compute_case`,
:func:`~cardseg.segment.write_outputs`) form a three-stage pipeline:

* a reader thread reads and checks case *i + 1* while the networks compute case *i*;
* a writer thread writes case *i - 1* (compressed volumes, the Slicer segmentation, read-back
  checks) meanwhile;
* the main thread computes, and hands each finished case to ``on_result`` in the order of
  ``jobs``, once its files are committed (so the resume state only ever names complete outputs).

At most one case is read ahead and one written behind, so memory stays at three cases. A case
that fails at any stage is reported as an error and the others go on, exactly as with
:meth:`cardseg.cohort.worker.CaseWorker.run`. On Ctrl-C or SIGTERM (raised in the main thread),
the case being computed is abandoned (its writer removes its temporary folder), the write in
flight is finished and reported, and the interrupt goes on up.

The threads overlap where the work releases the GIL: SimpleITK's readers and writers, zlib,
ONNX Runtime and torch kernels. ``Testing/benchmarks/batch_overlap.py`` measures the effect.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional, Sequence

from cardseg.cohort.worker import CaseWorker, Job, failed


def run_overlapped(worker: CaseWorker, jobs: Sequence[Job], on_result: Callable[[dict], None]) -> None:
    """Run ``jobs`` with ``worker``'s bundle (loaded here if it is not yet) and settings, calling
    ``on_result`` once per job, in order, always from this thread (see the module docstring)."""
    worker.load()
    bundle, method, device, batch_size = worker.bundle, worker.method, worker.device, worker.batch_size
    from cardseg import __version__
    from cardseg.base.progress import Progress
    from cardseg.io.outdir import OutputWriter
    from cardseg.segment import compute_case, read_case, write_outputs

    def read(job: Job):
        return read_case(job.path, job.out, frame=job.frame, spacing=job.spacing, overwrite=job.overwrite)

    def write(job: Job, t0: float, result, volume, out, writer) -> dict:
        try:
            write_outputs(result, volume, bundle, out, job.overwrite, Progress(), writer=writer)
        except BaseException as exc:
            writer.__exit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, Exception):
                return failed(job, exc, t0)
            raise
        writer.__exit__(None, None, None)
        return {"case": job.case, "status": "ok", "error": "", "report": result.report,
                "seconds": time.perf_counter() - t0}

    if not jobs:
        return
    with ThreadPoolExecutor(1, thread_name_prefix="cardseg-read") as reader, \
            ThreadPoolExecutor(1, thread_name_prefix="cardseg-write") as writer_pool:
        ahead: Future = reader.submit(read, jobs[0])
        behind: Optional[Future] = None
        try:
            for i, job in enumerate(jobs):
                t0 = time.perf_counter()
                current, ahead = ahead, (reader.submit(read, jobs[i + 1]) if i + 1 < len(jobs) else None)
                outcome = _compute(job, t0, current, bundle, method, device, batch_size, OutputWriter,
                                   __version__, compute_case)
                if behind is not None:  # the previous case is written before this one starts writing
                    done = behind.result()
                    behind = None  # reported once, even if an interrupt lands inside on_result
                    on_result(done)
                if isinstance(outcome, dict):  # failed before its write
                    on_result(outcome)
                    continue
                result, volume, out, writer = outcome
                behind = writer_pool.submit(write, job, t0, result, volume, out, writer)
            if behind is not None:
                done = behind.result()
                behind = None
                on_result(done)
        except BaseException:
            if behind is not None:  # a finished case is still reported (its files are complete)
                try:
                    on_result(behind.result())
                except BaseException:  # noqa: BLE001 - the first interruption is the one that counts
                    pass
            if ahead is not None:
                ahead.cancel()
            raise


def _compute(job, t0, current, bundle, method, device, batch_size, writer_class, version, compute_case):
    """``(result, volume, out, entered writer)``, or the error result of a case that failed while
    being read, locked or computed (its writer has cleaned up)."""
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

        result = compute_case(volume, bundle, job.path, method=method, device=device, batch_size=batch_size,
                              frame=job.frame, spacing=job.spacing, progress=Progress(), t_start=t0)
    except BaseException as exc:
        writer.__exit__(type(exc), exc, exc.__traceback__)
        if isinstance(exc, Exception):
            return failed(job, exc, t0)
        raise
    return result, volume, out, writer
