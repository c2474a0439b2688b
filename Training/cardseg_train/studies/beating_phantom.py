"""The beating cine phantom against real ACDC images and against the shipped model.

Three parts, written to ``OUT/beating_phantom.json`` and a generated ``OUT/README.md``:

* conventions: on the phantom's own frames, the labels' LV volume against the stated curve, the
  wall :func:`cardseg.cine.wall.wall_thickness` measures on the truth labels against the stated
  wall, and where the image's intensity edge lies relative to the truth label's boundary;
* appearance: the same measurements on ACDC's validation volumes (``--data``, HDF5, no geometry:
  pixels taken as 1.5 mm) and on the phantom, drawn with and without its trabecular layers: the
  median signal profile across each labelled boundary (LV to myocardium, RV to myocardium,
  myocardium to background) against the signed distance from the label boundary, the edge's
  25-75 % width, myocardium/blood and background/blood ratios and the pool's noise;
* model: the bundle's primary alone (``uc``) on every frame of the cine with and without the
  trabecular layers: per frame the LV volume's relative error, per AHA segment the wall error.

Profiles are in pixels (phantom 1.5 mm) and in units where the myocardium's median is 0 and the
deep LV pool's (more than 3 px inside) is 1. Nothing is fitted on the model's output.

    PYTHONPATH=Training python -m cardseg_train.studies.beating_phantom --out Training/results/beating-phantom
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from scipy import ndimage

RV, MYO, LV = 1, 2, 3
BINS_PX = np.arange(-4.0, 4.01, 0.5)  # signed distance from the label boundary, + outwards
ACDC_PX_MM = 1.5
N_SEGMENTS = 16


@dataclass(frozen=True)
class StudyOptions:
    """``frames``/``slices``/``seed`` of the cine, ``data``: the ACDC HDF5 folder, ``bundle``: model
    bundle folder (None: the shipped one), ``model``: run the model part, ``appearance_seeds``: the
    phantom seeds of the appearance part."""

    out: str
    data: str = "../shared/data/acdc"
    frames: int = 20
    slices: int = 10
    seed: int = 0
    bundle: Optional[str] = None
    model: bool = True
    appearance_seeds: int = 4


class Refs(NamedTuple):
    """A slice's reference levels: the deep LV pool's and the myocardium's median signal."""

    blood: float
    myo: float


def signed_px(mask: np.ndarray) -> np.ndarray:
    """Signed distance (px) of each pixel centre from the boundary of ``mask`` (half a pixel beyond
    the outermost centres): negative inside."""
    inside = ndimage.distance_transform_edt(mask) - 0.5
    outside = ndimage.distance_transform_edt(~mask) - 0.5
    return np.where(mask, -inside, outside)


def slice_refs(img: np.ndarray, lab: np.ndarray) -> Optional[Refs]:
    """The LV pool's median more than 3 px inside its boundary and the myocardium's median at least
    1.5 px from the pool and 2 px from anything else; None where either is too small or the pool is
    not the brighter."""
    lv, myo = lab == LV, lab == MYO
    d = signed_px(lv)
    d_other = ndimage.distance_transform_edt(~(~lv & ~myo))
    pool, wall = img[lv & (d <= -3)], img[myo & (d >= 1.5) & (d_other >= 2.0)]
    if pool.size < 20 or wall.size < 10 or np.median(pool) <= np.median(wall):
        return None
    return Refs(float(np.median(pool)), float(np.median(wall)))


def boundary_profile(img: np.ndarray, inside: np.ndarray, outside: np.ndarray, refs: Refs) -> np.ndarray:
    """Median normalised signal of the pixels of ``inside | outside`` in each bin of
    :data:`BINS_PX` (signed distance from ``inside``'s boundary); nan for bins under 5 pixels."""
    z = (img - refs.myo) / (refs.blood - refs.myo)
    d, sel = signed_px(inside), inside | outside
    out = []
    for centre in BINS_PX:
        s = sel & (d >= centre - 0.25) & (d < centre + 0.25)
        out.append(float(np.median(z[s])) if s.sum() >= 5 else np.nan)
    return np.array(out)


