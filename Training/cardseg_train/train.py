"""Training loop for one categorical-diffusion denoiser (primary or reference), and bundle export.

Recipe (paper, Implementation Details, plus what the field notes warn about):

* ``x0`` one-hot label on the network grid, ``t ~ U{0 .. T-1}``, ``x_t ~ Cat(abar_t x0 + (1-abar_t) u)``.
* Uniform start: inference feeds the exact uniform state ``u`` at the top step ``T-1``; a
  sampled one-hot ``x_t`` never looks like that, so with probability ``p_uniform`` a slice is
  given ``t = T-1`` and ``x_t = u`` instead.
* Image condition zeroed with probability ``p_uncond`` (0.2).
* Loss: :class:`cardseg_train.losses.DiffusionLoss` (variational KL + CE + Dice + boundary).
* Adam, linear learning-rate warm-up (1000 steps, or a tenth of a shorter run), then constant
  (or cosine decay to 10 %), gradient clipping, batch size 8.
* Validation: the engine's 5-step sampler (:func:`cardseg.trajectory.run_trajectory`, mode
  ``uc``) on the source-validation volumes; per-class Dice on the network grid, averaged over
  volumes; the checkpoint with the best mean foreground Dice is kept as ``best.pt``.

A run folder (keep it outside git, e.g. ``runs/``) holds ``config.json`` (the resolved
configuration), ``log.csv`` (one row per logging interval), ``last.pt`` (everything needed to
resume: weights, optimizer, scheduler, random-number state, sampler position), ``best.pt``
(weights of the best validated step) and ``summary.json``. Checkpoints are ``torch.save`` files
of plain state dicts, read back with ``weights_only=True``; they are never committed or shipped
(bundles carry safetensors only, written by :func:`export_bundle`).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from cardseg.diffusion import CategoricalSchedule, default_sampling_steps, one_hot
from cardseg.errors import CardsegError
from cardseg.networks import build_network, count_parameters, size_multiple
from cardseg.scaffold import ACDC_CLASSES, parse_network
from cardseg.segment import resolve_device
from cardseg.trajectory import run_trajectory

from .augment import AugmentConfig, BatchAugment
from .datasets import ACDC_H5_SPACING_MM, SliceDataset, detect_format, load_split, resolve_split
from .losses import AleatoricLoss, DiffusionLoss, LossWeights, SegmentationLoss

CHECKPOINT_FORMAT = "cardseg-train-checkpoint"
CHECKPOINT_VERSION = 1
#: what a run is for → how it trains: the two diffusion denoisers of a bundle, and the plain
#: segmentors of the conventional baselines (``deterministic``; with ``--size
#: discriminative:unet`` and two seeds also the Dual U-Net control) and the ``aleatoric`` one
ROLES = {"primary": "diffusion", "reference": "diffusion", "deterministic": "deterministic",
         "aleatoric": "aleatoric"}
#: the network a role trains when ``--size`` is not given
DEFAULT_NETWORK = {"primary": "time-swinunetr:mini", "reference": "time-swinunetr:mini",
                   "deterministic": "discriminative:swinunetr-tiny", "aleatoric": "discriminative:swinunetr-tiny"}
#: settings that may change when a run is resumed; everything else must match the run's config
RESUMABLE = ("steps", "time_budget_min", "val_interval", "log_interval", "device", "threads", "val_max_volumes",
             "val_batch_size", "amp")
_PALETTE = [[0.0, 0.0, 0.0], [0.30, 0.55, 0.90], [0.95, 0.75, 0.25], [0.90, 0.30, 0.30], [0.40, 0.80, 0.45],
            [0.70, 0.45, 0.85], [0.95, 0.55, 0.75], [0.45, 0.85, 0.85]]


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    """Everything a run depends on (written resolved to ``config.json`` in the run folder)."""

    data: str = "../shared/data/acdc"
    data_format: Optional[str] = None  # None: detect
    role: str = "primary"
    network: Optional[str] = None  # ARCH:SIZE; None: the role's DEFAULT_NETWORK
    spacing: float = 2.0  # network pixel size, mm
    input_size: int = 128  # network grid side N
    acdc_h5_spacing: float = ACDC_H5_SPACING_MM  # assumed pixel size of the geometry-less HDF5 files
    low_percentile: float = 0.5
    high_percentile: float = 99.5
    classes: List[dict] = field(default_factory=lambda: [dict(c) for c in ACDC_CLASSES])
    num_steps: int = 50  # diffusion horizon T
    sampled_steps: Optional[List[int]] = None  # None: default_sampling_steps(T, 5)
    steps: int = 25000  # optimisation steps
    batch_size: int = 8
    lr: float = 2e-4
    warmup: Optional[int] = None  # None: min(1000, steps // 10)
    lr_schedule: str = "constant"  # or "cosine" (decays to 10 % at `steps`)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    p_uniform: float = 0.15
    p_uncond: float = 0.2
    seed: int = 0
    log_interval: int = 50
    val_interval: int = 500
    val_max_volumes: Optional[int] = None
    val_batch_size: int = 16
    val_fraction: float = 0.1  # hold-out fraction when the data has no split files
    time_budget_min: Optional[float] = None
    device: str = "auto"
    threads: Optional[int] = None
    amp: bool = False  # bfloat16 autocast on CUDA
    max_train_patients: Optional[int] = None
    max_train_slices: Optional[int] = None
    loss: LossWeights = field(default_factory=LossWeights)
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def resolve(self) -> "TrainConfig":
        """Fill the derived defaults in place (warm-up, sampled steps) and check the values."""
        if self.role not in ROLES:
            raise CardsegError(f"--role must be one of {', '.join(ROLES)}, not {self.role!r}")
        if self.network is None:
            self.network = DEFAULT_NETWORK[self.role]
        diffusion_arch = not self.network.startswith("discriminative")
        if diffusion_arch != (self.kind == "diffusion"):
            raise CardsegError(f"--role {self.role} cannot train {self.network}: "
                               + ("use a time-conditioned network (time-swinunetr:SIZE or time-unet:SIZE)"
                                  if self.kind == "diffusion" else "use discriminative:swinunetr-SIZE or "
                                                                   "discriminative:unet"))
        if self.steps < 1 or self.batch_size < 1:
            raise CardsegError("--steps and --batch-size must be at least 1")
        if self.warmup is None:
            self.warmup = int(min(1000, max(1, self.steps // 10)))
        if self.sampled_steps is None:
            self.sampled_steps = default_sampling_steps(self.num_steps, 5)
        if self.lr_schedule not in ("constant", "cosine"):
            raise CardsegError(f"--lr-schedule must be constant or cosine, not {self.lr_schedule!r}")
        if self.log_interval < 1 or self.val_interval < 1:
            raise CardsegError("--log-interval and --val-interval must be at least 1")
        if not 0 <= self.p_uniform <= 1 or not 0 <= self.p_uncond <= 1:
            raise CardsegError("--p-uniform and --p-uncond are probabilities")
        spec = self.network_spec()
        mult = size_multiple(spec)
        if self.input_size % mult:
            raise CardsegError(f"--input-size {self.input_size} must be a multiple of {mult} for {self.network}")
        try:
            build_network(spec)
        except ValueError as exc:
            raise CardsegError(f"--size {self.network}: {exc}") from None
        return self

    @property
    def kind(self) -> str:
        """``diffusion``, ``deterministic`` or ``aleatoric``: how the role trains."""
        return ROLES.get(self.role, "diffusion")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def network_spec(self) -> dict:
        try:
            spec = parse_network(self.network or DEFAULT_NETWORK.get(self.role, "time-swinunetr:mini"))
        except ValueError as exc:
            raise CardsegError(f"--size {self.network}: {exc}") from None
        if self.kind == "aleatoric":
            spec["aleatoric"] = True
        return {**spec, "num_classes": self.num_classes}

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        loss = LossWeights(**d.pop("loss", {}))
        aug = AugmentConfig.from_dict(d.pop("augment", {}))
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known}, loss=loss, augment=aug)


#: how provenance describes each data layout
DATA_LAYOUTS = {"acdc-h5": "ACDC HDF5 layout", "acdc-nifti": "ACDC NIfTI layout",
                "pairs": "imagesTr/labelsTr NIfTI pairs"}


def data_name(data: os.PathLike, data_format: Optional[str] = None) -> str:
    """How provenance names a dataset: its folder's name and layout, never a machine's folders.

    ``/work/shared/data/acdc`` in the HDF5 layout → ``"acdc (ACDC HDF5 layout)"``; ``synthetic``
    stays ``"synthetic"``. A relative path is resolved against the working folder for its name.
    """
    if str(data) == "synthetic":
        return "synthetic"
    name = Path(data).resolve().name or str(data)
    layout = DATA_LAYOUTS.get(data_format or "")
    return f"{name} ({layout})" if layout else name


def _is_machine_path(text) -> bool:
    """Whether a recorded value is an absolute path (POSIX, or a Windows drive or share)."""
    return isinstance(text, str) and (text.startswith(("/", "\\")) or bool(PureWindowsPath(text).drive))


def class_list(names: Sequence[str]) -> List[dict]:
    """Class dictionaries for ``bundle.json`` (ACDC colours when the names are ACDC's)."""
    acdc = {c["name"]: c["color"] for c in ACDC_CLASSES}
    return [{"name": n, "color": list(acdc.get(n, _PALETTE[i % len(_PALETTE)]))} for i, n in enumerate(names)]


def smoke_config(config: TrainConfig, explicit: Sequence[str] = ()) -> TrainConfig:
    """Shrink a configuration to a seconds-long end-to-end run (keys in ``explicit`` are kept)."""
    tiny = "time-unet:micro" if ROLES.get(config.role) == "diffusion" else "discriminative:unet"
    preset = {"steps": 4, "batch_size": 2, "network": tiny, "input_size": 64, "spacing": 4.0,
              "log_interval": 1, "val_interval": 4, "val_max_volumes": 1, "max_train_patients": 2,
              "max_train_slices": 8, "warmup": 1}
    for k, v in preset.items():
        if k not in explicit:
            setattr(config, k, v)
    return config


def hardware_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}), torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    return f"CPU {cpu}, {torch.get_num_threads()} threads of {os.cpu_count()} cores, torch {torch.__version__}"


