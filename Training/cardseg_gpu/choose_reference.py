"""Choose the reference's capacity and training length on the source-validation pool.

    python Training/cardseg_gpu/choose_reference.py --primary runs/gpu/primary --candidates runs/gpu/reference-* \
        [--pack Training/cardseg_gpu/pack] [--variants clean,noise] [--out choice.json] [--plot sweep.png]
    python Training/cardseg_gpu/choose_reference.py --replot choice.json sweep.png   # the heat map again

The primary's reverse trajectory is run once per validation volume and variant, on the pack's
network grid (the validation volumes exactly as the engine maps them); every candidate
reference is evaluated on the primary's own states at every sampled step (paper Eq. 6), so
each candidate gets its own TAC map (Eq. 7) from one primary pass. CARD's temperature map is
then fitted per candidate (:func:`cardseg_train.calibration.fit.fit_card`) and the candidate
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


GPU_CANDIDATES = {
    "mini": "time-swinunetr:mini",
    "unet": "time-unet:tiny",
    "unet-micro": "time-unet:micro",
    "unet-small": "time-unet:small",
}


def sweep_grid(rows: dict):
    """Candidates named ``reference-<capacity>-s<steps>`` → ``(capacities, steps, nll (C, S))``,
    NaN where a capacity was not saved at a length (the paper's Fig. 5 axes)."""
    import re

    cells = {}
    for name, row in rows.items():
        m = re.fullmatch(r"(?:reference-)?(.+)-s(\d+)", name)
        if m:
            cells[(m.group(1), int(m.group(2)))] = row["card_nll"]
    caps = sorted({c for c, _ in cells}, key=lambda c: _capacity_parameters(c, rows) or 0)
    steps = sorted({s for _, s in cells})
    grid = np.full((len(caps), len(steps)), np.nan)
    for (c, s), v in cells.items():
        grid[caps.index(c), steps.index(s)] = v
    return caps, steps, grid


def _capacity_parameters(capacity: str, rows: dict):
    """Parameter count of a capacity: recorded in its rows, else that of its registered network
    (choices written before counts were recorded); None when neither is known."""
    import re

    counts = [
        r["parameters"]
        for n, r in rows.items()
        if r.get("parameters") and re.fullmatch(rf"(?:reference-)?{re.escape(capacity)}-s\d+", n)
    ]
    if counts:
        return min(counts)
    spec = GPU_CANDIDATES.get(capacity)
    if spec is None:
        return None
    from cardseg.method.networks import build_network, count_parameters
    from cardseg.bundle.scaffold import parse_network

    return count_parameters(build_network({**parse_network(spec), "num_classes": 4}))


def plot_sweep(rows: dict, path: Path, title: str = "") -> Path:
    """Heat map of CARD's validation-pool NLL x 100 per reference capacity and training length,
    the lowest cell outlined (paper Fig. 5)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    caps, steps, grid = sweep_grid(rows)
    if not caps:
        raise ValueError("no candidate named reference-<capacity>-s<steps>")
    fig, ax = plt.subplots(figsize=(1.2 * len(steps) + 2.5, 0.8 * len(caps) + 1.8))
    im = ax.imshow(100 * grid, cmap="viridis_r", aspect="auto")
    for i in range(len(caps)):
        for j in range(len(steps)):
            if np.isfinite(grid[i, j]):
                light = grid[i, j] < np.nanmin(grid) + 0.5 * (np.nanmax(grid) - np.nanmin(grid))
                ax.text(
                    j, i, f"{100 * grid[i, j]:.1f}", ha="center", va="center", color="k" if light else "w", fontsize=9
                )
    bi, bj = np.unravel_index(np.nanargmin(grid), grid.shape)
    ax.add_patch(Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    labels = []
    for c in caps:
        n = _capacity_parameters(c, rows)
        labels.append(GPU_CANDIDATES.get(c, c) + (f"\n{n / 1e6:.2f}M" if n else ""))
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


def _variant_image(img01: np.ndarray, case: str, variant: str) -> np.ndarray:
    """A validation volume ``(Z, H, W)`` in [0, 1] as the pool sees it under ``variant`` (seeded per case)."""
    from cardseg_train.data.perturb import perturb_image
    from cardseg_train.data.corruptions import corruption_rng

    return img01 if variant == "clean" else perturb_image(img01, variant, corruption_rng(case, f"pool:{variant}", 0))


def _file_sha(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def primary_pass(
    primary: nn.Module, volumes, images: dict, variants, steps, max_pixels: int, batch_size: int, progress=None
) -> list:
    """The primary's reverse trajectory once per validation volume and variant: what every
    candidate reference needs, kept at the pool's pixels only.

    volumes: ``[(case, labels (Z, H, W))]``; images: ``{(case, variant): (Z, H, W) image}`` (what
    :func:`_variant_image` gives; the candidates run on the same arrays). Returns one dict per (volume,
    variant): ``states`` ``(S, Z, H, W)`` uint8, the class of the one-hot state fed at each sampled
    step (255: the uniform start); ``probs`` ``(S, K, P)``, the primary's softmax at each step at
    the ``P`` pool pixels ``pixels`` (flat indices into ``(Z, H, W)``, the same pixels
    :func:`cardseg_train.calibration.pool.pool_item` keeps); ``logits`` ``(K, P)`` (final);
    ``labels`` ``(P,)``.
    """
    from cardseg.method.diffusion import CategoricalSchedule
    from cardseg.metrics.segmentation import roi_mask
    from cardseg.method.trajectory import run_trajectory

    sched = CategoricalSchedule(50)
    items = []
    for case, lab in volumes:
        roi = roi_mask(lab > 0, 10)
        flat = np.flatnonzero(roi)
        if max_pixels is not None and flat.size > max_pixels:  # pool_item's draw, exactly
            flat = flat[np.sort(np.random.default_rng(0).choice(flat.size, size=max_pixels, replace=False))]
        for variant in variants:
            x = images[(case, variant)]
            states, probs, logits = [], [], []
            for i in range(0, x.shape[0], batch_size):
                xb = torch.from_numpy(np.ascontiguousarray(x[i : i + batch_size]))[:, None]
                kept = {}

                def record(image, state, t, _kept=kept):
                    out = primary(image, state, t)
                    _kept[int(t[0])] = (state, out.softmax(dim=1))
                    return out

                with torch.no_grad():
                    res = run_trajectory(record, xb, steps, 4, mode="uc", schedule=sched)
                k = res.logits.shape[1]
                st = []
                for t in steps:
                    state = kept[t][0]
                    uniform = bool(((state - 1.0 / k).abs() < 1e-6).all())
                    one_hot = bool(((state == 0) | (state == 1)).all() and (state.sum(1) == 1).all())
                    if not (uniform or one_hot):
                        raise RuntimeError("the sampler's states are neither one-hot nor uniform; cannot cache them")
                    st.append(
                        np.full(state.shape[:1] + state.shape[2:], 255, np.uint8)
                        if uniform
                        else state.argmax(1).numpy().astype(np.uint8)
                    )
                states.append(np.stack(st))
                probs.append(np.stack([kept[t][1].numpy() for t in steps]))
                logits.append(res.logits.numpy())
            states, probs, logits = np.concatenate(states, 1), np.concatenate(probs, 1), np.concatenate(logits, 0)
            zyx = np.unravel_index(flat, lab.shape)
            items.append(
                {
                    "case": case,
                    "variant": variant,
                    "states": states,
                    "pixels": flat,
                    "probs": probs.transpose(0, 2, 1, 3, 4)[:, :, zyx[0], zyx[1], zyx[2]].astype(np.float32),
                    "logits": logits[zyx[0], :, zyx[1], zyx[2]].T.astype(np.float32),
                    "labels": lab.reshape(-1)[flat].astype(np.int64),
                }
            )
            if progress is not None:
                progress(1)
    return items


def save_items(items: list, path: Path, key: dict) -> None:
    arrays = {"key": np.array(json.dumps(key, sort_keys=True))}
    for n, it in enumerate(items):
        arrays[f"{n}.meta"] = np.array(json.dumps({"case": it["case"], "variant": it["variant"]}))
        for name in ("states", "pixels", "probs", "logits", "labels"):
            arrays[f"{n}.{name}"] = it[name]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def load_items(path: Path, key: dict):
    """The cached primary pass, or None when absent or made with other settings."""
    if not path.is_file():
        return None
    with np.load(path) as z:
        if json.loads(str(z["key"])) != json.loads(json.dumps(key, sort_keys=True)):
            return None
        n = len([k for k in z.files if k.endswith(".meta")])
        return [
            {
                **json.loads(str(z[f"{i}.meta"])),
                **{name: z[f"{i}.{name}"] for name in ("states", "pixels", "probs", "logits", "labels")},
            }
            for i in range(n)
        ]


def candidate_pool(reference: nn.Module, items: list, images: dict, steps, batch_size: int) -> list:
    """One candidate's pool: the reference on the primary's cached state at every sampled step
    (paper Eq. 6), JS against the primary's softmax at the pool pixels, averaged over the steps
    (Eq. 7). images: ``{(case, variant): (Z, H, W) image}``."""
    from cardseg.method.trajectory import js_divergence
    from cardseg_train.calibration.pool import PoolItem

    pool = []
    for it in items:
        x = images[(it["case"], it["variant"])]
        k = it["logits"].shape[0]
        z, h, w = it["states"].shape[1:]
        zyx = np.unravel_index(it["pixels"], (z, h, w))
        js = []
        for si, t in enumerate(steps):
            q = np.empty((z, k, h, w), np.float32)
            for i in range(0, z, batch_size):
                xb = torch.from_numpy(np.ascontiguousarray(x[i : i + batch_size]))[:, None]
                cls = torch.from_numpy(it["states"][si, i : i + batch_size].astype(np.int64))
                state = (
                    torch.full((cls.shape[0], k) + cls.shape[1:], 1.0 / k)
                    if bool((cls == 255).all())
                    else torch.nn.functional.one_hot(cls, k).permute(0, 3, 1, 2).float()
                )
                with torch.no_grad():
                    q[i : i + batch_size] = reference(xb, state, torch.full((cls.shape[0],), t)).softmax(dim=1).numpy()
            q_px = q[zyx[0], :, zyx[1], zyx[2]].T  # (K, P)
            js.append(js_divergence(torch.from_numpy(it["probs"][si])[None], torch.from_numpy(q_px)[None])[0].numpy())
        pool.append(PoolItem(it["logits"], it["labels"], np.mean(js, axis=0), case=it["case"], variant=it["variant"]))
    return pool


def build_parser() -> argparse.ArgumentParser:
    from cardseg_train.base.cli_options import add_cache

    ap = argparse.ArgumentParser(description="Choose the reference on the validation pool (lowest CARD NLL).")
    ap.add_argument("--primary", required=True)
    ap.add_argument("--candidates", nargs="+", required=True)
    ap.add_argument("--pack", default=str(ROOT / "Training" / "cardseg_gpu" / "pack"))
    ap.add_argument("--variants", default="clean,noise")
    ap.add_argument("--max-pixels", type=int, default=30000)
    ap.add_argument("--batch-size", type=int, default=16)
    add_cache(ap, "choose_reference", "where the primary's pass is cached")
    ap.add_argument(
        "--merge",
        metavar="CHOICE.json",
        help="keep the rows of an earlier choice (same primary and pool) for candidates not given now",
    )
    ap.add_argument("--out")
    ap.add_argument("--plot", metavar="PNG", help="also draw the capacity x training-length heat map (paper Fig. 5)")
    return ap


def validation_pool(pack: Path, variants: list):
    """The pack's validation volumes: ``([(case, labels (Z, H, W))], {(case, variant): image (Z, H, W)})``,
    the images in ``[0, 1]`` under each variant (:func:`_variant_image`)."""
    with np.load(pack / "data.npz") as z:
        imgs, labs, cases = z["val_images"], z["val_labels"], z["val_cases"]
    order = list(dict.fromkeys(cases.tolist()))
    volumes = [(c, labs[cases == c].astype(np.int64)) for c in order]
    images = {
        (c, v): _variant_image(imgs[cases == c].astype(np.float32) / 255.0, c, v) for c in order for v in variants
    }
    return volumes, images


def cached_primary_pass(
    a: argparse.Namespace, primary: nn.Module, volumes: list, images: dict, variants: list, steps: list
) -> list:
    """:func:`primary_pass` on the validation volumes and images (:func:`validation_pool`), read from
    ``--cache`` when it was made with the same primary, pack, variants, pixels and steps, and
    kept there otherwise."""
    from tqdm.auto import tqdm

    pack_meta = json.loads((Path(a.pack) / "pack.json").read_text())
    key = {
        "primary": _file_sha(Path(a.primary) / "best.pt"),
        "pack": pack_meta.get("data_sha256"),
        "variants": variants,
        "max_pixels": a.max_pixels,
        "steps": steps,
    }
    cache = Path(a.cache) / f"primary-{key['primary'][:16]}.npz" if a.cache else None
    items = load_items(cache, key) if cache is not None else None
    if items is None:
        bar = tqdm(total=len(volumes) * len(variants), desc="primary trajectories", unit="item")
        items = primary_pass(primary, volumes, images, variants, steps, a.max_pixels, a.batch_size, bar.update)
        bar.close()
        if cache is not None:
            save_items(items, cache, key)
    else:
        print(f"primary pass: {len(items)} items from {cache}")
    return items


def candidate_row(net: nn.Module, items: list, images: dict, steps: list, batch_size: int) -> dict:
    """One candidate's row of the choice: CARD's and TS's pool NLL after fitting, its size, its
    mean TAC and CARD's fitted parameters."""
    from cardseg_train.calibration.fit import fit_card, fit_ts, pool_nll

    pool = candidate_pool(net, items, images, steps, batch_size)
    card = fit_card(pool)
    return {
        "card_nll": pool_nll(card, pool),
        "ts_nll": pool_nll(fit_ts(pool), pool),
        "parameters": sum(p.numel() for p in net.parameters()),
        "mean_tac": float(np.mean([p.tac.mean() for p in pool])),
        "params": card.to_dict(),
    }


def main(argv=None) -> int:
    from cardseg.method.diffusion import default_sampling_steps
    from cardseg_train.training.runs import load_run_network

    a = build_parser().parse_args(argv)
    from tqdm.auto import tqdm

    primary, p_cfg, _ = load_run_network(a.primary)
    steps = list(p_cfg.sampled_steps or default_sampling_steps(50, 5))
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    volumes, images = validation_pool(Path(a.pack), variants)
    items = cached_primary_pass(a, primary, volumes, images, variants, steps)
    rows = {}
    if a.merge:
        earlier = json.loads(Path(a.merge).read_text())
        if earlier.get("variants") != variants:
            print(f"choose_reference: --merge {a.merge} was made with other variants", file=sys.stderr)
            return 2
        rows.update(earlier["candidates"])
    for c in tqdm(a.candidates, desc="reference candidates", unit="candidate"):
        name = Path(c).name
        rows[name] = candidate_row(load_run_network(c)[0], items, images, steps, a.batch_size)
        print(
            f"{name:28s} CARD NLL {rows[name]['card_nll']:.4f}  TS {rows[name]['ts_nll']:.4f}  "
            f"mean TAC {rows[name]['mean_tac']:.4f}",
            flush=True,
        )
    best = min(rows, key=lambda k: rows[k]["card_nll"])
    result = {
        "chosen": best,
        "variants": variants,
        "candidates": rows,
        "objective": "CARD pool NLL over ROI pixels, validation volumes on the network grid",
    }
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