def crossing_px(profile: np.ndarray, level: float) -> float:
    """Where a profile falling outwards first crosses ``level`` (px, linear between finite bins)."""
    ok = np.isfinite(profile)
    x, p = BINS_PX[ok], profile[ok]
    for i in range(len(x) - 1):
        if p[i] >= level > p[i + 1]:
            return float(x[i] + (p[i] - level) / (p[i] - p[i + 1]) * (x[i + 1] - x[i]))
    return float("nan")


def slice_stats(img: np.ndarray, lab: np.ndarray) -> Optional[dict]:
    """One slice's profiles (``lv``, ``rv``, ``epi``; ``rv`` None without an RV), myocardium/blood
    and background/blood ratios (background: the slice's 5th percentile) and pool noise/blood
    (standard deviation of the deep pool's signal minus its 1 px Gaussian blur)."""
    refs = slice_refs(img, lab)
    if refs is None:
        return None
    deep = (lab == LV) & (signed_px(lab == LV) <= -4)
    resid = (img - ndimage.gaussian_filter(img, 1.0))[deep]
    heart = np.isin(lab, (MYO, LV))
    return {
        "lv": boundary_profile(img, lab == LV, lab == MYO, refs),
        "rv": boundary_profile(img, lab == RV, lab == MYO, refs) if (lab == RV).sum() > 50 else None,
        "epi": boundary_profile(img, heart, lab == 0, refs),
        "myo_to_blood": refs.myo / refs.blood,
        "background_to_blood": float(np.percentile(img, 5)) / refs.blood,
        "noise_to_blood": float(resid.std()) / refs.blood if resid.size > 30 else np.nan,
    }


def summarise(stats: Sequence[dict]) -> dict:
    """Medians (and quartiles) over slices: each profile bin, the LV edge's 50 % crossing and 25-75 %
    width, the ratios and noise."""
    out: Dict[str, object] = {"slices": len(stats)}
    for key in ("lv", "rv", "epi"):
        rows = np.array([s[key] for s in stats if s[key] is not None])
        q = np.nanpercentile(rows, [25, 50, 75], axis=0)
        out[f"{key}_profile"] = {
            f"{b:+.1f}": _quartiles(q[:, i]) for i, b in enumerate(BINS_PX) if np.isfinite(q[1, i])
        }
    lv = [s["lv"] for s in stats]
    half = np.array([crossing_px(p, 0.5) for p in lv])
    width = np.array([crossing_px(p, 0.25) - crossing_px(p, 0.75) for p in lv])
    out["lv_50pct_crossing_px"] = _quartiles(np.nanpercentile(half, [25, 50, 75]))
    out["lv_edge_25_75_width_px"] = _quartiles(np.nanpercentile(width, [25, 50, 75]))
    for key in ("myo_to_blood", "background_to_blood", "noise_to_blood"):
        out[key] = _quartiles(np.nanpercentile([s[key] for s in stats], [25, 50, 75]))
    return out


def _quartiles(q) -> dict:
    return {"q25": round(float(q[0]), 3), "median": round(float(q[1]), 3), "q75": round(float(q[2]), 3)}


def acdc_volumes(data: str, phase: Optional[str] = None) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """The (image, label) arrays (Z, H, W) of ACDC's validation volumes (both frames, or ``phase``)."""
    import h5py

    for patient in Path(data, "val_patients.txt").read_text().split():
        for frame in ("frame01", "frame02") if phase is None else (phase,):
            with h5py.File(Path(data, "volumes", f"{patient}_{frame}.h5"), "r") as f:
                yield f["image"][()], f["label"][()]


