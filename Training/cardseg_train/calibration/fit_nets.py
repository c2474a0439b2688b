"""Fitting the small-network calibrators (PTS, LTS, CalibNet) on the calibration pool.

Same pool and objective as the other fitters (:mod:`cardseg_train.calibration.fit`): the mean
pixel-wise NLL of the calibrated ROI pixels of the source-validation pool. What differs is the
optimiser, since these have hundreds to thousands of weights: Adam from a fixed seed, with early
stopping on a held-out part of the pool.

* **Held-out part**: about ``holdout`` (:class:`NetFitOptions`, default 20%) of the pool's
  *patients* (every item of a held-out patient: both frames and all perturbations), drawn from
  ``seed``; with one patient, whole items instead. The weights kept are those of the epoch with the lowest held-out NLL,
  epoch 0 included, which is the start: every network starts as TS (output layer zero, biases set
  so that ``T`` is the TS temperature fitted on the training part), so a fitted network is never
  worse than that TS on the held-out part.
* **PTS** (:func:`fit_pts`) reads one pixel at a time: it trains on the pool's ROI pixel vectors
  (the same pixels as TS, ETS, HTS and CARD), in shuffled mini-batches.
* **LTS** and **CalibNet** (:func:`fit_lts`, :func:`fit_calibnet`) read neighbourhoods and the
  image, which the pixel vectors lack: they need the pool's spatial crops
  (:class:`~cardseg_train.calibration.spatial.SpatialItem`, a pool built with
  ``PoolOptions(spatial=True)``; CalibNet also ``augmentations=N``). Their loss is the NLL over
  *all* ROI pixels of the crops (the pixel vectors keep a random subset), a few slices of one item
  per step.
* **CalibNet's shape prior** (its denoising network of label maps) is trained first, on
  corrupted ground-truth label maps (:func:`corrupt_label_maps`): by default the training part's
  own crops; ``shape_labels`` gives other source label maps (``cardseg fit-calibration`` passes
  the training split's, so the prior never saw the patients it is calibrated on). It is frozen
  while the temperature network trains.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from cardseg.method.calibration import CalibNet, LocalTemperatureScaling, ParameterizedTemperatureScaling
from cardseg.method.calibration.netbase import NetworkCalibrator
from cardseg.base.progress import Progress

from cardseg_train.calibration.objectives import fit_temperature
from cardseg_train.calibration.pool import PoolItem, concat_pool
from cardseg_train.calibration.spatial import LOG_FLOOR, SpatialItem, crop_inputs, crop_nll

#: the held-out share of the pool's patients
HOLDOUT = 0.2
#: an epoch counts as better only if the held-out NLL drops by more than this
MIN_DELTA = 1e-5
#: gradient norm clip of every step
GRAD_CLIP = 1.0


# --------------------------------------------------------------------------------------------
# the fitters' options


@dataclass(frozen=True)
class NetFitOptions:
    """How a network calibrator trains (the fields every fitter shares).

    seed: draws the held-out split, the starting weights and the batch order; holdout: the
    held-out share of the pool's patients; lr: Adam's step size (each calibrator's own options
    set its default); max_epochs: the most passes over the training part; patience: epochs
    without a held-out improvement of more than :data:`MIN_DELTA` before training stops."""

    seed: int = 0
    holdout: float = HOLDOUT
    lr: float = 3e-3
    max_epochs: int = 30
    patience: int = 4


@dataclass(frozen=True)
class PTSOptions(NetFitOptions):
    """PTS (:func:`fit_pts`): training as :class:`NetFitOptions`, and

    hidden / layers: ReLU units per hidden layer and hidden layers of the MLP over the sorted
    logits; top_k: how many of the largest logits it reads (``None``: all ``K``); batch_pixels: pixels per mini-batch;
    max_steps_per_epoch: the most mini-batches per epoch; objective: ``nll`` (the pool's
    objective) or ``mse`` (the authors' squared error to the one-hot label)."""

    hidden: int = 5
    layers: int = 2
    top_k: Optional[int] = None
    lr: float = 5e-3
    batch_pixels: int = 8192
    max_steps_per_epoch: int = 200
    objective: str = "nll"


@dataclass(frozen=True)
class CropFitOptions(NetFitOptions):
    """A calibrator trained on the pool's spatial crops: training as :class:`NetFitOptions`, and
    slices: how many consecutive slices of one crop make one step's batch."""

    slices: int = 4


@dataclass(frozen=True)
class LTSOptions(CropFitOptions):
    """LTS (:func:`fit_lts`): training as :class:`CropFitOptions`, and kernel / dilation: the
    size and dilation of the tree's ``kernel x kernel`` convolutions."""

    kernel: int = 5
    dilation: int = 2
    lr: float = 1e-2


@dataclass(frozen=True)
class CalibNetOptions(CropFitOptions):
    """CalibNet (:func:`fit_calibnet`): training as :class:`CropFitOptions`, and

    branch: channels of each of the five input branches; hidden: channels of the dilated head
    convolution; reduction: the squeeze-and-excitation block's channel reduction; dae_hidden /
    dae_dilations: the shape prior's channels and the dilations of its convolutions, one layer
    each; dae_steps: the shape prior's training steps (:func:`train_shape_prior`)."""

    branch: int = 4
    hidden: int = 8
    reduction: int = 4
    dae_hidden: int = 8
    dae_dilations: Sequence[int] = (1, 2, 4, 8)
    dae_steps: int = 500
    lr: float = 3e-3


# --------------------------------------------------------------------------------------------
# the held-out split and the training loop


def holdout_split(
    pool: Sequence[PoolItem], fraction: float = HOLDOUT, seed: int = 0
) -> Tuple[List[PoolItem], List[PoolItem], List[str]]:
    """``(training items, held-out items, held-out names)``: whole patients (``patient``, else
    ``case``) when the pool has two or more, else whole items."""
    if len(pool) < 2:
        raise ValueError("early stopping needs a pool of at least two items (one is held out)")
    rng = np.random.default_rng(seed)
    groups = [it.patient or it.case for it in pool]
    names = sorted(set(groups))
    if len(names) >= 2:
        n = min(max(1, round(fraction * len(names))), len(names) - 1)
        held = set(str(v) for v in rng.choice(names, size=n, replace=False))
        mask = [g in held for g in groups]
    else:
        n = min(max(1, round(fraction * len(pool))), len(pool) - 1)
        picks = set(int(i) for i in rng.choice(len(pool), size=n, replace=False))
        mask = [i in picks for i in range(len(pool))]
        held = {f"item {i}" for i in sorted(picks)}
    train = [it for it, m in zip(pool, mask) if not m]
    test = [it for it, m in zip(pool, mask) if m]
    return train, test, sorted(held)


def _train(
    cal: NetworkCalibrator,
    params: List[torch.nn.Parameter],
    epoch: Callable[[torch.optim.Optimizer], float],
    held_nll: Callable[[], float],
    options: NetFitOptions,
    progress: Optional[Progress],
    info: dict,
) -> None:
    """Adam over ``params`` at ``options.lr`` (``epoch(optimizer)`` runs one pass, returns its mean
    training loss); keeps the state with the lowest held-out NLL (the start included), stops after
    ``options.patience`` epochs without improvement or after ``options.max_epochs``; fills ``info``."""
    lr, max_epochs, patience = options.lr, options.max_epochs, options.patience
    progress = progress or Progress()
    t0 = time.perf_counter()
    for p in params:
        p.requires_grad_(True)
    cal.net.train()
    opt = torch.optim.Adam(params, lr=lr)
    best = start = held_nll()
    best_state, best_epoch, stale, curve, losses = copy.deepcopy(cal.net.state_dict()), 0, 0, [start], []
    progress.stage(f"fit {cal.name}", max_epochs)
    for ep in range(1, max_epochs + 1):
        losses.append(epoch(opt))
        value = held_nll()
        curve.append(value)
        progress.advance(1)
        if value < best - MIN_DELTA:
            best, best_state, best_epoch, stale = value, copy.deepcopy(cal.net.state_dict()), ep, 0
        else:
            stale += 1
            if stale >= patience:
                break
    progress.close()
    cal.net.load_state_dict(best_state)
    cal.net.eval().requires_grad_(False)
    info.update(
        {
            "epochs": len(curve) - 1,
            "best_epoch": best_epoch,
            "held_out_nll_start": start,
            "held_out_nll": best,
            "held_out_curve": curve,
            "train_loss_curve": losses,
            "lr": lr,
            "fit_s": time.perf_counter() - t0,
        }
    )


def _clip(opt: torch.optim.Optimizer) -> None:
    """Clip the gradient norm at :data:`GRAD_CLIP` (a few very confident, wrong pixels at a small
    temperature give huge gradients that would otherwise throw the network back to its start)."""
    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], GRAD_CLIP)


