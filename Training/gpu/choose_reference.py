"""Choose the reference's capacity and training length on the source-validation pool.

    python Training/gpu/choose_reference.py --primary runs/gpu/primary --candidates runs/gpu/reference-* \
        [--pack Training/gpu/pack] [--variants clean,noise] [--out choice.json] [--plot sweep.png]
    python Training/gpu/choose_reference.py --replot choice.json sweep.png   # the heat map again

The primary's reverse trajectory is run once per validation volume and variant, on the pack's
network grid (the validation volumes exactly as the engine maps them); every candidate
reference is evaluated on the primary's own states at every sampled step (paper Eq. 5), so
each candidate gets its own TAC map (Eq. 6) from one primary pass. CARD's temperature map is
then fitted per candidate (:func:`cardseg_train.calibration_fit.fit_card`) and the candidate
with the lowest pool NLL (ROI pixels, as ``cardseg fit-calibration``) wins. Test patients are
never read: the pack holds only the training and validation splits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _sub in ("CARDSegment", "Training"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402


class _Recorder(nn.Module):
    """Wraps the primary: returns its logits and keeps each step's softmax."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net, self.probs = net, []

    def forward(self, image, state, t):
        out = self.net(image, state, t)
        self.probs.append(out.softmax(dim=1))
        return out


class _Candidates(nn.Module):
    """Runs every candidate reference on the state it is given; returns the first one's logits."""

    def __init__(self, nets):
        super().__init__()
        self.nets = nn.ModuleList(nets)
        self.probs = [[] for _ in nets]

    def forward(self, image, state, t):
        outs = [n(image, state, t) for n in self.nets]
        for store, o in zip(self.probs, outs):
            store.append(o.softmax(dim=1))
        return outs[0]


#: the GPU run's reference jobs, as their run folders name them (reference-<name>-s<steps>)
GPU_CANDIDATES = {"mini": "time-swinunetr:mini", "unet": "time-unet:tiny"}


def sweep_grid(rows: dict):
    """Candidates named ``reference-<capacity>-s<steps>`` → ``(capacities, steps, nll (C, S))``,
    NaN where a capacity was not saved at a length (the paper's Fig. 5 axes)."""
    import re

    cells = {}
    for name, row in rows.items():
        m = re.fullmatch(r"(?:reference-)?(.+)-s(\d+)", name)
        if m:
            cells[(m.group(1), int(m.group(2)))] = row["card_nll"]
    caps = sorted({c for c, _ in cells}, key=lambda c: min(r.get("parameters", 0) for n, r in rows.items()
                                                            if n.startswith(f"reference-{c}-s") or n.startswith(f"{c}-s")))
    steps = sorted({s for _, s in cells})
    grid = np.full((len(caps), len(steps)), np.nan)
    for (c, s), v in cells.items():
        grid[caps.index(c), steps.index(s)] = v
    return caps, steps, grid


