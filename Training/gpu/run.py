"""Entry script of one GPU training run: engine checks, then every network trained at once.

    python Training/gpu/run.py --pack Training/gpu/pack --out OUT [--budget-s 420] [--smoke]

What it does, in order (each part guarded, so one failure never costs the others):

1. ``checks``: the engine on CUDA through its array API (the GPU machine has no SimpleITK):
   the shipped bundle's trajectory on a synthetic cine phantom on the CPU and twice on CUDA
   (label agreement CPU vs CUDA, bit-identity of the two CUDA runs), and the paper-scale
   overhead timing (a time-SwinUNETR ``base`` primary and a ``mini`` reference, 256 x 256,
   batch 32, 5 steps, random weights; :func:`paper_scale_timing`). Written to ``engine.json``
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
``.safetensors`` per job (:data:`JOB_FILES`). ``Training/gpu/import_runs.py`` turns them into
ordinary run folders that ``cardseg train export`` reads.

``--smoke`` runs the same code on the CPU in seconds (tiny batch and budget; the pack built
with ``build_pack.py --data synthetic``); the test suite runs it so the GPU run cannot fail
on a typo.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
for _sub in ("CARDSegment", "Training"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))

import numpy as np  # noqa: E402
import torch  # noqa: E402

#: every job: network spec, loss kind, checkpoint policy, output file(s)
JOBS: Dict[str, dict] = {
    # the primary gets the whole budget and the largest batch: its Dice is what the run is for
    "primary": {"spec": {"arch": "time-swinunetr", "size": "tiny"}, "kind": "diffusion", "lr": 4e-4, "batch": 128,
                "keep": "best", "ema": 0.999},
    # references: saved at MILESTONES (the maturity axis), stopped after the last one
    "reference": {"spec": {"arch": "time-swinunetr", "size": "mini"}, "kind": "diffusion", "lr": 3e-4, "batch": 32,
                  "keep": "milestones", "max_steps": 16000},
    "reference_unet": {"spec": {"arch": "time-unet", "size": "tiny"}, "kind": "diffusion", "lr": 1e-3, "batch": 32,
                       "keep": "milestones", "max_steps": 16000},
    # the capacity axis of the reference sweep (paper Fig. 5): the same U-Net recipe one size down and up
    "reference_unet_micro": {"spec": {"arch": "time-unet", "size": "micro"}, "kind": "diffusion", "lr": 1e-3,
                             "batch": 32, "keep": "milestones", "max_steps": 16000},
    "reference_unet_small": {"spec": {"arch": "time-unet", "size": "small"}, "kind": "diffusion", "lr": 1e-3,
                             "batch": 32, "keep": "milestones", "max_steps": 16000},
    # the conventional baselines' segmentor: lowest priority, so it stops at 60 % of the budget
    # and leaves the GPU to the primary's annealing phase
    "deterministic": {"spec": {"arch": "discriminative", "backbone": "swinunetr", "feature_size": 24},
                      "kind": "deterministic", "lr": 4e-4, "batch": 32, "budget_frac": 0.6, "keep": "best",
                      "ema": 0.999},
    # the "Alea." row: the same SwinUNETR with a class-wise log-variance head (Kendall and Gal)
    "aleatoric": {"spec": {"arch": "discriminative", "backbone": "swinunetr", "feature_size": 24, "aleatoric": True},
                  "kind": "aleatoric", "lr": 4e-4, "batch": 32, "budget_frac": 0.6, "keep": "best", "ema": 0.999},
    # the second member of the Dual SwinUNETR control: the deterministic recipe, another seed
    "deterministic_b": {"spec": {"arch": "discriminative", "backbone": "swinunetr", "feature_size": 24},
                        "kind": "deterministic", "lr": 4e-4, "batch": 32, "budget_frac": 0.6, "keep": "best",
                        "ema": 0.999},
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


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
def log_line(out: Path, record: dict) -> None:
    """Append one JSON line to ``OUT/log.jsonl`` (short appends from several processes interleave whole)."""
    record = {"time": round(time.time(), 2), **record}
    with open(out / "log.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def save_weights(path: Path, tensors: Dict[str, torch.Tensor], meta: dict) -> None:
    """fp16 safetensors (floating tensors halved), written beside and renamed into place."""
    from safetensors.torch import save_file

    half = {k: (v.detach().to("cpu", torch.float16) if v.is_floating_point() else v.detach().cpu()).contiguous()
            for k, v in tensors.items()}
    tmp = path.with_name(path.name + ".part")
    save_file(half, str(tmp), metadata={"cardseg": json.dumps(meta)})
    os.replace(tmp, path)


def lr_factor(frac: float, warmup: float = 0.03, floor: float = 0.02) -> float:
    """Learning-rate multiplier at a fraction ``frac`` of the time budget: linear warm-up over
    the first ``warmup``, then a cosine from 1 down to ``floor`` at the end of the budget."""
    if frac < warmup:
        return max(frac / warmup, 0.01)
    x = min(1.0, (frac - warmup) / max(1e-9, 1 - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * x))


def load_pack(pack: Path, device: torch.device) -> dict:
    """The pack's arrays on ``device``: ``train_images (n, 1, N, N) uint8``, labels ``(n, N, N)``,
    and the validation volumes ``[(case, images, labels)]`` grouped by case."""
    meta = json.loads((pack / "pack.json").read_text())
    with np.load(pack / "data.npz") as z:
        arrays = {k: z[k] for k in z.files}
    out = {"meta": meta,
           "train_images": torch.from_numpy(arrays["train_images"])[:, None].to(device),
           "train_labels": torch.from_numpy(arrays["train_labels"]).to(device)}
    vols, cases = [], arrays["val_cases"]
    for case in dict.fromkeys(cases.tolist()):
        idx = np.flatnonzero(cases == case)
        vols.append((case, torch.from_numpy(arrays["val_images"][idx])[:, None].to(device),
                     torch.from_numpy(arrays["val_labels"][idx]).to(device)))
    out["val_volumes"] = vols
    return out


def as_float(images_u8: torch.Tensor) -> torch.Tensor:
    return images_u8.float() / 255.0


# --------------------------------------------------------------------------------------------
# data on the device
# --------------------------------------------------------------------------------------------
class DeviceAugment:
    """The training recipe's augmentation (:class:`cardseg_train.augment.BatchAugment`'s spatial
    map and ranges) with every random number drawn on the batch's device."""

    def __init__(self):
        from cardseg_train.augment import AugmentConfig, BatchAugment

        self.base = BatchAugment(AugmentConfig())
        self.c = self.base.config

    def __call__(self, image: torch.Tensor, label: torch.Tensor):
        image, label = self.base.spatial(image, label, self.base.affine(image.shape[0]))
        c, n, dev = self.c, image.shape[0], image.device

        def draw(p, lo, hi, off):
            on = torch.rand(n, 1, 1, 1, device=dev) < p
            v = lo + (hi - lo) * torch.rand(n, 1, 1, 1, device=dev)
            return torch.where(on, v, torch.full_like(v, off))

        x = image.clamp(0, 1).pow(draw(c.p_gamma, *c.gamma, 1.0))
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        x = (x - mean) * draw(c.p_contrast, *c.contrast, 1.0) + mean
        x = x + torch.randn_like(x) * draw(c.p_noise, *c.noise_std, 0.0)
        return x.clamp(0, 1), label


