"""``cardseg batch``: many cases through the engine's one path, a cohort table, resume, a triage report.

Every case goes through :func:`cardseg.segment.segment_file` (the same checks, pipeline and
atomic writing as ``cardseg segment``) into ``OUTDIR/<case>/``. This module only decides which
cases to run, runs them with a model loaded once per worker (here, or on Ray workers through
:mod:`cardseg.cohort.cluster`, imported only for ``--ray``), and writes what describes the cohort:

``OUTDIR/``
    ``<case>/``                  each case's ``cardseg segment`` outputs (its own stamp)
    ``cohort.csv``               one row per case (:data:`COHORT_COLUMNS`, class volumes, timings)
    ``cohort.parquet``           the same table, when pyarrow is importable
    ``subjects.csv``             cardiac indices with intervals, one row per subject with ED and ES
    ``curves.csv``               the cine subjects' LV and RV volume curves (:mod:`cardseg.cohort.cine`)
    ``triage.html``              the triage report (:mod:`cardseg.cohort.triage`)
    ``.cardseg-batch.json``      the stamp: this folder is a batch's output, and its settings
    ``.cardseg-batch-state.jsonl`` one line per finished case: its resume key
    ``.cardseg-batch-curves.jsonl`` one line per cine fast pass: its curve, under its resume key
    ``.cardseg-batch.lock``      held while a batch runs: a second batch into OUTDIR is refused

**Resume.** A case's key is the sha256 of the input's content (the file, its detached data file
for ``.hdr``/``.mhd``/``.nhdr``, or every file of a DICOM folder), its frame and spacing, the
method and the bundle (weight checksums and ``bundle.json``). A case whose key is in the state
file and whose folder still holds cardseg's outputs is not recomputed; its row is rebuilt from
its ``report.json``. A case whose input changed is recomputed and its folder replaced (only if
it still holds nothing but cardseg's files). Failed cases are retried on every run.

**Ownership.** OUTDIR may be new, empty, or an earlier batch's output (stamp present, nothing in
it but what batches and ``segment`` write). Anything else is refused, and so is an earlier batch
made with another bundle or method unless ``--overwrite`` is given. Nothing that cardseg did not
write is ever deleted; case folders of cases no longer listed are left alone.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from cardseg.base.errors import CardsegError, one_line
from cardseg.cohort.case_progress import CaseProgress
from cardseg.cohort.cases import Case, cases_from_inputs, read_manifest
from cardseg.cohort import cine_batch
from cardseg.cohort.cine import CineSubject, plan_cines
from cardseg.cohort.hashing import bundle_settings, case_key, content_hash
from cardseg.cohort.layout import COHORT_CSV, COHORT_PARQUET, LOCK_FILE, SUBJECTS_CSV, TRIAGE_HTML
from cardseg.cohort.options import BatchOptions, BatchResult, check_options, options_from_args, worker_options
from cardseg.cohort.state import (
    append_state,
    check_batch_outdir,
    finished_report,
    outputs_digest,
    read_state,
    recorded_cases,
    write_stamp,
)
from cardseg.cohort.subjects import indices_function, subject_columns, subject_rows
from cardseg.cohort.tables import cohort_row, table_columns, write_parquet, write_table
from cardseg.cohort.worker import CaseWorker, Job


@dataclass(frozen=True)
class _Checked:
    """What the checks before any case settled: OUTDIR and the bundle.

    out: OUTDIR; earlier: the stamp of the earlier batch that wrote into it (``None``: a new or
    empty OUTDIR); settings: the bundle's and method's settings that the stamp and the cases' keys
    hold (:func:`bundle_settings`); config: the bundle's ``bundle.json``; bundle_root: its folder."""

    out: Path
    earlier: Optional[dict]
    settings: dict
    config: dict
    bundle_root: Path


