"""Benchmark: a Segment & Calibrate through the warm engine (``cardseg serve``) against a one-shot
``cardseg segment`` process (not a test).

    python Testing/benchmarks/warm_engine.py [--input VOLUME] [--bundle PATH] [--backend auto|torch|onnx]
                                             [--rounds 3] [--requests 3] [--threads N] [--json OUT.json]
                                             [--batch-cases N] [--code LABEL=REPO ...]

Each round runs, one after the other, on the same input (a ``cardseg synth`` phantom, 10 slices
of 192 x 176, unless ``--input`` is given):

* a one-shot ``cardseg segment`` process: its wall clock (start to exit, as the module's one-shot
  run waits for it) and the trajectory time of its ``report.json`` (``timings_s.trajectory``);
* a fresh ``cardseg serve`` process: the wall clock from its start to its ``ready`` line (Python
  and the bundle loaded; torch only where it runs the networks), then ``--requests`` requests one after the other, each timed from
  writing its line to reading its result line (what the module waits for after a click), with
  the trajectory time its result reports (report.json's ``timings_s``). The first request is
  timed both from the ready line and from the process start (an engine started by the click).

The issue's goal is on the second request: its wall at most 1.2x its trajectory. Every request
of every round is kept in the JSON; the summary gives the median over rounds of each figure and
of each ratio (ratios are taken request by request, so load on a shared machine hits both sides
of one ratio alike). ``--backend`` is passed to every run (default: none, cardseg's own default:
ONNX Runtime on a CPU with the ``[speed]`` extra). The ONNX models go to a fresh cache folder,
filled by an untimed warm-up run. The load average is recorded before and after, and the
engine's resident memory once its requests are done (what keeping it warm holds), with the
modules its ``status`` event reports loaded then (torch, MONAI, ONNX Runtime).

``--batch-cases N`` adds to each round a ``cardseg batch`` process over N copies of the input
(its wall clock, start to exit). ``--code LABEL=REPO`` (repeatable) runs cardseg from another
checkout's ``CARDSegment/`` (put first on ``PYTHONPATH``, the same Python environment), e.g. a
``git worktree`` of an older commit: each round then runs everything once per checkout, their
order alternating from round to round, and the JSON holds each checkout's figures under
``by_code`` (startup before and after a change, under the same load).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cardseg.method.flips import network_seconds

CARDSEG = [sys.executable, "-m", "cardseg"]


def one_shot(src: Path, out: Path, opts: list, env: dict) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(
        CARDSEG + ["segment", str(src), "-o", str(out), "--progress", "none", *opts],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"warm_engine: cardseg segment failed:\n{proc.stderr[-2000:]}")
    timings = json.loads((out / "report.json").read_text())["timings_s"]
    return {"wall_s": wall, "trajectory_s": network_seconds(timings), "timings_s": timings}


class Engine:
    """A ``cardseg serve`` child read line by line (stdout holds protocol lines only)."""

    def __init__(self, opts: list, env: dict):
        self.t_start = time.perf_counter()
        self.proc = subprocess.Popen(
            CARDSEG + ["serve", *opts],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
        )
        self.ready = self.event()
        self.t_ready = time.perf_counter()
        if self.ready.get("error"):
            raise SystemExit(f"warm_engine: the engine could not load the bundle: {self.ready['error']}")

    def event(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"warm_engine: cardseg serve ended ({self.proc.wait()})")
            obj = json.loads(line)
            if "event" in obj:
                return obj

    def request(self, src: Path, out: Path) -> dict:
        t0 = time.perf_counter()
        self.proc.stdin.write(json.dumps({"input": str(src), "output": str(out)}) + "\n")
        self.proc.stdin.flush()
        result = self.event()
        wall = time.perf_counter() - t0
        if not result.get("ok"):
            raise SystemExit(f"warm_engine: a request failed: {result.get('error')}")
        return {
            "wall_s": wall,
            "t_sent": t0,
            "trajectory_s": network_seconds(result["timings_s"]),
            "timings_s": result["timings_s"],
            "engine_s": result["seconds"],
            "loaded_bundle": result["loaded_bundle"],
        }

    def modules(self) -> dict:
        """Which of torch, MONAI and ONNX Runtime the engine has imported (its ``status`` event)."""
        self.proc.stdin.write(json.dumps({"op": "status"}) + "\n")
        self.proc.stdin.flush()
        return self.event()["modules"]

    def rss_mib(self):
        """The engine's resident memory now (Linux ``/proc``; None elsewhere)."""
        try:
            text = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        kib = next((int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("VmRSS:")), None)
        return None if kib is None else kib / 1024

    def close(self) -> int:
        self.proc.stdin.close()
        return self.proc.wait(60)


