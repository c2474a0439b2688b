"""How well each candidate reference's disagreement marks the primary's errors, on validation.

``Training/cardseg_gpu/choose_reference.py`` chooses the reference by CARD's pool NLL (calibration).
The reviewer's flagged regions are cut from the same disagreement (TAC, paper Eq. 7; since 2.4.0 with
the flipped runs' disagreement added), so a
reference is also judged here by its map: with the bundle's primary and each candidate
reference, every clean validation volume is segmented as the engine does
(:func:`cardseg_train.review.data.collect_maps`, cached per weights), and the TAC smoothed
in-plane by 2 px (the review rules' map, :func:`cardseg.review.error_map.smoothed`) is scored
against the primary's substantial errors (:func:`cardseg.review.coverage.error_labels`):

* voxel AUROC and AUPRC inside the predicted heart's neighbourhood (:func:`map_quality`);
* the share of substantial errors covered (half their pixels) by the map's highest voxels at
  :data:`BURDENS` of the predicted heart, per volume (the review measure's baseline curve).

The primary, its segmentation and the errors are the same for every candidate; only the map
changes. Test patients are never read. ::

    python -m cardseg_train.studies.reference_maps --bundle B --candidates runs/gpu4/reference-* \\
        --data ../shared/data/acdc --out Training/results/acdc-2.1.0/gpu/reference_maps
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from cardseg.base.errors import CardsegError
from cardseg.metrics.detection import detection_scores
from cardseg.review import coverage as cv
from cardseg.review.error_map import smoothed

from cardseg_train.base.cli_options import add_cache, add_overwrite, out_record, write_recorded
from cardseg_train.training.export import swap_reference
from cardseg_train.base.report_files import atomic_write
from cardseg_train.training.config import read_run_config

#: shares of the predicted heart flagged by a map's highest voxels
BURDENS = (0.05, 0.10, 0.20)
#: in-plane smoothing of the TAC (pixels), as the review rules smooth it
SMOOTH_PX = 2.0


def map_quality(
    pred: Sequence[np.ndarray],
    truth: Sequence[np.ndarray],
    score: Sequence[np.ndarray],
    burdens: Sequence[float] = BURDENS,
) -> dict:
    """Scores of per-volume maps ``score`` (each ``(Z, Y, X)``, higher = more doubtful) against the
    substantial errors of ``pred`` against ``truth`` (uint8 label maps of the same shapes):
    ``{"volumes", "errors", "auroc", "auprc", "prevalence", "covered": {burden: share}}``."""
    errors = 0
    covered = {b: 0 for b in burdens}
    scores, wrong = [], []
    for p, t, s in zip(pred, truth, score):
        labels, n = cv.error_labels(p, t)
        near = cv.heart_neighbourhood(p)
        heart = cv.heart_voxels(p)
        errors += n
        for b, k in zip(burdens, cv.covered_at_burdens(labels, n, s, near, heart, burdens)):
            covered[b] += k
        scores.append(np.asarray(s, dtype=np.float32)[near])
        wrong.append((labels > 0)[near])
    det = detection_scores(np.concatenate(scores), np.concatenate(wrong)) if scores else {}
    return {
        "volumes": len(scores),
        "errors": errors,
        "auroc": det.get("auroc"),
        "auprc": det.get("auprc"),
        "prevalence": det.get("prevalence"),
        "covered": {f"{b:g}": (covered[b] / errors if errors else None) for b in burdens},
    }


def candidate_quality(bundle_dir: Path, data: str, cache: Optional[Path], label: str = "") -> dict:
    """:func:`map_quality` of one bundle's smoothed TAC on the clean validation volumes."""
    from cardseg.bundle.loading import load_bundle

    from cardseg_train.evaluation.segmentation import acdc_h5_volumes
    from cardseg_train.review.data import cache_key, collect_maps

    bundle = load_bundle(bundle_dir, device="cpu")
    cases = acdc_h5_volumes(data, "val")
    key_dir = None if cache is None else Path(cache) / cache_key(bundle, "val", 0)
    maps = collect_maps(bundle, cases, ["clean"], key_dir)
    row = map_quality([m.pred for m in maps], [m.truth for m in maps], [smoothed(m.tac, SMOOTH_PX) for m in maps])
    row["reference"] = dict(bundle.config["networks"]["reference"])
    row["label"] = label
    return row


def markdown(rows: Dict[str, dict]) -> str:
    lines = [
        "# The reference's disagreement as a map of the primary's errors (clean validation volumes)",
        "",
        f"TAC smoothed in-plane by {SMOOTH_PX:g} px; substantial errors of the bundle's primary (the same for "
        "every row); AUROC / AUPRC of the voxels of those errors inside the predicted heart's 10-pixel "
        "neighbourhood; covered: "
        "errors with half their pixels among the map's highest voxels, at a share of the predicted heart.",
        "",
        "| reference | errors | AUROC | AUPRC | " + " | ".join(f"covered at {b:.0%}" for b in BURDENS) + " |",
        "|---|---|---|---|" + "---|" * len(BURDENS),
    ]
    for name, r in rows.items():
        cov = " | ".join("n/a" if r["covered"][f"{b:g}"] is None else f"{r['covered'][f'{b:g}']:.3f}" for b in BURDENS)
        lines.append(f"| {name} | {r['errors']} | {r['auroc']:.3f} | {r['auprc']:.3f} | {cov} |")
    return "\n".join(lines) + "\n"


