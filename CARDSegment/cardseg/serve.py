"""``cardseg serve``: a warm engine that segments one volume per request, the model loaded once.

A GUI (the Slicer module, :mod:`CARDSegmentLib.runs.engine`) keeps this process alive between clicks,
so that a second "Segment & Calibrate" pays only the computation: python, the bundle and its
networks (ONNX Runtime sessions, or torch modules and torch) are loaded once. Every request runs the
same code as ``cardseg segment`` (:func:`cardseg.segment.segment_file`, the CLI's own option
checks), so it follows all of segment's rules: checks before any work, outputs staged in a
temporary folder, read back, moved into place in one step, nothing half written.

Protocol (version :data:`PROTOCOL`), JSON lines, UTF-8:

* **stdin**: one request object per line, run one at a time in the order received.

  - ``{"id": ANY, "input": PATH, "output": OUTDIR, ...}`` (``op`` ``"segment"``, the default):
    segment ``input`` into ``output``. The other fields are ``cardseg segment``'s options, named
    as its long options with ``_`` for ``-``: ``bundle``, ``device``, ``backend``, ``method``,
    ``frame``, ``spacing`` (``"SX,SY[,SZ]"`` or a list of numbers), ``batch_size``, ``threads``,
    ``review_map`` (the bundle's rule for flagged regions, :mod:`cardseg.bundle.review_rules`; the
    loaded networks serve every rule), ``overwrite`` (true/false). An absent field takes the value ``cardseg serve`` was started
    with (``--bundle``, ``--device``, ``--backend``, ``--threads``), else segment's default. The
    values are judged by segment's own parser and checks: the same one-line refusals.
  - ``{"id": ANY, "op": "batch", "manifest": CSV, "output": OUTDIR, ...}``: run ``cardseg batch
    --manifest CSV -o OUTDIR`` in this process (:func:`cardseg.cohort.batch.run_batch`, its checks,
    cohort table, resume and ``subjects.csv``), its cases on the bundle kept loaded. The other
    fields are the value fields of ``segment`` (``cardseg batch``'s options of the same names),
    ``overwrite`` and ``report`` (true, the default: write ``triage.html``; false:
    ``--no-report``); the cases run here, one after another (no ``--workers``, no ``--ray``).
  - ``{"id": ANY, "op": "status"}``: answered with a ``status`` event (below).
  - ``{"op": "exit"}``: end the engine (as end of input does).

* **stdout** (protocol lines only; everything else the process prints goes to stderr):

  - ``{"event": "ready", "protocol": 1, "pid": N, "bundle": PATH|null, "backend": ..., "device": ...,
    "error": null|LINE}``: once, after start-up; the bundle given at start (or the default one) is
    already loaded (``error`` says why not: the first request then loads its own or fails).
  - ``{"stage": NAME, "done": n, "total": m}``: progress of the running request, exactly the
    lines of ``cardseg segment --progress json`` (stages ``export-onnx``, ``trajectory``, ``write``)
    or, for ``batch``, of ``cardseg batch --progress json`` (stages ``hashing``, ``cases``).
  - ``{"event": "result", "id": ANY, "ok": true, "output": OUTDIR, "files": [...], "slices": n,
    "agreement": x|null, "out_of_domain": b|null, "regions": n, "timings_s": {...}, "backend": ...,
    "device": ..., "loaded_bundle": b, "notes": [...], "seconds": s}``: the request succeeded
    (``timings_s`` is report.json's; ``loaded_bundle`` whether this request (re)loaded the bundle;
    ``seconds`` its wall time in the engine).
  - ``{"event": "result", "id": ANY, "ok": true, "output": OUTDIR, "cases": n, "computed": n,
    "reused": n, "failed": 0, "files": [...], "loaded_bundle": b, "seconds": s}``: a ``batch``
    succeeded (``files``: the tables written at OUTDIR's top); when a case failed, the same with
    ``"ok": false``, ``"failed": k``, ``"code": 1`` and ``"error"`` saying how many (``cohort.csv``
    gives each case's one line), as ``cardseg batch`` then exits with 1.
  - ``{"event": "result", "id": ANY, "ok": false, "error": LINE, "code": c}``: it failed; ``LINE``
    is the one line ``cardseg segment`` would print after ``cardseg: error:``; ``code`` segment's
    exit status (2 bad input or options, 1 a failed write, 3 an unexpected error, whose traceback
    goes to stderr). The engine stays alive and reads the next request. A line that is not a JSON
    object is answered so too (``id`` null).
  - ``{"event": "status", "id": ANY, "pid": N, "requests": n, "bundle": {...}|null,
    "modules": {"monai": b, "torch": b, "onnxruntime": b}}``: ``modules`` says which of these are
    imported in this process now (``sys.modules``).
  - ``{"event": "exit", "reason": "eof"|"exit"|"terminated"|"interrupted"}``: last line.

* **End**: end of input (the client closed the pipe or died) ends the engine. With ``--eof stop``
  (the default) a request still running is stopped at once, like SIGTERM, with nothing half
  written; ``--eof finish`` first runs the requests already received (``cardseg serve <
  requests.jsonl``). SIGTERM stops the running request the same way (exit status 143); the
  engine's exit status is 0 after end of input or an ``exit`` request.

* **Bundle changes are noticed per request**: each request compares the bundle folder's
  ``bundle.json`` and weight files with those loaded by their stamps (:func:`fingerprint`); when
  one differs, the folder is checked whole as ``cardseg segment`` checks it and loaded again,
  unless its configuration and checksums turn out unchanged. Another bundle, device, backend
  (or, for ONNX sessions, thread count) is loaded; only one bundle is kept loaded, its networks
  those verified when it was loaded (from the verified bytes, as in ``cardseg segment``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Iterator, Optional

from cardseg.base import strictjson
from cardseg.base.argparsing import DefaultsHelpFormatter
from cardseg.base.errors import CardsegError, one_line

PROTOCOL = 1
#: request fields that map to a ``cardseg segment`` option taking a value
VALUE_FIELDS = ("bundle", "device", "backend", "method", "frame", "spacing", "batch_size", "threads", "review_map")
FIELDS = ("id", "op", "input", "output", "overwrite") + VALUE_FIELDS
#: the fields of a ``batch`` request (its value fields are those of ``segment``, options of ``cardseg batch`` too)
BATCH_FIELDS = ("id", "op", "manifest", "output", "overwrite", "report") + VALUE_FIELDS
OPS = ("segment", "batch", "status", "exit")
#: modules whose presence ``status`` reports
WATCHED_MODULES = ("monai", "torch", "onnxruntime")
#: exit status of an unexpected error in one request (the engine goes on)
UNEXPECTED = 3


def add_serve_parser(sub) -> None:
    """Register ``cardseg serve`` on the CLI's subparsers."""
    p = sub.add_parser(
        "serve",
        help="a warm engine: segment requests read as JSON lines on stdin (the Slicer module)",
        formatter_class=DefaultsHelpFormatter,
        description="Load the bundle once, then segment one volume per JSON line read on stdin "
        "exactly as 'segment' does, answering with JSON lines on stdout (progress, then "
        "one result per request). The protocol is in the documentation's command-line reference.",
    )
    p.add_argument(
        "--bundle",
        metavar="PATH",
        help="bundle loaded at start and used by requests that name none "
        "(default: $CARDSEG_BUNDLE or the shipped one)%(default).0s",
    )  # .0s: no '(default: None)' after it
    p.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"], help="device of requests that name none"
    )
    p.add_argument(
        "--backend",
        choices=["auto", "torch", "onnx"],
        help="backend of requests that name none ($CARDSEG_BACKEND, else auto)%(default).0s",
    )
    p.add_argument(
        "--threads", type=int, metavar="N", help="CPU threads of requests naming none (the CPUs usable)%(default).0s"
    )
    p.add_argument(
        "--eof",
        default="stop",
        choices=["stop", "finish"],
        help="at the end of input: stop at once (a client that went away), or finish the requests read",
    )
    p.add_argument("--no-preload", action="store_true", help="load the bundle with the first request, not at start")