def noisy_inputs(schedule, images: torch.Tensor, labels: torch.Tensor, k: int, p_uniform: float = 0.15,
                 p_uncond: float = 0.2):
    """The training recipe's inputs (:func:`cardseg_train.train.make_training_inputs`: ``x_t`` from
    paper Eq. 1, the exact uniform state with ``p_uniform``, the image zeroed with ``p_uncond``),
    drawn on the device. images ``(B, 1, N, N)``, labels ``(B, N, N)`` → ``(image, x_t, t)``."""
    from cardseg.method.diffusion import one_hot

    b, dev, top = labels.shape[0], labels.device, schedule.num_steps - 1
    t = torch.randint(0, schedule.num_steps, (b,), device=dev)
    uniform = torch.rand(b, device=dev) < p_uniform
    t = torch.where(uniform, torch.full_like(t, top), t)
    abar = schedule.alpha_bar.to(dev).float()[t].view(b, 1, 1)
    other = torch.randint(0, k, labels.shape, device=dev)
    drawn = torch.where(torch.rand(labels.shape, device=dev) < abar, labels.long(), other)
    x_t = one_hot(drawn, k)
    x_t = torch.where(uniform.view(b, 1, 1, 1), torch.full_like(x_t, 1.0 / k), x_t)
    drop = (torch.rand(b, device=dev) < p_uncond).view(b, 1, 1, 1)
    return torch.where(drop, torch.zeros_like(images), images), x_t, t


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def validate(net, volumes, kind: str, schedule, steps, k: int, batch: int = 64) -> Dict[str, float]:
    """Mean per-class Dice over validation volumes (foreground classes; a class absent from both
    label and prediction does not count), with the engine's sampler for diffusion networks."""
    from cardseg.method.trajectory import run_trajectory

    _no_simpleitk()  # the engine's file I/O is never used here
    from cardseg_train.train_steps import dice_per_class

    was = net.training
    net.eval()
    scores = []
    for _, imgs, labs in volumes:
        preds = []
        for i in range(0, imgs.shape[0], batch):
            x = as_float(imgs[i:i + batch])
            if kind == "diffusion":
                logits = run_trajectory(net, x, steps, k, mode="uc", schedule=schedule).logits
            elif kind == "aleatoric":
                logits = net.heads(x)[0]  # the mean logits: the argmax the sampled prediction also has
            else:
                logits = net(x)
            preds.append(logits.argmax(dim=1))
        scores.append(dice_per_class(torch.cat(preds), labs.long(), k))
    net.train(was)
    with np.errstate(all="ignore"):
        per = np.nan_to_num(np.nanmean(np.array(scores, dtype=np.float64), axis=0))
    names = ["RV", "MYO", "LV"] if k == 4 else [f"class{c}" for c in range(1, k)]
    return {"dice": float(per.mean()), **{f"dice_{n}": float(v) for n, v in zip(names, per)}}


