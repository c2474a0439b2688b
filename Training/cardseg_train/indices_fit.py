"""``cardseg fit-indices``: fit the cardiac-index intervals on validation, measure them on test.

The shipped engine runs (``segment_volume(..., method="card")``) on every ED (``frame01``) and ES
(``frame02``) volume of a split; what the indices need (predicted labels, calibrated
probabilities, TAC map, ground-truth labels) is cached per volume under ``cache/indices/<key>/``
(key: the bundle's weights and calibration, the data and the assumed geometry), so a rerun
only recomputes the statistics. :mod:`cardseg.cohort.indices` does the arithmetic; this module feeds it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from cardseg.base.errors import CardsegError

#: bump when what a cached volume holds, or how it is computed, changes
CACHE_VERSION = 1
#: ACDC HDF5 frame names → cardiac phase (the data README: frame01 = ED, frame02 = ES)
PHASES = {"frame01": "ED", "frame02": "ES"}


@dataclass
class VolumeArrays:
    """One segmented volume: ``labels``/``truth`` uint8 ``(Z, Y, X)``, ``probs`` float32
    ``(Z, Y, X, K)`` (calibrated), ``disagreement`` float32 ``(Z, Y, X)``, spacing (x, y, z) mm."""

    case: str
    patient: str
    phase: str
    spacing: tuple
    labels: np.ndarray
    probs: np.ndarray
    disagreement: np.ndarray
    truth: np.ndarray


def cache_key(bundle, settings: dict) -> str:
    """Weights, calibration (parameters and TAC steps) and every setting that shapes the arrays."""
    cal = bundle.config["calibration"]
    blob = json.dumps({"weights": bundle.checksums, "version": CACHE_VERSION,
                       "calibration": {k: cal.get(k) for k in ("method", "tau_min", "tau_max", "w_b", "w_k",
                                                                 "tac_steps")},
                       **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _load(path: Path, case: str, patient: str, phase: str) -> VolumeArrays:
    with np.load(path, allow_pickle=False) as f:
        return VolumeArrays(case, patient, phase, tuple(float(s) for s in f["spacing"]), f["labels"], f["probs"],
                            f["disagreement"], f["truth"])


def _save(path: Path, v: VolumeArrays) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez_compressed(tmp, spacing=np.asarray(v.spacing, dtype=float), labels=v.labels, probs=v.probs,
                        disagreement=v.disagreement, truth=v.truth)
    tmp.replace(path)


def split_volumes(bundle, data: str, split: str, h5_spacing: float, cache_dir: Optional[str], device="cpu",
                  batch_size: int = 8, log: Callable[[str], None] = print):
    """Yield :class:`VolumeArrays` for every volume of ``split``, from the cache when it is there.

    Volumes are the ACDC HDF5 ones as ``cardseg evaluate`` reads them (pixels ``h5_spacing`` mm,
    slices :data:`~cardseg_train.evaluation.ACDC_H5_THICKNESS_MM` apart).
    """
    from cardseg.segment import segment_volume

    from .evaluation import ACDC_H5_THICKNESS_MM, acdc_h5_volumes

    settings = {"data": str(Path(data).resolve()), "split": split, "h5_spacing": float(h5_spacing),
                "thickness": ACDC_H5_THICKNESS_MM}
    root = Path(cache_dir) / cache_key(bundle, settings) if cache_dir else None
    for item in acdc_h5_volumes(data, split, h5_spacing):
        frame = item.case.rsplit("_", 1)[-1]
        if frame not in PHASES:
            continue
        phase = PHASES[frame]
        path = root / f"{item.case}.npz" if root is not None else None
        if path is not None and path.is_file():
            yield _load(path, item.case, item.patient, phase)
            continue
        t0 = time.perf_counter()
        res = segment_volume(item.volume, bundle, method="card", device=device, batch_size=batch_size)
        v = VolumeArrays(item.case, item.patient, phase, tuple(float(s) for s in item.volume.spacing), res.labels,
                         res.probabilities, res.disagreement, item.labels)
        if path is not None:
            _save(path, v)
        log(f"{item.case}: segmented in {time.perf_counter() - t0:.1f} s")
        yield v


# --------------------------------------------------------------------------------------------
# per-subject statistics
# --------------------------------------------------------------------------------------------
@dataclass
class Subject:
    """One patient: index values from the segmentation, from the labels, and unscaled spreads."""

    patient: str
    values: Dict[str, float]
    truth: Dict[str, float]
    spreads: Dict[str, float]


def subjects_of(volumes, class_names: Sequence[str], flag_threshold: float) -> List[Subject]:
    """Pair each patient's ED and ES volumes (:class:`VolumeArrays`) into :class:`Subject` rows;
    patients without both frames are left out. Holds only one volume's arrays at a time."""
    from cardseg.cohort import indices as ix

    frames: Dict[str, Dict[str, tuple]] = {}
    k = len(class_names)
    for v in volumes:
        vols, sds = ix.frame_statistics(v.labels, v.probs, v.disagreement, v.spacing, class_names, flag_threshold)
        truth = ix.structure_volumes(ix.class_volumes(v.truth, v.spacing, k), class_names)
        frames.setdefault(v.patient, {})[v.phase] = (vols, sds, truth)
    out = []
    for patient, f in frames.items():
        if "ED" not in f or "ES" not in f:
            continue
        (ev, esd, et), (sv, ssd, st) = f["ED"], f["ES"]
        out.append(Subject(patient, ix.cardiac_indices(ev, sv), ix.cardiac_indices(et, st),
                           ix.index_spreads(ev, sv, esd, ssd)))
    return out


