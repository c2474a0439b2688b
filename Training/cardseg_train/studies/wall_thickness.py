"""Regional wall thickness on the model's segmentation against the ground truth's, on ACDC.

For every patient of the split (validation; the test split for reporting only) the end-diastolic
volume (``frame01``) is segmented by the bundle's primary alone (``uc``: the same labels as CARD's,
which only recalibrates the probabilities), and :func:`cardseg.cine.wall.wall_thickness` runs on
those labels and on the ground truth's: per AHA segment the mean absolute and the mean signed
error (model minus truth) over the patients where both have the segment, and how many had it. The
ACDC HDF5 files carry no geometry: thicknesses are in the mm of the project's assumed in-plane
spacing (:data:`cardseg_train.data.datasets.ACDC_H5_SPACING_MM`). Nothing is fitted or chosen.

With ``--phantom-frames N`` (validation runs: 6) the same model also segments each frame of a
beating phantom (:func:`cardseg.bundle.beating.beating_cine`) against the phantom's stated wall and
its labels' LV volumes.

Writes ``wall_thickness_<split>.json`` and ``.md``::

    python -m cardseg_train.studies.wall_thickness --split val --out Training/results/wall-thickness
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from cardseg_train.studies.common import study_main

N_SEGMENTS = 16
ED_FRAME = "frame01"


def segment_errors(truths: Sequence[Sequence[float]], preds: Sequence[Sequence[float]]) -> List[dict]:
    """Per AHA segment (1..16): ``n`` (volumes where both have it), ``truth_only`` (the truth has it,
    the model's labels not), ``mae_mm``, ``mean_error_mm`` (model minus truth) and
    ``mean_truth_mm``; errors ``None`` where ``n`` is 0. truths, preds: 16 values a volume."""
    t, p = np.asarray(truths, float).reshape(-1, N_SEGMENTS), np.asarray(preds, float).reshape(-1, N_SEGMENTS)
    rows = []
    for s in range(N_SEGMENTS):
        both = np.isfinite(t[:, s]) & np.isfinite(p[:, s])
        err = p[both, s] - t[both, s]
        rows.append(
            {
                "segment": s + 1,
                "n": int(both.sum()),
                "truth_only": int((np.isfinite(t[:, s]) & ~np.isfinite(p[:, s])).sum()),
                "mae_mm": float(np.abs(err).mean()) if both.any() else None,
                "mean_error_mm": float(err.mean()) if both.any() else None,
                "mean_truth_mm": float(t[both, s].mean()) if both.any() else None,
            }
        )
    return rows


def acdc_part(bundle, cases, log=print) -> dict:
    """The end-diastolic volumes of ``cases``: the segments' errors, the errors of the largest
    segment thickness, and how often the two label maps put a slice on the same level."""
    from cardseg.cine.wall import wall_thickness
    from cardseg.segment import SegmentOptions, segment_volume

    truths, preds, max_err, same_level, slices = [], [], [], 0, 0
    method = ""
    for item in cases:
        if not item.case.endswith(ED_FRAME):
            continue
        spacing = tuple(float(s) for s in item.volume.spacing)
        labels = segment_volume(item.volume, bundle, SegmentOptions(method="uc")).labels
        t, p = wall_thickness(item.labels, spacing), wall_thickness(labels, spacing)
        truths.append(t.segments_mm)
        preds.append(p.segments_mm)
        if np.isfinite(t.max_mm) and np.isfinite(p.max_mm):
            max_err.append(p.max_mm - t.max_mm)
        same_level += sum(a == b for a, b in zip(t.slices, p.slices))
        slices += len(t.slices)
        method = t.method
        log(f"{item.case}: done")
    return {
        "volumes": len(truths),
        "frame": ED_FRAME,
        "in_plane_spacing_mm": list(spacing[:2]) if truths else None,
        "method": method,
        "segments": segment_errors(truths, preds),
        "max_thickness": {
            "n": len(max_err),
            "mae_mm": float(np.mean(np.abs(max_err))) if max_err else None,
            "mean_error_mm": float(np.mean(max_err)) if max_err else None,
        },
        "slice_level_agreement": same_level / slices if slices else None,
    }


def phantom_part(bundle, frames: int, seed: int = 0, log=print) -> dict:
    """The model on each frame of the beating phantom (``frames`` frames, 10 slices, ``seed``): per
    frame the LV volume's relative error and the wall's errors over the 16 segments against the
    stated thickness."""
    from cardseg.bundle.beating import BeatOptions, beating_cine
    from cardseg.cine.wall import wall_thickness
    from cardseg.segment import SegmentOptions, segment_volume

    cine = beating_cine(BeatOptions(frames=frames), shape=(10, 192, 176), seed=seed)
    ml = float(np.prod(cine.frames[0].spacing)) / 1000.0
    rows, model_lv = [], []
    for k, vol in enumerate(cine.frames):
        labels = segment_volume(vol, bundle, SegmentOptions(method="uc")).labels
        model_lv.append(float((labels == 3).sum() * ml))
        model_seg = np.array(wall_thickness(labels, vol.spacing).segments_mm)
        phantom_seg = np.array(wall_thickness(cine.labels[k], vol.spacing).segments_mm)
        err = model_seg - cine.truth.wall_mm[k]
        rows.append(
            {
                "frame": k,
                "lv_ml": cine.truth.lv_ml[k],
                "model_lv_ml": model_lv[-1],
                "lv_relative_error": model_lv[-1] / cine.truth.lv_ml[k] - 1.0,
                "wall_mm": cine.truth.wall_mm[k],
                "segments_measured": int(np.isfinite(err).sum()),
                "wall_mean_error_mm": float(np.nanmean(err)),
                "wall_max_abs_error_mm": float(np.nanmax(np.abs(err))),
                "phantom_labels_max_abs_error_mm": float(np.nanmax(np.abs(phantom_seg - cine.truth.wall_mm[k]))),
            }
        )
        log(f"phantom frame {k}: done")
    return {
        "frames": frames,
        "seed": seed,
        "ed_frame": cine.truth.ed_frame,
        "es_frame": cine.truth.es_frame,
        "model_ed_frame": int(np.argmax(model_lv)),
        "model_es_frame": int(np.argmin(model_lv)),
        "rows": rows,
    }


def git_state() -> dict:
    """The checkout's commit and whether it has uncommitted changes (``None`` outside a git checkout)."""
    root = Path(__file__).resolve().parents[3]

    def git(*args: str) -> Optional[str]:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": commit.strip() if commit else None,
        "uncommitted_changes": bool(status) if status is not None else None,
    }


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(result: dict) -> str:
    a = result["acdc"]
    g = result["git"]
    lines = [
        f"# Wall thickness on the model's segmentation: {result['bundle']}, {result['split']} split",
        "",
        f"{a['volumes']} end-diastolic volumes ({a['frame']}); model: the primary alone (uc), whose labels CARD "
        f"shares. In-plane spacing assumed {_fmt(a['in_plane_spacing_mm'] and a['in_plane_spacing_mm'][0], 2)} mm "
        f"(the files carry none). Commit {g['commit']}"
        + (" with uncommitted changes" if g["uncommitted_changes"] else "")
        + ". Nothing fitted.",
        "",
        f"Measure: {a['method']}",
        "",
        "| AHA segment | volumes | truth only | mean truth (mm) | MAE (mm) | mean error, model - truth (mm) |",
        "|---|---|---|---|---|---|",
    ]
    for r in a["segments"]:
        lines.append(
            f"| {r['segment']} | {r['n']} | {r['truth_only']} | {_fmt(r['mean_truth_mm'])} | {_fmt(r['mae_mm'])} | "
            f"{_fmt(r['mean_error_mm'])} |"
        )
    m = a["max_thickness"]
    lines += [
        "",
        f"Largest segment thickness: MAE {_fmt(m['mae_mm'])} mm, mean error {_fmt(m['mean_error_mm'])} mm "
        f"({m['n']} volumes). Slices put on the same level (basal, mid, apical, none) by both: "
        f"{_fmt(a['slice_level_agreement'] and 100 * a['slice_level_agreement'], 1)} %.",
    ]
    if result.get("phantom"):
        lines += _phantom_markdown(result["phantom"])
    return "\n".join(lines) + "\n"