def phantom_volumes(
    seeds: int, slices: int, trabecular: Tuple[float, float]
) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """The end-diastolic phantom heart (8 mm wall) of seeds 0.. ``seeds - 1``, with ``trabecular``."""
    from cardseg.bundle.phantom import HeartShape, synthetic_cine_volume

    for seed in range(seeds):
        vol, lab = synthetic_cine_volume(
            (slices, 192, 176), seed=seed, heart=HeartShape(wall_mm=8.0, trabecular_mm=trabecular)
        )
        yield vol.array, lab


def appearance(volumes: Iterator[Tuple[np.ndarray, np.ndarray]]) -> dict:
    """:func:`summarise` over every slice of ``volumes`` with an LV pool and a myocardium."""
    stats = []
    for img, lab in volumes:
        for z in range(img.shape[0]):
            s = slice_stats(img[z].astype(np.float64), lab[z])
            if s is not None:
                stats.append(s)
    return summarise(stats)


def conventions(cine) -> dict:
    """The phantom's own consistency: labels' LV volume against the stated curve, the wall measured on
    the truth labels against the stated wall (per frame, largest absolute error), and the LV edge's
    50 % crossing on the frames' images relative to the truth labels."""
    from cardseg.cine.wall import wall_thickness

    t = cine.truth
    lv_err = [t.lv_ml[k] / t.lv_target_ml[k] - 1.0 for k in range(len(t.lv_ml))]
    wall_err = [
        float(np.nanmax(np.abs(np.array(wall_thickness(lab, cine.frames[0].spacing).segments_mm) - t.wall_mm[k])))
        for k, lab in enumerate(cine.labels)
    ]
    return {
        "lv_labels_vs_stated_max_relative_error": float(np.max(np.abs(lv_err))),
        "wall_on_labels_max_abs_error_mm_per_frame": [round(w, 3) for w in wall_err],
        "frame_appearance": appearance(
            (f.array, cine.labels[k]) for k, f in enumerate(cine.frames[:: max(len(cine.frames) // 4, 1)])
        ),
    }


def model_run(cine, bundle, log) -> dict:
    """The primary alone on every frame: LV volumes and their relative errors, ED/ES from the model's
    LV curve, the wall error (model minus stated) per frame and AHA segment, and summaries."""
    from cardseg.cine.wall import wall_thickness
    from cardseg.segment import SegmentOptions, segment_volume

    t, spacing = cine.truth, cine.frames[0].spacing
    ml = float(np.prod(spacing)) / 1000.0
    lv, errors = [], []
    for k, vol in enumerate(cine.frames):
        start = time.time()
        labels = segment_volume(vol, bundle, SegmentOptions(method="uc")).labels
        lv.append(float((labels == LV).sum() * ml))
        errors.append(np.array(wall_thickness(labels, spacing).segments_mm) - t.wall_mm[k])
        log(f"frame {k}: LV {lv[-1]:.1f} ml (truth {t.lv_ml[k]:.1f}), {time.time() - start:.0f} s")
    rel = np.array(lv) / np.array(t.lv_ml) - 1.0
    err = np.array(errors)
    return {
        "model_lv_ml": [round(v, 2) for v in lv],
        "lv_relative_error": [round(float(v), 4) for v in rel],
        "lv_max_abs_relative_error": float(np.max(np.abs(rel))),
        "model_ed_frame": int(np.argmax(lv)),
        "model_es_frame": int(np.argmin(lv)),
        "wall_error_mm": [[None if not np.isfinite(v) else round(float(v), 3) for v in row] for row in err],
        "wall_segment_mean_error_mm": [round(float(v), 3) for v in np.nanmean(err, 0)],
        "wall_segment_max_abs_error_mm": [round(float(v), 3) for v in np.nanmax(np.abs(err), 0)],
        "wall_max_abs_error_mm": float(np.nanmax(np.abs(err))),
        "wall_segments_missing": int((~np.isfinite(err)).sum()),
    }


def compute(opts: StudyOptions, log=print) -> dict:
    """Every part of the study for ``opts``."""
    from cardseg.bundle.beating import ACDC_TRABECULAR_MM, BeatOptions, beating_cine

    variants = {"flat": (0.0, 0.0), "trabecular": tuple(ACDC_TRABECULAR_MM)}
    result: Dict[str, object] = {"options": asdict(opts), "acdc_pixel_mm_assumed": ACDC_PX_MM}
    result["acdc"] = {
        "both": appearance(acdc_volumes(opts.data)),
        "ed": appearance(acdc_volumes(opts.data, "frame01")),
        "es": appearance(acdc_volumes(opts.data, "frame02")),
    }
    result["phantom"] = {
        k: appearance(phantom_volumes(opts.appearance_seeds, opts.slices, v)) for k, v in variants.items()
    }
    log("appearance done")
    bundle = None
    if opts.model:
        from cardseg.bundle.loading import load_bundle

        bundle = load_bundle(opts.bundle)
        result["bundle"] = bundle.ident
    for name, trab in variants.items():
        cine = beating_cine(
            BeatOptions(frames=opts.frames, trabecular_mm=trab), shape=(opts.slices, 192, 176), seed=opts.seed
        )
        part = {"truth": cine.truth.as_json(), "conventions": conventions(cine)}
        if bundle is not None:
            part["model"] = model_run(cine, bundle, lambda s: log(f"{name} {s}"))
        result[name] = part
    return result


def _row(p: dict, bins: Sequence[str]) -> str:
    return " | ".join(f"{p[b]['median']:.2f}" if b in p else "" for b in bins)


def readme(r: dict) -> str:
    """The generated README.md of the result folder."""
    o = r["options"]
    bins = [f"{b:+.1f}" for b in BINS_PX if abs(b) <= 4.0 and b != 0.0 and b != 2.0 and b != -2.0]
    lines = [
        "# The beating phantom against ACDC and the shipped model",
        "",
        f"Generated by `Training/cardseg_train/studies/beating_phantom.py`: {o['frames']} frames, {o['slices']} slices, seed {o['seed']}; "
        f"bundle {r.get('bundle', '(model part not run)')}. ACDC: the validation volumes, ED and ES, pixels taken as "
        f"{r['acdc_pixel_mm_assumed']} mm (the files carry no spacing); phantom 1.5 x 1.5 x 8 mm. Numbers: beating_phantom.json.",
        "",
        "## Signal across the labelled boundaries",
        "",
        "Median over slices of the normalised signal (myocardium 0, deep LV pool 1) against the signed distance "
        "from the label boundary in pixels (negative: inside the cavity, or inside the heart for the epicardium).",
        "",
        "| boundary | source | " + " | ".join(bins) + " |",
        "|---|---|" + "---|" * len(bins),
    ]
    sources = [
        ("ACDC", r["acdc"]["both"]),
        ("phantom, flat pool", r["phantom"]["flat"]),
        ("phantom, trabecular", r["phantom"]["trabecular"]),
    ]
    for key, name in (("lv", "LV -> MYO"), ("rv", "RV -> MYO"), ("epi", "MYO -> outside")):
        for label, s in sources:
            lines.append(f"| {name} | {label} | {_row(s[f'{key}_profile'], bins)} |")
    lines += [
        "",
        "| measure (median [q25, q75]) | ACDC ED | ACDC ES | phantom, flat | phantom, trabecular |",
        "|---|---|---|---|---|",
    ]
    for key in (
        "lv_50pct_crossing_px",
        "lv_edge_25_75_width_px",
        "myo_to_blood",
        "background_to_blood",
        "noise_to_blood",
    ):
        cells = [r["acdc"]["ed"][key], r["acdc"]["es"][key], r["phantom"]["flat"][key], r["phantom"]["trabecular"][key]]
        lines.append(
            f"| {key} | " + " | ".join(f"{c['median']:.2f} [{c['q25']:.2f}, {c['q75']:.2f}]" for c in cells) + " |"
        )
    lines += ["", "## The phantom's own conventions", ""]
    for name in ("flat", "trabecular"):
        c = r[name]["conventions"]
        lines.append(
            f"- {name}: labels' LV vs stated curve, largest relative error {c['lv_labels_vs_stated_max_relative_error']:.4f}; "
            f"wall on the truth labels vs stated, largest error per frame {max(c['wall_on_labels_max_abs_error_mm_per_frame']):.2f} mm; "
            f"LV edge's 50 % level at {c['frame_appearance']['lv_50pct_crossing_px']['median']:+.2f} px from the label "
            "boundary, over frames 0, 5, 10 and 15 (smaller cavities than at ED; the ED-only figure is in the table above)."
        )
    if "model" in r["flat"]:
        lines += _model_lines(r)
    return "\n".join(lines) + "\n"


def _model_lines(r: dict) -> List[str]:
    lines = ["", "## The model on the cine (primary alone)", ""]
    for name in ("flat", "trabecular"):
        m, t = r[name]["model"], r[name]["truth"]
        lines.append(
            f"- {name}: ED/ES {m['model_ed_frame']}/{m['model_es_frame']} (phantom {t['ed_frame']}/{t['es_frame']}); "
            f"LV largest |error| {100 * m['lv_max_abs_relative_error']:.1f} %; wall largest |error| {m['wall_max_abs_error_mm']:.2f} mm."
        )
    lines += [
        "",
        "| frame | LV truth (ml) | flat: model | flat: error | trabecular: model | trabecular: error |",
        "|---|---|---|---|---|---|",
    ]
    f, tr = r["flat"], r["trabecular"]
    for k, truth in enumerate(f["truth"]["lv_ml"]):
        lines.append(
            f"| {k} | {truth:.1f} | {f['model']['model_lv_ml'][k]:.1f} | {100 * f['model']['lv_relative_error'][k]:+.1f} % | "
            f"{tr['model']['model_lv_ml'][k]:.1f} | {100 * tr['model']['lv_relative_error'][k]:+.1f} % |"
        )
    lines += [
        "",
        "| AHA segment | flat: mean error (mm) | flat: max abs | trabecular: mean error | trabecular: max abs |",
        "|---|---|---|---|---|",
    ]
    for s in range(N_SEGMENTS):
        fm, tm = f["model"], tr["model"]
        lines.append(
            f"| {s + 1} | {fm['wall_segment_mean_error_mm'][s]:+.2f} | {fm['wall_segment_max_abs_error_mm'][s]:.2f} | "
            f"{tm['wall_segment_mean_error_mm'][s]:+.2f} | {tm['wall_segment_max_abs_error_mm'][s]:.2f} |"
        )
    return lines


def _json_safe(value):
    """``value`` with nan turned into None, for a strict JSON file."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def parse(argv: Optional[List[str]]) -> StudyOptions:
    """The command line as :class:`StudyOptions`."""
    p = argparse.ArgumentParser(prog="beating_phantom", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="result folder")
    p.add_argument("--data", default=StudyOptions.data, help="ACDC HDF5 folder")
    p.add_argument("--frames", type=int, default=StudyOptions.frames)
    p.add_argument("--slices", type=int, default=StudyOptions.slices)
    p.add_argument("--seed", type=int, default=StudyOptions.seed)
    p.add_argument("--bundle", default=None, help="bundle folder (default: the shipped one)")
    p.add_argument("--no-model", action="store_true", help="skip the model part")
    a = p.parse_args(argv)
    opts = StudyOptions(out=a.out, data=a.data, frames=a.frames, slices=a.slices, seed=a.seed, bundle=a.bundle)
    return replace(opts, model=not a.no_model)


def main(argv: Optional[List[str]] = None) -> int:
    opts = parse(argv)
    if not Path(opts.data, "val_patients.txt").is_file():
        print(f"beating_phantom: no ACDC validation list under {opts.data}", file=sys.stderr)
        return 2
    result = _json_safe(compute(opts, log=lambda s: print(s, flush=True)))
    out = Path(opts.out)
    os.makedirs(out, exist_ok=True)
    (out / "beating_phantom.json").write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    (out / "README.md").write_text(readme(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