# --------------------------------------------------------------------------------------------
# fit and measure
# --------------------------------------------------------------------------------------------
def fit_block(subjects: Sequence[Subject], config: dict, level: float, flag_threshold: float, fit_info: dict) -> dict:
    """The ``indices`` block from validation subjects (split-conformal scale per family)."""
    from cardseg.cohort import indices as ix

    scales, counts = ix.fit_scales([s.values for s in subjects], [s.truth for s in subjects],
                                   [s.spreads for s in subjects], level)
    block = ix.make_block(config, scales, level, flag_threshold)
    measured = measure(subjects, block)
    block["fit"] = {**fit_info, "subjects": len(subjects), "residuals": counts,
                    "validation_coverage_in_sample": {f: measured["families"][f]["coverage"] for f in ix.FAMILIES}}
    return block


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> List[float]:
    """Exact two-sided ``1 - alpha`` interval of a binomial proportion ``k / n``."""
    from scipy.stats import beta

    if n == 0:
        return [float("nan"), float("nan")]
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return [lo, hi]


def measure(subjects: Sequence[Subject], block: dict) -> dict:
    """Coverage, mean width and errors of the intervals ``block`` gives on ``subjects``.

    Per index: coverage (fraction of subjects whose label-derived index lies in the interval),
    mean width, MAE, mean signed error (segmentation minus labels), Spearman rho of spread
    against absolute error; per family the same pooled, with an exact 95% binomial interval of
    the coverage.
    """
    from scipy.stats import spearmanr

    from cardseg.cohort import indices as ix

    rows = []
    for s in subjects:
        iv = ix.subject_intervals(s.values, s.spreads, block)
        rows.append({"patient": s.patient, **{n: {**iv[n], "truth": s.truth[n], "spread": s.spreads[n]}
                                              for n in ix.INDEX_NAMES}})
    per_index, families = {}, {}
    for name in ix.INDEX_NAMES:
        items = [r[name] for r in rows]
        t = np.array([i["truth"] for i in items])
        v = np.array([i["value"] for i in items])
        lo, hi = np.array([i["low"] for i in items]), np.array([i["high"] for i in items])
        inside = (lo <= t) & (t <= hi)
        err = v - t
        spreads = [i["spread"] for i in items]
        varies = len(items) > 2 and np.ptp(spreads) > 0 and np.ptp(np.abs(err)) > 0
        rho = spearmanr(spreads, np.abs(err)).correlation if varies else float("nan")
        per_index[name] = {"unit": ix.UNITS[name], "family": ix.FAMILY_OF[name], "n": len(items),
                           "covered": int(inside.sum()), "coverage": ix.coverage(t, lo, hi),
                           "coverage_ci95": clopper_pearson(int(inside.sum()), len(items)),
                           "mean_width": float(np.mean(hi - lo)), "median_width": float(np.median(hi - lo)),
                           "mae": float(np.mean(np.abs(err))), "mean_error": float(np.mean(err)),
                           "truth_mean": float(np.mean(t)), "spearman_spread_abs_error": _finite(rho)}
    for fam, names in ix.FAMILIES.items():
        n = sum(per_index[x]["n"] for x in names)
        k = sum(per_index[x]["covered"] for x in names)
        families[fam] = {"n": n, "covered": k, "coverage": k / n if n else float("nan"),
                         "coverage_ci95": clopper_pearson(k, n), "scale": float(block["scales"][fam])}
    return {"nominal": float(block["nominal"]), "subjects": len(rows), "indices": per_index, "families": families,
            "rows": rows}