def _phantom_markdown(p: dict) -> List[str]:
    lines = [
        "",
        f"## The beating phantom ({p['frames']} frames, seed {p['seed']})",
        "",
        f"End-diastole / end-systole: phantom frames {p['ed_frame']} / {p['es_frame']}, from the model's LV curve "
        f"{p['model_ed_frame']} / {p['model_es_frame']}.",
        "",
        "| frame | LV (ml) | model LV (ml) | LV error | stated wall (mm) | model wall mean error (mm) | "
        "model wall max abs error (mm) | phantom labels max abs error (mm) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in p["rows"]:
        lines.append(
            f"| {r['frame']} | {_fmt(r['lv_ml'], 1)} | {_fmt(r['model_lv_ml'], 1)} | "
            f"{_fmt(100 * r['lv_relative_error'], 1)} % | {_fmt(r['wall_mm'])} | {_fmt(r['wall_mean_error_mm'])} | "
            f"{_fmt(r['wall_max_abs_error_mm'])} | {_fmt(r['phantom_labels_max_abs_error_mm'])} |"
        )
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    def options(p) -> None:
        p.add_argument(
            "--phantom-frames", type=int, default=0, help="also the model on a beating phantom of N frames (0: not)"
        )

    def check(a) -> None:
        from cardseg.base.options import check_int_range

        if a.phantom_frames:
            check_int_range("--phantom-frames", a.phantom_frames, 2, 40)

    def compute(bundle, cases, a) -> Dict[str, object]:
        def log(text: str) -> None:
            print(text, file=sys.stderr, flush=True)

        ident = bundle.config["id"]
        out: Dict[str, object] = {"bundle_name": ident["name"], "bundle_version": ident["version"], "git": git_state()}
        out["acdc"] = acdc_part(bundle, cases, log)
        out["phantom"] = phantom_part(bundle, a.phantom_frames, log=log) if a.phantom_frames else None
        return out

    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--split", default="val")
    split = pre.parse_known_args(argv)[0].split  # the file's name; study_main checks the value
    prog = "python -m cardseg_train.studies.wall_thickness"
    return study_main(argv, prog, __doc__, f"wall_thickness_{split}", compute, markdown, options, check)


if __name__ == "__main__":
    raise SystemExit(main())
