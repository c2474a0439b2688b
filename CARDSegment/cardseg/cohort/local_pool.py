"""``cardseg batch --workers N``: the cases on N worker processes of this machine, one model each.

Small convolutions on 160 x 160 slices use a CPU's cores poorly when one process runs them with
many threads; N processes with fewer threads each get more cases through where there are many
cores (on this project's 2 cores, where one process already uses both well, two single-thread
workers got 1.10x the cases per minute of one two-thread worker over 12 cases). Each worker
process is started once (``spawn``), loads the bundle once (:class:`cardseg.cohort.batch.CaseWorker`) and
runs one case at a time; results come back to the batch process, which alone writes the cohort
table and the resume state, in completion order, exactly as for one worker or for Ray.

A worker process that dies (killed, out of memory) breaks the whole pool: the cases in flight at
that moment (at most one per worker) fail, one line each; the cases not yet started go to a fresh set of workers (at most ``2 N`` restarts). Ctrl-C
and SIGTERM stop the workers at once: they ignore SIGINT themselves, so that only this process
decides, and it ends and reaps them (:func:`_stop`); on Linux a worker also ends when the batch
process dies by SIGKILL.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

from cardseg.base import cpus

#: the worker of this process (set by :func:`_start_worker` in each worker process)
_WORKER = None


def default_threads(workers: int) -> int:
    """CPU threads per worker when ``--threads`` is not given: the CPUs this process may use
    (affinity and cgroup quota, :func:`cardseg.base.cpus.usable_cpus`) shared out."""
    return cpus.default_threads(workers)


def _die_with_parent(parent: int) -> None:
    """On Linux, have the kernel end this worker when the batch process dies, even by SIGKILL
    (no orphan keeps a model in memory); elsewhere nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call above
        os._exit(1)


def _start_worker(bundle_root: str, method: str, device: str, batch_size: int, threads: int, backend: str,
                  parent: int = 0) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the batch process's to handle
    if parent:
        _die_with_parent(parent)
    from cardseg.cohort.worker import CaseWorker

    _WORKER = CaseWorker(Path(bundle_root), method, device, batch_size, threads, backend)


def _run_case(job) -> dict:
    res = _WORKER.run(job)
    res["worker"] = os.getpid()
    return res


def _failed(job, why: str) -> dict:
    return {"case": job.case, "status": "error", "report": None, "seconds": 0.0, "error": why}


def run_jobs(jobs: Sequence, on_result: Callable[[dict], None], *, bundle_root: Path, method: str = "card",
             device: str = "auto", batch_size: int = 8, threads: Optional[int] = None, backend: str = "torch",
             workers: int = 2) -> int:
    """Run ``jobs`` on ``workers`` local processes, calling ``on_result`` here for each finished
    case (completion order). Returns how many worker processes loaded the bundle (one per
    process that ran a case)."""
    import multiprocessing

    workers = max(1, min(int(workers), len(jobs)))
    threads = threads or default_threads(workers)
    args = (str(bundle_root), method, device, batch_size, threads, backend, os.getpid())
    ctx = multiprocessing.get_context("spawn")
    pending = list(reversed(jobs))  # popped from the end: jobs in their order
    loaded = set()
    restarts = 0
    while pending:
        pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker, initargs=args)
        inflight: Dict[object, object] = {}
        broken = False
        try:
            while (pending and not broken) or inflight:
                while pending and not broken and len(inflight) < workers:  # one case per worker at a time
                    job = pending.pop()
                    try:
                        inflight[pool.submit(_run_case, job)] = job
                    except BrokenProcessPool:
                        pending.append(job)
                        broken = True
                done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
                for fut in done:
                    job = inflight.pop(fut)
                    try:
                        res = fut.result()
                        loaded.add(res.pop("worker", None))
                    except BrokenProcessPool as exc:
                        broken = True
                        res = _failed(job, f"worker process died ({_first(exc)})")
                    except Exception as exc:  # noqa: BLE001 - e.g. a result that cannot be sent back
                        res = _failed(job, f"{type(exc).__name__}: {_first(exc)}")
                    on_result(res)
        except BaseException:
            _stop(pool)
            raise
        pool.shutdown(wait=True)
        if broken and pending:
            restarts += 1
            if restarts > 2 * workers:
                while pending:
                    on_result(_failed(pending.pop(), "no worker process left (they kept dying)"))
    loaded.discard(None)
    return len(loaded)


def _stop(pool: ProcessPoolExecutor, grace_s: float = 5.0) -> None:
    """End the workers now (Ctrl-C, SIGTERM, or an error in this process), without waiting for their
    cases: SIGTERM, then SIGKILL for any still there after ``grace_s``; every worker is reaped
    before this returns, so none outlives the batch (and with them goes multiprocessing's
    resource tracker, which lives as long as a process holds its pipe)."""
    import time

    procs = list((getattr(pool, "_processes", None) or {}).values())
    for proc in procs:
        try:
            proc.terminate()
        except Exception:  # noqa: BLE001 - already gone
            pass
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        except Exception:  # noqa: BLE001 - already reaped
            pass
    pool.shutdown(wait=False, cancel_futures=True)


def _first(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]