def _finite(x) -> Optional[float]:
    return float(x) if x is not None and np.isfinite(x) else None


def constant_width_baseline(fit: Sequence[Subject], test: Sequence[Subject], level: float) -> dict:
    """The same conformal fit with a constant spread (one width per family, no CARD): coverage and
    width on ``test``, to show what CARD's spread adds. Fitted on ``fit`` only."""
    from cardseg.cohort import indices as ix

    ones = {n: 1.0 for n in ix.INDEX_NAMES}
    scales, _ = ix.fit_scales([s.values for s in fit], [s.truth for s in fit], [ones for _ in fit], level)
    block = {"nominal": level, "scales": scales}
    m = measure([Subject(s.patient, s.values, s.truth, ones) for s in test], block)
    return {"scales": scales, "indices": {n: {k: m["indices"][n][k] for k in ("coverage", "mean_width")}
                                          for n in ix.INDEX_NAMES},
            "families": {f: {k: m["families"][f][k] for k in ("coverage", "n")} for f in ix.FAMILIES}}


def leave_one_out(subjects: Sequence[Subject], level: float, constant: bool = False) -> Dict[str, dict]:
    """Validation-only check of the method: each subject's intervals from scales fitted on the
    others. ``{index: {"coverage", "mean_width"}}``; ``constant``: a spread of 1 for everyone."""
    from cardseg.cohort import indices as ix

    ones = {n: 1.0 for n in ix.INDEX_NAMES}
    subs = [Subject(s.patient, s.values, s.truth, ones) for s in subjects] if constant else list(subjects)
    inside: Dict[str, list] = {n: [] for n in ix.INDEX_NAMES}
    width: Dict[str, list] = {n: [] for n in ix.INDEX_NAMES}
    for i, held in enumerate(subs):
        rest = subs[:i] + subs[i + 1:]
        scales, _ = ix.fit_scales([s.values for s in rest], [s.truth for s in rest], [s.spreads for s in rest], level)
        iv = ix.subject_intervals(held.values, held.spreads, {"nominal": level, "scales": scales})
        for n in ix.INDEX_NAMES:
            inside[n].append(iv[n]["low"] <= held.truth[n] <= iv[n]["high"])
            width[n].append(iv[n]["high"] - iv[n]["low"])
    return {n: {"coverage": float(np.mean(inside[n])), "mean_width": float(np.mean(width[n]))}
            for n in ix.INDEX_NAMES}


