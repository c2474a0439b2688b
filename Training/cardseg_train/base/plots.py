"""Figures for run folders: the learning curve (training loss and validation Dice)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Dict, List, Sequence


def read_log(run: Path) -> List[Dict[str, float]]:
    """Rows of a run's ``log.csv`` with numeric values (empty cells dropped)."""
    rows = []
    with open(Path(run) / "log.csv", newline="") as f:
        for r in csv.DictReader(f):
            rows.append({k: float(v) for k, v in r.items() if v not in ("", None)})
    return rows


def plot_learning_curve(runs: Sequence[Path], out: Path, labels: Sequence[str] = ()) -> Path:
    """Training loss (left) and validation Dice per class (right) against step, one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_dice) = plt.subplots(1, 2, figsize=(10, 3.8))
    styles = {"val_dice": "-", "val_dice_RV": ":", "val_dice_MYO": "--", "val_dice_LV": "-."}
    for i, run in enumerate(runs):
        rows = read_log(Path(run))
        name = labels[i] if i < len(labels) else Path(run).name
        colour = f"C{i}"
        steps = [r["step"] for r in rows if "loss" in r]
        ax_loss.plot(steps, [r["loss"] for r in rows if "loss" in r], color=colour, lw=1, label=name)
        for key, ls in styles.items():
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                ax_dice.plot(
                    *zip(*pts),
                    ls,
                    color=colour,
                    marker="o",
                    ms=3,
                    label=f"{name} {key.replace('val_dice', 'mean').replace('mean_', '')}",
                )
    ax_loss.set(xlabel="step", ylabel="training loss", yscale="log", title="training loss")
    ax_dice.set(xlabel="step", ylabel="Dice (validation, network grid)", ylim=(0, 1), title="validation Dice")
    ax_loss.legend(fontsize=8)
    ax_dice.legend(fontsize=7, ncol=2, loc="lower right")
    for ax in (ax_loss, ax_dice):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
