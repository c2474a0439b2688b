"""Training loop for one categorical-diffusion denoiser (primary or reference), and bundle export.

Recipe (paper, Implementation Details, plus what the field notes warn about):

* ``x0`` one-hot label on the network grid, ``t ~ U{0 .. T-1}``, ``x_t ~ Cat(abar_t x0 + (1-abar_t) u)``.
* Uniform start: inference feeds the exact uniform state ``u`` at the top step ``T-1``; a
  sampled one-hot ``x_t`` never looks like that, so with probability ``p_uniform`` a slice is
  given ``t = T-1`` and ``x_t = u`` instead.
* Image condition zeroed with probability ``p_uncond`` (0.2).
* Loss: :class:`cardseg_train.training.losses.DiffusionLoss` (variational KL + CE + Dice + boundary).
* Adam, linear learning-rate warm-up (1000 steps, or a tenth of a shorter run), then constant
  (or cosine decay to 10 %), gradient clipping, batch size 8.
* Validation: the engine's 5-step sampler (:func:`cardseg.method.trajectory.run_trajectory`, mode
  ``uc``) on the source-validation volumes; per-class Dice on the network grid, averaged over
  volumes; the checkpoint with the best mean foreground Dice is kept as ``best.pt``.

A run folder (keep it outside git, e.g. ``runs/``) holds ``config.json`` (the resolved
configuration), ``log.csv`` (one row per logging interval), ``last.pt`` (everything needed to
resume: weights, optimizer, scheduler, random-number state, sampler position), ``best.pt``
(weights of the best validated step) and ``summary.json``. Checkpoints are ``torch.save`` files
of plain state dicts, read back with ``weights_only=True``; they are never committed or shipped
(bundles carry safetensors only, written by :func:`cardseg_train.training.export.export_bundle`).

The recipe's pieces live beside this file: :mod:`.train_config` (the configuration and roles),
:mod:`.train_steps` (noised inputs, learning-rate schedule, validation), :mod:`.runs`
(checkpoints) and :mod:`.export` (bundles).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from cardseg.method.diffusion import CategoricalSchedule
from cardseg.base.errors import CardsegError
from cardseg.method.networks import build_network, count_parameters
from cardseg.base.devices import resolve_device

from cardseg_train.data.augment import BatchAugment
from cardseg_train.data.datasets import detect_format, load_split, resolve_split
from cardseg_train.training.losses import AleatoricLoss, DiffusionLoss, SegmentationLoss
from cardseg_train.training.runs import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    RunLog,
    atomic_save,
    hardware_description,
    load_checkpoint,
)
from cardseg_train.data.slice_dataset import SliceDataset
from cardseg_train.training.config import TrainConfig, data_name, merge_resume_config, read_run_config
from cardseg_train.training.steps import InputRecipe, lr_factor, make_training_inputs, validate


def check_new_run_folder(out: Path) -> None:
    """A new run goes into a new or empty folder: anything already there (a run, a run killed
    before its first checkpoint, the user's own files) is refused, so nothing is overwritten,
    deleted or appended to."""
    if not out.exists():
        return
    if not out.is_dir():
        raise CardsegError(f"{out}: is a file, not a run folder; choose a new folder for --out")
    if (out / "last.pt").exists():
        raise CardsegError(
            f"{out}: already holds a run; choose a new (or empty) folder for --out, or use --resume "
            "to continue that run"
        )
    if any(out.iterdir()):
        killed = (out / "config.json").is_file() and (out / "log.csv").is_file()
        why = (
            " (it looks like a run stopped before its first checkpoint, which cannot be resumed: empty the "
            "folder yourself to start again)"
            if killed
            else ""
        )
        raise CardsegError(
            f"{out}: is not empty; a new run needs a new or empty folder: choose another --out, "
            f"or use --resume for a run's folder{why}"
        )


def load_run_data(
    c: TrainConfig, train_data: Optional[SliceDataset] = None, val_data: Optional[SliceDataset] = None
) -> Tuple[SliceDataset, Optional[SliceDataset], List]:
    """The run's training slices and validation volumes on its grid (given datasets are used as
    they are; ``max_train_slices`` / ``val_max_volumes`` applied) → ``(train, val, val volumes)``."""
    fmt = c.data_format or detect_format(c.data)
    c.data_format = fmt
    kw = dict(fmt=fmt, val_fraction=c.val_fraction, seed=c.seed, spacing_mm=c.acdc_h5_spacing)
    if train_data is None:
        recs = load_split(c.data, "train", max_patients=c.max_train_patients, **kw)
        train_data = SliceDataset(
            recs, c.spacing, c.input_size, c.low_percentile, c.high_percentile, num_classes=c.num_classes
        )
    if c.max_train_slices is not None and len(train_data) > c.max_train_slices:
        keep = np.linspace(0, len(train_data) - 1, c.max_train_slices).round().astype(int)
        train_data = train_data.subset(keep.tolist())
    if val_data is None:
        val_patients = resolve_split(c.data, fmt, c.val_fraction, c.seed).get("val", [])
        if c.val_max_volumes is not None:
            val_patients = val_patients[: max(1, c.val_max_volumes)]
        if val_patients:
            recs = [r for r in load_split(c.data, "val", **kw) if r.patient in set(val_patients)]
            val_data = SliceDataset(
                recs, c.spacing, c.input_size, c.low_percentile, c.high_percentile, num_classes=c.num_classes
            )
    val_volumes = val_data.volumes() if val_data is not None else []
    if c.val_max_volumes is not None:
        val_volumes = val_volumes[: c.val_max_volumes]
    if len(train_data) == 0:
        raise CardsegError(f"{c.data}: no training slices (check --data, --max-train-patients and --val-fraction)")
    if train_data.num_classes > c.num_classes:
        raise CardsegError(f"labels have {train_data.num_classes} classes, the run declares {c.num_classes}")
    return train_data, val_data, val_volumes


class Trainer:
    """Trains one denoiser into a run folder. ``Trainer(config, out, resume).run()`` → summary dict."""

    def __init__(
        self,
        config: TrainConfig,
        out: os.PathLike,
        resume: bool = False,
        progress: bool = True,
        train_data: Optional[SliceDataset] = None,
        val_data: Optional[SliceDataset] = None,
    ):
        self.out = Path(out)
        self.progress = progress
        self.resume_from: Optional[dict] = None
        if resume:
            ckpt_path = self.out / "last.pt"
            if not ckpt_path.is_file():
                hint = (
                    " (the run stopped before its first checkpoint: start it again in a new folder)"
                    if (self.out / "config.json").is_file()
                    else ""
                )
                raise CardsegError(f"{self.out}: nothing to resume (no last.pt){hint}")
            config = merge_resume_config(read_run_config(self.out), config, self.out)
            self.resume_from = load_checkpoint(ckpt_path)
            self.config = config.resolve()
        else:
            self.config = config.resolve()
            check_new_run_folder(self.out)
        c = self.config
        if c.threads:
            torch.set_num_threads(int(c.threads))
        self.device = resolve_device(c.device)
        self.schedule = CategoricalSchedule(num_steps=c.num_steps)
        self.generator = torch.Generator().manual_seed(int(c.seed))
        torch.manual_seed(int(c.seed))
        self.train_data = train_data
        self.val_data = val_data
        self.class_names = [cl["name"] for cl in c.classes]
        self.log = RunLog(self.out / "log.csv", self.class_names)

    # -- data --------------------------------------------------------------------------------
    def _load_data(self) -> None:
        self.train_data, self.val_data, self.val_volumes = load_run_data(self.config, self.train_data, self.val_data)

    def _provenance_data(self) -> dict:
        c = self.config
        return {
            "data": data_name(c.data, c.data_format),
            "format": c.data_format,
            "train_patients": list(self.train_data.patients),
            "train_slices": len(self.train_data),
            "val_patients": sorted({p for p in (self.val_data.patients if self.val_data else [])}),
            "val_volumes": [v[0] for v in self.val_volumes],
        }

    # -- sampler -----------------------------------------------------------------------------
    def _next_indices(self, n: int) -> torch.Tensor:
        """Slices of the next batch: shuffled epochs drawn from the run's generator."""
        total = len(self.train_data)
        out = []
        while len(out) < n:
            if self.cursor >= len(self.perm):
                self.perm = torch.randperm(total, generator=self.generator)
                self.cursor = 0
            take = min(n - len(out), len(self.perm) - self.cursor)
            out.extend(self.perm[self.cursor : self.cursor + take].tolist())
            self.cursor += take
        return torch.tensor(out, dtype=torch.long)

    # -- state -------------------------------------------------------------------------------
    def _state(self, step: int) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "kind": "last",
            "step": int(step),
            "model": {k: v.detach().cpu() for k, v in self.net.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": {"generator": self.generator.get_state(), "torch": torch.get_rng_state()},
            "sampler": {"perm": self.perm.clone(), "cursor": int(self.cursor)},
            "best": dict(self.best),
            "elapsed_s": float(self.elapsed_before + time.perf_counter() - self.t_start),
            "network": self.config.network_spec(),
        }

    def _save_last(self, step: int) -> None:
        atomic_save(self._state(step), self.out / "last.pt")

    def _save_best(self, step: int, val: Dict[str, float]) -> None:
        atomic_save(
            {
                "format": CHECKPOINT_FORMAT,
                "version": CHECKPOINT_VERSION,
                "kind": "best",
                "step": int(step),
                "model": {k: v.detach().cpu() for k, v in self.net.state_dict().items()},
                "val": dict(val),
                "network": self.config.network_spec(),
            },
            self.out / "best.pt",
        )

    def _loss(self, img: torch.Tensor, lab: torch.Tensor, autocast):
        """One batch's loss for the run's role: the diffusion recipe (noised state, time), one
        forward pass of a plain segmentor, or the aleatoric heads."""
        c = self.config
        if c.kind == "diffusion":
            recipe = InputRecipe(c.p_uniform, c.p_uncond, c.p_focus, c.sampled_steps)
            img, x_t, t = make_training_inputs(self.schedule, img, lab, c.num_classes, recipe, self.generator)
            with autocast:
                logits = self.net(img, x_t, t)
            return self.loss_fn(logits.float(), lab, x_t, t)
        if c.kind == "aleatoric":
            with autocast:
                mu, log_var = self.net.heads(img)
            return self.loss_fn(mu.float(), log_var.float(), lab)
        with autocast:
            logits = self.net(img)
        return self.loss_fn(logits.float(), lab)

    # -- run ---------------------------------------------------------------------------------
    def _build(self) -> int:
        """Network, optimiser, schedule, loss and sampler; restored from ``last.pt`` when resuming.
        Returns the step the run continues from."""
        c = self.config
        torch.manual_seed(int(c.seed))
        self.net = build_network(c.network_spec()).to(self.device)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=c.lr, weight_decay=c.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, int(c.warmup), c.steps, c.lr_schedule)
        )
        self.loss_fn = {
            "diffusion": lambda: DiffusionLoss(self.schedule, c.loss),
            "deterministic": lambda: SegmentationLoss(c.loss),
            "aleatoric": lambda: AleatoricLoss(c.loss),
        }[c.kind]()
        self.augment = BatchAugment(c.augment)
        self.perm = torch.zeros(0, dtype=torch.long)
        self.cursor = 0
        self.best = {"dice": -1.0, "step": -1}
        self.elapsed_before = 0.0
        if self.resume_from is None:
            return 0
        ck = self.resume_from
        self.net.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self.scheduler.load_state_dict(ck["scheduler"])
        self.generator.set_state(ck["rng"]["generator"])
        torch.set_rng_state(ck["rng"]["torch"])
        self.perm, self.cursor = ck["sampler"]["perm"], int(ck["sampler"]["cursor"])
        self.best = dict(ck["best"])
        self.elapsed_before = float(ck.get("elapsed_s", 0.0))
        step = int(ck["step"])
        self.log.truncate(step)
        return step

    def _optimise(self, images: torch.Tensor, labels: torch.Tensor, autocast) -> Dict[str, torch.Tensor]:
        """One optimisation step on a batch drawn from ``images`` / ``labels``; returns the loss terms."""
        c = self.config
        idx = self._next_indices(c.batch_size).to(self.device)
        img, lab = self.augment(images[idx], labels[idx].long(), self.generator)
        loss, terms = self._loss(img, lab, autocast)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if c.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), c.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        terms["loss"] = loss.detach()
        return terms

    def _log_row(self, step: int, sums: Dict[str, torch.Tensor], n_acc: int, seconds: float) -> dict:
        """The ``log.csv`` row of the last ``n_acc`` steps (mean loss terms, speed)."""
        means = {k: float(v) / n_acc for k, v in sums.items()}
        if not math.isfinite(means["loss"]):
            raise CardsegError(f"training diverged at step {step} (loss {means['loss']}); lower --lr")
        fmt = lambda key: f"{means[key]:.5f}" if key in means else ""  # noqa: E731
        return {
            "step": step,
            "lr": f"{self.scheduler.get_last_lr()[0]:.6g}",
            "loss": fmt("loss"),
            "kl": fmt("kl"),
            "ce": fmt("ce"),
            "dice_loss": fmt("dice"),
            "boundary": fmt("boundary"),
            "steps_per_s": f"{n_acc / max(seconds, 1e-9):.3f}",
            "elapsed_s": f"{self.elapsed_before + time.perf_counter() - self.t_start:.1f}",
        }

    def _validate(self, step: int, row: dict) -> Dict[str, float]:
        """Validate, add the Dice to ``row``, keep ``best.pt`` when it improved, save ``last.pt``."""
        c = self.config
        val = validate(
            self.net,
            self.val_volumes,
            c.num_classes,
            self.schedule,
            c.sampled_steps,
            self.device,
            c.val_batch_size,
            self.class_names,
        )
        row["val_dice"] = f"{val['dice']:.4f}"
        for n in self.class_names[1:]:
            row[f"val_dice_{n}"] = f"{val[f'dice_{n}']:.4f}"
        if val["dice"] > self.best["dice"]:
            self.best = {"dice": float(val["dice"]), "step": step}
            self._save_best(step, val)
        self._save_last(step)
        return val

    def _progress_bar(self, step: int):
        if not self.progress:
            return None
        from tqdm.auto import tqdm

        return tqdm(
            total=self.config.steps,
            initial=step,
            desc=f"train {self.config.role}",
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            smoothing=0.05,
        )

    def run(self) -> dict:
        c = self.config
        self._load_data()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "STOP").unlink(missing_ok=True)  # a stop request belongs to the previous invocation
        (self.out / "config.json").write_text(json.dumps(c.to_dict(), indent=2) + "\n")
        step = self._build()
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        images = self.train_data.images.to(self.device)
        labels = self.train_data.labels.to(self.device)
        self.t_start = time.perf_counter()
        budget_s = None if c.time_budget_min is None else float(c.time_budget_min) * 60.0
        stop_reason = "steps"
        bar = self._progress_bar(step)
        sums: Dict[str, torch.Tensor] = {}
        n_acc, t_row = 0, time.perf_counter()
        last_val: Dict[str, float] = {}
        self.net.train()
        autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if (c.amp and self.device.type == "cuda")
            else contextlib.nullcontext()
        )
        try:
            while step < c.steps:
                for k, v in self._optimise(images, labels, autocast).items():
                    sums[k] = sums.get(k, 0.0) + v
                step += 1
                n_acc += 1
                if bar is not None:
                    bar.update(1)
                stop_file = (self.out / "STOP").exists()  # `touch RUN/STOP` ends a run cleanly
                over_budget = stop_file or (budget_s is not None and time.perf_counter() - self.t_start >= budget_s)
                last_step = step >= c.steps or over_budget
                do_val = bool(self.val_volumes) and (step % c.val_interval == 0 or last_step)
                if step % c.log_interval == 0 or do_val or last_step:
                    row = self._log_row(step, sums, n_acc, time.perf_counter() - t_row)
                    if do_val:
                        last_val = self._validate(step, row)
                    self.log.write(row)
                    if bar is not None:
                        post = {"loss": f"{float(row['loss']):.3f}"}
                        if last_val:
                            post["val_dice"] = f"{last_val['dice']:.3f}"
                        bar.set_postfix(post, refresh=False)
                    sums, n_acc, t_row = {}, 0, time.perf_counter()
                if step % c.val_interval == 0 and not do_val:
                    self._save_last(step)  # a resumable point even without validation data
                if over_budget and step < c.steps:
                    stop_reason = "stop file" if stop_file else "time budget"
                    break
        except KeyboardInterrupt:
            self._save_last(step)
            raise
        finally:
            if bar is not None:
                bar.close()
        self._save_last(step)
        return self._finish(step, stop_reason, last_val)

    def _finish(self, step: int, stop_reason: str, last_val: Dict[str, float]) -> dict:
        """Write ``summary.json`` (and ``best.pt`` of a run without validation data)."""
        c = self.config
        if not self.val_volumes and self.best["step"] < 0:
            self.best = {"dice": None, "step": step}
            self._save_best(step, {})
        summary = {
            "role": c.role,
            "network": c.network_spec(),
            "parameters": count_parameters(self.net),
            "steps_done": step,
            "steps_planned": c.steps,
            "stopped_by": stop_reason,
            "elapsed_s": round(self.elapsed_before + time.perf_counter() - self.t_start, 2),
            "best": self.best,
            "last_val": last_val,
            "hardware": hardware_description(self.device),
            "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **self._provenance_data(),
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def train(config: TrainConfig, out: os.PathLike, resume: bool = False, progress: bool = True, **data) -> dict:
    """Train one denoiser into the run folder ``out`` (see :class:`Trainer`); returns the summary."""
    return Trainer(config, out, resume=resume, progress=progress, **data).run()