@dataclass
class _Plan:
    """What a batch will do, decided before OUTDIR is touched."""

    options: BatchOptions
    out: Path
    earlier: Optional[dict]
    settings: dict
    config: dict
    bundle_root: Path
    cases: List[Case]
    hashes: Dict[str, object]
    keys: Dict[str, str]
    rows: Dict[str, dict]
    jobs: List[Job]
    earlier_cases: frozenset = frozenset()  # the cases earlier runs finished into OUTDIR (its state file)
    state: Dict[str, dict] = field(default_factory=dict)  # the state file's records, by case
    spacing: Optional[tuple] = None  # --spacing
    cines: List[CineSubject] = field(default_factory=list)  # the cine subjects (cardseg.cohort.cine)

    @property
    def pending_cines(self) -> List[CineSubject]:
        """The ``ed-es`` cine subjects whose curve a fast pass must find (none cached, the input hashed)."""
        return [
            s
            for s in self.cines
            if s.choice is None
            and s.pending_cases
            and not isinstance(self.hashes.get(s.pending_cases[0].name), CardsegError)
        ]

    @property
    def class_names(self) -> List[str]:
        return [c["name"] for c in self.config["classes"]][1:]


@dataclass(frozen=True)
class BatchHooks:
    """What a caller that keeps a model loaded (``cardseg serve``) hands :func:`run_batch`.

    progress: reports the cases (a :class:`CaseProgress`'s ``start``, ``advance``, ``close``; None:
    the one ``--progress`` asks for); load_worker: ``(options, bundle_root, checked) -> CaseWorker``,
    the local worker with its bundle loaded (None: loaded here, :func:`_loaded_worker`)."""

    progress: Optional[CaseProgress] = None
    load_worker: Optional[Callable[[BatchOptions, Path, object], CaseWorker]] = None


def run_batch(o: BatchOptions, hooks: Optional[BatchHooks] = None) -> BatchResult:
    """Run a batch: every check first, then the cases, then the tables and the report.

    Order: options, the cases (manifest or INPUTs), the bundle (schema, checksums), OUTDIR, the
    inputs' content hashes (read only), then the Ray cluster (``--ray``) or the networks (local);
    a refusal up to here is a one-line :class:`CardsegError` and nothing is written. Only then is
    OUTDIR created or taken (its lock), stamped, and filled. ``hooks``: see :class:`BatchHooks`.
    """
    from cardseg.bundle.folder import check_bundle, check_method
    from cardseg.bundle.review_rules import with_review_map
    from cardseg.io.inputs import parse_spacing

    t_start = time.perf_counter()
    check_options(o)
    spacing = parse_spacing(o.spacing) if o.spacing else None
    target = os.path.realpath(os.path.abspath(os.fspath(o.output)))  # nothing is ever taken from inside it
    cases = (
        read_manifest(o.manifest, o.frame, outdir=target)
        if o.manifest
        else cases_from_inputs(o.inputs, o.frame, outdir=target)
    )
    cases, cines = plan_cines(cases, o.frames, o.frame)  # a 4D input with no frame picked: a cine subject
    checked = check_bundle(o.bundle)
    chosen = with_review_map(checked, o.review_map)  # a map the bundle keeps no rule for is refused here
    checked = chosen if o.method == "card" else checked  # the rule is part of a card case's key (uc cuts no regions)
    bundle_root, config = checked.root, checked.config
    check_method(bundle_root, config, o.method)  # as segment refuses it, before any case
    settings = bundle_settings(config, o.method)
    out, earlier = check_batch_outdir(o.output, settings, o.overwrite)
    hooks = hooks or BatchHooks()
    progress = hooks.progress or CaseProgress(o.progress, o.quiet)
    plan = _plan(o, _Checked(out, earlier, settings, config, Path(bundle_root)), cases, spacing, progress, cines)

    worker = cluster = None
    ray_started = False
    passes = bool(plan.pending_cines)  # the fast passes run here, with a local worker
    if (plan.jobs or passes) and o.ray:  # a cluster that cannot be reached is a refusal, before OUTDIR is touched
        from cardseg.cohort import cluster

        ray_started = cluster.connect(o.ray)
        try:
            cluster.check_capacity(o.ray_cpus_per_worker, o.ray)
        except CardsegError:
            cluster.disconnect(ray_started)
            raise
    try:
        if (plan.jobs and not o.ray) or passes:  # the networks load here, once: one that does not is a refusal
            worker = (hooks.load_worker or _loaded_worker)(o, bundle_root, checked)
        result = _execute(plan, progress, worker, cluster)
    finally:
        if cluster is not None:
            cluster.disconnect(ray_started)
    result.seconds = time.perf_counter() - t_start
    return result


