"""Benchmark: where a whole ``cardseg segment`` run's time goes, and batch against a loop (not a test).

    python Testing/benchmarks/whole_run.py [--input VOLUME] [--bundle PATH] [--backend auto|torch|onnx]
                                           [--repeats 5] [--cases 8] [--batch-repeats 2] [--threads N]
                                           [--batch-workers N] [--device cpu|cuda]
                                           [--json OUT.json]

Every run is a fresh process, as a user's would be. For ``--method uc`` and ``--method card`` it runs

* plain ``cardseg segment`` processes (the wall clock around the subprocess, and ``timings_s`` from
  their ``report.json``): the ratios are taken from these;
* the same command in an instrumented process that times, without changing what runs: the
  imports (torch, MONAI, ONNX Runtime, the engine with numpy/SciPy/SimpleITK/...; each import
  statement's own time, nested imports counted once), the checks (options, OUTDIR, bundle), the
  read, the bundle load, normalisation, resampling to the network grid and back, the networks
  (``run_trajectory``), post-processing (calibration, softmax), agreement and flagged regions,
  and writing; "python start/exit" is the subprocess's wall clock less what the process timed
  (it ends with ``os._exit`` as the plain run does). Imports made on other threads (the ONNX
  sessions opened while the input is read) are not counted: they run beside the main thread;
  "waiting for the ONNX sessions" is the main thread's wait for them. A run whose ONNX models are
  cached imports no torch (its "import torch" row is 0); "rest" is what no row names.

then ``cardseg batch`` over ``--cases`` copies of the volume (one process; as it is, with triage.html,
and again with ``--no-report``) against a loop of as many ``cardseg segment`` processes
(``--method card``, the default), each timed by its wall clock; the loop counts ``--cases`` times its
fastest case, the batch its fastest of ``--batch-repeats`` runs.
It prints the breakdown and the issue's three ratios, measured in this one run, each time taken as
the least over the repeats (other load on a shared machine only ever adds time; the median of the
plain runs is printed too). Ratios: whole-run card/uc (goal <= 1.10), whole-run / trajectory time
(goal <= 1.5; trajectory = ``timings_s.trajectory`` plus ``timings_s.flips`` where the bundle runs flipped copies, resampling included), batch / loop
throughput (goal >= 3).
The input is a ``cardseg synth`` phantom (10 slices of 192 x 176) unless ``--input`` is given.
uc and card runs alternate, so that a change in the machine's load hits both alike; the load
average is printed before and after. ``--backend`` is passed to every run (default ``auto``, which is
cardseg's: ONNX Runtime on a CPU with the ``[speed]`` extra); unless ``$CARDSEG_CACHE_DIR`` is set, the
ONNX models go to a fresh cache folder, filled by an untimed warm-up run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cardseg.method.flips import network_seconds

# --------------------------------------------------------------------------------------------
# the instrumented child: ``whole_run.py --child OUT.json -- segment ARGS...``
# --------------------------------------------------------------------------------------------
IMPORT_GROUPS = {
    "torch": "import torch",
    "monai": "import MONAI",
    "onnxruntime": "import onnxruntime",
    "onnx": "import onnxruntime",
}
OTHER_IMPORTS = "import engine + numpy/SciPy/SimpleITK/..."


def _child(out_json: str, argv: list) -> int:
    t_child = time.perf_counter()
    import builtins
    import threading

    main_thread = threading.get_ident()

    imports: dict = {}
    phases: dict = {}
    stack: list = []  # [group, time spent in nested imports]
    outer = [0.0]  # time in outermost import statements (subtracted from the phase they ran in)
    late: dict = {}  # {module: [(function, phase)]} to wrap once the run has imported the module
    original = builtins.__import__

    def group_of(name, globals_, level):
        top = ((globals_ or {}).get("__package__") or "") if level else name
        return IMPORT_GROUPS.get(top.split(".")[0])

    def timed_import(name, globals=None, locals=None, fromlist=(), level=0):
        if threading.get_ident() != main_thread:  # e.g. the ONNX lookup's imports: beside the main thread's work
            return original(name, globals, locals, fromlist, level)
        g = group_of(name, globals, level) or (stack[-1][0] if stack else OTHER_IMPORTS)
        t0 = time.perf_counter()
        stack.append([g, 0.0])
        try:
            return original(name, globals, locals, fromlist, level)
        finally:
            dt = time.perf_counter() - t0
            _, nested = stack.pop()
            imports[g] = imports.get(g, 0.0) + dt - nested
            if stack:
                stack[-1][1] += dt
            else:
                outer[0] += dt
                for module in [m for m in late if m in sys.modules]:  # wrapped before the caller sees it
                    for fname, phase in late.pop(module):
                        wrap(sys.modules[module], fname, phase)

    builtins.__import__ = timed_import

    def wrap(module, name, phase):
        f = getattr(module, name, None)
        if f is None:
            return

        def timed(*a, **k):
            t0, i0 = time.perf_counter(), outer[0]
            try:
                return f(*a, **k)
            finally:
                phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - t0 - (outer[0] - i0)

        setattr(module, name, timed)

    import cardseg.bundle.folder
    import cardseg.cli
    import cardseg.io.outdir
    import cardseg.io.volume

    wrap(cardseg.io.outdir, "check_output", "checks (options, OUTDIR, bundle)")
    wrap(cardseg.bundle.folder, "check_bundle", "checks (options, OUTDIR, bundle)")
    wrap(cardseg.io.volume, "read_volume", "read + input checks")
    # wrapped when the run itself imports them, so that every module (torch, when a run imports
    # it) is imported when and where the plain run imports it (the ONNX sessions open on a thread meanwhile)
    late.update(
        {
            "cardseg.bundle.loading": [("load_bundle", "bundle load")],
            "cardseg.bundle.onnx_backend": [("all_found", "waiting for the ONNX sessions")],
            "cardseg.segment": [
                ("run_trajectory", "networks (run_trajectory)"),
                ("resample_to_network", "resampling to/from the network grid"),
                ("network_to_slices", "resampling to/from the network grid"),
                ("build_report", "agreement + flagged regions (report)"),
                ("write_outputs", "writing"),
            ],
        }
    )
    rc = cardseg.cli.main(argv)
    builtins.__import__ = original
    Path(out_json).write_text(
        json.dumps({"rc": rc, "imports": imports, "phases": phases, "child_s": time.perf_counter() - t_child})
    )
    # the plain run ends with os._exit (cardseg.cli.console_main): so does this one, or the row
    # "python start/exit" would hold the interpreter's teardown of torch that no plain run pays
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


# --------------------------------------------------------------------------------------------
# the driver
# --------------------------------------------------------------------------------------------
def _cardseg_cmd() -> list:
    exe = Path(sys.executable).with_name("cardseg")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "cardseg"]


def _run(cmd: list, env: dict) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if p.returncode not in (0,):
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return dt


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _best(xs):
    """The least of the repeats: other load on the machine only ever adds time."""
    xs = [x for x in xs if x is not None]
    return min(xs) if xs else None


STAGES_FROM_REPORT = ("preprocess", "postprocess")
ROW_ORDER = [
    "python start/exit",
    "import torch",
    "import MONAI",
    "import onnxruntime",
    OTHER_IMPORTS,
    "checks (options, OUTDIR, bundle)",
    "read + input checks",
    "waiting for the ONNX sessions",
    "bundle load",
    "normalise (preprocess)",
    "resampling to/from the network grid",
    "networks (run_trajectory)",
    "trajectory: rest",
    "postprocess (calibration, softmax)",
    "agreement + flagged regions (report)",
    "writing",
    "rest",
]


def breakdown(wall: float, child: dict, report: dict) -> dict:
    """One instrumented run → ``{row: seconds}`` that adds up to ``wall``."""
    t = report["timings_s"]
    ph = child["phases"]
    rows = {"python start/exit": wall - child["child_s"]}
    for g in ("import torch", "import MONAI", "import onnxruntime", OTHER_IMPORTS):
        rows[g] = child["imports"].get(g, 0.0)
    for k in (
        "checks (options, OUTDIR, bundle)",
        "read + input checks",
        "waiting for the ONNX sessions",
        "bundle load",
        "resampling to/from the network grid",
        "networks (run_trajectory)",
        "agreement + flagged regions (report)",
        "writing",
    ):
        rows[k] = ph.get(k, 0.0)
    rows["normalise (preprocess)"] = t["preprocess"]
    rows["postprocess (calibration, softmax)"] = t["postprocess"]
    # the networks' time: the trajectory and, for a bundle whose review map needs them, the flipped copies' runs
    rows["trajectory: rest"] = (
        network_seconds(t) - rows["resampling to/from the network grid"] - rows["networks (run_trajectory)"]
    )
    rows["rest"] = wall - sum(rows.values())
    return rows


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        sep = sys.argv.index("--")
        sys.exit(_child(sys.argv[2], sys.argv[sep + 1 :]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", help="volume file (default: a cardseg synth phantom, 10 slices)")
    ap.add_argument("--bundle", help="bundle folder (default: the shipped one)")
    ap.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "torch", "onnx"],
        help="passed to every run (auto: cardseg's default, onnx on a CPU when the [speed] extra is there)",
    )
    ap.add_argument("--repeats", type=int, default=5, help="runs of each kind per method (the least counts)")
    ap.add_argument("--cases", type=int, default=8, help="copies of the volume for batch against loop (0: skip)")
    ap.add_argument("--batch-repeats", type=int, default=2, help="rounds of loop + batch (least of them)")
    ap.add_argument("--threads", type=int, help="--threads for every run (default: torch's choice)")
    ap.add_argument("--device", help="--device for every run (default: cardseg's, auto)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument(
        "--batch-workers", type=int, default=1, help="cardseg batch --workers N (with --threads T: T // N threads each)"
    )
    ap.add_argument("--json", help="write every measurement here")
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="cardseg-bench-"))
    env = dict(os.environ)
    if a.backend != "torch" and "CARDSEG_CACHE_DIR" not in env:
        env["CARDSEG_CACHE_DIR"] = str(tmp / "cache")  # a fresh model cache, filled by the warm-up run
    cs = _cardseg_cmd()
    try:
        if a.input:
            inp = Path(a.input).resolve()
        else:
            inp = tmp / "phantom.nii.gz"
            subprocess.run(cs + ["synth", str(inp)], env=env, check=True, stdout=subprocess.DEVNULL)
        common = ["--quiet", "--overwrite", "--batch-size", str(a.batch_size), "--backend", a.backend]
        common += ["--bundle", a.bundle] if a.bundle else []
        common += ["--threads", str(a.threads)] if a.threads else []
        common += ["--device", a.device] if a.device else []
        batch_common = [x for x in common]
        if a.batch_workers > 1:
            batch_common += ["--workers", str(a.batch_workers)]
            if a.threads:
                batch_common[batch_common.index("--threads") + 1] = str(max(1, a.threads // a.batch_workers))

        def seg_args(method, out):
            return ["segment", str(inp), "-o", str(out), "--method", method] + common

        load_before = _load()
        print(
            f"load average before: {load_before}; {os.cpu_count()} CPUs; backend {a.backend}; input {inp}", flush=True
        )
        for m in ("uc", "card"):  # warm-up: OS file cache, the ONNX model cache
            _run(cs + seg_args(m, tmp / f"warm-{m}"), env)
        res = {m: {"plain_wall": [], "plain_timings": [], "rows": []} for m in ("uc", "card")}
        for r in range(a.repeats):
            for m in ("uc", "card"):
                out = tmp / f"plain-{m}"
                w = _run(cs + seg_args(m, out), env)
                rep = json.loads((out / "report.json").read_text())
                res[m]["plain_wall"].append(w)
                res[m]["plain_timings"].append(rep["timings_s"])
                out = tmp / f"inst-{m}"
                cj = tmp / f"child-{m}.json"
                w = _run(
                    [sys.executable, str(Path(__file__).resolve()), "--child", str(cj), "--"] + seg_args(m, out), env
                )
                child = json.loads(cj.read_text())
                rep = json.loads((out / "report.json").read_text())
                res[m]["rows"].append(breakdown(w, child, rep))
                print(
                    f"  repeat {r + 1}: {m:4s} plain {res[m]['plain_wall'][-1]:.2f} s "
                    f"(trajectory {res[m]['plain_timings'][-1]['trajectory']:.2f} s), instrumented {w:.2f} s",
                    flush=True,
                )

        batch = None
        if a.cases > 0:
            cases = tmp / "cases"
            cases.mkdir()
            for i in range(a.cases):
                shutil.copyfile(inp, cases / f"case{i:03d}{''.join(inp.suffixes) or '.nii.gz'}")
            loop_walls, batch_walls, no_report_walls = [], [], []
            for r in range(a.batch_repeats):
                for f in sorted(cases.iterdir()):
                    loop_walls.append(
                        _run(cs + ["segment", str(f), "-o", str(tmp / "loop" / f.name.split(".")[0])] + common, env)
                    )
                for walls, extra in ((batch_walls, []), (no_report_walls, ["--no-report"])):
                    out = tmp / f"batch-{r}-{len(extra)}"
                    walls.append(_run(cs + ["batch", str(cases), "-o", str(out)] + batch_common + extra, env))
                    shutil.rmtree(out)
            # the loop: --cases times its least case (the fairest to the loop); the batch: its least run
            loop_s, bw, bw_nr = a.cases * min(loop_walls), min(batch_walls), min(no_report_walls)
            batch = {
                "cases": a.cases,
                "loop_walls": loop_walls,
                "batch_walls": batch_walls,
                "no_report_walls": no_report_walls,
                "loop_s": loop_s,
                "batch_s": bw,
                "batch_no_report_s": bw_nr,
                "loop_cases_per_min": a.cases / loop_s * 60,
                "batch_cases_per_min": a.cases / bw * 60,
                "batch_no_report_cases_per_min": a.cases / bw_nr * 60,
            }
        load_after = _load()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    # ---- the table ----
    # per stage: the least over the repeats; the instrumented whole run: the run with the least total
    best_rows = {m: min(res[m]["rows"], key=lambda rw: sum(rw.values())) for m in res}
    med = {m: {k: _best([rw[k] for rw in res[m]["rows"]]) for k in ROW_ORDER} for m in res}
    wall = {m: _best(res[m]["plain_wall"]) for m in res}
    traj = {m: _best([network_seconds(t) for t in res[m]["plain_timings"]]) for m in res}
    inst = {m: sum(best_rows[m].values()) for m in res}
    print(f"\nload average after: {load_after}\n")
    print(f"| stage (instrumented runs, least of {a.repeats}) | uc (s) | card (s) |")
    print("| --- | ---: | ---: |")
    for k in ROW_ORDER:
        print(f"| {k} | {med['uc'][k]:.3f} | {med['card'][k]:.3f} |")
    print(f"| **whole run, instrumented (fastest run)** | {inst['uc']:.3f} | {inst['card']:.3f} |")
    print(f"| **whole run, plain `cardseg segment`** (least of {a.repeats}) | {wall['uc']:.3f} | {wall['card']:.3f} |")
    print(f"| `timings_s.trajectory` of the plain runs (least) | {traj['uc']:.3f} | {traj['card']:.3f} |")
    print(
        f"| plain whole run, median of {a.repeats} | {statistics.median(res['uc']['plain_wall']):.3f} | "
        f"{statistics.median(res['card']['plain_wall']):.3f} |"
    )
    # issue 25's goal: a whole run at most its trajectory + 1.5 s (each run against its own trajectory)
    over = {m: [w - network_seconds(t) for w, t in zip(res[m]["plain_wall"], res[m]["plain_timings"])] for m in res}
    for m in ("uc", "card"):
        print(
            f"whole run - its trajectory, {m}: least {min(over[m]):.2f} s, median {statistics.median(over[m]):.2f} s "
            f"(goal <= 1.5 s); of which importing torch {med[m]['import torch']:.2f} s"
        )
    r1 = wall["card"] / wall["uc"]
    print(f"\nwhole-run card / uc: {r1:.2f}x (goal <= 1.10)")
    for m in ("uc", "card"):
        print(f"whole-run / trajectory, {m}: {wall[m] / traj[m]:.2f}x (goal <= 1.5)")
    r3 = None
    if batch:
        r3 = batch["batch_cases_per_min"] / batch["loop_cases_per_min"]
        print(
            f"batch {batch['cases']} cases: {batch['batch_s']:.1f} s ({batch['batch_cases_per_min']:.1f} cases/min); "
            f"loop of cardseg segment: {batch['loop_s']:.1f} s ({batch['loop_cases_per_min']:.1f} cases/min); "
            f"throughput batch / loop: {r3:.2f}x (goal >= 3)"
        )
        print(
            f"  the same batch with --no-report (no triage.html): {batch['batch_no_report_s']:.1f} s "
            f"({batch['batch_no_report_cases_per_min']:.1f} cases/min), "
            f"{batch['batch_no_report_cases_per_min'] / batch['loop_cases_per_min']:.2f}x the loop"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "backend": a.backend,
                    "device": a.device or "auto",
                    "load_before": load_before,
                    "load_after": load_after,
                    "cpus": os.cpu_count(),
                    "results": res,
                    # the least of the repeats per row (the key's name is historical)
                    "median_rows": med,
                    "row_medians": {
                        m: {k: statistics.median(rw[k] for rw in res[m]["rows"]) for k in ROW_ORDER} for m in res
                    },
                    "plain_wall": wall,
                    "trajectory": traj,
                    "batch": batch,
                    "whole_minus_trajectory_s": {
                        m: {"runs": over[m], "least": min(over[m]), "median": statistics.median(over[m])} for m in over
                    },
                    "ratios": {
                        "card_over_uc": r1,
                        "whole_over_trajectory": {m: wall[m] / traj[m] for m in wall},
                        "batch_over_loop": r3,
                    },
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
