"""What a training run depends on: :class:`TrainConfig` (written resolved to the run's
``config.json``), the roles a run can train, resuming rules and how provenance names data.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath
from typing import List, Optional, Sequence

from cardseg.method.diffusion import default_sampling_steps
from cardseg.base.errors import CardsegError
from cardseg.base.options import MAX_THREADS
from cardseg.method.networks import build_network, size_multiple
from cardseg.bundle.fields import OptionWhere, Where, integer_value, number_value
from cardseg.bundle.schema import INPUT_SIZE, NUM_STEPS, PIXEL_SPACING_MM
from cardseg.bundle.scaffold import ACDC_CLASSES, parse_network

from cardseg_train.data.augment import AugmentConfig
from cardseg_train.data.datasets import ACDC_H5_SPACING_MM
from cardseg_train.training.losses import LossWeights

#: what a run is for → how it trains: the two diffusion denoisers of a bundle, and the plain
#: segmentors of the conventional baselines (``deterministic``; with ``--size
#: discriminative:unet`` and two seeds also the Dual U-Net control) and the ``aleatoric`` one
ROLES = {"primary": "diffusion", "reference": "diffusion", "deterministic": "deterministic", "aleatoric": "aleatoric"}
#: the network a role trains when ``--size`` is not given
DEFAULT_NETWORK = {
    "primary": "time-swinunetr:mini",
    "reference": "time-swinunetr:mini",
    "deterministic": "discriminative:swinunetr-tiny",
    "aleatoric": "discriminative:swinunetr-tiny",
}
#: settings that may change when a run is resumed; everything else must match the run's config
RESUMABLE = (
    "steps",
    "time_budget_min",
    "val_interval",
    "log_interval",
    "device",
    "threads",
    "val_max_volumes",
    "val_batch_size",
    "amp",
)
_PALETTE = [
    [0.0, 0.0, 0.0],
    [0.30, 0.55, 0.90],
    [0.95, 0.75, 0.25],
    [0.90, 0.30, 0.30],
    [0.40, 0.80, 0.45],
    [0.70, 0.45, 0.85],
    [0.95, 0.55, 0.75],
    [0.45, 0.85, 0.85],
]


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
    p_focus: float = 0.0  # share of slices trained on the sampler's own steps (train_steps.draw_steps)
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
        check_options(self)
        if self.role not in ROLES:
            raise CardsegError(f"--role must be one of {', '.join(ROLES)}, not {self.role!r}")
        if self.network is None:
            self.network = DEFAULT_NETWORK[self.role]
        diffusion_arch = not self.network.startswith("discriminative")
        if diffusion_arch != (self.kind == "diffusion"):
            raise CardsegError(
                f"--role {self.role} cannot train {self.network}: "
                + (
                    "use a time-conditioned network (time-swinunetr:SIZE or time-unet:SIZE)"
                    if self.kind == "diffusion"
                    else "use discriminative:swinunetr-SIZE or discriminative:unet"
                )
            )
        if self.warmup is None:
            self.warmup = int(min(1000, max(1, self.steps // 10)))
        if self.sampled_steps is None:
            self.sampled_steps = default_sampling_steps(self.num_steps, 5)
        if self.lr_schedule not in ("constant", "cosine"):
            raise CardsegError(f"--lr-schedule must be constant or cosine, not {self.lr_schedule!r}")
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


def _at_least(opt: Where, key: str, value, low: int) -> None:
    if value is not None:
        integer_value(opt, key, value, low=low)


def check_options(c: TrainConfig) -> None:
    """Refuse, in one :class:`CardsegError` line naming the option, any value a run cannot use,
    before anything is read or written. The grid (``--spacing``, ``--input-size``,
    ``--num-steps``) must lie in the bundle schema's ranges (:mod:`cardseg.bundle.schema`), so
    that ``cardseg train export`` can ship what trains; the optimisation values must be finite
    and in their meaningful ranges (a negative learning rate or loss weight trains silently
    wrong, a zero batch or interval never ends). Unset (``None``) values are skipped."""
    opt = OptionWhere()
    if c.spacing is not None:
        number_value(opt, "--spacing", c.spacing, low=PIXEL_SPACING_MM[0], high=PIXEL_SPACING_MM[1])
    if c.input_size is not None:
        integer_value(opt, "--input-size", c.input_size, low=INPUT_SIZE[0], high=INPUT_SIZE[1])
    if c.num_steps is not None:
        integer_value(opt, "--num-steps", c.num_steps, low=NUM_STEPS[0], high=NUM_STEPS[1])
    if c.acdc_h5_spacing is not None:
        number_value(opt, "--acdc-h5-spacing", c.acdc_h5_spacing, low=PIXEL_SPACING_MM[0], high=PIXEL_SPACING_MM[1])
    if c.lr is not None:
        number_value(opt, "--lr", c.lr, low=0.0, low_open=True)
    for key, value in (
        ("--steps", c.steps),
        ("--batch-size", c.batch_size),
        ("--val-batch-size", c.val_batch_size),
        ("--log-interval", c.log_interval),
        ("--val-interval", c.val_interval),
        ("--val-volumes", c.val_max_volumes),
        ("--max-train-patients", c.max_train_patients),
        ("--max-train-slices", c.max_train_slices),
    ):
        _at_least(opt, key, value, 1)
    _at_least(opt, "--warmup", c.warmup, 0)
    if c.threads is not None:
        integer_value(opt, "--threads", c.threads, low=1, high=MAX_THREADS)
    if c.val_fraction is not None:
        number_value(opt, "--val-fraction", c.val_fraction, low=0.0)
        if c.val_fraction >= 1:
            opt.fail("--val-fraction", f"must be below 1 (some patients must train) (got {c.val_fraction})")
    if c.time_budget_min is not None:
        number_value(opt, "--time-budget", c.time_budget_min, low=0.0, low_open=True)
    for key, value in (("--p-uniform", c.p_uniform), ("--p-uncond", c.p_uncond), ("--p-focus", c.p_focus)):
        if value is not None:
            number_value(opt, key, value, low=0.0, high=1.0)
    for key, value in (("weight_decay", c.weight_decay), ("grad_clip", c.grad_clip)):
        if value is not None:
            number_value(opt, key, value, low=0.0)
    if c.loss is not None:
        w = c.loss
        for key, value in (("--w-kl", w.kl), ("--w-ce", w.ce), ("--w-dice", w.dice), ("--w-boundary", w.boundary)):
            number_value(opt, key, value, low=0.0)
        if not any(v > 0 for v in (w.kl, w.ce, w.dice, w.boundary)):
            opt.fail("--w-kl/--w-ce/--w-dice/--w-boundary", "are all 0: at least one loss weight must be positive")
        integer_value(opt, "--boundary-radius", w.boundary_radius, low=1)


#: how provenance describes each data layout
DATA_LAYOUTS = {
    "acdc-h5": "ACDC HDF5 layout",
    "acdc-nifti": "ACDC NIfTI layout",
    "pairs": "imagesTr/labelsTr NIfTI pairs",
}


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


def is_machine_path(text) -> bool:
    """Whether a recorded value is an absolute path (POSIX, or a Windows drive or share)."""
    return isinstance(text, str) and (text.startswith(("/", "\\")) or bool(PureWindowsPath(text).drive))


def class_list(names: Sequence[str]) -> List[dict]:
    """Class dictionaries for ``bundle.json`` (ACDC colours when the names are ACDC's)."""
    acdc = {c["name"]: c["color"] for c in ACDC_CLASSES}
    return [{"name": n, "color": list(acdc.get(n, _PALETTE[i % len(_PALETTE)]))} for i, n in enumerate(names)]


def smoke_config(config: TrainConfig, explicit: Sequence[str] = ()) -> TrainConfig:
    """Shrink a configuration to a seconds-long end-to-end run (keys in ``explicit`` are kept)."""
    tiny = "time-unet:micro" if ROLES.get(config.role) == "diffusion" else "discriminative:unet"
    preset = {
        "steps": 4,
        "batch_size": 2,
        "network": tiny,
        "input_size": 64,
        "spacing": 4.0,
        "log_interval": 1,
        "val_interval": 4,
        "val_max_volumes": 1,
        "max_train_patients": 2,
        "max_train_slices": 8,
        "warmup": 1,
    }
    for k, v in preset.items():
        if k not in explicit:
            setattr(config, k, v)
    return config


def merge_resume_config(saved: TrainConfig, new: TrainConfig, where: os.PathLike = "run") -> TrainConfig:
    """The configuration a resumed run continues with: ``saved`` with the :data:`RESUMABLE`
    settings of ``new``. Other settings of ``new`` must equal the saved ones or be ``None``
    (meaning "as saved"); anything else is refused, so a resumed run stays one recipe.
    """
    s, n = dataclasses.asdict(saved), dataclasses.asdict(new)
    changed = [k for k, v in n.items() if k not in RESUMABLE and v is not None and s[k] != v]
    if changed:
        raise CardsegError(
            f"{where}: cannot resume with different {', '.join(changed)} (only {', '.join(RESUMABLE)} may change)"
        )
    out = TrainConfig.from_dict(s)
    for k in RESUMABLE:
        setattr(out, k, getattr(new, k))
    return out


def read_run_config(run: os.PathLike) -> TrainConfig:
    p = Path(run) / "config.json"
    if not p.is_file():
        raise CardsegError(f"{run}: not a training run folder (no config.json)")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(d, dict):
            raise ValueError(f"a JSON {type(d).__name__}, not an object")
        return TrainConfig.from_dict(d)
    except (ValueError, TypeError, AttributeError) as exc:  # not JSON, or not a run's settings
        raise CardsegError(f"{p}: not a readable run configuration ({str(exc).splitlines()[0][:160]})") from None