def _loaded_worker(o: BatchOptions, bundle_root, checked) -> CaseWorker:
    """The local :class:`CaseWorker` with its bundle loaded (a refusal when it does not load); its notes printed."""
    from cardseg.base.progress import make_progress

    worker = CaseWorker(bundle_root, o.method, o.device, o.batch_size, o.threads, o.backend, o.review_map)
    load_progress = make_progress(o.progress, o.quiet)
    try:
        worker.load(load_progress, checked)  # torch only when the cached ONNX sessions are not all there
    finally:
        load_progress.close()
    if not o.quiet:
        for note in worker.bundle.notes:
            print(f"cardseg: note: {note}", file=sys.stderr)
    return worker


def _plan(o: BatchOptions, checked: _Checked, cases: List[Case], spacing, progress: CaseProgress, cines=()) -> _Plan:
    """Which cases are finished (same key in the state file, outputs still there) and which to run;
    a cine subject's ED and ES cases wait for its fast pass unless an earlier run's curve is kept."""
    out, earlier, settings, config = checked.out, checked.earlier, checked.settings, checked.config
    state = {} if (o.overwrite or earlier is None) else read_state(out)
    hashes = _hash_inputs(cases, progress, o.hash_threads)
    plan = _Plan(
        o, out, earlier, settings, config, checked.bundle_root, list(cases), hashes, {}, {}, [], frozenset(state)
    )
    plan.state, plan.spacing, plan.cines = state, tuple(spacing) if spacing else None, list(cines)
    cine_batch.settle_kept_curves(plan)
    waiting = {c.name for s in plan.pending_cines for c in s.pending_cases}
    for c in cases:
        if c.name in waiting:
            plan.rows[c.name] = cohort_row(c, "pending", input_digest=hashes[c.name])
        else:
            _plan_case(plan, c)
    return plan


def _plan_case(plan: _Plan, c: Case) -> None:
    """One case into the plan: its row (an error, reused from an earlier run, or pending) and its job."""
    h = plan.hashes[c.name]
    if isinstance(h, CardsegError):
        plan.rows[c.name] = cohort_row(c, "error", one_line(h))
        return
    key = plan.keys[c.name] = case_key(h, c, plan.spacing, plan.settings)
    folder = plan.out / c.name
    rec = plan.state.get(c.name)
    report = finished_report(folder, rec.get("outputs")) if rec and rec.get("key") == key else None
    if report is not None:
        plan.rows[c.name] = cohort_row(c, "ok", report=report, reused=True, input_digest=h)
        return
    if rec and rec.get("key") == key and not plan.options.quiet:
        print(
            f"cardseg: note: case {c.name}: its folder no longer holds what this batch wrote for it; "
            "computing it again",
            file=sys.stderr,
        )
    plan.jobs.append(Job(c.name, c.path, str(folder), c.frame, plan.spacing, overwrite=folder.exists()))
    plan.rows[c.name] = cohort_row(c, "pending", input_digest=h)