def batch_run(src: Path, n: int, out: Path, opts: list, env: dict) -> dict:
    """A ``cardseg batch`` process over ``n`` copies of ``src`` (made beside ``out``): its wall clock,
    and that less its cases' trajectories (``timings_s.trajectory`` of their ``report.json``)."""
    cases = out.with_name(out.name + "-cases")
    cases.mkdir()
    for i in range(n):
        shutil.copyfile(src, cases / f"case{i}{''.join(src.suffixes)}")
    t0 = time.perf_counter()
    proc = subprocess.run(
        CARDSEG + ["batch", str(cases), "-o", str(out), "--quiet", *opts], capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"warm_engine: cardseg batch failed:\n{proc.stderr[-2000:]}")
    reports = [json.loads((out / f"case{i}" / "report.json").read_text()) for i in range(n)]
    trajectories = sum(network_seconds(rep["timings_s"]) for rep in reports)
    return {
        "wall_s": wall,
        "cases": n,
        "trajectories_s": trajectories,
        "wall_less_trajectories_s": wall - trajectories,
        "backend": sorted({rep["backend"] for rep in reports}),
    }


def median(values):
    return statistics.median(values) if values else None


def one_round(
    r: int, src: Path, work: Path, opts: list, env: dict, n_requests: int, batch_cases: int, tag: str = ""
) -> dict:
    """One round for one checkout: a one-shot run, a fresh engine and its requests, a batch."""
    single = one_shot(src, work / f"one-shot{tag}-{r}", opts, env)
    engine = Engine(opts, env)
    requests = [engine.request(src, work / f"engine{tag}-{r}-{i}") for i in range(n_requests)]
    rss = engine.rss_mib()
    modules = engine.modules()
    code = engine.close()
    first = requests[0]
    out = {
        "one_shot": single,
        "engine_start_to_ready_s": engine.t_ready - engine.t_start,
        "first_request_from_start_s": first["t_sent"] + first["wall_s"] - engine.t_start,
        "requests": [{k: v for k, v in q.items() if k != "t_sent"} for q in requests],
        "engine_rss_mib_idle": rss,
        "engine_modules": modules,
        "engine_exit_status": code,
    }
    if batch_cases:
        out["batch"] = batch_run(src, batch_cases, work / f"batch{tag}-{r}", opts, env)
    second = requests[1]
    batch = (
        f"; batch of {batch_cases} {out['batch']['wall_s']:.2f} s (trajectories {out['batch']['trajectories_s']:.2f})"
        if batch_cases
        else ""
    )
    print(
        f"round {r + 1}{tag}: one-shot {single['wall_s']:.2f} s (trajectory {single['trajectory_s']:.2f}); "
        f"engine ready after {out['engine_start_to_ready_s']:.2f} s; first request "
        f"{first['wall_s']:.2f} s (trajectory {first['trajectory_s']:.2f}, {out['first_request_from_start_s']:.2f} s "
        f"from start), second {second['wall_s']:.2f} s (trajectory {second['trajectory_s']:.2f}, ratio "
        f"{second['wall_s'] / second['trajectory_s']:.3f}){batch}; engine modules {modules}",
        flush=True,
    )
    return out


