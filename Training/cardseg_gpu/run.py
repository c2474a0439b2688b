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
from cardseg_gpu.train_job import JobOptions, run_job  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line of the run (and of the one-job processes it starts: ``--job``)."""
    ap = argparse.ArgumentParser(
        description="One GPU run: engine checks, then every network at once.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--pack", default=str(ROOT / "Training" / "cardseg_gpu" / "pack"))
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
    return ap


class UsageError(Exception):
    """A command line the run refuses (printed as one ``run:`` line, exit status 2)."""


def selected_jobs(spec: str) -> List[str]:
    """The jobs of ``--jobs`` (comma-separated), each checked against :data:`cardseg_gpu.jobs.JOBS`."""
    jobs = [j.strip() for j in spec.split(",") if j.strip()]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        raise UsageError(f"unknown job(s) {', '.join(unknown)} (choose from {', '.join(JOBS)})")
    return jobs


def init_sources(items: List[str], jobs: List[str]) -> Dict[str, str]:
    """``--init-from [JOB=]FILE`` items → ``{job: file}`` (a bare FILE names the only job)."""
    inits: Dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            if len(jobs) != 1:
                raise UsageError("--init-from FILE needs exactly one job; write JOB=FILE")
            name, path = jobs[0], item
        if name not in jobs or not Path(path).is_file():
            raise UsageError(f"--init-from {item}: {'no such job in --jobs' if name not in jobs else 'no such file'}")
        inits[name] = path
    return inits


def run_one_job(a: argparse.Namespace, pack: Path, out: Path) -> int:
    """``--job NAME``: train that one job in this process."""
    if a.smoke:
        torch.set_num_threads(1)
    options = JobOptions(
        pack=pack,
        out=out,
        budget_s=a.budget_s,
        batch=a.batch_size,
        seed=a.seed,
        smoke=a.smoke,
        init_from=(a.init_from or [None])[0],
        lr_scale=a.lr_scale,
        p_uncond=a.p_uncond,
        val_every_s=a.val_every_s,
        share_with_primary=not a.alone,
    )
    run_job(a.job, options)
    return 0


def job_command(
    a: argparse.Namespace, pack: Path, out: Path, name: str, seed: int, alone: bool, init_from
) -> List[str]:
    """The command line of the process that trains the job ``name`` (``--job``)."""
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
        str(seed),
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
    if alone:
        cmd.append("--alone")
    if init_from is not None:
        cmd += ["--init-from", init_from]
    return cmd


def wait_for(procs: Dict[str, subprocess.Popen], deadline: float) -> dict:
    """Each job process's exit status, or ``"killed at the deadline"`` for one still running then."""
    codes = {}
    for name, p in procs.items():
        try:
            codes[name] = p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            codes[name] = "killed at the deadline"
    return codes


def main(argv: Optional[List[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    out, pack = Path(a.out), Path(a.pack)
    out.mkdir(parents=True, exist_ok=True)
    if not (pack / "pack.json").is_file():
        print(f"run: {pack}: no pack.json (build one with Training/cardseg_gpu/build_pack.py)", file=sys.stderr)
        return 2
    if a.job:
        return run_one_job(a, pack, out)
    try:
        jobs = selected_jobs(a.jobs)
        inits = init_sources(a.init_from, jobs)
    except UsageError as exc:
        print(f"run: {exc}", file=sys.stderr)
        return 2
    if not a.no_checks:
        run_checks(out, a.smoke)
    alone = "primary" not in jobs
    procs = {}
    for i, name in enumerate(jobs):
        cmd = job_command(a, pack, out, name, a.seed + i, alone, inits.get(name))
        procs[name] = subprocess.Popen(cmd, stdout=sys.stdout, stderr=sys.stderr)
    codes = wait_for(procs, time.time() + (a.budget_s + 120 if not a.smoke else 900))
    log_line(out, {"event": "run done", "exit_codes": codes})
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