def _execute(plan: _Plan, progress: CaseProgress, worker: Optional[CaseWorker], cluster) -> BatchResult:
    """OUTDIR taken (its lock), stamped and filled: the cases run, then the cohort table (also after
    an interrupt), ``subjects.csv`` and the report."""
    from cardseg.io.outdir import clean_leftovers

    out = plan.out
    result = BatchResult(outdir=out)
    before = None
    lock = _lock_outdir(out)
    try:
        clean_leftovers(out.parent, skip=out.name)  # what killed runs of any kind left beside OUTDIR
        clean_leftovers(out)  # and inside it, once: the cases' writers then look only at their own names
        write_stamp(out, plan.settings, (plan.earlier or {}).get("created"))
        unrecorded: Dict[str, dict] = {}  # rows of ok cases whose state line is being appended
        try:
            if plan.pending_cines:  # the fast passes (no case folder changes) add the cine subjects' jobs
                cine_batch.run_fast_passes(plan, worker, progress, _plan_case)
            # what an interrupt compares with (did a case folder change?); not with Ray, whose killed workers
            # may still write a case after the interrupt is handled: there the earlier tables always go
            before = None if cluster is not None else _job_stamps(plan)
            if plan.jobs:
                progress.start(len(plan.jobs))
                on_result = _result_recorder(plan, result, unrecorded, progress)
                result.worker_loads = _run_jobs(plan, on_result, worker, cluster)
            cine_batch.settle_all_frames(plan)
        finally:  # the table also after Ctrl-C: unfinished cases are 'pending'
            progress.close()
            _write_cohort_table(plan, result, unrecorded)
        _write_subjects(out, plan, result)
        cine_batch.write_curves(plan, result, _remove_stale)
        _write_triage(plan, result)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: an earlier run's subjects.csv and report stay
        exc.batch_left = _interrupted(plan, result, before)  # only where no case folder changed
        raise
    finally:
        lock.release()
    result.reused = sum(1 for r in result.rows if r["reused"])
    result.failed = sum(1 for r in result.rows if r["status"] != "ok")
    return result


def _lock_outdir(out: Path):
    """OUTDIR created where it is not there yet, and its lock taken (a
    :class:`cardseg.io.outdir.FileLock`, held: the caller releases it); one-line
    :class:`CardsegError` while another batch holds it (OUTDIR, if created here, removed again)."""
    from cardseg.io.outdir import FileLock

    created = not out.exists()
    os.makedirs(out, exist_ok=True)
    lock = FileLock(out / LOCK_FILE)
    if not lock.acquire():  # an interrupt in it leaves no lock (FileLock's rule); the caller's guard starts at once
        if created:
            _rmdir_quiet(out)
        raise CardsegError(f"{out}: another cardseg batch is running into this folder now")
    return lock


