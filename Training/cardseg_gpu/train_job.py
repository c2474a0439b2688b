"""One job of the GPU run: one network trained for its budget (or, in smoke mode, for exactly
:data:`cardseg_gpu.jobs.SMOKE_STEPS` steps), validated, and written to ``OUT`` as it goes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, Optional

import torch

from cardseg_gpu.device_data import DeviceAugment, as_float, load_pack, noisy_inputs
from cardseg_gpu.jobs import JOB_FILES, JOBS, MILESTONES, PER_FILE, SAVE_EVERY_S, SMOKE_STEPS, lr_factor
from cardseg_gpu.outputs import log_line, save_weights
from cardseg_gpu.validation import validate


def run_job(
    name: str,
    pack: Path,
    out: Path,
    budget_s: float,
    batch: Optional[int],
    seed: int,
    smoke: bool,
    init_from: Optional[str] = None,
    lr_scale: float = 1.0,
    p_uncond: float = 0.2,
    val_every_s: float = 30.0,
    share_with_primary: bool = True,
) -> dict:
    from cardseg.method.diffusion import CategoricalSchedule, default_sampling_steps
    from cardseg.method.networks import build_network, count_parameters
    from cardseg_train.training.losses import AleatoricLoss, DiffusionLoss, SegmentationLoss

    job = JOBS[name]
    if share_with_primary:  # the lower-priority jobs leave the GPU to the primary's annealing
        budget_s = budget_s * float(job.get("budget_frac", 1.0))
    batch = int(batch) if batch else int(job.get("batch", 32))
    max_steps = int(job.get("max_steps", 10**9))
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
    p_uncond = float(job.get("p_uncond", p_uncond))  # a job's own recipe wins over the run's default
    p_focus = float(job.get("p_focus", 0.0))
    opt = torch.optim.AdamW(net.parameters(), lr=job["lr"], weight_decay=1e-5)
    ema = None
    if job.get("ema"):  # an exponential moving average of the weights, validated beside them
        ema = {n: p.detach().clone().float() for n, p in net.state_dict().items()}
        ema_keys = [n for n, p in net.state_dict().items() if p.is_floating_point()]
        live = [net.state_dict()[n] for n in ema_keys]  # views of the live parameters and buffers
        shadow = [ema[n] for n in ema_keys]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
    n_train = data["train_images"].shape[0]
    base = {
        "job": name,
        "network": {k_: v for k_, v in spec.items() if k_ != "num_classes"},
        "parameters": count_parameters(net),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "batch_size": batch,
        "budget_s": budget_s,
        "lr": job["lr"],
        "seed": seed,
        "p_uncond": p_uncond,
        "p_focus": p_focus,
        "init_from": Path(init_from).name if init_from else None,
        "pack": {
            k_: meta_pack.get(k_)
            for k_ in ("data", "pixel_spacing_mm", "input_size", "preprocessing", "split", "data_sha256")
        },
    }
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
            save_weights(
                files[0],
                best_state,
                {**base, "step": best["step"], "val": best, "elapsed_s": round(time.perf_counter() - t0, 1)},
            )

    def write_milestones() -> None:
        order = sorted(kept)
        per = PER_FILE if len(files) > 1 else len(order)  # a single file holds every checkpoint
        for i, path in enumerate(files):
            part = order[i * per : (i + 1) * per] if i < len(files) - 1 else order[i * per :]
            if not part:
                continue
            tensors = {f"step{s}.{n}": v for s in part for n, v in kept[s].items()}
            save_weights(
                path,
                tensors,
                {
                    **base,
                    "checkpoints": {str(s): kept_val.get(s, {}) for s in part},
                    "elapsed_s": round(time.perf_counter() - t0, 1),
                },
            )

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
                img, x_t, t = noisy_inputs(schedule, img, lab, k, p_uncond=p_uncond, p_focus=p_focus, focus_steps=steps)
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
            log_line(
                out,
                {
                    "job": name,
                    "event": "train",
                    "step": step,
                    "loss": round(cur, 5),
                    "lr": opt.param_groups[0]["lr"],
                    "steps_per_s": round(n_sum / (now - t_log), 2),
                    "elapsed_s": round(now - t0, 1),
                },
            )
            t_log, n_sum = now, 0
        if job["keep"] == "best" and now - t_val >= val_every:
            for weights in ("raw", "ema") if ema is not None else ("raw",):
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
        for weights in ("raw", "ema") if ema is not None else ("raw",):
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
    summary = {
        **base,
        "event": "done",
        "steps": step,
        "elapsed_s": round(time.perf_counter() - t0, 1),
        "best": best if job["keep"] == "best" else None,
        "milestones": sorted(kept) if job["keep"] == "milestones" else None,
    }
    log_line(out, summary)
    return summary