class Protocol:
    """Writes the protocol's JSON lines to one stream, flushed line by line. A client that is gone
    (a broken pipe) is said once on stderr, and the engine stops reading (:attr:`gone`)."""

    def __init__(self, stream):
        self.stream = stream
        self.gone = False  # the answers' pipe broke: said once on stderr, nothing more is written

    def send(self, obj: dict) -> None:
        if self.gone:
            return
        try:
            self.stream.write(strictjson.dumps(obj) + "\n")  # never a bare NaN a client cannot read
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            self.gone = True
            print("cardseg serve: the client stopped reading the answers; no more are sent", file=sys.stderr)


@contextlib.contextmanager
def protocol_stdout() -> Iterator[Protocol]:
    """The real stdout becomes the protocol's alone: file descriptor 1 (Python's ``print`` and any
    native library writing there) goes to stderr while the engine runs, and comes back after."""
    sys.stdout.flush()
    saved = os.dup(1)
    stream = os.fdopen(os.dup(1), "w", encoding="utf-8", newline="\n")
    os.dup2(2, 1)
    try:
        yield Protocol(stream)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        with contextlib.suppress(OSError):
            stream.close()


#: the longest request line read (a request is a few hundred bytes); a longer one is refused
MAX_REQUEST_BYTES = 1 << 20
#: what :class:`StdinReader` hands on in place of a line longer than :data:`MAX_REQUEST_BYTES`
TOO_LONG = "\0too long"


