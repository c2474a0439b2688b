"""Validation of a job's network on the pack's validation volumes."""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from cardseg_gpu.device_data import as_float
from cardseg_gpu.engine_env import no_simpleitk


@torch.no_grad()
def validate(net, volumes, kind: str, schedule, steps, k: int, batch: int = 64) -> Dict[str, float]:
    """Mean per-class Dice over validation volumes (foreground classes; a class absent from both
    label and prediction does not count), with the engine's sampler for diffusion networks."""
    from cardseg.method.trajectory import run_trajectory

    no_simpleitk()  # the engine's file I/O is never used here
    from cardseg_train.training.steps import dice_per_class

    was = net.training
    net.eval()
    scores = []
    for _, imgs, labs in volumes:
        preds = []
        for i in range(0, imgs.shape[0], batch):
            x = as_float(imgs[i : i + batch])
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