def fit_indices(bundle_path: Optional[str], data: str, level: float = 0.9, h5_spacing: float = 1.5,
                cache_dir: Optional[str] = "cache/indices", device="cpu", batch_size: int = 8, write: bool = True,
                measure_out: Optional[str] = None, fit: bool = True, log: Callable[[str], None] = print) -> dict:
    """Fit the index intervals on the validation subjects (writes ``bundle.json``'s ``indices``
    block unless ``write`` is false) and, with ``measure_out``, measure them on the test subjects.

    Test subjects are only measured: nothing is fitted or chosen on them. Returns a summary.
    """
    from cardseg import __version__
    from cardseg.cohort import indices as ix
    from cardseg.bundle.loading import load_bundle, update_config

    from .evaluation import ACDC_H5_THICKNESS_MM
    from .train_config import data_name

    if not 0.0 < level < 1.0:
        raise CardsegError(f"--level must be in (0, 1), got {level}")
    bundle = load_bundle(bundle_path, device=device)
    names = bundle.class_names
    for s in ix.STRUCTURES:
        ix.class_index(names, s)
    summary: dict = {"bundle": bundle.ident, "timings_s": {}}
    geometry = (f"ACDC HDF5 volumes carry no spacing: pixels taken as {h5_spacing:g} mm (as in training) and "
                f"slices {ACDC_H5_THICKNESS_MM:g} mm apart (as cardseg evaluate)")
    val_subjects = None
    if fit:
        t0 = time.perf_counter()
        thr = float(bundle.config["regions"]["flag_threshold"])
        val_subjects = subjects_of(split_volumes(bundle, data, "val", h5_spacing, cache_dir, device, batch_size, log),
                                   names, thr)
        info = {"split": "val", "data": data_name(data, "acdc-h5"), "geometry": geometry,
                "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"), "engine": "segment_volume card",
                "cardseg": __version__}
        block = fit_block(val_subjects, bundle.config, level, thr, info)
        summary["timings_s"]["fit"] = time.perf_counter() - t0
        summary["block"] = block
        log(f"fitted on {len(val_subjects)} validation subjects at {level:.0%}: "
            + ", ".join(f"{f} {s:.3g}" for f, s in block["scales"].items())
            + f"  ({summary['timings_s']['fit']:.0f} s)")
        if write:
            update_config(bundle.path, {"indices": block})
            bundle.config["indices"] = block
            log(f"wrote the indices block into {bundle.path / 'bundle.json'}")
    if measure_out:
        t0 = time.perf_counter()
        block = ix.fitted_block(bundle.config) if (write or not fit) else summary["block"]
        test_subjects = subjects_of(split_volumes(bundle, data, "test", h5_spacing, cache_dir, device, batch_size,
                                                  log), names, float(block["spread"]["flag_threshold"]))
        result = measure(test_subjects, block)
        if val_subjects is None:
            val_subjects = subjects_of(split_volumes(bundle, data, "val", h5_spacing, cache_dir, device, batch_size,
                                                     log), names, float(block["spread"]["flag_threshold"]))
        result["constant_width_baseline"] = constant_width_baseline(val_subjects, test_subjects, block["nominal"])
        result["validation_in_sample"] = {k: v for k, v in measure(val_subjects, block).items() if k != "rows"}
        try:
            result["validation_leave_one_out"] = {
                "card": leave_one_out(val_subjects, block["nominal"]),
                "constant_width": leave_one_out(val_subjects, block["nominal"], constant=True)}
        except CardsegError:  # too few validation subjects for the level without one of them
            result["validation_leave_one_out"] = None
        result["settings"] = {"bundle": bundle.ident, "split": "test", "data": data_name(data, "acdc-h5"),
                              "geometry": geometry, "block": {k: block[k] for k in ("nominal", "method", "spread",
                                                                                     "scales")},
                              "fit": block.get("fit", {})}
        summary["timings_s"]["measure"] = time.perf_counter() - t0
        result["timings_s"] = summary["timings_s"]
        write_measurement(result, Path(measure_out), f"{bundle.ident} on the ACDC test subjects")
        summary["measurement"] = result
        log(f"measured on {result['subjects']} test subjects ({summary['timings_s']['measure']:.0f} s): "
            + ", ".join(f"{f} {m['coverage']:.2f}" for f, m in result["families"].items()) + f" -> {measure_out}")
    return summary