def _result_recorder(
    plan: _Plan, result: BatchResult, unrecorded: Dict[str, dict], progress: CaseProgress
) -> Callable[[dict], None]:
    """The ``on_result`` that takes each finished case's result (a worker's dict): its row in
    ``plan.rows``, an ok case's state line appended (its row is in ``unrecorded`` while the line is
    being appended, so that an interrupt in the append is settled by :func:`_write_cohort_table`)."""
    by_name = {c.name: c for c in plan.cases}
    out, rows = plan.out, plan.rows

    def on_result(res: dict) -> None:
        c = by_name[res["case"]]
        h = plan.hashes[c.name]
        if res["status"] == "ok":  # finished when its state line is
            unrecorded[c.name] = cohort_row(c, "ok", report=res["report"], input_digest=h)
            append_state(
                out,
                {
                    "case": c.name,
                    "key": plan.keys[c.name],
                    "input_sha256": h,
                    "outputs": outputs_digest(out / c.name),
                    "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
            )
            rows[c.name] = unrecorded.pop(c.name)
            result.computed += 1
        else:
            rows[c.name] = cohort_row(c, "error", res["error"], input_digest=h)
        progress.advance(res["status"] == "ok")

    return on_result


def _run_jobs(plan: _Plan, on_result: Callable[[dict], None], worker: Optional[CaseWorker], cluster) -> int:
    """Run the plan's jobs on the Ray cluster (``cluster``: :mod:`cardseg.cohort.cluster`, connected),
    on local worker processes (``--workers``) or here with ``worker``; returns how many times a
    bundle was loaded."""
    o = plan.options
    if cluster is not None:
        return cluster.run_jobs(
            plan.jobs,
            on_result,
            bundle_root=plan.bundle_root,
            config=plan.config,
            outdir=plan.out,
            options=worker_options(o),
            workers=o.ray_workers,
            cpus_per_worker=o.ray_cpus_per_worker,
        )
    if o.workers > 1 and len(plan.jobs) > 1:
        from cardseg.cohort import local_pool

        return local_pool.run_jobs(
            plan.jobs,
            on_result,
            bundle_root=plan.bundle_root,
            options=worker_options(o, worker.bundle.backend),  # the backend the check load settled on
            workers=o.workers,
        )
    from cardseg.cohort.pipeline import run_overlapped  # the next case read and the last one written while one computes

    run_overlapped(worker, plan.jobs, on_result)
    return worker.loads


def _write_cohort_table(plan: _Plan, result: BatchResult, unrecorded: Dict[str, dict]) -> None:
    """``cohort.csv`` (and ``cohort.parquet`` where pyarrow is there) from the plan's rows, after the
    ok cases whose state line an interrupt cut short but that the state file holds are counted."""
    out, rows = plan.out, plan.rows
    for name in recorded_cases(out, unrecorded, plan.keys):  # the interrupt came after the line
        rows[name], result.computed = unrecorded[name], result.computed + 1
    result.rows = [rows[c.name] for c in plan.cases]
    columns = table_columns(result.rows, plan.class_names)
    write_table(out / COHORT_CSV, result.rows, columns)
    result.files.append(COHORT_CSV)
    if write_parquet(out / COHORT_PARQUET, result.rows, columns):
        result.files.append(COHORT_PARQUET)


def _write_triage(plan: _Plan, result: BatchResult) -> None:
    """``triage.html``; with ``--no-report`` an earlier run's page would describe other results, so it
    is removed (only that one: :func:`_remove_stale`)."""
    if plan.options.report:
        from cardseg.cohort.triage import write_report

        write_report(plan.out, config=plan.config, max_thumbnails=plan.options.report_thumbnails)
        result.files.append(TRIAGE_HTML)
    else:
        _remove_stale(plan.out, plan.earlier, TRIAGE_HTML)


@dataclass
class _Left:
    """What an interrupted batch left in OUTDIR, for the one line that reports the interrupt."""

    pending: int  # cases not finished: 'pending' in the table
    table: bool  # whether cohort.csv was written
    missing: List[str]  # the files this run would have written after the table but did not (and did not keep)
    removed: List[str]  # an earlier run's versions of those, removed: they described other results
    kept: List[str] = field(default_factory=list)  # an earlier run's versions, kept: no case folder changed


def _job_stamps(plan: _Plan) -> Optional[Dict[str, Optional[bytes]]]:
    """``{case: its folder's stamp as bytes, or None}`` for the cases this run computes, as they are
    before the first one runs; read only where an earlier run's ``subjects.csv`` or ``triage.html``
    is there for an interrupt to keep (:func:`_interrupted`), else ``None``."""
    if not any(_earlier_file(plan.out, plan.earlier, n) for n in (SUBJECTS_CSV, TRIAGE_HTML)):
        return None
    return {j.case: _stamp_bytes(Path(j.out)) for j in plan.jobs}


def _stamp_bytes(folder: Path) -> Optional[bytes]:
    from cardseg.io.outdir import STAMP

    try:
        return (folder / STAMP).read_bytes()
    except OSError:
        return None


def _interrupted(plan: _Plan, result: BatchResult, before: Optional[Dict[str, Optional[bytes]]]) -> _Left:
    """After Ctrl-C or SIGTERM: what to do with the earlier run's ``subjects.csv`` and
    ``triage.html`` that this run did not get to write again (only those an earlier batch wrote:
    :func:`_remove_stale`).

    Kept, both, when this run wrote neither and changed no case folder: no case of it finished
    (every case it computes is still 'pending') and no case folder's stamp differs from
    ``before`` (:func:`_job_stamps`: a case whose outputs were written but not yet reported
    counts as changed; ``None``, an interrupt before they were read, counts as changed too), and
    this run lists every case the earlier runs finished (else they would describe cases that this
    run's ``cohort.csv`` no longer lists). They then still describe the case folders as they are.
    Otherwise removed: they would describe other results than the folders hold, or than this run's
    ``subjects.csv``."""
    replaced = [SUBJECTS_CSV] + ([TRIAGE_HTML] if plan.options.report else [])  # written or removed at the end
    unwritten = [n for n in replaced if n not in result.files]
    kept = []
    if (
        len(unwritten) == len(replaced)
        and before is not None
        and not _cases_changed(plan, before)
        and plan.earlier_cases <= {c.name for c in plan.cases}
    ):
        kept = [n for n in unwritten if _earlier_file(plan.out, plan.earlier, n)]
    removed = []
    for name in (n for n in unwritten if n not in kept):
        try:
            if _remove_stale(plan.out, plan.earlier, name):
                removed.append(name)
        except OSError:  # best effort: the interrupt goes on, with no traceback of this
            pass
    wanted = ([SUBJECTS_CSV] if any(c.subject for c in plan.cases) else []) + replaced[1:]
    pending = sum(1 for r in plan.rows.values() if r["status"] == "pending")
    return _Left(
        pending,
        COHORT_CSV in result.files,
        [n for n in wanted if n not in result.files and n not in kept],
        removed,
        kept,
    )


def _cases_changed(plan: _Plan, before: Dict[str, Optional[bytes]]) -> bool:
    """Whether a case this run computes finished (ok or failed) or its folder changed since ``before``."""
    for job in plan.jobs:
        if plan.rows[job.case]["status"] != "pending" or _stamp_bytes(Path(job.out)) != before.get(job.case):
            return True
    return False


def interrupted_line(head: str, exc: BaseException) -> str:
    """The one line that reports an interrupted batch (``head``: ``interrupted``, ``terminated (SIGTERM)``)."""
    left = getattr(exc, "batch_left", None)
    if left is None:  # during the checks, the hashing or the model's loading: OUTDIR untouched
        return f"cardseg: {head} before the cases ran; nothing was written into OUTDIR"
    parts = [
        f"{COHORT_CSV} was not written"
        if not left.table
        else f"no case is pending ({COHORT_CSV} is complete)"
        if not left.pending
        else f"{left.pending} unfinished case{'s are' if left.pending > 1 else ' is'} 'pending' in {COHORT_CSV}"
    ]
    if left.missing:
        parts.append(f"{' and '.join(left.missing)} {'were' if len(left.missing) > 1 else 'was'} not written")
    if left.removed:
        parts.append(
            f"the earlier run's {' and '.join(left.removed)} {'were' if len(left.removed) > 1 else 'was'} removed"
        )
    if left.kept:
        they = "they still describe" if len(left.kept) > 1 else "it still describes"
        parts.append(
            f"the earlier run's {' and '.join(left.kept)} {'are' if len(left.kept) > 1 else 'is'} kept "
            f"(no case of this run finished: {they} the case folders)"
        )
    again = "resume" if left.pending or not left.table else "finish"
    return f"cardseg: {head}; {', '.join(parts)}; run the same command again to {again}"


def _rmdir_quiet(p: Path) -> None:
    try:
        p.rmdir()
    except OSError:
        pass


def _hash_inputs(cases: Sequence[Case], progress: CaseProgress, threads: int) -> Dict[str, object]:
    """``{case: sha256 or CardsegError}``, several files at a time (hashlib releases the GIL); an
    input that several cases share (a 4D file's ED and ES frames) is read once."""
    by_path: Dict[str, List[Case]] = {}
    for c in cases:
        by_path.setdefault(c.path, []).append(c)
    out: Dict[str, object] = {}
    progress.start(len(cases), stage="hashing", leave=False)

    def one(path: str):
        try:
            return content_hash(path)
        except CardsegError as exc:
            return exc

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads))
    try:
        for path, h in zip(by_path, pool.map(one, by_path)):
            for c in by_path[path]:
                out[c.name] = h
                progress.advance(True)
    finally:  # Ctrl-C or SIGTERM: the files not yet started are not read
        pool.shutdown(wait=True, cancel_futures=True)
        progress.close()
    return {c.name: out[c.name] for c in cases}


