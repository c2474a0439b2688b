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
stops the workers at once: they ignore SIGINT themselves, so that only this process decides.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

#: the worker of this process (set by :func:`_start_worker` in each worker process)
_WORKER = None


def default_threads(workers: int) -> int:
    """CPU threads per worker when ``--threads`` is not given: the machine's CPUs shared out."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def _start_worker(bundle_root: str, method: str, device: str, batch_size: int, threads: int, backend: str) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the batch process's to handle
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
    args = (str(bundle_root), method, device, batch_size, threads, backend)
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


def _stop(pool: ProcessPoolExecutor) -> None:
    """End the workers now (Ctrl-C, or an error in this process), without waiting for their cases."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        try:
            proc.terminate()
        except Exception:  # noqa: BLE001 - already gone
            pass
    pool.shutdown(wait=False, cancel_futures=True)


def _first(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]