def _nll(logp: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean NLL of log-probabilities ``(n, K)`` at labels ``(n,)`` (not floored: training)."""
    return -logp[torch.arange(y.numel()), y].mean()


# --------------------------------------------------------------------------------------------
# PTS


def fit_pts(
    pool: Sequence[PoolItem],
    options: PTSOptions = PTSOptions(),
    progress: Optional[Progress] = None,
    info: Optional[dict] = None,
) -> ParameterizedTemperatureScaling:
    """PTS on the pool's ROI pixel vectors (see the module docstring).

    ``options.objective``: ``nll`` (the pool's objective, default) or ``mse`` (the authors' squared
    error to the one-hot label); early stopping always watches the held-out NLL. An epoch is at
    most ``options.max_steps_per_epoch`` mini-batches of ``options.batch_pixels`` pixels.
    """
    objective, batch_pixels, seed = options.objective, options.batch_pixels, options.seed
    if objective not in ("nll", "mse"):
        raise ValueError(f"unknown PTS objective {objective!r} (nll or mse)")
    info = {} if info is None else info
    train, held, names = holdout_split(pool, options.holdout, seed)
    z_np, y_np, _ = concat_pool(train)
    t0 = fit_temperature(z_np, y_np)
    k = z_np.shape[1]
    cal = ParameterizedTemperatureScaling(
        {"num_classes": k, "top_k": options.top_k or k, "hidden": options.hidden, "layers": options.layers},
        seed=seed,
    )
    cal.set_constant_temperature(t0)
    z, y = torch.from_numpy(z_np.astype(np.float32)), torch.from_numpy(y_np)
    zh_np, yh_np, _ = concat_pool(held)
    zh, yh = torch.from_numpy(zh_np.astype(np.float32)), torch.from_numpy(yh_np)
    rng = np.random.default_rng(seed)

    def loss(zb, yb):
        lp = cal.log_probs(zb)
        if objective == "nll":
            return _nll(lp, yb)
        return ((lp.exp() - torch.nn.functional.one_hot(yb, k).float()) ** 2).sum(dim=1).mean()

    def epoch(opt):
        order = torch.from_numpy(rng.permutation(y.numel()))
        steps = min(math.ceil(y.numel() / batch_pixels), options.max_steps_per_epoch)
        total = 0.0
        for s in range(steps):
            idx = order[s * batch_pixels : (s + 1) * batch_pixels]
            opt.zero_grad()
            value = loss(z[idx], y[idx])
            value.backward()
            _clip(opt)
            opt.step()
            total += float(value.detach())
        return total / steps

    def held_nll():
        with torch.no_grad():
            lp = cal.log_probs(zh.double())
            return float(-lp[torch.arange(yh.numel()), yh].clamp_min(LOG_FLOOR).mean())

    info.update(
        {
            "t0": t0,
            "objective": objective,
            "held_out": names,
            "train_pixels": int(y.numel()),
            "held_out_pixels": int(yh.numel()),
            "seed": seed,
        }
    )
    _train(cal, list(cal.net.parameters()), epoch, held_nll, options, progress, info)
    return cal


# --------------------------------------------------------------------------------------------
# LTS and CalibNet: on the pool's spatial crops


def spatial_crops(pool: Sequence[PoolItem], method: str) -> List[SpatialItem]:
    """The crops of every item, or a ``ValueError`` saying what the pool lacks."""
    missing = [i for i, it in enumerate(pool) if it.spatial is None]
    if missing:
        raise ValueError(
            f"{method} reads the image and the pixels' neighbourhoods, and {len(missing)} of the "
            f"{len(pool)} pool items hold ROI pixel vectors only: build the pool with spatial crops "
            f"(build_pool with PoolOptions(spatial=True); cardseg fit-calibration --baselines ...,{method} does)"
        )
    return [it.spatial for it in pool]


def _crop_fit_info(t0: float, names, train_c, held_c, seed: int) -> dict:
    """The fit record's start temperature, held-out patients, pixel counts and seed of a crop fit."""
    return {
        "t0": t0,
        "held_out": names,
        "train_pixels": sum(sp.pixels for sp in train_c),
        "held_out_pixels": sum(sp.pixels for sp in held_c),
        "seed": seed,
    }


def _crop_temperature_start(crops: Sequence[SpatialItem]) -> float:
    """TS temperature on the ROI pixels of crops (the networks' starting point)."""
    z = np.concatenate([np.moveaxis(sp.logits, 1, 0)[:, sp.roi].T for sp in crops]).astype(np.float64)
    y = np.concatenate([sp.labels[sp.roi] for sp in crops]).astype(np.int64)
    return fit_temperature(z, y)


def _crop_batches(crops: Sequence[SpatialItem], slices: int) -> List[Tuple[int, int, int]]:
    """``(crop index, first slice, end slice)`` chunks holding ROI pixels."""
    out = []
    for i, sp in enumerate(crops):
        for s in range(0, sp.labels.shape[0], slices):
            if sp.roi[s : s + slices].any():
                out.append((i, s, min(s + slices, sp.labels.shape[0])))
    return out


def _fit_on_crops(
    cal: NetworkCalibrator,
    params,
    train: Sequence[SpatialItem],
    held: Sequence[SpatialItem],
    options: CropFitOptions,
    progress: Optional[Progress],
    info: dict,
) -> None:
    """Adam on the mean NLL over the ROI pixels of ``options.slices``-slice chunks of the training
    crops (batch order drawn from ``options.seed``)."""
    rng = np.random.default_rng(options.seed)
    batches = _crop_batches(train, options.slices)
    if not batches:
        raise ValueError(f"{cal.name}: the training crops hold no ROI pixels")

    def epoch(opt):
        total = 0.0
        for b in rng.permutation(len(batches)):
            i, s0, s1 = batches[int(b)]
            sp = train[i]
            part = SpatialItem(
                (0, 0, 0, 0, 0, 0),
                sp.logits[s0:s1],
                sp.image[s0:s1],
                sp.labels[s0:s1],
                sp.roi[s0:s1],
                None,
                None if sp.aug_mean is None else sp.aug_mean[s0:s1],
                None if sp.aug_std is None else sp.aug_std[s0:s1],
                sp.augmentations,
            )
            roi = torch.from_numpy(part.roi)
            opt.zero_grad()
            lp = cal.log_probs(torch.from_numpy(part.logits), **crop_inputs(cal, part))
            value = _nll(lp.permute(1, 0, 2, 3)[:, roi].T, torch.from_numpy(part.labels.astype(np.int64))[roi])
            value.backward()
            _clip(opt)
            opt.step()
            total += float(value.detach())
        return total / len(batches)

    _train(cal, params, epoch, lambda: crop_nll(cal, held), options, progress, info)


def fit_lts(
    pool: Sequence[PoolItem],
    options: LTSOptions = LTSOptions(),
    progress: Optional[Progress] = None,
    info: Optional[dict] = None,
) -> LocalTemperatureScaling:
    """LTS (the authors' tree of ``kernel x kernel`` convolutions of dilation ``dilation``) on the
    pool's spatial crops (see the module docstring). Its nodes are single linear convolutions whose
    weights travel further than a deep network's, hence a larger default step than CalibNet's."""
    info = {} if info is None else info
    seed = options.seed
    spatial_crops(pool, "lts")
    train, held, names = holdout_split(pool, options.holdout, seed)
    train_c, held_c = [it.spatial for it in train], [it.spatial for it in held]
    t0 = _crop_temperature_start(train_c)
    k = train_c[0].logits.shape[1]
    arch = {"num_classes": k, "kernel": options.kernel, "dilation": options.dilation}
    cal = LocalTemperatureScaling(arch, seed=seed)
    cal.set_constant_temperature(t0)
    info.update(_crop_fit_info(t0, names, train_c, held_c, seed))
    _fit_on_crops(cal, list(cal.net.parameters()), train_c, held_c, options, progress, info)
    return cal


# --------------------------------------------------------------------------------------------
# CalibNet


def corrupt_label_maps(labels: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """The shape prior's training input: label maps ``(B, P, P)`` → class probabilities
    ``(B, K, P, P)`` float32 of a corrupted version.

    Per map: with probability 3/4, 1 to 4 square blobs (side 3 to 12 px) set to a random class,
    and with probability 1/2 a square patch (side 8 to 24 px) replaced by the labels a few pixels
    (up to 6) away, a displaced boundary; then ``Softmax(s · onehot + noise)`` with ``s`` in
    ``[2, 8]`` and Gaussian noise of sigma in ``[0, 1.5]``, so the input looks like a network's
    softmax rather than a one-hot map.
    """
    lab = np.array(labels, dtype=np.int64, copy=True)
    b, p, _ = lab.shape
    for i in range(b):
        if rng.random() < 0.75:
            for _ in range(int(rng.integers(1, 5))):
                side = min(int(rng.integers(3, 13)), p)
                y, x = (int(v) for v in rng.integers(0, p - side + 1, 2))
                lab[i, y : y + side, x : x + side] = int(rng.integers(k))
        side = int(rng.integers(8, 25))
        if rng.random() < 0.5 and p - side - 6 > 6:
            y, x = (int(v) for v in rng.integers(6, p - side - 5, 2))
            dy, dx = (int(v) for v in rng.integers(-6, 7, 2))
            lab[i, y : y + side, x : x + side] = labels[i, y + dy : y + dy + side, x + dx : x + dx + side]
    onehot = np.moveaxis(np.eye(k, dtype=np.float32)[lab], -1, 1)
    scale = rng.uniform(2.0, 8.0, (b, 1, 1, 1)).astype(np.float32)
    sigma = rng.uniform(0.0, 1.5, (b, 1, 1, 1)).astype(np.float32)
    noise = rng.normal(0.0, 1.0, onehot.shape).astype(np.float32) * sigma
    logits = torch.from_numpy(scale * onehot + noise)
    return torch.softmax(logits, dim=1).numpy()


def _label_patches(maps: Sequence[np.ndarray], n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random ``size x size`` windows of the 2D label maps (padded with background)."""
    out = np.zeros((n, size, size), dtype=np.int64)
    for i in range(n):
        m = maps[int(rng.integers(len(maps)))]
        h, w = m.shape
        y = int(rng.integers(0, max(h - size, 0) + 1))
        x = int(rng.integers(0, max(w - size, 0) + 1))
        win = m[y : y + size, x : x + size]
        out[i, : win.shape[0], : win.shape[1]] = win
    return out


def train_shape_prior(
    cal: CalibNet,
    maps: Sequence[np.ndarray],
    steps: int = 500,
    batch: int = 8,
    size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    progress: Optional[Progress] = None,
) -> List[float]:
    """Train CalibNet's shape prior (its ``dae``) to restore label maps from corrupted ones
    (cross-entropy, Adam); returns the loss per step. ``maps``: 2D source label maps."""
    maps = [np.asarray(m) for m in maps if np.asarray(m).any()]
    if not maps:
        raise ValueError("no label maps with foreground to train CalibNet's shape prior on")
    k = int(cal.arch["num_classes"])
    rng = np.random.default_rng(seed)
    dae = cal.net.dae
    dae.train().requires_grad_(True)
    opt = torch.optim.Adam(dae.parameters(), lr=lr)
    progress = progress or Progress()
    progress.stage("calibnet shape prior", steps)
    losses = []
    for _ in range(steps):
        clean = _label_patches(maps, batch, size, rng)
        noisy = torch.from_numpy(corrupt_label_maps(clean, k, rng))
        opt.zero_grad()
        value = torch.nn.functional.cross_entropy(dae(noisy), torch.from_numpy(clean))
        value.backward()
        opt.step()
        losses.append(float(value.detach()))
        progress.advance(1)
    progress.close()
    dae.eval().requires_grad_(False)
    return losses


def fit_calibnet(
    pool: Sequence[PoolItem],
    options: CalibNetOptions = CalibNetOptions(),
    shape_labels: Optional[Sequence[np.ndarray]] = None,
    progress: Optional[Progress] = None,
    info: Optional[dict] = None,
) -> CalibNet:
    """CalibNet on the pool's spatial crops with augmentation statistics (module docstring):
    the shape prior first (on ``shape_labels``, 2D label maps, default the training crops' label
    slices), then the temperature network with the prior frozen."""
    info = {} if info is None else info
    seed, dae_steps = options.seed, options.dae_steps
    crops = spatial_crops(pool, "calibnet")
    counts = {sp.augmentations for sp in crops}
    if len(counts) != 1 or 0 in counts or any(sp.aug_mean is None for sp in crops):
        raise ValueError(
            "calibnet needs every crop with augmentation statistics over one number of augmentations "
            "(build_pool with PoolOptions(spatial=True, augmentations=N))"
        )
    train, held, names = holdout_split(pool, options.holdout, seed)
    train_c, held_c = [it.spatial for it in train], [it.spatial for it in held]
    k = train_c[0].logits.shape[1]
    cal = CalibNet(
        {
            "num_classes": k,
            "branch": options.branch,
            "hidden": options.hidden,
            "reduction": options.reduction,
            "dae_hidden": options.dae_hidden,
            "dae_dilations": list(options.dae_dilations),
            "augmentations": counts.pop(),
        },
        seed=seed,
    )
    own = shape_labels is None
    maps = [sp.labels[z] for sp in train_c for z in range(sp.labels.shape[0])] if own else list(shape_labels)
    t1 = time.perf_counter()
    dae_losses = train_shape_prior(cal, maps, dae_steps, seed=seed, progress=progress)
    t0 = _crop_temperature_start(train_c)
    cal.set_constant_temperature(t0)
    info.update(
        {
            **_crop_fit_info(t0, names, train_c, held_c, seed),
            "shape_prior": {
                "maps": len(maps),
                "source": "training crops" if own else "given label maps",
                "steps": dae_steps,
                "loss_first": dae_losses[0] if dae_losses else None,
                "loss_last": float(np.mean(dae_losses[-20:])) if dae_losses else None,
                "fit_s": time.perf_counter() - t1,
            },
        }
    )
    params = [p for name, p in cal.net.named_parameters() if not name.startswith("dae.")]
    _fit_on_crops(cal, params, train_c, held_c, options, progress, info)
    return cal


NET_FITTERS: Dict[str, Callable[..., NetworkCalibrator]] = {"pts": fit_pts, "lts": fit_lts, "calibnet": fit_calibnet}
#: each network calibrator's options class
NET_OPTIONS: Dict[str, type] = {"pts": PTSOptions, "lts": LTSOptions, "calibnet": CalibNetOptions}


def fit_network(
    method: str, pool: Sequence[PoolItem], progress: Optional[Progress] = None, info: Optional[dict] = None, **kwargs
) -> NetworkCalibrator:
    """Fit the network calibrator ``method`` (one of :data:`NET_FITTERS`) with its options as
    keywords, as :func:`cardseg_train.calibration.fit.fit_calibrator` passes them: the fields of
    its :data:`NET_OPTIONS` class (another keyword raises ``TypeError``), and for CalibNet also
    ``shape_labels``."""
    if method == "calibnet":
        shape_labels = kwargs.pop("shape_labels", None)
        return fit_calibnet(pool, CalibNetOptions(**kwargs), shape_labels, progress, info)
    return NET_FITTERS[method](pool, NET_OPTIONS[method](**kwargs), progress, info)