class StdinReader:
    """Reads request lines on a thread (:func:`cardseg.base.input_watch.watch_input`, the watchdog
    ``cardseg segment --eof stop`` has too), so that the end of input is seen while a request runs.

    ``on_eof`` is called (from the reader thread) when the input ends; lines go to :meth:`get`,
    which returns None after the last one.
    """

    def __init__(self, stream, on_eof: Callable[[], None]):
        from cardseg.base.input_watch import watch_input

        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.on_eof = on_eof
        self.thread = watch_input(stream, self._ended, self._line, "cardseg-serve-stdin", MAX_REQUEST_BYTES)

    def _line(self, raw: Optional[bytes]) -> None:
        self.lines.put(TOO_LONG if raw is None else raw.decode("utf-8", errors="replace"))

    def _ended(self) -> None:
        self.lines.put(None)
        self.on_eof()

    def get(self) -> Optional[str]:
        return self.lines.get()


class LoadedBundle:
    """The one bundle kept loaded, what it was loaded for (folder, configuration, device, backend)
    and its files' fingerprint (:func:`fingerprint`), by which a change on disk is noticed."""

    def __init__(self):
        self.key: Optional[tuple] = None  # (folder, configuration, device, backend)
        self.files: Optional[tuple] = None
        self.bundle = self.device = None  # the device it was loaded onto: "cpu" or a torch.device
        self.threads: Optional[int] = None  # the threads the bundle's ONNX sessions were opened with

    def get(self, bundle_arg, device_name: str, backend: str, method: str, progress, threads: int) -> tuple:
        """``(bundle, loaded_now, device)`` for a request. While the folder's files are those loaded
        (same fingerprint) nothing is read; otherwise the folder is checked whole as ``cardseg segment``
        checks it and loaded again unless its configuration and checksums are still those loaded.
        torch is imported as ``cardseg segment`` imports it (:func:`cardseg.bundle.onnx_backend.settle_device`);
        torch and the file compression run on each request's ``threads``; ONNX sessions keep theirs (reopened)."""
        from cardseg.base.devices import surely_cpu
        from cardseg.bundle.folder import check_bundle, check_method, resolve_bundle_path
        from cardseg.bundle.loading import load_bundle
        from cardseg.bundle.onnx_backend import settle_device, start_cpu_lookup
        from cardseg.io.written import set_threads

        set_threads(threads)
        root = resolve_bundle_path(bundle_arg)
        device = "cpu" if surely_cpu(device_name) else settle_device(device_name, None, threads)
        if sys.modules.get("torch") is not None:  # imported for this request or an earlier one
            sys.modules["torch"].set_num_threads(int(threads))
        files = fingerprint(root, self.bundle.config) if self.bundle is not None else None
        same_threads = self.bundle is not None and (not self.bundle.takes_numpy or self.threads == int(threads))
        if (
            same_threads
            and files == self.files
            and self.key[0] == str(root.resolve())
            and self.key[2:] == (str(device), backend)
        ):
            check_method(root, self.bundle.config, method)
            return self.bundle, False, self.device
        checked = check_bundle(bundle_arg)
        check_method(checked.root, checked.config, method)
        key = (str(checked.root.resolve()), json.dumps(checked.config, sort_keys=True), str(device), backend)
        if same_threads and key == self.key:  # touched, not changed
            self.files = fingerprint(checked.root, checked.config)
            return self.bundle, False, self.device
        files = fingerprint(checked.root, checked.config)
        lookup = start_cpu_lookup(checked.config, checked.weights, backend, str(device), threads)
        device = settle_device(str(device), lookup, threads)  # torch only when the sessions are not all cached
        self.bundle = self.key = self.files = None  # a failed load leaves nothing stale behind
        bundle = load_bundle(
            checked.root,
            device=device,
            backend=backend,
            progress=progress,
            prepared=True,
            checked=checked,
            onnx_lookup=lookup,
            threads=threads,
        )
        for note in bundle.notes:
            print(f"cardseg: note: {note}", file=sys.stderr)
        self.bundle, self.key, self.files, self.device, self.threads = bundle, key, files, device, int(threads)
        return bundle, True, device

    def describe(self) -> Optional[dict]:
        if self.bundle is None:
            return None
        b = self.bundle
        return {
            "id": b.ident,
            "path": str(b.path),
            "backend": b.backend,
            "device": self.key[2],
            "checksums": dict(b.checksums),
        }