def _write_subjects(out: Path, plan: _Plan, result: BatchResult) -> None:
    """``subjects.csv`` for the cases with a subject (the cine subjects' cells and the wall thickness:
    :mod:`cardseg.cohort.cine_tables`); with none (or no indices module) an earlier batch's
    ``subjects.csv`` would describe other cases, so it is removed (only that one: see
    :func:`_remove_stale`)."""
    from cardseg.cohort.cine_tables import add_cine_cells, add_wall_cells, wall_functions

    cases, rows, config, earlier = plan.cases, plan.rows, plan.config, plan.earlier
    if not any(c.subject for c in cases):
        _remove_stale(out, earlier, SUBJECTS_CSV)
        return
    compute = indices_function()
    if compute is None:
        print(
            "cardseg: note: cardiac indices are not available in this cardseg (no cardseg.cohort.indices); "
            f"{SUBJECTS_CSV} not written",
            file=sys.stderr,
        )
        _remove_stale(out, earlier, SUBJECTS_CSV)
        return
    status = {name: r["status"] for name, r in rows.items()}
    subj, names = subject_rows(out, cases, status, config, compute)
    columns = subject_columns(names)
    extra = add_cine_cells(subj, plan.cines)
    if plan.cines:  # a batch of cines: the wall thickness of every subject with ED and ES segmentations
        extra += add_wall_cells(subj, out, lambda case: status.get(case) == "ok", wall_functions(config))
    columns = columns[:-1] + extra + columns[-1:]  # the error column stays last
    write_table(out / SUBJECTS_CSV, subj, columns)
    result.subjects = subj
    result.files.append(SUBJECTS_CSV)