def _order(name: str) -> tuple:
    """Candidates ``reference-<capacity>-s<steps>`` by capacity, then training length; others first."""
    m = re.fullmatch(r"(?:reference-)?(.+)-s(\d+)", name)
    return (1, m.group(1), int(m.group(2))) if m else (0, name, 0)


def plot(rows: Dict[str, dict], path: Path) -> Path:
    """AUPRC and errors covered at 10 % of the heart against the reference's training length, one
    line per capacity; the bundle's own reference as a horizontal line."""
    from cardseg_train.base.report_files import pyplot, save_titled

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.4))
    lines: Dict[str, list] = {}
    for name, r in rows.items():
        m = re.fullmatch(r"(?:reference-)?(.+)-s(\d+)", name)
        if m:
            lines.setdefault(m.group(1), []).append((int(m.group(2)), r))
    for ax, key, label in (
        (axes[0], lambda r: r["auprc"], "AUPRC of substantial-error voxels"),
        (axes[1], lambda r: r["covered"]["0.1"], "errors covered at 10 % of the heart"),
    ):
        for i, (cap, pts) in enumerate(sorted(lines.items())):
            pts.sort(key=lambda t: t[0])
            ax.plot([s for s, _ in pts], [key(r) for _, r in pts], "-o", ms=4, color=f"C{i}", label=cap)
        for name, r in rows.items():
            if not re.fullmatch(r"(?:reference-)?(.+)-s(\d+)", name):
                ax.axhline(key(r), color="k", ls=":", lw=1, label=f"{name} reference")
        ax.set_xscale("log")
        steps = []
        for st in sorted({st for pts in lines.values() for st, _ in pts}):
            if not steps or st > 1.25 * steps[-1]:  # no two labels on top of each other
                steps.append(st)
        ax.set_xticks(steps, [str(st) for st in steps], fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("reference training steps", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
    axes[0].legend(fontsize=7)
    return save_titled(fig, path, "The reference's disagreement as a map of the primary's errors (validation, clean)")


#: what :func:`write_outputs` writes into --out
OUTPUT_FILES = ("reference_maps.json", "reference_maps.md", "reference_maps.png")


def write_outputs(rows: Dict[str, dict], out: Path) -> None:
    rows = dict(sorted(rows.items(), key=lambda kv: _order(kv[0])))
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(
        out / "reference_maps.json",
        (
            json.dumps(
                {"smooth_px": SMOOTH_PX, "burdens": list(BURDENS), "split": "val", "condition": "clean", "rows": rows},
                indent=1,
            )
            + "\n"
        ).encode("utf-8"),
    )
    atomic_write(out / "reference_maps.md", markdown(rows).encode("utf-8"))
    plot(rows, out / "reference_maps.png")


def main(argv: Optional[List[str]] = None) -> int:
    from cardseg.base.argparsing import CommandLineParser

    p = CommandLineParser(prog="python -m cardseg_train.studies.reference_maps", description=__doc__.split("\n")[0])
    p.add_argument("--bundle", required=True, help="the bundle whose primary (and reference, the first row) is used")
    p.add_argument("--candidates", nargs="+", default=[], help="reference training runs (run folders)")
    p.add_argument("--checkpoint", default="last", choices=["best", "last"])
    p.add_argument("--data", default="../shared/data/acdc")
    add_cache(p, "review", "map cache (per weights; fit-review's own)")
    p.add_argument("--out", required=True)
    add_overwrite(p)
    p.add_argument("--replot", metavar="JSON", help="write the table and figure again from a reference_maps.json")
    a = p.parse_args(argv)
    out = Path(a.out)
    try:  # every candidate, and --out, checked before the first one's long pass (and before --out is made)
        not_diffusion = [run for run in a.candidates if read_run_config(run).kind != "diffusion"]
        record = out_record(a.out, p.prog, OUTPUT_FILES, a.overwrite)
    except CardsegError as exc:
        print(f"reference_maps: error: {exc}", file=sys.stderr)
        return 2
    if not_diffusion:
        print(
            f"reference_maps: error: not a diffusion reference run: {', '.join(map(str, not_diffusion))}",
            file=sys.stderr,
        )
        return 2
    if a.replot:
        try:
            replot = json.loads(Path(a.replot).read_text(encoding="utf-8"))["rows"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"reference_maps: error: --replot {a.replot}: not a reference_maps.json ({exc})", file=sys.stderr)
            return 2
        return write_recorded(record, "reference_maps", lambda: write_outputs(replot, out))
    cache = Path(a.cache) if a.cache else None
    rows = {"bundle's own": candidate_quality(Path(a.bundle), a.data, cache, "bundle")}
    print(f"bundle's own: AUPRC {rows[next(iter(rows))]['auprc']:.3f}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="refmaps-") as tmp:
        for run in sorted(a.candidates):
            name = Path(run).name
            swapped = swap_reference(Path(a.bundle), Path(run), Path(tmp) / name, a.checkpoint)
            rows[name] = candidate_quality(swapped, a.data, cache, name)
            print(
                f"{name}: AUROC {rows[name]['auroc']:.3f} AUPRC {rows[name]['auprc']:.3f} "
                f"covered {rows[name]['covered']}",
                file=sys.stderr,
                flush=True,
            )
    return write_recorded(record, "reference_maps", lambda: write_outputs(rows, out))


if __name__ == "__main__":
    sys.exit(main())
