"""Run folders on disk: checkpoints (``torch.save`` of plain state dicts, read back with
``weights_only=True``; never committed or shipped), a run's network, and the hardware it ran on.
"""

from __future__ import annotations

import csv
import os
import platform
from pathlib import Path
from typing import List, Sequence, Tuple

import torch

from cardseg.base.errors import CardsegError
from cardseg.method.networks import build_network

from cardseg_train.training.config import TrainConfig, read_run_config

CHECKPOINT_FORMAT = "cardseg-train-checkpoint"
CHECKPOINT_VERSION = 1


def atomic_save(obj: dict, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: os.PathLike) -> dict:
    """Read a training checkpoint (plain tensors and containers only: ``weights_only=True``)."""
    p = Path(path)
    if not p.is_file():
        raise CardsegError(f"{p}: no such checkpoint")
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - corrupted or foreign file
        raise CardsegError(f"{p}: not a readable training checkpoint ({str(exc).splitlines()[0][:160]})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise CardsegError(f"{p}: not a cardseg training checkpoint")
    return ckpt


def hardware_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}), torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    return f"CPU {cpu}, {torch.get_num_threads()} threads of {os.cpu_count()} cores, torch {torch.__version__}"


def load_run_network(run: os.PathLike, which: str = "best") -> Tuple[torch.nn.Module, TrainConfig, dict]:
    """The network of a run from ``best.pt`` or ``last.pt`` → ``(net (eval), config, checkpoint meta)``."""
    if which not in ("best", "last"):
        raise CardsegError(f"checkpoint must be best or last, not {which!r}")
    cfg = read_run_config(run)
    ckpt = load_checkpoint(Path(run) / f"{which}.pt")
    net = build_network(cfg.network_spec())
    net.load_state_dict(ckpt["model"])
    meta = {k: v for k, v in ckpt.items() if k in ("step", "val", "best", "elapsed_s", "kind")}
    return net.eval(), cfg, meta


class RunLog:
    """A run's ``log.csv``: one row per logging interval (loss terms, learning rate, speed, and the
    validation Dice of each foreground class when the row validated)."""

    def __init__(self, path: Path, class_names: Sequence[str]):
        self.path = Path(path)
        self.fields: List[str] = [
            "step",
            "lr",
            "loss",
            "kl",
            "ce",
            "dice_loss",
            "boundary",
            "steps_per_s",
            "elapsed_s",
            "val_dice",
        ] + [f"val_dice_{n}" for n in list(class_names)[1:]]

    def write(self, row: dict) -> None:
        new = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.fields)
            if new:
                w.writeheader()
            w.writerow({k: row.get(k, "") for k in self.fields})

    def truncate(self, step: int) -> None:
        """Drop rows written after ``step`` (the tail an interrupted run wrote past its checkpoint)."""
        if not self.path.exists():
            return
        with open(self.path, newline="") as f:
            rows = list(csv.DictReader(f))
        keep = [r for r in rows if r.get("step", "").isdigit() and int(r["step"]) <= step]
        if len(keep) != len(rows):
            with open(self.path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=self.fields)
                w.writeheader()
                w.writerows({k: r.get(k, "") for k in self.fields} for r in keep)