def figures(rounds: list) -> tuple:
    """``(per-round lists, their medians)`` of the rounds of one checkout."""
    with_kind = {
        "one_shot_wall_s": [r["one_shot"]["wall_s"] for r in rounds],
        "one_shot_trajectory_s": [r["one_shot"]["trajectory_s"] for r in rounds],
        "one_shot_ratio": [r["one_shot"]["wall_s"] / r["one_shot"]["trajectory_s"] for r in rounds],
        "engine_start_to_ready_s": [r["engine_start_to_ready_s"] for r in rounds],
        "first_request_wall_s": [r["requests"][0]["wall_s"] for r in rounds],
        "first_request_from_start_s": [r["first_request_from_start_s"] for r in rounds],
        "first_request_trajectory_s": [r["requests"][0]["trajectory_s"] for r in rounds],
        "first_request_from_start_less_trajectory_s": [
            r["first_request_from_start_s"] - r["requests"][0]["trajectory_s"] for r in rounds
        ],
        "first_request_ratio": [r["requests"][0]["wall_s"] / r["requests"][0]["trajectory_s"] for r in rounds],
        "second_request_wall_s": [r["requests"][1]["wall_s"] for r in rounds],
        "second_request_trajectory_s": [r["requests"][1]["trajectory_s"] for r in rounds],
        "second_request_ratio": [r["requests"][1]["wall_s"] / r["requests"][1]["trajectory_s"] for r in rounds],
        "later_request_ratio": [q["wall_s"] / q["trajectory_s"] for r in rounds for q in r["requests"][1:]],
        "engine_rss_mib_idle": [r["engine_rss_mib_idle"] for r in rounds if r["engine_rss_mib_idle"] is not None],
    }
    if rounds and "batch" in rounds[0]:
        for key in ("wall_s", "trajectories_s", "wall_less_trajectories_s"):
            with_kind[f"batch_{key}"] = [r["batch"][key] for r in rounds]
    summary = {k: median(v) for k, v in with_kind.items()}
    summary["second_request_goal"] = 1.2
    summary["second_request_within_goal"] = summary["second_request_ratio"] <= 1.2
    summary["engine_modules"] = rounds[-1]["engine_modules"] if rounds else None
    return with_kind, summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", help="volume to segment (default: a cardseg synth phantom, 10 slices)")
    ap.add_argument("--bundle", help="bundle (default: cardseg's)")
    ap.add_argument("--backend", choices=["auto", "torch", "onnx"], help="default: cardseg's own")
    ap.add_argument("--threads", type=int, help="--threads of every run (default: cardseg's, the usable CPUs)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3, help="requests per engine (at least 2)")
    ap.add_argument("--batch-cases", type=int, default=0, help="also time a cardseg batch over N copies per round")
    ap.add_argument(
        "--code",
        action="append",
        default=[],
        metavar="LABEL=REPO",
        help="run cardseg from REPO/CARDSegment (repeatable: the checkouts alternate in each round)",
    )
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--note", default="", help="a remark stored with the result (e.g. that the machine was shared)")
    a = ap.parse_args(argv)
    if a.requests < 2 or a.rounds < 1:
        ap.error("--requests must be at least 2 and --rounds at least 1")
    codes = []
    for item in a.code:
        label, sep, repo = item.partition("=")
        if not sep or not (Path(repo) / "CARDSegment" / "cardseg").is_dir():
            ap.error(f"--code {item}: LABEL=REPO, REPO a checkout holding CARDSegment/cardseg")
        codes.append((label, Path(repo).resolve()))
    work = Path(tempfile.mkdtemp(prefix="cardseg-warm-"))
    env = {**os.environ, "CARDSEG_CACHE_DIR": str(work / "model-cache"), "PYTHONUNBUFFERED": "1"}
    envs = (
        {"": env}
        if not codes
        else {
            label: {
                **env,
                "PYTHONPATH": os.pathsep.join([str(repo / "CARDSegment")] + [p for p in [env.get("PYTHONPATH")] if p]),
            }
            for label, repo in codes
        }
    )
    opts = []
    for flag, value in (("--bundle", a.bundle), ("--backend", a.backend), ("--threads", a.threads)):
        if value is not None:
            opts += [flag, str(value)]
    load_before = os.getloadavg()
    try:
        src = Path(a.input) if a.input else work / "phantom.nii.gz"
        if not a.input:
            subprocess.run(CARDSEG + ["synth", str(src)], check=True, capture_output=True, env=env)
        # fills the model cache (shared by the checkouts: its keys do not name the code), untimed
        warm = {label: one_shot(src, work / f"warm-up-{i}", opts, e) for i, (label, e) in enumerate(envs.items())}
        rounds = {label: [] for label in envs}
        labels = list(envs)
        for r in range(a.rounds):
            for label in labels if r % 2 == 0 else labels[::-1]:
                rounds[label].append(
                    one_round(r, src, work, opts, envs[label], a.requests, a.batch_cases, f"-{label}" if label else "")
                )
        per_code = {label: figures(rs) for label, rs in rounds.items()}
        result = {
            "what": "warm engine (cardseg serve) against one-shot cardseg segment, one run",
            "input": "cardseg synth phantom, 10 x 192 x 176" if not a.input else str(a.input),
            "options": opts or ["(cardseg defaults)"],
            "backend": json.loads((work / "warm-up-0" / "report.json").read_text())["backend"],
            "rounds": a.rounds,
            "requests_per_engine": a.requests,
            "batch_cases": a.batch_cases,
            "machine": {
                "cpus": os.cpu_count(),
                "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                "python": platform.python_version(),
                "load_average_before": list(load_before),
                "load_average_after": list(os.getloadavg()),
            },
            "note": a.note,
        }
        if not codes:
            with_kind, summary = per_code[""]
            result.update(
                {"summary_median": summary, "per_round": with_kind, "warm_up_run": warm[""], "raw": rounds[""]}
            )
        else:
            result["code"] = {label: str(repo) for label, repo in codes}
            result["summary_median"] = {label: per_code[label][1] for label in labels}
            result["by_code"] = {
                label: {"per_round": per_code[label][0], "warm_up_run": warm[label], "raw": rounds[label]}
                for label in labels
            }
        print(json.dumps(result["summary_median"], indent=2))
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