def plot_sweep(rows: dict, path: Path, title: str = "") -> Path:
    """Heat map of CARD's validation-pool NLL x 100 per reference capacity and training length,
    the lowest cell outlined (paper Fig. 5)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from cardseg.scaffold import parse_network

    caps, steps, grid = sweep_grid(rows)
    if not caps:
        raise ValueError("no candidate named reference-<capacity>-s<steps>")
    fig, ax = plt.subplots(figsize=(1.2 * len(steps) + 2.5, 0.8 * len(caps) + 1.8))
    im = ax.imshow(100 * grid, cmap="viridis_r", aspect="auto")
    for i in range(len(caps)):
        for j in range(len(steps)):
            if np.isfinite(grid[i, j]):
                light = grid[i, j] < np.nanmin(grid) + 0.5 * (np.nanmax(grid) - np.nanmin(grid))
                ax.text(j, i, f"{100 * grid[i, j]:.1f}", ha="center", va="center", color="k" if light else "w",
                        fontsize=9)
    bi, bj = np.unravel_index(np.nanargmin(grid), grid.shape)
    ax.add_patch(Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    labels = []
    for c in caps:
        n = next((r.get("parameters") for k, r in rows.items() if k.endswith(tuple(f"{c}-s{s}" for s in steps))), None)
        spec = GPU_CANDIDATES.get(c)
        if n is None and spec is not None:
            from cardseg.networks import build_network, count_parameters

            n = count_parameters(build_network({**parse_network(spec), "num_classes": 4}))
        labels.append((spec or c) + (f"\n{n / 1e6:.2f}M" if n else ""))
    ax.set_xticks(range(len(steps)), [str(s) for s in steps])
    ax.set_yticks(range(len(caps)), labels)
    ax.set_xlabel("reference training steps")
    ax.set_ylabel("reference capacity")
    ax.set_title(title or "CARD NLL x 100 on the validation pool (lowest outlined)", fontsize=10)
    fig.colorbar(im, ax=ax, label="NLL x 100")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    from cardseg.diffusion import CategoricalSchedule, default_sampling_steps
    from cardseg.metrics import roi_mask
    from cardseg.trajectory import js_divergence, run_trajectory
    from cardseg_train.calibration_fit import fit_card, fit_ts, perturb_image, pool_item, pool_nll
    from cardseg_train.corruptions import corruption_rng
    from cardseg_train.runs import load_run_network

    ap = argparse.ArgumentParser(description="Choose the reference on the validation pool (lowest CARD NLL).")
    ap.add_argument("--primary", required=True)
    ap.add_argument("--candidates", nargs="+", required=True)
    ap.add_argument("--pack", default=str(ROOT / "Training" / "gpu" / "pack"))
    ap.add_argument("--variants", default="clean,noise")
    ap.add_argument("--max-pixels", type=int, default=30000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out")
    ap.add_argument("--plot", metavar="PNG", help="also draw the capacity x training-length heat map (paper Fig. 5)")
    a = ap.parse_args(argv)

    primary, p_cfg, _ = load_run_network(a.primary)
    cands = [load_run_network(c)[0] for c in a.candidates]
    steps = list(p_cfg.sampled_steps or default_sampling_steps(50, 5))
    sched = CategoricalSchedule(50)
    with np.load(Path(a.pack) / "data.npz") as z:
        imgs, labs, cases = z["val_images"], z["val_labels"], z["val_cases"]
    pools = {c: [] for c in a.candidates}
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    from tqdm.auto import tqdm

    order = list(dict.fromkeys(cases.tolist()))
    bar = tqdm(total=len(order) * len(variants), desc="reference candidates", unit="item")
    for case in order:
        idx = np.flatnonzero(cases == case)
        img01 = imgs[idx].astype(np.float32) / 255.0
        lab = labs[idx].astype(np.int64)
        roi = roi_mask(lab > 0, 10)
        for variant in variants:
            rng = corruption_rng(case, f"pool:{variant}", 0)
            x = img01 if variant == "clean" else perturb_image(img01, variant, rng)
            logits_all, tacs = [], [[] for _ in cands]
            for i in range(0, len(idx), a.batch_size):
                xb = torch.from_numpy(np.ascontiguousarray(x[i:i + a.batch_size]))[:, None]
                rec, cs = _Recorder(primary), _Candidates(cands)
                with torch.no_grad():
                    res = run_trajectory(rec, xb, steps, 4, reference=cs, mode="card", schedule=sched)
                logits_all.append(res.logits)
                for j in range(len(cands)):
                    js = [js_divergence(p, q) for p, q in zip(rec.probs, cs.probs[j])]
                    tacs[j].append(torch.stack(js).mean(0))
            logits = torch.cat(logits_all).numpy()
            for j, c in enumerate(a.candidates):
                tac = torch.cat(tacs[j]).numpy()
                pools[c].append(pool_item(logits, tac, lab, roi, np.random.default_rng(0), a.max_pixels, case=case,
                                          variant=variant))
            bar.update(1)
    bar.close()
    rows = {}
    for c, pool in pools.items():
        card = fit_card(pool)
        rows[Path(c).name] = {"card_nll": pool_nll(card, pool), "ts_nll": pool_nll(fit_ts(pool), pool),
                              "parameters": sum(p.numel() for p in cands[a.candidates.index(c)].parameters()),
                              "mean_tac": float(np.mean([p.tac.mean() for p in pool])), "params": card.to_dict()}
        print(f"{Path(c).name:28s} CARD NLL {rows[Path(c).name]['card_nll']:.4f}  TS {rows[Path(c).name]['ts_nll']:.4f}  "
              f"mean TAC {rows[Path(c).name]['mean_tac']:.4f}", flush=True)
    best = min(rows, key=lambda k: rows[k]["card_nll"])
    result = {"chosen": best, "variants": variants, "candidates": rows,
              "objective": "CARD pool NLL over ROI pixels, validation volumes on the network grid"}
    print(f"chosen: {best}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    if a.plot:
        plot_sweep(rows, Path(a.plot))
    return 0


def replot(argv=None) -> int:
    """``choose_reference.py --replot CHOICE.json PNG``: the heat map of a saved choice."""
    choice, png = argv
    plot_sweep(json.loads(Path(choice).read_text())["candidates"], Path(png))
    return 0


if __name__ == "__main__":
    sys.exit(replot(sys.argv[2:]) if sys.argv[1:2] == ["--replot"] else main())
