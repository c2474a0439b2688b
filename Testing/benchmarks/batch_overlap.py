"""Benchmark: a batch case's time, stage by stage, and what overlapping reading and writing with
the computation saves (not a test).

    python Testing/benchmarks/batch_overlap.py [--input VOLUME] [--cases 8] [--device cpu|cuda]
                                               [--backend auto|torch|onnx] [--threads N] [--out FILE.json]

In one process, with the bundle loaded once (as a ``cardseg batch`` worker), on ``--cases``
copies of the input (a ``cardseg synth`` phantom, 10 slices of 192 x 176, unless ``--input``):

* every case once through :meth:`CaseWorker.run` (case after case, as before) with each stage
  timed: read and checks, trajectory, post-processing with agreement and regions, and writing
  with each output file on its own (compression and read-back included);
* the same cases through :func:`cardseg.cohort.pipeline.run_overlapped` (next case read, last case written
  while the current one computes), then case after case again, alternating, ``--repeats`` times.

It reports the marginal wall time per case of each schedule (the least over the repeats: other
load on a shared machine only ever adds time) against the per-case trajectory time measured in
the same runs, which is the goal's ratio (``cardseg batch`` marginal per-case wall at most 1.25x
the per-case trajectory), and the share of a case that writing takes. A first, untimed case
warms the caches (ONNX export, prepared torch programs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cardseg.method.flips import network_seconds


def _phantom(folder: Path) -> Path:
    from cardseg.bundle.phantom import synthetic_cine_volume

    import SimpleITK as sitk

    vol, _ = synthetic_cine_volume(shape=(10, 192, 176), spacing=(1.5, 1.5, 8.0), seed=0)
    path = folder / "phantom.nii.gz"
    sitk.WriteImage(vol.to_image(), str(path))
    return path


def _stage_times(worker, src: Path, out: Path) -> dict:
    """One case through the stages of :func:`cardseg.segment.segment_file`, each timed, and
    each output file's write timed on its own."""
    from cardseg import __version__, segment
    from cardseg.base.progress import Progress
    from cardseg.io.outdir import OutputWriter

    t = {}
    t0 = time.perf_counter()
    out, volume = segment.read_case(src, out)
    t["read"] = time.perf_counter() - t0
    with OutputWriter(out, version=__version__) as writer:
        t0 = time.perf_counter()
        options = segment.SegmentOptions(worker.method, worker.device, worker.batch_size, Progress())
        run = segment.run_networks(volume, worker.bundle, options)
        result = segment.finish_case(run, volume, worker.bundle, src, options=options, t_start=t0)
        compute = time.perf_counter() - t0
        t["trajectory"] = network_seconds(result.report["timings_s"])
        t["postprocess, agreement, regions"] = compute - t["trajectory"] - result.report["timings_s"]["preprocess"]
        t["preprocess"] = result.report["timings_s"]["preprocess"]
        files = {}
        for name in segment.output_files(result):
            t0 = time.perf_counter()
            segment.write_one(name, writer.path(name), result, volume, worker.bundle)
            files[name] = time.perf_counter() - t0
        t0 = time.perf_counter()
        writer.commit()
        files["(commit)"] = time.perf_counter() - t0
    t["write"] = sum(files.values())
    t["write_files"] = files
    return t


def _schedule(worker, jobs, overlapped: bool, finishers=None) -> tuple:
    """``(wall seconds, [trajectory seconds per case])`` of one pass over ``jobs``."""
    seen = []
    t0 = time.perf_counter()
    if overlapped:
        from cardseg.cohort.pipeline import run_overlapped

        run_overlapped(worker, jobs, seen.append, finishers=finishers)
    else:
        for job in jobs:
            seen.append(worker.run(job))
    wall = time.perf_counter() - t0
    bad = [r for r in seen if r["status"] != "ok"]
    if bad:
        raise SystemExit(f"batch_overlap: a case failed: {bad[0]['error']}")
    return wall, [network_seconds(r["report"]["timings_s"]) for r in seen]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input")
    ap.add_argument("--bundle")
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--finishers", type=int, help="threads finishing cases (default: cardseg batch's, by CPU count)")
    ap.add_argument("--out", help="write the figures here as JSON")
    a = ap.parse_args(argv)
    from cardseg.bundle.folder import resolve_bundle_path
    from cardseg.cohort.pipeline import default_finishers
    from cardseg.cohort.worker import CaseWorker, Job

    work = Path(tempfile.mkdtemp(prefix="cardseg-overlap-"))
    os.environ.setdefault("CARDSEG_CACHE_DIR", str(work / "model-cache"))
    try:
        src = Path(a.input) if a.input else _phantom(work)
        worker = CaseWorker(resolve_bundle_path(a.bundle), device=a.device, backend=a.backend, threads=a.threads)
        worker.load()
        worker.run(Job(case="warm", path=str(src), out=str(work / "warm")))  # caches, allocator, first-call costs
        stages = _stage_times(worker, src, work / "stages")
        runs = {"sequential": [], "overlapped": []}
        for r in range(a.repeats):
            for mode in ("overlapped", "sequential"):
                jobs = [
                    Job(case=f"c{i}", path=str(src), out=str(work / f"{mode}-{r}" / f"c{i}")) for i in range(a.cases)
                ]
                wall, traj = _schedule(worker, jobs, mode == "overlapped", a.finishers)
                runs[mode].append(
                    {"wall_s": wall, "per_case_s": wall / a.cases, "trajectory_per_case_s": statistics.mean(traj)}
                )
                shutil.rmtree(work / f"{mode}-{r}", ignore_errors=True)
        best = {m: min(v, key=lambda x: x["per_case_s"]) for m, v in runs.items()}
        case_total = (
            stages["read"]
            + stages["preprocess"]
            + stages["trajectory"]
            + stages["postprocess, agreement, regions"]
            + stages["write"]
        )
        result = {
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": sys.version.split()[0],
                "load_average_at_end": os.getloadavg(),
            },
            "device": str(worker.device),
            "backend": worker.bundle.backend,
            "threads": a.threads,
            "input": "cardseg synth phantom (10 x 192 x 176)" if not a.input else str(a.input),
            "cases": a.cases,
            "repeats": a.repeats,
            "one_case_stages_s": stages,
            "write_share_of_case": stages["write"] / case_total,
            "runs": runs,
            "finishers": a.finishers or default_finishers(),
            "ratio_per_case_wall_to_trajectory": {
                m: b["per_case_s"] / b["trajectory_per_case_s"] for m, b in best.items()
            },
            # the same wall against the trajectory of the case-after-case runs, where nothing runs beside it
            "ratio_per_case_wall_to_sequential_trajectory": {
                m: b["per_case_s"] / best["sequential"]["trajectory_per_case_s"] for m, b in best.items()
            },
            "goal": "cardseg batch: marginal per-case wall at most 1.25x the per-case trajectory",
        }
        text = json.dumps(result, indent=2)
        print(text)
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(text + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
