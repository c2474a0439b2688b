"""Measure what the first ``cardseg segment`` of a new environment costs against a warm one.

Runs ``cardseg synth`` once, then ``cardseg segment`` on the phantom with an empty model cache
(the first run exports the ONNX models, or prepares the TorchScript programs) and again with the
cache it left, ``--repeats`` times each, and writes the wall times and the stages' timings to
``docs/_data/first_run.json`` (or ``--json``). Usage::

    python docs/tools/measure_first_run.py --threads 2 --repeats 2
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

REPO = Path(__file__).resolve().parents[2]


def _run(cmd, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _segment(cardseg: str, work: Path, cache: Path, threads: int, name: str) -> dict:
    env = dict(os.environ, CARDSEG_CACHE_DIR=str(cache), OMP_NUM_THREADS=str(threads))
    out = work / name
    wall = _run(
        [
            cardseg,
            "segment",
            str(work / "demo.nii.gz"),
            "-o",
            str(out),
            "--progress",
            "none",
            "--threads",
            str(threads),
        ],
        env,
    )
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    return {"wall_s": wall, "timings_s": report["timings_s"], "backend": report.get("backend")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=str(REPO / "docs" / "_data" / "first_run.json"))
    a = ap.parse_args()
    cardseg = str(Path(sys.executable).with_name("cardseg"))
    work = Path(tempfile.mkdtemp(prefix="cardseg-first-run-"))
    try:
        _run([cardseg, "synth", str(work / "demo.nii.gz")], dict(os.environ))
        first, warm = [], []
        for i in range(a.repeats):
            cache = work / f"cache{i}"
            first.append(_segment(cardseg, work, cache, a.threads, f"first{i}"))
            warm.append(_segment(cardseg, work, cache, a.threads, f"warm{i}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {
        "what": "cardseg segment on the cardseg synth phantom: a first run with an empty model cache, then a run with the cache it left",
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "threads": a.threads,
        "load_average_before": os.getloadavg()[0],
        "first": first,
        "warm": warm,
        "first_wall_s_median": statistics.median(r["wall_s"] for r in first),
        "warm_wall_s_median": statistics.median(r["wall_s"] for r in warm),
    }
    record["first_minus_warm_s"] = record["first_wall_s_median"] - record["warm_wall_s_median"]
    Path(a.json).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: record[k] for k in ("first_wall_s_median", "warm_wall_s_median", "first_minus_warm_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
