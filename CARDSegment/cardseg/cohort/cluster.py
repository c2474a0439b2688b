"""``cardseg batch --ray``: the batch's cases as tasks of Ray actors, one model per actor.

Imported only when ``--ray`` is given (Ray is the optional ``[cluster]`` extra). The driver
(:func:`cardseg.cohort.batch.run_batch`) decides which cases to run, keeps the state file and writes the
tables exactly as for a local batch; this module only spreads :class:`cardseg.cohort.batch.Job` s over
actors, each a :class:`cardseg.cohort.batch.CaseWorker` that loads the bundle once and writes every case
it runs through :func:`cardseg.segment.segment_file` straight into ``OUTDIR/<case>/``.

How things move:

* **the bundle** travels through Ray's object store (its ``bundle.json`` and weight files, a few
  MB); each actor writes it into a private temporary folder, checks it there like any bundle
  (schema, checksums) and loads it: the nodes need not see the driver's bundle folder;
* **inputs and results** do not travel through Ray: input paths and OUTDIR are absolute paths that
  every node must see the same way (a shared filesystem: NFS, Lustre, a mounted bucket). An
  actor that cannot see OUTDIR reports each of its cases as failed with a line saying so;
* **reports** (``report.json``'s content, a few KB) come back as task results, so the driver
  builds the table without reading the case folders again.

Actors ask for ``cpus_per_worker`` CPUs each and, when the cluster has GPUs and the device is not
``cpu``, one GPU each (then there is one actor per GPU unless ``workers`` says otherwise).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import tempfile
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from cardseg.base.errors import CardsegError, one_line
from cardseg.cohort.layout import BATCH_STAMP
from cardseg.cohort.options import WorkerOptions
from cardseg.cohort.worker import CaseWorker, Job

try:
    import ray
except ImportError:  # pragma: no cover - depends on the extra
    ray = None

#: how many cases an actor is given ahead, so that it never waits for the driver
PREFETCH = 2


def connect(address: str) -> bool:
    """Connect (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``) or start one here (``local``);
    True when this call started or connected Ray (and so must :func:`disconnect` it). A Ray
    already initialised in this process (a test, a notebook) is used as it is. One-line
    :class:`CardsegError` when there is no Ray or no cluster there."""
    if ray is None:
        raise CardsegError("--ray needs Ray: pip install 'cardsegment[cluster]'")
    if ray.is_initialized():  # e.g. a test or a notebook that called ray.init() itself
        return False
    kwargs = dict(ignore_reinit_error=True, logging_level="WARNING", log_to_driver=False, include_dashboard=False)
    from cardseg.base.interrupt import keep_sigterm_handler

    try:
        with keep_sigterm_handler():  # ray.init's own handler would exit without the batch's cleanup
            if address == "local":
                ray.init(**kwargs)
            else:
                ray.init(address=address, **kwargs)
    except Exception as exc:
        raise CardsegError(f"--ray {address}: cannot connect to a Ray cluster ({one_line(exc)})") from None
    return True


def check_capacity(cpus_per_worker: float, address: str) -> None:
    """An actor of ``cpus_per_worker`` CPUs must fit on a node of the connected cluster: on the
    cluster this batch starts here (``--ray local``) a bigger one would wait forever, so that is a
    one-line :class:`CardsegError`; on another cluster (an autoscaler may add nodes) a warning."""
    sizes = [float((n.get("Resources") or {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]
    largest = max(sizes, default=0.0)
    if cpus_per_worker <= largest:
        return
    msg = (
        f"--ray-cpus-per-worker {cpus_per_worker:g}: no node of the Ray cluster has that many CPUs "
        f"(the largest has {largest:g})"
    )
    if address == "local":
        raise CardsegError(msg)
    print(f"cardseg: warning: {msg}; the workers wait until the cluster has such a node", file=sys.stderr)


def _bundle_blob(bundle_root: Path, config: dict) -> Dict[str, bytes]:
    names = ["bundle.json"] + [spec["file"] for spec in config["networks"].values()]
    return {n: (Path(bundle_root) / n).read_bytes() for n in dict.fromkeys(names)}


#: the prefix of an actor's private bundle folder in its node's temporary folder (then its pid)
BUNDLE_TMP_PREFIX = "cardseg-bundle-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def sweep_bundle_folders(tmpdir: Optional[str] = None) -> int:
    """Remove the private bundle folders (``cardseg-bundle-<pid>-*``) that actors of this node left
    when they were killed: those whose process is gone. Returns how many were removed."""
    root = Path(tmpdir or tempfile.gettempdir())
    removed = 0
    try:
        entries = list(root.iterdir())
    except OSError:
        return 0
    for e in entries:
        m = re.match(re.escape(BUNDLE_TMP_PREFIX) + r"(\d+)-", e.name)
        if m and e.is_dir() and not e.is_symlink() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(e, ignore_errors=True)
            removed += 1
    return removed


class _WorkerActor:
    """One model on one Ray worker: the bundle is written to a private folder, checked, loaded at
    once and the folder removed again, so that an actor that is killed later leaves nothing behind
    (a folder left by one killed while loading is removed by the next actor on that node)."""

    def __init__(self, blob: Dict[str, bytes], outdir: str, options: WorkerOptions):
        from cardseg.bundle.folder import check_bundle_folder

        sweep_bundle_folders()
        self.outdir = outdir
        self.host = socket.gethostname()
        self.error = ""
        tmp = tempfile.mkdtemp(prefix=f"{BUNDLE_TMP_PREFIX}{os.getpid()}-")
        try:
            for name, data in blob.items():
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            root, _ = check_bundle_folder(tmp)
            o = options  # its backend is not used: Ray's workers always run torch
            self.worker = CaseWorker(root, o.method, o.device, o.batch_size, o.threads, review_map=o.review_map)
            self.worker.load()
        except Exception as exc:  # every case of this actor fails with this line
            self.error = f"worker on {self.host} cannot load the bundle ({type(exc).__name__}: {one_line(exc)})"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def run(self, job: Job) -> dict:
        if self.error:
            return {"case": job.case, "status": "error", "report": None, "seconds": 0.0, "error": self.error}
        if not os.path.isfile(os.path.join(self.outdir, BATCH_STAMP)):
            return {
                "case": job.case,
                "status": "error",
                "report": None,
                "seconds": 0.0,
                "error": f"worker on {self.host} cannot see OUTDIR {self.outdir}: it must be on a filesystem "
                "that every node mounts at the same path",
            }
        res = self.worker.run(job)
        res["host"] = self.host
        return res

    def loads(self) -> int:
        return 0 if self.error else self.worker.loads

    def close(self) -> None:
        """Nothing left to remove (the bundle folder went at once); kept for drivers that call it."""


def disconnect(started: bool) -> None:
    """Shut down the Ray this batch started or connected (``started``), then remove the bundle
    folders of this node's actors that are gone (a local cluster's, killed mid-load)."""
    if started and ray is not None and ray.is_initialized():
        ray.shutdown()
    sweep_bundle_folders()


def run_jobs(
    jobs: Sequence[Job],
    on_result: Callable[[dict], None],
    *,
    bundle_root: Path,
    config: dict,
    outdir: Path,
    options: WorkerOptions = WorkerOptions(),
    workers: Optional[int] = None,
    cpus_per_worker: float = 1.0,
) -> int:
    """Run ``jobs`` on Ray actors (after :func:`connect`), calling ``on_result`` in this process
    for each finished case (in completion order). ``options``: how each actor runs its cases (its
    backend aside: Ray's workers always run torch; ``threads`` default: ``cpus_per_worker``). A
    worker that dies fails the cases it held (one line each) and is replaced. Returns how many
    times a bundle was loaded (one per actor that ran a case)."""
    pool = None
    try:
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0)) if options.device != "cpu" else 0
        per_gpu = 1 if gpus else 0
        if workers is None:
            workers = gpus if gpus else max(1, int(resources.get("CPU", 1) // cpus_per_worker))
        workers = max(1, min(int(workers), len(jobs)))
        remote_cls = ray.remote(_WorkerActor).options(num_cpus=cpus_per_worker, num_gpus=per_gpu)
        actor_options = replace(
            options,
            device="cuda" if per_gpu and options.device == "auto" else options.device,
            threads=options.threads or max(1, int(cpus_per_worker)),
        )
        blob = ray.put(_bundle_blob(bundle_root, config))
        pool = _ActorPool(lambda: remote_cls.remote(blob, str(outdir), actor_options), workers, jobs)
        pool.run(on_result)
        return pool.loads()
    finally:
        if pool is not None:
            pool.kill()


def _failed(job: Job, why: str) -> dict:
    return {"case": job.case, "status": "error", "report": None, "seconds": 0.0, "error": why}


class _ActorPool:
    """The actors of one :func:`run_jobs` and the cases they hold: each actor is given
    :data:`PREFETCH` cases ahead; one that dies is replaced, at most ``2 * workers`` times and
    only while cases wait."""

    def __init__(self, new_actor: Callable[[], object], workers: int, jobs: Sequence[Job]):
        self.new_actor = new_actor
        self.workers = workers
        self.actors: List = [new_actor() for _ in range(workers)]
        self.pending = deque(jobs)
        self.inflight: Dict[object, tuple] = {}  # {task: (actor, job)}
        self.restarts = 0

    def submit(self, actor) -> None:
        if self.pending:
            job = self.pending.popleft()
            self.inflight[actor.run.remote(job)] = (actor, job)

    def run(self, on_result: Callable[[dict], None]) -> None:
        """Every case to an actor, ``on_result`` for each as it finishes; the cases left when no
        actor is left fail (one line each)."""
        for a in self.actors:
            for _ in range(PREFETCH):
                self.submit(a)
        while self.inflight:
            ready, _ = ray.wait(list(self.inflight), num_returns=1)
            actor, job = self.inflight.pop(ready[0])
            res, actor = self._result(ready[0], actor, job)
            on_result(res)
            if actor is not None:
                self.submit(actor)
            elif not self.actors and self.pending:
                while self.pending:
                    on_result(_failed(self.pending.popleft(), "no Ray worker left (they kept dying)"))

    def _result(self, ref, actor, job: Job) -> tuple:
        """``(the case's result, the actor to give the next case)``; no actor (``None``) when it died."""
        try:
            return ray.get(ref), actor
        except ray.exceptions.RayActorError as exc:
            res = _failed(job, f"Ray worker died ({_first(exc)})")
            self._replace(actor)
            return res, None
        except ray.exceptions.RayError as exc:
            return _failed(job, f"Ray task failed ({_first(exc)})"), actor

    def _replace(self, actor) -> None:
        """Drop a dead actor and, while restarts are left and cases wait, start another one."""
        if actor in self.actors:
            self.actors.remove(actor)
            if self.restarts < 2 * self.workers and self.pending:
                self.restarts += 1
                self.actors.append(self.new_actor())
                for _ in range(PREFETCH):
                    self.submit(self.actors[-1])

    def loads(self) -> int:
        """How many times the live actors loaded the bundle (each actor closed on the way)."""
        loads = 0
        for a in self.actors:
            try:
                loads += ray.get(a.loads.remote())
                ray.get(a.close.remote())
            except ray.exceptions.RayError:
                pass
        return loads

    def kill(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:
                pass


def _first(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]
