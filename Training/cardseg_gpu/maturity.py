"""The reference's maturity axis as curves (paper Fig. 5, read along training length).

    python Training/cardseg_gpu/maturity.py --choice "runs 1-2=Training/results/acdc-2.1.0/gpu/reference_choice.json" \
           --choice "run 4=Training/results/acdc-2.1.0/gpu/reference_choice_run4.json" \
           --out maturity.png --json maturity.json

Each ``--choice LABEL=FILE`` is the output of ``choose_reference.py`` (candidates named
``reference-<capacity>-s<steps>``, each with its CARD validation-pool NLL). One curve is drawn per
training run and capacity: a run saves the same network at several lengths, so the points of one
curve are one network growing up, and two runs of the same capacity are two seeds. The summary
says, per curve, where its lowest NLL lies and whether that minimum is *interior* (a longer
checkpoint is worse: the curve has turned) or at the last saved length (no minimum yet: the
premise that an immature reference is best is not supported within the tested range).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
for _sub in ("CARDSegment", "Training"):
    if str(ROOT / _sub) not in sys.path:
        sys.path.insert(0, str(ROOT / _sub))

import numpy as np  # noqa: E402

from cardseg_gpu.choose_reference import sweep_grid  # noqa: E402

Curve = List[Tuple[int, float]]


def maturity_curves(choices: Dict[str, dict]) -> Dict[str, Curve]:
    """``{label: choice JSON}`` → ``{"label: capacity": [(steps, card_nll), ...]}`` sorted by steps."""
    curves: Dict[str, Curve] = {}
    for label, choice in choices.items():
        caps, steps, grid = sweep_grid(choice["candidates"])
        for i, cap in enumerate(caps):
            pts = [(s, float(grid[i, j])) for j, s in enumerate(steps) if np.isfinite(grid[i, j])]
            if pts:
                curves[f"{label}: {cap}"] = pts
    return curves


def curve_minima(curves: Dict[str, Curve]) -> Dict[str, dict]:
    """Per curve: the length with the lowest NLL, its NLL, the longest length saved, and whether
    the minimum is interior (some longer checkpoint is worse) or sits at the longest length."""
    out = {}
    for name, pts in curves.items():
        best_steps, best = min(pts, key=lambda p: p[1])
        longest = max(s for s, _ in pts)
        out[name] = {
            "best_steps": best_steps,
            "best_card_nll": best,
            "longest_steps": longest,
            "points": len(pts),
            "interior_minimum": best_steps < longest,
        }
    return out


def pool_ts_nll(choices: Dict[str, dict]) -> float | None:
    """TS on the same validation pool (the line every reference must beat), when all choices agree."""
    vals = {round(r["ts_nll"], 4) for c in choices.values() for r in c["candidates"].values() if "ts_nll" in r}
    return vals.pop() if len(vals) == 1 else None


def plot_maturity(curves: Dict[str, Curve], path: Path, ts_nll: float | None = None) -> Path:
    """CARD NLL x 100 against training steps (log axis), one line per curve, minima marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for name, pts in curves.items():
        s, v = zip(*pts)
        (line,) = ax.plot(s, 100 * np.array(v), marker="o", label=name)
        j = int(np.argmin(v))
        ax.plot([s[j]], [100 * v[j]], marker="*", markersize=14, color=line.get_color(), markeredgecolor="k")
    if ts_nll is not None:
        ax.axhline(100 * ts_nll, color="grey", linestyle="--", label="TS, same pool")
    ax.set_xscale("log")
    ticks = sorted({st for pts in curves.values() for st, _ in pts})
    ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=7, rotation=45)
    ax.minorticks_off()
    ax.set_xlabel("reference training steps")
    ax.set_ylabel("CARD NLL x 100 (validation pool)")
    ax.set_title("Reference maturity: lower is better, star = each curve's minimum", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Reference maturity curves from choose_reference outputs.")
    ap.add_argument("--choice", action="append", required=True, metavar="LABEL=FILE")
    ap.add_argument("--out", required=True, metavar="PNG")
    ap.add_argument("--json", metavar="FILE", help="also write the curves and their minima")
    a = ap.parse_args(argv)
    choices = {}
    for item in a.choice:
        label, sep, file = item.partition("=")
        if not sep or not Path(file).is_file():
            print(f"maturity: --choice {item}: expected LABEL=FILE of an existing choice JSON", file=sys.stderr)
            return 2
        choices[label] = json.loads(Path(file).read_text())
    curves = maturity_curves(choices)
    if not curves:
        print("maturity: no candidate named reference-<capacity>-s<steps> in the choices", file=sys.stderr)
        return 2
    ts = pool_ts_nll(choices)
    plot_maturity(curves, Path(a.out), ts)
    minima = curve_minima(curves)
    for name, m in minima.items():
        where = "interior" if m["interior_minimum"] else "at the longest length (no minimum yet)"
        print(
            f"{name:32s} best {100 * m['best_card_nll']:.2f} at {m['best_steps']} steps of "
            f"{m['longest_steps']}: {where}"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {"ts_nll": ts, "curves": {k: [list(p) for p in v] for k, v in curves.items()}, "minima": minima},
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