# --------------------------------------------------------------------------------------------
# pieces of a training step
# --------------------------------------------------------------------------------------------
def sample_noisy_state(schedule: CategoricalSchedule, labels: torch.Tensor, t: torch.Tensor, num_classes: int,
                       generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One-hot ``x_t ~ Cat(abar_t x0 + (1 - abar_t) u)`` (paper Eq. 1) for labels ``(B, H, W)``.

    Drawn as the equivalent mixture (keep the label with probability ``abar_t``, otherwise a
    uniformly random class), with the random numbers taken from a CPU generator so that runs
    reproduce on any device. Returns ``(B, K, H, W)`` on the labels' device.
    """
    b = labels.shape[0]
    keep_u = torch.rand(labels.shape, generator=generator).to(labels.device)
    other = torch.randint(0, num_classes, labels.shape, generator=generator).to(labels.device)
    abar = schedule.abar(t.cpu()).float().to(labels.device).view(b, 1, 1)
    drawn = torch.where(keep_u < abar, labels.long(), other)
    return one_hot(drawn, num_classes)


def make_training_inputs(schedule: CategoricalSchedule, images: torch.Tensor, labels: torch.Tensor, num_classes: int,
                         p_uniform: float, p_uncond: float, generator: Optional[torch.Generator] = None):
    """Step indices, noisy states and (possibly masked) images for one batch.

    images ``(B, 1, N, N)``, labels ``(B, N, N)`` → ``(image, x_t (B, K, N, N), t (B,))``. With
    probability ``p_uniform`` a slice gets ``t = T-1`` and the exact uniform state (what
    inference starts from); with probability ``p_uncond`` its image is zeroed.
    """
    b = labels.shape[0]
    dev = labels.device
    top = schedule.num_steps - 1
    t = torch.randint(0, schedule.num_steps, (b,), generator=generator)
    uniform = torch.rand(b, generator=generator) < p_uniform
    t = torch.where(uniform, torch.full_like(t, top), t)
    x_t = sample_noisy_state(schedule, labels, t, num_classes, generator)
    u = uniform.to(dev).view(b, 1, 1, 1)
    x_t = torch.where(u, torch.full_like(x_t, 1.0 / num_classes), x_t)
    drop = (torch.rand(b, generator=generator) < p_uncond).to(dev).view(b, 1, 1, 1)
    images = torch.where(drop, torch.zeros_like(images), images)
    return images, x_t, t.to(dev)


def lr_factor(step: int, warmup: int, total: int, schedule: str = "constant") -> float:
    """Learning-rate multiplier at optimisation step ``step`` (0-based): linear warm-up, then
    constant or cosine decay to 0.1 at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "cosine":
        span = max(1, total - warmup)
        frac = min(1.0, (step - warmup) / span)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
    return 1.0


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
def dice_per_class(pred: torch.Tensor, label: torch.Tensor, num_classes: int) -> List[float]:
    """Dice of classes ``1 .. K-1`` for one volume (any shape); NaN where both are empty."""
    out = []
    for k in range(1, num_classes):
        a, b = pred == k, label == k
        denom = int(a.sum()) + int(b.sum())
        out.append(float("nan") if denom == 0 else 2.0 * int((a & b).sum()) / denom)
    return out


@torch.no_grad()
def validate(net: torch.nn.Module, volumes: Sequence[Tuple[str, torch.Tensor, torch.Tensor]], num_classes: int,
             schedule: CategoricalSchedule, sampled_steps: Sequence[int], device: torch.device,
             batch_size: int = 16, class_names: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """Mean per-class Dice over volumes, with the engine's reverse sampler (mode ``uc``; one
    forward pass for a plain segmentor).

    volumes: ``[(case, images (Z, 1, N, N), labels (Z, N, N))]`` on the network grid. Returns
    ``{"dice": mean over foreground classes, "dice_<name>": ...}``; a class absent from a
    volume's label and prediction does not count for that volume.
    """
    names = list(class_names or [f"class{k}" for k in range(num_classes)])
    was_training = net.training
    net.eval()
    scores = []
    try:
        for _, images, labels in volumes:
            preds = []
            for i in range(0, images.shape[0], batch_size):
                x = images[i:i + batch_size].to(device)
                if getattr(net, "one_shot", False):  # a plain segmentor: one forward pass
                    logits = net(x)
                else:
                    logits = run_trajectory(net, x, sampled_steps, num_classes, mode="uc", schedule=schedule).logits
                preds.append(logits.argmax(dim=1).cpu())
            scores.append(dice_per_class(torch.cat(preds), labels.long(), num_classes))
    finally:
        net.train(was_training)
    arr = np.array(scores, dtype=np.float64).reshape(-1, num_classes - 1)
    with np.errstate(all="ignore"):
        per_class = np.nanmean(arr, axis=0) if len(arr) else np.full(num_classes - 1, np.nan)
    per_class = np.nan_to_num(per_class, nan=0.0)
    out = {"dice": float(per_class.mean()) if len(per_class) else 0.0}
    out.update({f"dice_{names[k]}": float(per_class[k - 1]) for k in range(1, num_classes)})
    return out


# --------------------------------------------------------------------------------------------
# checkpoints
# --------------------------------------------------------------------------------------------
def _atomic_save(obj: dict, path: Path) -> None:
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


def merge_resume_config(saved: TrainConfig, new: TrainConfig, where: os.PathLike = "run") -> TrainConfig:
    """The configuration a resumed run continues with: ``saved`` with the :data:`RESUMABLE`
    settings of ``new``. Other settings of ``new`` must equal the saved ones or be ``None``
    (meaning "as saved"); anything else is refused, so a resumed run stays one recipe.
    """
    s, n = dataclasses.asdict(saved), dataclasses.asdict(new)
    changed = [k for k, v in n.items() if k not in RESUMABLE and v is not None and s[k] != v]
    if changed:
        raise CardsegError(f"{where}: cannot resume with different {', '.join(changed)} "
                           f"(only {', '.join(RESUMABLE)} may change)")
    out = TrainConfig.from_dict(s)
    for k in RESUMABLE:
        setattr(out, k, getattr(new, k))
    return out


def read_run_config(run: os.PathLike) -> TrainConfig:
    p = Path(run) / "config.json"
    if not p.is_file():
        raise CardsegError(f"{run}: not a training run folder (no config.json)")
    return TrainConfig.from_dict(json.loads(p.read_text(encoding="utf-8")))


# --------------------------------------------------------------------------------------------
# the trainer
# --------------------------------------------------------------------------------------------
class Trainer:
    """Trains one denoiser into a run folder. ``Trainer(config, out, resume).run()`` → summary dict."""

    def __init__(self, config: TrainConfig, out: os.PathLike, resume: bool = False, progress: bool = True,
                 train_data: Optional[SliceDataset] = None, val_data: Optional[SliceDataset] = None):
        self.out = Path(out)
        self.progress = progress
        self.resume_from: Optional[dict] = None
        if resume:
            ckpt_path = self.out / "last.pt"
            if not ckpt_path.is_file():
                raise CardsegError(f"{self.out}: nothing to resume (no last.pt)")
            config = merge_resume_config(read_run_config(self.out), config, self.out)
            self.resume_from = load_checkpoint(ckpt_path)
        elif (self.out / "last.pt").exists():
            raise CardsegError(f"{self.out}: already holds a run (use --resume, or another --out)")
        self.config = config.resolve()
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

    # -- data --------------------------------------------------------------------------------
    def _load_data(self) -> None:
        c = self.config
        fmt = c.data_format or detect_format(c.data)
        c.data_format = fmt
        kw = dict(fmt=fmt, val_fraction=c.val_fraction, seed=c.seed, spacing_mm=c.acdc_h5_spacing)
        if self.train_data is None:
            recs = load_split(c.data, "train", max_patients=c.max_train_patients, **kw)
            self.train_data = SliceDataset(recs, c.spacing, c.input_size, c.low_percentile, c.high_percentile,
                                           num_classes=c.num_classes)
        if c.max_train_slices is not None and len(self.train_data) > c.max_train_slices:
            keep = np.linspace(0, len(self.train_data) - 1, c.max_train_slices).round().astype(int)
            self.train_data = self.train_data.subset(keep.tolist())
        if self.val_data is None:
            lists = resolve_split(c.data, fmt, c.val_fraction, c.seed)
            val_patients = lists.get("val", [])
            if c.val_max_volumes is not None:
                val_patients = val_patients[:max(1, c.val_max_volumes)]
            if val_patients:
                recs = load_split(c.data, "val", **kw)
                recs = [r for r in recs if r.patient in set(val_patients)]
                self.val_data = SliceDataset(recs, c.spacing, c.input_size, c.low_percentile, c.high_percentile,
                                             num_classes=c.num_classes)
        self.val_volumes = self.val_data.volumes() if self.val_data is not None else []
        if c.val_max_volumes is not None:
            self.val_volumes = self.val_volumes[:c.val_max_volumes]
        if self.train_data.num_classes > c.num_classes:
            raise CardsegError(f"labels have {self.train_data.num_classes} classes, the run declares {c.num_classes}")

    def _provenance_data(self) -> dict:
        c = self.config
        return {"data": data_name(c.data, c.data_format),
                "format": c.data_format, "train_patients": list(self.train_data.patients),
                "train_slices": len(self.train_data),
                "val_patients": sorted({p for p in (self.val_data.patients if self.val_data else [])}),
                "val_volumes": [v[0] for v in self.val_volumes]}

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
            out.extend(self.perm[self.cursor:self.cursor + take].tolist())
            self.cursor += take
        return torch.tensor(out, dtype=torch.long)

    # -- state -------------------------------------------------------------------------------
    def _state(self, step: int) -> dict:
        return {
            "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "kind": "last", "step": int(step),
            "model": {k: v.detach().cpu() for k, v in self.net.state_dict().items()},
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "rng": {"generator": self.generator.get_state(), "torch": torch.get_rng_state()},
            "sampler": {"perm": self.perm.clone(), "cursor": int(self.cursor)},
            "best": dict(self.best), "elapsed_s": float(self.elapsed_before + time.perf_counter() - self.t_start),
            "network": self.config.network_spec(),
        }

    def _save_last(self, step: int) -> None:
        _atomic_save(self._state(step), self.out / "last.pt")

    def _save_best(self, step: int, val: Dict[str, float]) -> None:
        _atomic_save({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "kind": "best", "step": int(step),
                      "model": {k: v.detach().cpu() for k, v in self.net.state_dict().items()},
                      "val": dict(val), "network": self.config.network_spec()}, self.out / "best.pt")

    # -- logging -----------------------------------------------------------------------------
    def _csv_fields(self) -> List[str]:
        return (["step", "lr", "loss", "kl", "ce", "dice_loss", "boundary", "steps_per_s", "elapsed_s", "val_dice"]
                + [f"val_dice_{n}" for n in self.class_names[1:]])

    def _write_row(self, row: dict) -> None:
        path = self.out / "log.csv"
        new = not path.exists()
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self._csv_fields())
            if new:
                w.writeheader()
            w.writerow({k: row.get(k, "") for k in self._csv_fields()})

    def _truncate_log(self, step: int) -> None:
        """Drop log rows written after the checkpoint being resumed (an interrupted tail)."""
        path = self.out / "log.csv"
        if not path.exists():
            return
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        keep = [r for r in rows if r.get("step", "").isdigit() and int(r["step"]) <= step]
        if len(keep) != len(rows):
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=self._csv_fields())
                w.writeheader()
                w.writerows({k: r.get(k, "") for k in self._csv_fields()} for r in keep)

    def _loss(self, img: torch.Tensor, lab: torch.Tensor, autocast):
        """One batch's loss for the run's role: the diffusion recipe (noised state, time), one
        forward pass of a plain segmentor, or the aleatoric heads."""
        c = self.config
        if c.kind == "diffusion":
            img, x_t, t = make_training_inputs(self.schedule, img, lab, c.num_classes, c.p_uniform, c.p_uncond,
                                               self.generator)
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
    def run(self) -> dict:
        c = self.config
        self._load_data()
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "STOP").unlink(missing_ok=True)  # a stop request belongs to the previous invocation
        (self.out / "config.json").write_text(json.dumps(c.to_dict(), indent=2) + "\n")

        torch.manual_seed(int(c.seed))
        self.net = build_network(c.network_spec()).to(self.device)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=c.lr, weight_decay=c.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, int(c.warmup), c.steps, c.lr_schedule))
        self.loss_fn = {"diffusion": lambda: DiffusionLoss(self.schedule, c.loss),
                        "deterministic": lambda: SegmentationLoss(c.loss),
                        "aleatoric": lambda: AleatoricLoss(c.loss)}[c.kind]()
        self.augment = BatchAugment(c.augment)
        self.perm = torch.zeros(0, dtype=torch.long)
        self.cursor = 0
        self.best = {"dice": -1.0, "step": -1}
        self.elapsed_before = 0.0
        step = 0
        if self.resume_from is not None:
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
            self._truncate_log(step)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        train_images = self.train_data.images.to(self.device)
        train_labels = self.train_data.labels.to(self.device)

        self.t_start = time.perf_counter()
        budget_s = None if c.time_budget_min is None else float(c.time_budget_min) * 60.0
        stop_reason = "steps"
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=c.steps, initial=step, desc=f"train {c.role}", unit="step", file=sys.stderr,
                       dynamic_ncols=True, smoothing=0.05)
        sums: Dict[str, torch.Tensor] = {}
        n_acc = 0
        t_row = time.perf_counter()
        last_val: Dict[str, float] = {}
        self.net.train()
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if (c.amp and self.device.type == "cuda")
                    else contextlib.nullcontext())
        try:
            while step < c.steps:
                idx = self._next_indices(c.batch_size).to(self.device)
                img, lab = self.augment(train_images[idx], train_labels[idx].long(), self.generator)
                loss, terms = self._loss(img, lab, autocast)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if c.grad_clip:
                    torch.nn.utils.clip_grad_norm_(self.net.parameters(), c.grad_clip)
                self.optimizer.step()
                self.scheduler.step()
                step += 1
                terms["loss"] = loss.detach()
                for k, v in terms.items():
                    sums[k] = sums.get(k, 0.0) + v
                n_acc += 1
                if bar is not None:
                    bar.update(1)

                over_budget = budget_s is not None and (time.perf_counter() - self.t_start) >= budget_s
                stop_file = (self.out / "STOP").exists()  # `touch RUN/STOP` ends a run cleanly
                over_budget = over_budget or stop_file
                last_step = step >= c.steps or over_budget
                do_val = bool(self.val_volumes) and (step % c.val_interval == 0 or last_step)
                if step % c.log_interval == 0 or do_val or last_step:
                    means = {k: float(v) / n_acc for k, v in sums.items()}
                    if not math.isfinite(means["loss"]):
                        raise CardsegError(f"training diverged at step {step} (loss {means['loss']}); lower --lr")
                    now = time.perf_counter()
                    row = {"step": step, "lr": f"{self.scheduler.get_last_lr()[0]:.6g}",
                           "loss": f"{means['loss']:.5f}", "kl": f"{means['kl']:.5f}" if "kl" in means else "",
                           "ce": f"{means['ce']:.5f}",
                           "dice_loss": f"{means['dice']:.5f}", "boundary": f"{means['boundary']:.5f}",
                           "steps_per_s": f"{n_acc / max(now - t_row, 1e-9):.3f}",
                           "elapsed_s": f"{self.elapsed_before + now - self.t_start:.1f}"}
                    if do_val:
                        last_val = validate(self.net, self.val_volumes, c.num_classes, self.schedule,
                                            c.sampled_steps, self.device, c.val_batch_size, self.class_names)
                        row["val_dice"] = f"{last_val['dice']:.4f}"
                        for n in self.class_names[1:]:
                            row[f"val_dice_{n}"] = f"{last_val[f'dice_{n}']:.4f}"
                        if last_val["dice"] > self.best["dice"]:
                            self.best = {"dice": float(last_val["dice"]), "step": step}
                            self._save_best(step, last_val)
                        self._save_last(step)
                    self._write_row(row)
                    if bar is not None:
                        post = {"loss": f"{means['loss']:.3f}"}
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
            if bar is not None:
                bar.close()
            raise
        if bar is not None:
            bar.close()
        self._save_last(step)
        if not self.val_volumes and self.best["step"] < 0:
            self.best = {"dice": None, "step": step}
            self._save_best(step, {})
        summary = {
            "role": c.role, "network": c.network_spec(), "parameters": count_parameters(self.net),
            "steps_done": step, "steps_planned": c.steps, "stopped_by": stop_reason,
            "elapsed_s": round(self.elapsed_before + time.perf_counter() - self.t_start, 2),
            "best": self.best, "last_val": last_val, "hardware": hardware_description(self.device),
            "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **self._provenance_data(),
        }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def train(config: TrainConfig, out: os.PathLike, resume: bool = False, progress: bool = True, **data) -> dict:
    """Train one denoiser into the run folder ``out`` (see :class:`Trainer`); returns the summary."""
    return Trainer(config, out, resume=resume, progress=progress, **data).run()