# --------------------------------------------------------------------------------------------
# one job
# --------------------------------------------------------------------------------------------
def run_job(name: str, pack: Path, out: Path, budget_s: float, batch: Optional[int], seed: int, smoke: bool,
            init_from: Optional[str] = None, lr_scale: float = 1.0, p_uncond: float = 0.2,
            val_every_s: float = 30.0, share_with_primary: bool = True) -> dict:
    from cardseg.method.diffusion import CategoricalSchedule, default_sampling_steps
    from cardseg.method.networks import build_network, count_parameters
    from cardseg_train.losses import AleatoricLoss, DiffusionLoss, SegmentationLoss

    job = JOBS[name]
    if share_with_primary:  # the lower-priority jobs leave the GPU to the primary's annealing
        budget_s = budget_s * float(job.get("budget_frac", 1.0))
    batch = int(batch) if batch else int(job.get("batch", 32))
    max_steps = int(job.get("max_steps", 10 ** 9))
    if smoke:
        max_steps = SMOKE_STEPS
    cuda = torch.cuda.is_available() and not smoke
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(seed)
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    data = load_pack(pack, device)
    meta_pack = data["meta"]
    k = int(meta_pack["num_classes"])
    spec = {**job["spec"], "num_classes": k}
    net = build_network(spec).to(device)
    if init_from:  # continue from weights a previous run returned (fp16 safetensors)
        from safetensors.torch import load_file

        held = load_file(str(init_from))
        own = net.state_dict()
        net.load_state_dict({n: held[n].to(own[n].dtype) for n in own})
    schedule = CategoricalSchedule(50)
    steps = default_sampling_steps(50, 5)
    loss_fn, plain_loss, aleatoric_loss = DiffusionLoss(schedule), SegmentationLoss(), AleatoricLoss()
    augment = DeviceAugment()
    job = {**job, "lr": job["lr"] * lr_scale}
    opt = torch.optim.AdamW(net.parameters(), lr=job["lr"], weight_decay=1e-5)
    ema = None
    if job.get("ema"):  # an exponential moving average of the weights, validated beside them
        ema = {n: p.detach().clone().float() for n, p in net.state_dict().items()}
        ema_keys = [n for n, p in net.state_dict().items() if p.is_floating_point()]
        live = [net.state_dict()[n] for n in ema_keys]  # views of the live parameters and buffers
        shadow = [ema[n] for n in ema_keys]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
    n_train = data["train_images"].shape[0]
    base = {"job": name, "network": {k_: v for k_, v in spec.items() if k_ != "num_classes"},
            "parameters": count_parameters(net), "device": torch.cuda.get_device_name() if cuda else "cpu",
            "batch_size": batch, "budget_s": budget_s, "lr": job["lr"], "seed": seed, "p_uncond": p_uncond,
            "init_from": Path(init_from).name if init_from else None,
            "pack": {k_: meta_pack.get(k_) for k_ in ("data", "pixel_spacing_mm", "input_size", "preprocessing",
                                                       "split", "data_sha256")}}
    log_line(out, {**base, "event": "start", "train_slices": n_train})
    files = [out / f for f in JOB_FILES[name]]
    milestones = {m for m in MILESTONES}
    kept: Dict[int, Dict[str, torch.Tensor]] = {}
    kept_val: Dict[int, dict] = {}
    best = {"dice": -1.0, "step": 0, "weights": "raw"}
    best_state = None
    last_save = time.perf_counter()
    val_every = 2.0 if smoke else val_every_s
    log_every = 1.0 if smoke else 15.0
    t0 = time.perf_counter()
    t_val, t_log = t0, t0
    step, n_sum = 0, 0

    def current_val(weights: str) -> dict:
        if weights == "ema":
            raw = {n: p.detach().clone() for n, p in net.state_dict().items()}
            net.load_state_dict({n: v.to(raw[n].dtype) for n, v in ema.items()})
            v = validate(net, data["val_volumes"], job["kind"], schedule, steps, k)
            net.load_state_dict(raw)
            return v
        return validate(net, data["val_volumes"], job["kind"], schedule, steps, k)

    def write_best() -> None:
        if best_state is not None:
            save_weights(files[0], best_state, {**base, "step": best["step"], "val": best, "elapsed_s":
                                                round(time.perf_counter() - t0, 1)})

    def write_milestones() -> None:
        order = sorted(kept)
        per = PER_FILE if len(files) > 1 else len(order)  # a single file holds every checkpoint
        for i, path in enumerate(files):
            part = order[i * per:(i + 1) * per] if i < len(files) - 1 else order[i * per:]
            if not part:
                continue
            tensors = {f"step{s}.{n}": v for s in part for n, v in kept[s].items()}
            save_weights(path, tensors, {**base, "checkpoints": {str(s): kept_val.get(s, {}) for s in part},
                                         "elapsed_s": round(time.perf_counter() - t0, 1)})

    net.train()
    while True:
        elapsed = time.perf_counter() - t0
        frac = step / max_steps if smoke else elapsed / budget_s
        if frac >= 1.0 or step >= max_steps:
            break
        for g in opt.param_groups:
            g["lr"] = job["lr"] * lr_factor(frac)
        idx = torch.randint(0, n_train, (batch,), device=device)
        img, lab = augment(as_float(data["train_images"][idx]), data["train_labels"][idx].long())
        with autocast:
            if job["kind"] == "diffusion":
                img, x_t, t = noisy_inputs(schedule, img, lab, k, p_uncond=p_uncond)
                logits = net(img, x_t, t)
            elif job["kind"] == "aleatoric":
                logits, log_var = net.heads(img)
            else:
                logits = net(img)
        if job["kind"] == "diffusion":
            loss, _ = loss_fn(logits.float(), lab, x_t, t)
        elif job["kind"] == "aleatoric":
            loss, _ = aleatoric_loss(logits.float(), log_var.float(), lab)
        else:
            loss, _ = plain_loss(logits.float(), lab)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        step += 1
        n_sum += 1
        if ema is not None:
            d = min(job["ema"], (1 + step) / (10 + step))
            with torch.no_grad():
                torch._foreach_lerp_(shadow, live, 1 - d)
        if job["keep"] == "milestones" and step in milestones:
            kept[step] = {n: p.detach().clone() for n, p in net.state_dict().items()}
            kept_val[step] = current_val("raw")
            log_line(out, {"job": name, "event": "milestone", "step": step, **kept_val[step]})
        now = time.perf_counter()
        if now - t_log >= log_every:
            cur = float(loss.detach())
            log_line(out, {"job": name, "event": "train", "step": step, "loss": round(cur, 5),
                           "lr": opt.param_groups[0]["lr"], "steps_per_s": round(n_sum / (now - t_log), 2),
                           "elapsed_s": round(now - t0, 1)})
            t_log, n_sum = now, 0
        if job["keep"] == "best" and now - t_val >= val_every:
            for weights in (("raw", "ema") if ema is not None else ("raw",)):
                v = current_val(weights)
                log_line(out, {"job": name, "event": "val", "step": step, "weights": weights, **v})
                if v["dice"] > best["dice"]:
                    best = {**v, "step": step, "weights": weights}
                    src = ema if weights == "ema" else net.state_dict()
                    best_state = {n: p.detach().clone() for n, p in src.items()}
            t_val = time.perf_counter()
        if time.perf_counter() - last_save >= SAVE_EVERY_S:
            write_best() if job["keep"] == "best" else write_milestones()
            last_save = time.perf_counter()

    # the end of the budget: a last validation and the final files
    if job["keep"] == "best":
        for weights in (("raw", "ema") if ema is not None else ("raw",)):
            v = current_val(weights)
            log_line(out, {"job": name, "event": "val", "step": step, "weights": weights, "final": True, **v})
            if v["dice"] > best["dice"]:
                best = {**v, "step": step, "weights": weights}
                src = ema if weights == "ema" else net.state_dict()
                best_state = {n: p.detach().clone() for n, p in src.items()}
        write_best()
    else:
        kept[step] = {n: p.detach().clone() for n, p in net.state_dict().items()}
        kept_val[step] = current_val("raw")
        log_line(out, {"job": name, "event": "milestone", "step": step, "final": True, **kept_val[step]})
        write_milestones()
    summary = {**base, "event": "done", "steps": step, "elapsed_s": round(time.perf_counter() - t0, 1),
               "best": best if job["keep"] == "best" else None,
               "milestones": sorted(kept) if job["keep"] == "milestones" else None}
    log_line(out, summary)
    return summary