def fingerprint(root: Path, config: dict) -> Optional[tuple]:
    """Identity and change stamps (inode, size, modification and change times) of ``bundle.json``
    and the weight files ``config`` names; None when one cannot be read. Writing or replacing a
    file changes its change time (which no tool can set back), so an unchanged fingerprint means
    the files that were checked and loaded are still there as they were."""
    names = ["bundle.json"] + [spec.get("file", "") for spec in config.get("networks", {}).values()]
    stamps = []
    for name in names:
        try:
            st = os.stat(Path(root) / name)
        except OSError:
            return None
        stamps.append((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stamps)


class Engine:
    """Runs requests one at a time against a :class:`LoadedBundle` (see the module docstring).

    ``make_parser`` is the CLI's parser factory, ``check_segment`` the checks ``cardseg segment``
    runs on its arguments and ``check_backend`` the one that settles ``--backend`` (all from
    :mod:`cardseg.cli`, handed in so that this module does not import the CLI).
    """

    def __init__(
        self,
        defaults: argparse.Namespace,
        protocol: Protocol,
        make_parser: Callable,
        check_segment: Callable,
        check_backend: Callable,
    ):
        self.defaults = defaults
        self.protocol = protocol
        self.parser = make_parser()
        self.check_segment = check_segment
        self.check_backend = check_backend
        self.loaded = LoadedBundle()
        self.requests = 0

    # -- requests

    def arguments(self, request: dict) -> argparse.Namespace:
        """``request`` as ``cardseg segment``'s parsed arguments (its parser: same choices, types, defaults)."""
        argv = self.option_argv("segment", request, FIELDS, ("input", "output"))
        return self.parse(argv + ["--", request["input"]])

    def batch_arguments(self, request: dict) -> argparse.Namespace:
        """``request`` as ``cardseg batch --manifest``'s parsed arguments (its parser, as for segment)."""
        argv = self.option_argv("batch", request, BATCH_FIELDS, ("manifest", "output"))
        report = request.get("report", True)
        if not isinstance(report, bool):
            raise CardsegError(f"'report' must be true or false, got {json.dumps(report)}")
        return self.parse(argv + [f"--manifest={request['manifest']}"] + ([] if report else ["--no-report"]))

    def option_argv(self, command: str, request: dict, fields: tuple, paths: tuple) -> list:
        """The command line of ``command`` that ``request`` asks for, without its input: its fields
        checked (only ``fields``; each of ``paths`` a path), the engine's start options for the
        value fields it leaves out, ``--progress json``."""
        unknown = sorted(set(request) - set(fields))
        if unknown:
            raise CardsegError(f"unknown request field {unknown[0]!r} (fields: {', '.join(fields)})")
        for name in paths:
            if not isinstance(request.get(name), str) or not request[name]:
                raise CardsegError(f"the request needs {name!r}: a path")
        d = self.defaults
        values = {"bundle": d.bundle, "device": d.device, "backend": d.backend, "threads": d.threads}
        values.update({k: request[k] for k in VALUE_FIELDS if request.get(k) is not None})
        argv = [command, f"--output={request['output']}", "--progress=json"]
        for name, value in values.items():
            if value is not None:
                argv.append(f"--{name.replace('_', '-')}={option_text(name, value)}")
        overwrite = request.get("overwrite", False)
        if not isinstance(overwrite, bool):
            raise CardsegError(f"'overwrite' must be true or false, got {json.dumps(overwrite)}")
        return argv + (["--overwrite"] if overwrite else [])

    def parse(self, argv: list) -> argparse.Namespace:
        """Parse with the CLI's parser; its usage error becomes a one-line :class:`CardsegError`."""
        import io

        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                return self.parser.parse_args(argv)
        except SystemExit:
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            text = lines[-1] if lines else "invalid request"
            raise CardsegError(text.split(" error: ", 1)[-1].split(" (see cardseg ", 1)[0]) from None  # no CLI hint

    def segment(self, request: dict, t0: float) -> dict:
        """One ``segment`` request, checked as ``cardseg segment`` checks; the result event."""
        from cardseg.base.cpus import default_threads
        from cardseg.base.progress import JsonProgress
        from cardseg.bundle.review_rules import check_review_map, with_review_map
        from cardseg.io.inputs import parse_spacing
        from cardseg.io.outdir import check_output
        from cardseg.segment import FileOptions, SegmentOptions, segment_file

        a = self.arguments(request)
        self.check_segment(a)
        spacing = parse_spacing(a.spacing) if a.spacing else None
        check_output(a.output, a.overwrite, inputs=[a.input])
        check_review_map(a.bundle, a.review_map)  # before any network loads
        progress = JsonProgress(self.protocol.stream)
        bundle, loaded_now, device = self.loaded.get(
            a.bundle, a.device, a.backend, a.method, progress, a.threads or default_threads()
        )
        bundle = with_review_map(bundle, a.review_map)
        report = segment_file(
            a.input,
            a.output,
            bundle,
            SegmentOptions(method=a.method, device=device, batch_size=a.batch_size, progress=progress),
            FileOptions(frame=a.frame, spacing=spacing, overwrite=a.overwrite),
            t_start=t0,
        )
        out = Path(os.path.realpath(os.path.abspath(a.output)))
        files = sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith("."))
        return {
            "event": "result",
            "id": request.get("id"),
            "ok": True,
            "output": str(out),
            "files": files,
            "slices": report["slices"],
            "agreement": report["agreement"],
            "out_of_domain": report["out_of_domain"],
            "regions": len(report["regions"]),
            "timings_s": report["timings_s"],
            "backend": report["backend"],
            "device": report["device"],
            "loaded_bundle": loaded_now,
            "notes": list(bundle.notes),
            "seconds": time.perf_counter() - t0,
        }

    def batch(self, request: dict, t0: float) -> dict:
        """One ``batch`` request: :func:`cardseg.cohort.batch.run_batch`, the code ``cardseg batch``
        runs (its checks, cohort table, resume), in this process with the bundle kept loaded; the
        result event (``ok`` false with code 1 when a case failed, as ``cardseg batch`` exits)."""
        from cardseg.cohort.batch import BatchHooks, run_batch
        from cardseg.cohort.options import options_from_args

        a = self.batch_arguments(request)
        self.check_backend(a)
        loads: list = []
        hooks = BatchHooks(protocol_case_progress(self.protocol.stream), self.warm_worker(loads))
        r = run_batch(options_from_args(a), hooks)
        event = {
            "event": "result",
            "id": request.get("id"),
            "ok": not r.failed,
            "output": str(r.outdir),
            "cases": len(r.rows),
            "computed": r.computed,
            "reused": r.reused,
            "failed": r.failed,
            "files": list(r.files),
            "loaded_bundle": any(loads),
            "seconds": time.perf_counter() - t0,
        }
        if r.failed:
            event.update(error=f"{r.failed} of {len(r.rows)} cases failed (cohort.csv says why)", code=1)
        return event

    def warm_worker(self, loads: list) -> Callable:
        """The batch's ``load_worker``: a case worker on the bundle kept loaded (loaded now if it is
        not the one the batch names); ``loads`` receives whether it was (re)loaded."""
        from cardseg.base.cpus import default_threads
        from cardseg.base.progress import JsonProgress
        from cardseg.bundle.review_rules import with_review_map
        from cardseg.cohort.worker import CaseWorker

        def load(o, bundle_root, checked) -> CaseWorker:
            threads = o.threads or default_threads()
            progress = JsonProgress(self.protocol.stream)  # a first run's ONNX export, as segment's
            bundle, loaded_now, device = self.loaded.get(o.bundle, o.device, o.backend, o.method, progress, threads)
            worker = CaseWorker(bundle_root, o.method, o.device, o.batch_size, o.threads, o.backend, o.review_map)
            worker.bundle, worker.device = with_review_map(bundle, o.review_map), device
            loads.append(loaded_now)
            return worker

        return load

    def status(self, request: dict) -> dict:
        return {
            "event": "status",
            "id": request.get("id"),
            "pid": os.getpid(),
            "requests": self.requests,
            "bundle": self.loaded.describe(),
            "modules": {m: m in sys.modules for m in WATCHED_MODULES},
        }

    def handle(self, line: str) -> bool:
        """Answer one input line; False when it asks the engine to end."""
        t0 = time.perf_counter()
        if line is TOO_LONG:
            self.protocol.send(error_event(None, f"a request line must be at most {MAX_REQUEST_BYTES} bytes", 2))
            return True
        try:
            request = strictjson.loads(line)
        except (ValueError, RecursionError) as exc:  # nested deeper than Python's parser goes: refused too
            self.protocol.send(error_event(None, f"not a JSON request ({one_line(exc)})", 2))
            return True
        if not isinstance(request, dict):
            self.protocol.send(error_event(None, "a request must be a JSON object", 2))
            return True
        op = request.get("op", "segment")
        if op not in OPS:
            self.protocol.send(
                error_event(request.get("id"), f"unknown op {json.dumps(op)} (ops: {', '.join(OPS)})", 2)
            )
            return True
        if op == "exit":
            return False
        if op == "status":
            self.protocol.send(self.status(request))
            return True
        self.requests += 1
        self.protocol.send(self.run_request(request, t0, self.batch if op == "batch" else self.segment))
        return True

    def run_request(self, request: dict, t0: float, work: Optional[Callable] = None) -> dict:
        """The result event of one segment (or ``work``'s) request; errors become error events (a
        stop goes on up)."""
        rid = request.get("id")
        try:
            return (work or self.segment)(request, t0)
        except CardsegError as exc:
            return error_event(rid, one_line(exc), 2)
        except KeyboardInterrupt:
            self.protocol.send(error_event(rid, "stopped; nothing half-written was left", 130))
            raise
        except OSError as exc:  # as cardseg segment: a full disk, a folder that vanished
            where = f"{exc.filename}: " if exc.filename else ""
            return error_event(rid, f"{where}{exc.strerror or one_line(exc)}", 1)
        except Exception as exc:  # noqa: BLE001 - a bug in one request must not end the engine
            traceback.print_exc(file=sys.stderr)
            return error_event(rid, f"{type(exc).__name__}: {one_line(exc)}", UNEXPECTED)

    def preload(self) -> Optional[str]:
        """Load the start-up bundle (``--bundle`` or the default); None, or why it could not be."""
        from types import SimpleNamespace

        from cardseg.base.cpus import default_threads
        from cardseg.base.options import check_run_options

        try:
            d = self.defaults
            check_run_options(1, d.threads, None)
            a = SimpleNamespace(backend=d.backend, device=d.device)
            self.check_backend(a)
            self.loaded.get(d.bundle, a.device, a.backend, "uc", None, d.threads or default_threads())
        except (CardsegError, OSError) as exc:
            return one_line(exc)
        except Exception as exc:  # noqa: BLE001 - reported in the ready line; requests load again
            traceback.print_exc(file=sys.stderr)
            return f"{type(exc).__name__}: {one_line(exc)}"
        return None