# --------------------------------------------------------------------------------------------
# loading runs and exporting a bundle
# --------------------------------------------------------------------------------------------
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


def _run_data_name(summary: dict, cfg: TrainConfig) -> str:
    """The run's data as provenance names it; summaries written before names were recorded hold
    an absolute path, which is reduced to its name here."""
    fmt = summary.get("format", cfg.data_format)
    data = summary.get("data")
    if data is None or _is_machine_path(data):
        return data_name(data or cfg.data, fmt)
    return data


def _run_provenance(run: Path, cfg: TrainConfig, meta: dict, which: str) -> dict:
    """What a bundle records of one training run: names and numbers, no machine's folders."""
    summary = {}
    if (run / "summary.json").is_file():
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    return {
        "run": run.resolve().name,
        "network": f"{cfg.network}",
        "checkpoint": which,
        "checkpoint_step": meta.get("step"),
        "val_dice": (meta.get("val") or {}).get("dice") if which == "best" else (summary.get("last_val") or {}).get("dice"),
        "val": meta.get("val") if which == "best" else summary.get("last_val"),
        "steps_done": summary.get("steps_done", meta.get("step")),
        "training_time_s": summary.get("elapsed_s", meta.get("elapsed_s")),
        "hardware": summary.get("hardware"),
        "data": _run_data_name(summary, cfg),
        "data_format": summary.get("format", cfg.data_format),
        "split": {"train_patients": summary.get("train_patients"), "val_patients": summary.get("val_patients")},
        "recipe": {"batch_size": cfg.batch_size, "lr": cfg.lr, "warmup": cfg.warmup, "lr_schedule": cfg.lr_schedule,
                   "p_uniform": cfg.p_uniform, "p_uncond": cfg.p_uncond, "seed": cfg.seed,
                   "loss": cfg.loss.to_dict(), "augment": cfg.augment.to_dict(),
                   "acdc_h5_spacing_mm": cfg.acdc_h5_spacing if cfg.data_format == "acdc-h5" else None},
    }