def _earlier_file(out: Path, earlier: Optional[dict], name: str) -> bool:
    """Whether ``OUTDIR/<name>`` (``subjects.csv``, ``triage.html``) is an earlier batch's: OUTDIR
    carried a batch stamp listing it among the batch's files (:func:`check_batch_outdir` then
    admitted nothing at the top level but those files), and it is a plain file. A new or empty
    OUTDIR (no earlier stamp) has none."""
    if earlier is None or name not in (earlier.get("files") or ()):
        return False
    path = out / name
    return path.is_file() and not path.is_symlink()


def _remove_stale(out: Path, earlier: Optional[dict], name: str) -> bool:
    """Delete ``OUTDIR/<name>`` only where it is an earlier batch's (:func:`_earlier_file`).
    Returns whether a file was removed."""
    if not _earlier_file(out, earlier, name):
        return False
    (out / name).unlink()
    return True


def main_from_args(a) -> int:
    """``cardseg batch``: run, print one summary line; exit code 0, or 1 when a case failed.

    SIGTERM is handled like Ctrl-C (:func:`cardseg.base.interrupt.sigterm_as_interrupt`): the
    cohort table is written with the unfinished cases as ``pending``, an earlier run's
    ``subjects.csv`` and ``triage.html`` that this run did not write again are removed, unless no
    case of this run finished and no case folder changed (then both stay: :func:`_interrupted`),
    worker processes and Ray actors are ended, one line says what was left
    (:func:`interrupted_line`) and the exit status is 143 (Ctrl-C: 130)."""
    from cardseg.base.interrupt import EXIT_TERMINATED, sigterm_as_interrupt

    try:
        with sigterm_as_interrupt() as sigterm:
            r = run_batch(options_from_args(a))
    except KeyboardInterrupt as exc:
        print(interrupted_line("terminated (SIGTERM)" if sigterm.received else "interrupted", exc), file=sys.stderr)
        return EXIT_TERMINATED if sigterm.received else 130
    if not a.quiet:
        n = len(r.rows)
        ok = n - r.failed
        ood = sum(1 for row in r.rows if row.get("out_of_domain") is True)
        empty = sum(1 for row in r.rows if row.get("no_foreground") is True)
        empty_note = f" ({empty} with no foreground)" if empty else ""
        moved = sum(1 for row in r.rows if row.get("grid_moved") is True)
        moved_note = f", {moved} on a grid moved onto the heart" if moved else ""
        rate = r.computed / (r.seconds / 60.0) if r.seconds > 0 and r.computed else 0.0
        reused = f" ({r.reused} from earlier runs)" if r.reused else ""
        print(
            f"{r.outdir}: {n} case{'s' if n != 1 else ''}, {ok} ok{reused}, {r.failed} failed, {ood} out of domain"
            f"{empty_note}{moved_note}; {', '.join(r.files)}; {r.computed} computed in {r.seconds:.1f} s "
            f"({rate:.1f} cases/min)"
        )
    return 1 if r.failed else 0
