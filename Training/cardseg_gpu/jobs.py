"""The GPU run's jobs: which networks train, how long, and which files each returns.

Pure data and arithmetic (no torch): every other module of the run reads it.
"""

from __future__ import annotations

import math
from typing import Dict, List

#: every job: network spec, loss kind, checkpoint policy, output file(s)
JOBS: Dict[str, dict] = {
    # the primary gets the whole budget and the largest batch: its Dice is what the run is for
    "primary": {
        "spec": {"arch": "time-swinunetr", "size": "tiny"},
        "kind": "diffusion",
        "lr": 4e-4,
        "batch": 128,
        "keep": "best",
        "ema": 0.999,
    },
    # the primary's recipe changed on a continuation (``--init-from JOB=primary.safetensors``): no
    # zeroed images, and half (or all) of the slices on the steps the 5-step sampler calls
    "primary_focus": {
        "spec": {"arch": "time-swinunetr", "size": "tiny"},
        "kind": "diffusion",
        "lr": 1.5e-4,
        "batch": 128,
        "keep": "best",
        "ema": 0.999,
        "p_uncond": 0.0,
        "p_focus": 0.5,
    },
    "primary_focus_all": {
        "spec": {"arch": "time-swinunetr", "size": "tiny"},
        "kind": "diffusion",
        "lr": 1.5e-4,
        "batch": 128,
        "keep": "best",
        "ema": 0.999,
        "p_uncond": 0.0,
        "p_focus": 1.0,
    },
    # references: saved at MILESTONES (the maturity axis), stopped after the last one
    "reference": {
        "spec": {"arch": "time-swinunetr", "size": "mini"},
        "kind": "diffusion",
        "lr": 3e-4,
        "batch": 32,
        "keep": "milestones",
        "max_steps": 16000,
    },
    "reference_unet": {
        "spec": {"arch": "time-unet", "size": "tiny"},
        "kind": "diffusion",
        "lr": 1e-3,
        "batch": 32,
        "keep": "milestones",
        "max_steps": 16000,
    },
    # the capacity axis of the reference sweep (paper Fig. 5): the same U-Net recipe one size down and up
    "reference_unet_micro": {
        "spec": {"arch": "time-unet", "size": "micro"},
        "kind": "diffusion",
        "lr": 1e-3,
        "batch": 32,
        "keep": "milestones",
        "max_steps": 16000,
    },
    "reference_unet_small": {
        "spec": {"arch": "time-unet", "size": "small"},
        "kind": "diffusion",
        "lr": 1e-3,
        "batch": 32,
        "keep": "milestones",
        "max_steps": 16000,
    },
    # the conventional baselines' segmentor: lowest priority, so it stops at 60 % of the budget
    # and leaves the GPU to the primary's annealing phase
    "deterministic": {
        "spec": {"arch": "discriminative", "backbone": "swinunetr", "feature_size": 24},
        "kind": "deterministic",
        "lr": 4e-4,
        "batch": 32,
        "budget_frac": 0.6,
        "keep": "best",
        "ema": 0.999,
    },
    # the "Alea." row: the same SwinUNETR with a class-wise log-variance head (Kendall and Gal)
    "aleatoric": {
        "spec": {"arch": "discriminative", "backbone": "swinunetr", "feature_size": 24, "aleatoric": True},
        "kind": "aleatoric",
        "lr": 4e-4,
        "batch": 32,
        "budget_frac": 0.6,
        "keep": "best",
        "ema": 0.999,
    },
    # the second member of the Dual SwinUNETR control: the deterministic recipe, another seed
    "deterministic_b": {
        "spec": {"arch": "discriminative", "backbone": "swinunetr", "feature_size": 24},
        "kind": "deterministic",
        "lr": 4e-4,
        "batch": 32,
        "budget_frac": 0.6,
        "keep": "best",
        "ema": 0.999,
    },
}
#: what a call runs without ``--jobs``: the bundle's networks and the conventional baselines'
#: segmentors, within the device's 8 returned files (the capacity-sweep references are asked for
#: by name: ``--jobs reference_unet_micro,reference_unet_small``)
DEFAULT_JOBS = ("primary", "reference", "reference_unet", "deterministic", "aleatoric")
#: steps at which the references are saved (plus their last step): the maturity axis
MILESTONES = (250, 500, 1000, 2000, 4000, 8000, 12000, 16000)
#: at most this many checkpoints per file keeps a Mini SwinUNETR file under 16 MiB
PER_FILE = 4
SAVE_EVERY_S = 120.0
#: --smoke trains every job for exactly this many steps (never a wall-clock budget, so a busy
#: machine cannot turn the rehearsal into a failure)
SMOKE_STEPS = 4


def job_files(name: str) -> List[str]:
    if JOBS[name]["keep"] == "best":
        return [f"{name}.safetensors"]
    n_files = math.ceil((len(MILESTONES) + 1) / PER_FILE) if name == "reference" else 1
    return [f"{name}.safetensors"] if n_files == 1 else [f"{name}_{i}.safetensors" for i in range(n_files)]


JOB_FILES = {name: job_files(name) for name in JOBS}


def lr_factor(frac: float, warmup: float = 0.03, floor: float = 0.02) -> float:
    """Learning-rate multiplier at a fraction ``frac`` of the time budget: linear warm-up over
    the first ``warmup``, then a cosine from 1 down to ``floor`` at the end of the budget."""
    if frac < warmup:
        return max(frac / warmup, 0.01)
    x = min(1.0, (frac - warmup) / max(1e-9, 1 - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * x))