def export_bundle(primary_run: os.PathLike, reference_run: os.PathLike, out: os.PathLike, name: str = "acdc",
                  version: str = "0.1.0", primary_checkpoint: str = "best", reference_checkpoint: str = "last",
                  overwrite: bool = False, fp16: bool = True) -> Path:
    """Assemble a bundle from a trained primary run and a reference run (engine :func:`save_bundle`).

    A *plain* bundle wraps one deterministic or aleatoric run (given as both runs) so the
    conventional baselines fit and evaluate through the same engine path: one forward pass
    (``sampled_steps`` ``[0]``), the TAC identically 0, ``"segmentor": {"kind": ...}`` recorded.
    Two deterministic runs of one network (different seeds) make the Dual U-Net control: the
    "TAC" is then the JS between their softmaxes, and CARD's fitted sigmoid temperature acts on
    the first one's logits (``"segmentor": {"kind": "dual"}``).

    The primary defaults to its best validated checkpoint; the reference to its last one (the
    paper fixes the reference's training length a priori instead of selecting it). Both runs
    must share the grid (spacing, size), the classes, the diffusion horizon and the
    preprocessing. Provenance (data, split, steps, time, hardware, validation Dice) is recorded.
    """
    from cardseg.bundle import default_config, save_bundle

    p_run, r_run = Path(primary_run), Path(reference_run)
    p_net, p_cfg, p_meta = load_run_network(p_run, primary_checkpoint)
    r_net, r_cfg, r_meta = load_run_network(r_run, reference_checkpoint)
    if (p_cfg.kind == "diffusion") != (r_cfg.kind == "diffusion"):
        raise CardsegError("a bundle holds two diffusion denoisers, or one plain segmentor given as both "
                           f"--primary and --reference (got roles {p_cfg.role} and {r_cfg.role})")
    plain = p_cfg.kind != "diffusion"
    segmentor = None
    if plain and p_run.resolve() == r_run.resolve():
        # one forward pass ("step 0"); the reference is the segmentor itself, so the TAC is 0
        r_net, r_cfg, r_meta, reference_checkpoint = p_net, p_cfg, p_meta, primary_checkpoint
        segmentor = {"kind": p_cfg.kind}
    elif plain:
        # the Dual U-Net control: two plain segmentors; the "TAC" is the JS of their softmaxes
        if p_cfg.kind != "deterministic" or r_cfg.kind != "deterministic" or p_cfg.network != r_cfg.network:
            raise CardsegError("a dual-segmentor bundle takes two deterministic runs of one network "
                               f"(got {p_cfg.role} {p_cfg.network} and {r_cfg.role} {r_cfg.network})")
        segmentor = {"kind": "dual", "seeds": [p_cfg.seed, r_cfg.seed]}
    for key in ("spacing", "input_size", "num_steps", "classes", "low_percentile", "high_percentile", "sampled_steps"):
        a, b = getattr(p_cfg, key), getattr(r_cfg, key)
        if a != b:
            raise CardsegError(f"primary and reference runs differ in {key} ({a!r} vs {b!r})")
    warnings = []
    for key in ("data", "data_format", "acdc_h5_spacing", "val_fraction"):
        a, b = getattr(p_cfg, key), getattr(r_cfg, key)
        if a != b:
            warnings.append(f"primary and reference runs differ in {key}: {a!r} vs {b!r}")
    for w in warnings:
        print(f"cardseg: warning: {w}", file=sys.stderr)
    strip = lambda spec: {k: v for k, v in spec.items() if k != "num_classes"}  # noqa: E731
    config = default_config(name, p_cfg.classes, strip(p_cfg.network_spec()), strip(r_cfg.network_spec()),
                            p_cfg.spacing, p_cfg.input_size, version=version, num_steps=p_cfg.num_steps,
                            sampled_steps=[0] if plain else list(p_cfg.sampled_steps))
    if segmentor:
        config["segmentor"] = segmentor
    config["preprocessing"].update({"low_percentile": p_cfg.low_percentile, "high_percentile": p_cfg.high_percentile})
    config["provenance"] = {
        "training": {"primary": _run_provenance(p_run, p_cfg, p_meta, primary_checkpoint),
                     "reference": _run_provenance(r_run, r_cfg, r_meta, reference_checkpoint)},
        "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "weights_dtype": "float16" if fp16 else "float32",
        "warnings": warnings,
    }
    return save_bundle(out, config, p_net, r_net, fp16=fp16, overwrite=overwrite)
