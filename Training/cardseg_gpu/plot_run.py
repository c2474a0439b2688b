"""Learning curves of one GPU run (or a run and its continuation) from the returned ``log.jsonl`` files.

    python Training/cardseg_gpu/plot_run.py OUT1/log.jsonl [OUT2/log.jsonl ...] -o curves.png

Validation Dice (network grid, the engine's 5-step sampler for diffusion networks) against
training steps, one line per job; a continuation's steps are counted after its first run's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def curves(logs):
    """``{job: [(step, dice), ...]}`` over the logs in order, continuing step counts per job."""
    out, offset = {}, {}
    for log in logs:
        rows = [json.loads(x) for x in Path(log).read_text().splitlines() if x.strip()]
        last = {}
        for r in rows:
            job = r.get("job")
            if job is None:
                continue
            name = job
            if r.get("event") == "val" and r.get("weights", "raw") == "ema":
                name = f"{job} (EMA)"
            if r.get("event") in ("val", "milestone"):
                out.setdefault(name, []).append((offset.get(job, 0) + int(r["step"]), float(r["dice"])))
            if r.get("event") == "done":
                last[job] = int(r["steps"])
        for job, steps in last.items():
            offset[job] = offset.get(job, 0) + steps
    return out


def main(argv=None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description="Plot validation Dice of a GPU run's jobs.")
    ap.add_argument("logs", nargs="+")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args(argv)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, pts in sorted(curves(a.logs).items()):
        xs, ys = zip(*sorted(pts))
        ax.plot(xs, ys, marker="o" if len(xs) < 12 else None, ms=3, label=name)
    ax.set_xlabel("training steps")
    ax.set_ylabel("validation Dice (network grid)")
    ax.set_ylim(0.5, 0.95)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    print(a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
