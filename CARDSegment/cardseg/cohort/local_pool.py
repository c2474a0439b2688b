"""``cardseg batch --workers N``: the cases on N worker processes of this machine, one model each.

Small convolutions on 160 x 160 slices use a CPU's cores poorly when one process runs them with
many threads; N processes with fewer threads each get more cases through where there are many
cores (on this project's 2 cores, where one process already uses both well, two single-thread
workers got 1.10x the cases per minute of one two-thread worker over 12 cases). Each worker
process is started once (``spawn``), loads the bundle once (:class:`cardseg.cohort.batch.CaseWorker`) and
runs one case at a time; results come back to the batch process, which alone writes the cohort
table and the resume state, in completion order, exactly as for one worker or for Ray.

A worker process that dies (killed, out of memory) breaks the whole pool: the cases in flight at
that moment (at most one per worker) fail, one line each; the cases not yet started go to a fresh
set of workers (at most ``2 N`` restarts). Ctrl-C and SIGTERM stop the workers without finishing
their cases, and without leaving anything half written: the workers ignore SIGINT, so that only
this process decides; it sends them SIGTERM (:func:`_stop`), which a worker takes like Ctrl-C in
its case (the case's temporary folder and lock are removed, as with one worker) and then ends;
SIGTERM to the whole process group does the same. A worker still there after :data:`STOP_GRACE_S`
(stuck in a native call) is killed; on Linux a worker also ends when the batch process dies by
SIGKILL.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

from cardseg.base import cpus
from cardseg.cohort.options import WorkerOptions

#: the worker of this process (set by :func:`_start_worker` in each worker process)
_WORKER = None
#: whether this worker process is running a case (SIGTERM then stops the case, see :func:`_on_sigterm`)
_BUSY = False
#: seconds a stopped worker is given to clean up its case before it is killed (:func:`_stop`)
STOP_GRACE_S = 30.0
#: seconds after which a stop still waiting for its workers says so (:func:`_stop`)
STOP_NOTICE_S = 3.0


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


def _start_worker(bundle_root: str, options: WorkerOptions, parent: int = 0) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the batch process's to handle
    signal.signal(signal.SIGTERM, _on_sigterm)
    if parent:
        _die_with_parent(parent)
    from cardseg.cohort.worker import CaseWorker

    o = options
    _WORKER = CaseWorker(Path(bundle_root), o.method, o.device, o.batch_size, o.threads, o.backend, o.review_map)


def _on_sigterm(signum, frame) -> None:
    """A worker told to stop: in a case, the case ends as after Ctrl-C (its output writer removes
    the temporary folder and the lock) and then the process (:func:`_run_case`); between cases
    it ends at once (nothing of its own is open). Later SIGTERMs do not cut the cleanup short."""
    from cardseg.base.interrupt import EXIT_TERMINATED, Terminated

    signal.signal(signum, signal.SIG_IGN)
    if not _BUSY:
        os._exit(EXIT_TERMINATED)
    raise Terminated(f"signal {signum}")


def _run_case(job) -> dict:
    global _BUSY
    from cardseg.base.interrupt import EXIT_TERMINATED

    _BUSY = True
    try:
        res = _WORKER.run(job)
    except KeyboardInterrupt:  # stopped (SIGTERM): the case cleaned up on its way out
        os._exit(EXIT_TERMINATED)  # the batch process sees a dead worker, never an exception to raise
    finally:
        _BUSY = False
    res["worker"] = os.getpid()
    return res


def _failed(job, why: str) -> dict:
    return {"case": job.case, "status": "error", "report": None, "seconds": 0.0, "error": why}


def run_jobs(
    jobs: Sequence,
    on_result: Callable[[dict], None],
    *,
    bundle_root: Path,
    options: WorkerOptions = WorkerOptions(),
    workers: int = 2,
) -> int:
    """Run ``jobs`` on ``workers`` local processes, each running its cases with ``options`` (its
    ``threads`` default: :func:`default_threads`), calling ``on_result`` here for each finished
    case (completion order). Returns how many worker processes loaded the bundle (one per
    process that ran a case)."""
    import multiprocessing

    workers = max(1, min(int(workers), len(jobs)))
    options = replace(options, threads=options.threads or default_threads(workers))
    args = (str(bundle_root), options, os.getpid())
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
            pool.shutdown(wait=True)
        except BaseException:
            _stop(pool)
            raise
        if broken and pending:
            restarts += 1
            if restarts > 2 * workers:
                while pending:
                    on_result(_failed(pending.pop(), "no worker process left (they kept dying)"))
    loaded.discard(None)
    return len(loaded)


def _stop(pool: ProcessPoolExecutor, grace_s: Optional[float] = None) -> None:
    """End the workers now (Ctrl-C, SIGTERM, or an error in this process), without waiting for their
    cases to finish: SIGTERM, on which a worker cleans up its case and ends (:func:`_on_sigterm`),
    then SIGKILL for any still there after ``grace_s`` (:data:`STOP_GRACE_S`), or at once on a
    second Ctrl-C. Every worker is reaped before this returns, so none outlives the batch (and
    with them goes multiprocessing's resource tracker, which lives as long as a process holds its
    pipe)."""
    import sys
    import time

    procs = list((getattr(pool, "_processes", None) or {}).values())
    for proc in procs:
        try:
            proc.terminate()
        except Exception:  # noqa: BLE001 - already gone
            pass
    deadline = time.monotonic() + (STOP_GRACE_S if grace_s is None else grace_s)
    notice = min(deadline, time.monotonic() + STOP_NOTICE_S)
    try:
        for until in (notice, deadline):
            if until == deadline and notice < deadline and any(_alive(proc) for proc in procs):
                print(
                    f"cardseg: waiting up to {deadline - time.monotonic():.0f} s for the workers to clean up "
                    "their cases (Ctrl-C again stops them now)",
                    file=sys.stderr,
                )
            for proc in procs:
                try:
                    proc.join(max(0.0, until - time.monotonic()))
                except Exception:  # noqa: BLE001 - already reaped
                    pass
    except BaseException:  # a second Ctrl-C: no more waiting
        _kill(procs)
        raise
    if any(_alive(proc) for proc in procs):
        print(
            "cardseg: a worker process did not stop in time and was killed; the next run into this folder "
            "removes what its case left",
            file=sys.stderr,
        )
    _kill(procs)
    pool.shutdown(wait=False, cancel_futures=True)


def _alive(proc) -> bool:
    try:
        return proc.is_alive()
    except Exception:  # noqa: BLE001 - already reaped
        return False


def _kill(procs) -> None:
    for proc in procs:
        try:
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        except Exception:  # noqa: BLE001 - already reaped
            pass


def _first(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]
