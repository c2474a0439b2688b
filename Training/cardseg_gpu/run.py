"""Entry script of one GPU training run: engine checks, then every network trained at once.

    python Training/cardseg_gpu/run.py --pack Training/cardseg_gpu/pack --out OUT [--budget-s 420] [--smoke]

What it does, in order (each part guarded, so one failure never costs the others):

1. ``checks``: the engine on CUDA through its array API (the GPU machine has no SimpleITK):
   the shipped bundle's trajectory on a synthetic cine phantom on the CPU and twice on CUDA
   (label agreement CPU vs CUDA, bit-identity of the two CUDA runs), and the paper-scale
   overhead timing (a time-SwinUNETR ``base`` primary and a ``mini`` reference, 256 x 256,
   batch 32, 5 steps, random weights; :func:`cardseg_gpu.checks.paper_scale_timing`). Written to ``engine.json``
   before any training starts, so training never disturbs the timings.
2. ``jobs``: one process per network, all sharing the GPU for the same wall-clock budget:
   the diffusion primary, two references (the paper's Mini SwinUNETR and the cheap U-Net)
   saved at several training lengths, and a deterministic and an aleatoric SwinUNETR of the
   primary's size (the conventional baselines' segmentors). ``--jobs`` picks a subset.
   Each trains with bf16 autocast, data and augmentation on the GPU, a learning rate that
   warms up and then follows a cosine over the *time* budget, validates on the pack's
   validation volumes with the engine's 5-step sampler, and writes fp16 safetensors into OUT
   at least every two minutes (best-so-far for primary and deterministic; the milestone
   checkpoints for references), so a run cut short still returns its best weights.

Files written to OUT (at most 8, each under 16 MiB, as the GPU machine returns them):
``engine.json``, ``log.jsonl`` (one JSON line per logging interval and job), and one
``.safetensors`` per job (:data:`cardseg_gpu.jobs.JOB_FILES`). ``Training/cardseg_gpu/import_runs.py`` turns them into
ordinary run folders that ``cardseg train export`` reads.

``--smoke`` runs the same code on the CPU in seconds (tiny batch, every job a fixed
:data:`cardseg_gpu.jobs.SMOKE_STEPS` steps, never a wall-clock budget; the pack built with
``build_pack.py --data synthetic``); the test suite runs it so the GPU run cannot fail
on a typo.

This script holds the command line and the parent; the run's pieces are the package
:mod:`cardseg_gpu` beside it (``Training`` is put on ``sys.path`` below, so it imports as ``gpu.*``):
:mod:`cardseg_gpu.jobs` (the jobs table), :mod:`cardseg_gpu.checks` (``engine.json``), :mod:`cardseg_gpu.train_job`
(one job), :mod:`cardseg_gpu.device_data`, :mod:`cardseg_gpu.validation`, :mod:`cardseg_gpu.outputs`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
for _sub in ("CARDSegment", "Training"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))

import torch  # noqa: E402

from cardseg_gpu.checks import run_checks  # noqa: E402
from cardseg_gpu.jobs import DEFAULT_JOBS, JOBS  # noqa: E402
from cardseg_gpu.outputs import log_line  # noqa: E402
from cardseg_gpu.train_job import run_job  # noqa: E402


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description="One GPU run: engine checks, then every network at once.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--pack", default=str(ROOT / "Training" / "gpu" / "pack"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=420.0, help="training wall-clock budget of every job")
    ap.add_argument("--batch-size", type=int, help="every job's batch (default: each job's own)")
    ap.add_argument(
        "--jobs",
        default=",".join(DEFAULT_JOBS),
        help=f"comma-separated, from {', '.join(JOBS)} (default {','.join(DEFAULT_JOBS)})",
    )
    ap.add_argument("--no-checks", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny batch and budget: the test suite's rehearsal")
    ap.add_argument("--job", help=argparse.SUPPRESS)  # internal: run one job in this process
    ap.add_argument("--alone", action="store_true", help=argparse.SUPPRESS)  # internal: no primary beside it
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--init-from",
        action="append",
        default=[],
        metavar="[JOB=]FILE",
        help="continue a job from a returned .safetensors (a bare FILE: the only job); repeatable",
    )
    ap.add_argument("--lr-scale", type=float, default=1.0, help="multiply every job's learning rate")
    ap.add_argument("--p-uncond", type=float, default=0.2, help="diffusion jobs: probability of zeroing the image")
    ap.add_argument("--val-every-s", type=float, default=30.0, help="seconds between validations")
    a = ap.parse_args(argv)
    out, pack = Path(a.out), Path(a.pack)
    out.mkdir(parents=True, exist_ok=True)
    if not (pack / "pack.json").is_file():
        print(f"run: {pack}: no pack.json (build one with Training/cardseg_gpu/build_pack.py)", file=sys.stderr)
        return 2
    if a.job:
        if a.smoke:
            torch.set_num_threads(1)
        run_job(
            a.job,
            pack,
            out,
            a.budget_s,
            a.batch_size,
            a.seed,
            a.smoke,
            (a.init_from or [None])[0],
            a.lr_scale,
            a.p_uncond,
            a.val_every_s,
            share_with_primary=not a.alone,
        )
        return 0
    jobs = [j.strip() for j in a.jobs.split(",") if j.strip()]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        print(f"run: unknown job(s) {', '.join(unknown)} (choose from {', '.join(JOBS)})", file=sys.stderr)
        return 2
    inits: Dict[str, str] = {}
    for item in a.init_from:
        name, sep, path = item.partition("=")
        if not sep:
            if len(jobs) != 1:
                print("run: --init-from FILE needs exactly one job; write JOB=FILE", file=sys.stderr)
                return 2
            name, path = jobs[0], item
        if name not in jobs or not Path(path).is_file():
            print(
                f"run: --init-from {item}: {'no such job in --jobs' if name not in jobs else 'no such file'}",
                file=sys.stderr,
            )
            return 2
        inits[name] = path
    if not a.no_checks:
        run_checks(out, a.smoke)
    procs = {}
    for i, name in enumerate(jobs):
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--pack",
            str(pack),
            "--out",
            str(out),
            "--job",
            name,
            "--budget-s",
            str(a.budget_s),
            "--seed",
            str(a.seed + i),
            "--lr-scale",
            str(a.lr_scale),
            "--p-uncond",
            str(a.p_uncond),
            "--val-every-s",
            str(a.val_every_s),
        ]
        if a.batch_size:
            cmd += ["--batch-size", str(a.batch_size)]
        if a.smoke:
            cmd.append("--smoke")
        if "primary" not in jobs:
            cmd.append("--alone")
        if name in inits:
            cmd += ["--init-from", inits[name]]
        procs[name] = subprocess.Popen(cmd, stdout=sys.stdout, stderr=sys.stderr)
    deadline = time.time() + (a.budget_s + 120 if not a.smoke else 900)
    codes = {}
    for name, p in procs.items():
        try:
            codes[name] = p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            codes[name] = "killed at the deadline"
    log_line(out, {"event": "run done", "exit_codes": codes})
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