# --------------------------------------------------------------------------------------------
# engine checks
# --------------------------------------------------------------------------------------------
def _no_simpleitk() -> None:
    """Let the engine's modules import where SimpleITK is absent: the array path used here never
    calls it (reading and writing files does, and stays untested on the GPU machine)."""
    import importlib.util

    if "SimpleITK" not in sys.modules and importlib.util.find_spec("SimpleITK") is None:
        import types

        sys.modules["SimpleITK"] = types.ModuleType("SimpleITK")


def cuda_consistency(smoke: bool) -> dict:
    """The shipped bundle's CARD trajectory on a phantom: CPU vs CUDA labels, CUDA twice."""
    _no_simpleitk()
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.scaffold import synthetic_cine_volume
    from cardseg.segment import trajectory_on_slices, normalized_slices

    vol, _ = synthetic_cine_volume((10, 216, 256), seed=3)
    cpu_b = load_bundle(device="cpu")
    slices = normalized_slices(vol, cpu_b)
    ref = trajectory_on_slices(slices, vol.spacing[:2], cpu_b, "card", "cpu", batch_size=10)
    res = {"bundle": cpu_b.ident, "slices": int(slices.shape[0])}
    if smoke or not torch.cuda.is_available():
        res["cuda"] = "not available"
        return res
    gpu_b = load_bundle(device="cuda")
    runs = [trajectory_on_slices(slices, vol.spacing[:2], gpu_b, "card", "cuda", batch_size=10) for _ in range(2)]
    lab_cpu = ref.logits.argmax(1)
    lab_gpu = [r.logits.argmax(1) for r in runs]
    res.update({
        "labels_cpu_vs_cuda_equal_fraction": float((lab_cpu == lab_gpu[0]).float().mean()),
        "labels_cpu_vs_cuda_differ_pixels": int((lab_cpu != lab_gpu[0]).sum()),
        "max_abs_logit_diff_cpu_vs_cuda": float((ref.logits - runs[0].logits).abs().max()),
        "max_abs_tac_diff_cpu_vs_cuda": float((ref.tac - runs[0].tac).abs().max()),
        "cuda_runs_bit_identical_logits": bool(torch.equal(runs[0].logits, runs[1].logits)),
        "cuda_runs_bit_identical_tac": bool(torch.equal(runs[0].tac, runs[1].tac)),
        "cuda_runs_max_abs_logit_diff": float((runs[0].logits - runs[1].logits).abs().max()),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
    })
    return res