# --------------------------------------------------------------------------------------------
# tables and figure
# --------------------------------------------------------------------------------------------
def markdown(result: dict, title: str = "") -> str:
    from cardseg.cohort import indices as ix

    nom = result["nominal"]
    base = result["constant_width_baseline"]
    val = result["validation_in_sample"]
    s = result["settings"]
    fit = s.get("fit", {})
    lines = [f"# Cardiac indices: {title}" if title else "# Cardiac indices", "",
             f"Nominal level **{nom:.0%}**; {s['block']['method']} scales fitted on {fit.get('subjects', '?')} "
             f"{fit.get('split', 'val')} subjects ({fit.get('date', '?')}); measured on {result['subjects']} test "
             f"subjects (ED = frame01, ES = frame02), nothing fitted or chosen on them. Truth: the indices computed "
             f"from the ground-truth labels on the same grid. {s['geometry']}.", "",
             "| Index | unit | coverage | 95% CI of coverage | mean width | MAE | mean error (seg - labels) | "
             "mean truth | Spearman(spread, abs error) | constant-width coverage | constant-width mean width |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in ix.INDEX_NAMES:
        m, b = result["indices"][n], base["indices"][n]
        rho = "n/a" if m["spearman_spread_abs_error"] is None else f"{m['spearman_spread_abs_error']:.2f}"
        lines.append(f"| {n} | {m['unit']} | {m['covered']}/{m['n']} = {m['coverage']:.2f} | "
                     f"{m['coverage_ci95'][0]:.2f}-{m['coverage_ci95'][1]:.2f} | {m['mean_width']:.1f} | "
                     f"{m['mae']:.1f} | {m['mean_error']:+.1f} | {m['truth_mean']:.1f} | {rho} | "
                     f"{b['coverage']:.2f} | {b['mean_width']:.1f} |")
    lines += ["", "Per family (coverage pooled over its indices and subjects; the scale multiplies the spread):", "",
              "| Family | scale | test coverage | 95% CI | validation coverage (in-sample) | constant-width test "
              "coverage |", "|---|---|---|---|---|---|"]
    for f, m in result["families"].items():
        lines.append(f"| {f} | {m['scale']:.3g} | {m['covered']}/{m['n']} = {m['coverage']:.2f} | "
                     f"{m['coverage_ci95'][0]:.2f}-{m['coverage_ci95'][1]:.2f} | "
                     f"{val['families'][f]['coverage']:.2f} | {base['families'][f]['coverage']:.2f} |")
    idx = result["indices"]
    vols = list(ix.VOLUME_NAMES)
    lines += ["", f"Mean absolute error: LVEF {idx['LVEF']['mae']:.1f} points, RVEF {idx['RVEF']['mae']:.1f} points; "
              + ", ".join(f"{n} {idx[n]['mae']:.1f} ml" for n in vols)
              + f" (volumes together {np.mean([idx[n]['mae'] for n in vols]):.1f} ml); "
              f"LVM {idx['LVM_g']['mae']:.1f} g.",
              ""]
    loo = result.get("validation_leave_one_out")
    if loo:
        lines += ["Validation, leave one subject out (each subject's intervals from scales fitted on the other "
                  "validation subjects; the check made on validation before the test split was measured):", "",
                  "| Index | CARD spread coverage | CARD spread mean width | constant-width coverage | "
                  "constant-width mean width |", "|---|---|---|---|---|"]
        for n in ix.INDEX_NAMES:
            c, k = loo["card"][n], loo["constant_width"][n]
            lines.append(f"| {n} | {c['coverage']:.2f} | {c['mean_width']:.1f} | {k['coverage']:.2f} | "
                         f"{k['mean_width']:.1f} |")
        lines.append("")
    lines += [f"Constant-width baseline: the same split-conformal fit on validation with a spread of 1 for every "
              f"subject (no CARD), to show what the calibrated spread adds. With {result['subjects']} test subjects a "
              f"single index's coverage moves in steps of {1 / max(result['subjects'], 1):.2f}; read the 95% "
              f"intervals of coverage, not the point values."]
    return "\n".join(lines) + "\n"


def write_measurement(result: dict, out: Path, title: str = "") -> Dict[str, Path]:
    """``indices.md``, ``indices.json`` and ``indices_coverage.png`` into ``out``."""
    from .report_files import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "indices.md", "json": out / "indices.json", "png": out / "indices_coverage.png"}
    atomic_write(paths["md"], markdown(result, title).encode("utf-8"))
    atomic_write(paths["json"], json.dumps({"title": title, **result}, indent=1).encode("utf-8"))
    plot_intervals(result, paths["png"], title)
    return paths