def protocol_case_progress(stream):
    """A batch's progress over its cases as ``cardseg batch --progress json`` writes it, on the
    protocol's stream ``stream`` (a :class:`cardseg.cohort.case_progress.CaseProgress`)."""
    from cardseg.base.progress import JsonProgress
    from cardseg.cohort.case_progress import CaseProgress

    progress = CaseProgress("none")
    progress.kind, progress.json = "json", JsonProgress(stream)
    return progress


def option_text(name: str, value) -> str:
    """A request value as the text of its command-line option (a list for ``spacing``)."""
    if name == "spacing" and isinstance(value, list):
        value = ",".join(str(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise CardsegError(
            f"{name!r} must be a {'number' if name in ('frame', 'batch_size', 'threads') else 'text'}, "
            f"got {json.dumps(value)}"
        )
    return str(value)


def error_event(rid, message: str, code: int) -> dict:
    return {"event": "result", "id": rid, "ok": False, "error": message, "code": code}


def serve(a: argparse.Namespace, make_parser: Callable, check_segment: Callable, check_backend: Callable) -> int:
    """Run the engine until the end of input, an ``exit`` request or SIGTERM; the exit status."""
    from cardseg.base.interrupt import EXIT_TERMINATED, SigtermState, sigterm_as_interrupt, stop_from_thread

    busy = threading.Event()
    eof = threading.Event()
    stop: Optional[Callable[[], None]] = None  # set below, once its handler is in place

    def on_eof() -> None:
        eof.set()
        if a.eof == "stop" and busy.is_set() and stop is not None:
            stop()  # the client is gone: stop the work as Ctrl-C would

    reason, code, sigterm = "eof", 0, SigtermState()
    with protocol_stdout() as protocol:
        try:
            with sigterm_as_interrupt() as sigterm, stop_from_thread() as stop:
                engine = Engine(a, protocol, make_parser, check_segment, check_backend)
                error = None if a.no_preload else engine.preload()
                b = engine.loaded.describe()
                protocol.send(
                    {
                        "event": "ready",
                        "protocol": PROTOCOL,
                        "pid": os.getpid(),
                        "bundle": b and b["path"],
                        "backend": b and b["backend"],
                        "device": b and b["device"],
                        "error": error,
                    }
                )
                reader = StdinReader(sys.stdin.buffer, on_eof)
                while True:
                    line = reader.get()
                    if line is None or (eof.is_set() and a.eof == "stop"):  # stop: no queued request runs
                        break
                    if protocol.gone:  # nobody reads the answers: stop rather than work unheard
                        reason = "client gone"
                        break
                    if not line.strip():
                        continue
                    busy.set()
                    try:
                        if not engine.handle(line):
                            reason = "exit"
                            break
                    finally:
                        busy.clear()
        except KeyboardInterrupt:
            if sigterm.received:
                reason, code = "terminated", EXIT_TERMINATED
            elif not eof.is_set():  # at the end of input, the initial "eof", 0 stands
                reason, code = "interrupted", 130
        protocol.send({"event": "exit", "reason": reason})
    return code