def _timed(fn, cuda: bool, repeats: int) -> List[float]:
    """Two warm-up calls, then ``repeats`` timed calls (seconds, sorted)."""
    def once() -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    once()
    once()
    return sorted(once() for _ in range(repeats))


def schedule_variants(primary, reference, x: torch.Tensor, steps, k: int, sched, repeats: int) -> dict:
    """The trajectory under every execution schedule of :mod:`cardseg.method.gpu_exec`, timed in one run.

    For each family (eager fp32, eager bf16, CUDA graph fp32, CUDA graph bf16): ``uc_ms``,
    ``card_ms``, ``card_streams_ms`` (reference on a second stream), the reference's own five
    forwards ``reference_ms``, the ratios, the *floor* ``1 + reference_ms / uc_ms`` and, against
    the eager fp32 CARD trajectory, the label agreement and the largest TAC difference. Each
    family is guarded: one that fails (e.g. capture unsupported) records its error.
    """
    from cardseg.method.diffusion import uniform_state
    from cardseg.method.gpu_exec import GraphedTrajectory, run_trajectory_fast

    cuda = x.device.type == "cuda"
    b, _, h, w = x.shape
    states = [uniform_state((b, h, w), k, device=x.device) for _ in steps]
    t_batches = [torch.full((b,), t, dtype=torch.long, device=x.device) for t in steps]
    ms = lambda ts: round(1000 * ts[len(ts) // 2], 2)  # noqa: E731 - median in ms
    with torch.no_grad():
        ref_eager = run_trajectory_fast(primary, reference, x, steps, k, "card", sched)
    out: dict = {}
    families = [("eager_fp32", False, None), ("eager_bf16", False, torch.bfloat16)]
    if cuda:
        families += [("graph_fp32", True, None), ("graph_bf16", True, torch.bfloat16)]
    for name, graph, dtype in families:
        fam: dict = {}
        try:
            def ref_only():
                with torch.no_grad(), (torch.autocast("cuda", dtype=dtype) if dtype is not None and cuda
                                       else torch.autocast("cpu", enabled=False)):
                    for s, tb in zip(states, t_batches):
                        reference(x, s, tb)

            runners = {}
            if graph:
                for label, mode, streams in (("uc", "uc", False), ("card", "card", False),
                                             ("card_streams", "card", True)):
                    g = GraphedTrajectory(primary, reference, x, steps, k, mode=mode, schedule=sched,
                                          streams=streams, dtype=dtype)
                    runners[label] = (lambda g=g: g(x))
                ref_graph = torch.cuda.CUDAGraph()
                ref_only()
                with torch.cuda.graph(ref_graph):
                    ref_only()
                runners["reference"] = ref_graph.replay
            else:
                for label, mode, streams in (("uc", "uc", False), ("card", "card", False),
                                             ("card_streams", "card", True)):
                    runners[label] = (lambda mode=mode, streams=streams: run_trajectory_fast(
                        primary, reference, x, steps, k, mode, sched, streams=streams, dtype=dtype))
                runners["reference"] = ref_only
            for label, fn in runners.items():
                ts = _timed(fn, cuda, repeats)
                fam[f"{label}_ms"] = ms(ts)
                fam[f"{label}_ms_all"] = [round(1000 * t, 2) for t in ts]
            fam["ratio"] = round(fam["card_ms"] / fam["uc_ms"], 3)
            fam["ratio_streams"] = round(fam["card_streams_ms"] / fam["uc_ms"], 3)
            fam["floor"] = round(1 + fam["reference_ms"] / fam["uc_ms"], 3)
            for label in ("card", "card_streams"):
                res = runners[label]()
                agree = (res.logits.argmax(1) == ref_eager.logits.argmax(1)).float().mean()
                fam[f"{label}_label_agreement_vs_eager_fp32"] = float(agree)
                fam[f"{label}_max_abs_tac_diff_vs_eager_fp32"] = float((res.tac - ref_eager.tac).abs().max())
        except Exception as exc:  # noqa: BLE001 - one schedule failing must not hide the others
            fam["error"] = f"{type(exc).__name__}: {exc}"
            fam["traceback"] = traceback.format_exc()[-1500:]
        out[name] = fam
    return out


def paper_scale_timing(smoke: bool, repeats: int = 5) -> dict:
    """Paper Sec. "Computational overhead": the primary alone vs primary + reference (CARD) over
    5 sampled steps on a batch of 32 slices of 256 x 256, random weights, median of runs, under
    every execution schedule (:func:`schedule_variants`). ``uc_ms``/``card_ms``/``ratio`` are the
    eager fp32 figures (the paper's setting)."""
    from cardseg.method.diffusion import CategoricalSchedule, default_sampling_steps
    from cardseg.method.networks import build_network, count_parameters

    cuda = torch.cuda.is_available() and not smoke
    dev = torch.device("cuda" if cuda else "cpu")
    size, batch, p_size = (256, 32, "base") if not smoke else (64, 2, "mini")
    torch.manual_seed(0)
    primary = build_network({"arch": "time-swinunetr", "size": p_size, "num_classes": 4}).to(dev).eval()
    reference = build_network({"arch": "time-swinunetr", "size": "mini", "num_classes": 4}).to(dev).eval()
    x = torch.rand(batch, 1, size, size, device=dev)
    steps = default_sampling_steps(50, 5)
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "primary_parameters": count_parameters(primary), "reference_parameters": count_parameters(reference),
           "input": [batch, 1, size, size], "steps": steps, "dtype": "float32", "repeats": repeats}
    out["schedules"] = schedule_variants(primary, reference, x, steps, 4, CategoricalSchedule(50), repeats)
    base = out["schedules"]["eager_fp32"]
    out.update({"uc_ms": base["uc_ms"], "card_ms": base["card_ms"], "ratio": round(base["card_ms"] / base["uc_ms"], 3),
                "floor": base["floor"]})
    out["paper"] = {"uc_ms": 1736.8, "card_ms": 2015.5, "ratio": 1.16}
    return out


def bundle_timing(smoke: bool, repeats: int = 10) -> dict:
    """The shipped bundle's networks on one 10-slice phantom volume (its real grid and weights)
    under every execution schedule: the overhead a user of ``cardseg segment --device cuda`` sees."""
    _no_simpleitk()
    from cardseg.bundle.loading import load_bundle
    from cardseg.bundle.scaffold import synthetic_cine_volume
    from cardseg.segment import network_inputs

    cuda = torch.cuda.is_available() and not smoke
    dev = "cuda" if cuda else "cpu"
    vol, _ = synthetic_cine_volume((10, 216, 256) if not smoke else (2, 64, 64), seed=3)
    b = load_bundle(device=dev)
    x, _ = network_inputs(vol, b)
    x = x.float().to(dev)
    res = {"bundle": b.ident, "input": list(x.shape), "device": torch.cuda.get_device_name() if cuda else "cpu"}
    res["schedules"] = schedule_variants(b.primary, b.reference, x, b.sampled_steps, b.num_classes, b.schedule,
                                         repeats if not smoke else 2)
    return res


def run_checks(out: Path, smoke: bool) -> dict:
    res: dict = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        res["gpu"] = torch.cuda.get_device_name()
    for key, fn in (("paper_scale_timing", paper_scale_timing), ("bundle_timing", bundle_timing),
                    ("cuda_consistency", cuda_consistency)):
        t0 = time.perf_counter()
        try:
            res[key] = fn(smoke)
        except Exception as exc:  # noqa: BLE001 - one failed check must not stop the run
            res[key] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
        res[key + "_s"] = round(time.perf_counter() - t0, 1)
        (out / "engine.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items()}, default=str)[:3000], flush=True)
    return res


# --------------------------------------------------------------------------------------------
# the whole run
# --------------------------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="One GPU run: engine checks, then every network at once.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--pack", default=str(ROOT / "Training" / "gpu" / "pack"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=420.0, help="training wall-clock budget of every job")
    ap.add_argument("--batch-size", type=int, help="every job's batch (default: each job's own)")
    ap.add_argument("--jobs", default=",".join(DEFAULT_JOBS),
                    help=f"comma-separated, from {', '.join(JOBS)} (default {','.join(DEFAULT_JOBS)})")
    ap.add_argument("--no-checks", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny batch and budget: the test suite's rehearsal")
    ap.add_argument("--job", help=argparse.SUPPRESS)  # internal: run one job in this process
    ap.add_argument("--alone", action="store_true", help=argparse.SUPPRESS)  # internal: no primary beside it
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-from", action="append", default=[], metavar="[JOB=]FILE",
                    help="continue a job from a returned .safetensors (a bare FILE: the only job); repeatable")
    ap.add_argument("--lr-scale", type=float, default=1.0, help="multiply every job's learning rate")
    ap.add_argument("--p-uncond", type=float, default=0.2, help="diffusion jobs: probability of zeroing the image")
    ap.add_argument("--val-every-s", type=float, default=30.0, help="seconds between validations")
    a = ap.parse_args(argv)
    out, pack = Path(a.out), Path(a.pack)
    out.mkdir(parents=True, exist_ok=True)
    if not (pack / "pack.json").is_file():
        print(f"run: {pack}: no pack.json (build one with Training/gpu/build_pack.py)", file=sys.stderr)
        return 2
    if a.job:
        if a.smoke:
            torch.set_num_threads(1)
        run_job(a.job, pack, out, a.budget_s, a.batch_size, a.seed, a.smoke, (a.init_from or [None])[0],
                a.lr_scale, a.p_uncond, a.val_every_s, share_with_primary=not a.alone)
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
            print(f"run: --init-from {item}: {'no such job in --jobs' if name not in jobs else 'no such file'}",
                  file=sys.stderr)
            return 2
        inits[name] = path
    if not a.no_checks:
        run_checks(out, a.smoke)
    procs = {}
    for i, name in enumerate(jobs):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--pack", str(pack), "--out", str(out), "--job", name,
               "--budget-s", str(a.budget_s), "--seed", str(a.seed + i), "--lr-scale", str(a.lr_scale),
               "--p-uncond", str(a.p_uncond), "--val-every-s", str(a.val_every_s)]
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