def plot_intervals(result: dict, path: Path, title: str = "") -> Path:
    """Predicted index with its interval against the label-derived one, one panel per index, and
    the empirical coverage per family against the nominal level."""
    from cardseg.cohort import indices as ix

    from .report_files import pyplot, save_titled

    plt = pyplot()
    fig, axes = plt.subplots(2, 5, figsize=(16, 6.6))
    for ax, name in zip(axes.ravel(), ix.INDEX_NAMES):
        items = [r[name] for r in result["rows"]]
        t = np.array([i["truth"] for i in items])
        v = np.array([i["value"] for i in items])
        lo, hi = np.array([i["low"] for i in items]), np.array([i["high"] for i in items])
        inside = (lo <= t) & (t <= hi)
        for ok, colour in ((True, "C0"), (False, "C3")):
            sel = inside == ok
            ax.errorbar(t[sel], v[sel], yerr=[v[sel] - lo[sel], hi[sel] - v[sel]], fmt="o", ms=4, color=colour,
                        capsize=2, lw=1, label="truth inside the interval" if ok else "truth outside")
        both = np.concatenate([t, lo, hi])
        a, b = float(np.nanmin(both)), float(np.nanmax(both))
        ax.plot([a, b], [a, b], color="0.5", lw=0.8, ls="--")
        m = result["indices"][name]
        ax.set_title(f"{name}: {m['covered']}/{m['n']} inside, width {m['mean_width']:.1f}", fontsize=9)
        ax.set_xlabel(f"from labels ({m['unit']})", fontsize=8)
        ax.set_ylabel(f"from segmentation ({m['unit']})", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper left")
    ax = axes.ravel()[-1]
    fams = list(result["families"])
    cov = [result["families"][f]["coverage"] for f in fams]
    ci = np.array([result["families"][f]["coverage_ci95"] for f in fams])
    base = [result["constant_width_baseline"]["families"][f]["coverage"] for f in fams]
    x = np.arange(len(fams))
    ax.bar(x - 0.18, cov, 0.36, color="C0", label="CARD spread")
    ax.errorbar(x - 0.18, cov, yerr=[np.array(cov) - ci[:, 0], ci[:, 1] - np.array(cov)], fmt="none", color="k",
                capsize=3, lw=1)
    ax.bar(x + 0.18, base, 0.36, color="0.7", label="constant width")
    ax.axhline(result["nominal"], color="C3", ls="--", lw=1, label=f"nominal {result['nominal']:.0%}")
    short = {"LV_volume": "LV vol", "RV_volume": "RV vol", "LV_stroke_volume": "LVSV", "RV_stroke_volume": "RVSV",
             "LV_ejection_fraction": "LVEF", "RV_ejection_fraction": "RVEF", "LV_mass": "LVM"}
    ax.set_xticks(x, [short.get(f, f) for f in fams], fontsize=7)
    ax.set(ylim=(0, 1.05), ylabel="test coverage", title="coverage per family (95% CI)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="lower left")
    return save_titled(fig, Path(path), title)
