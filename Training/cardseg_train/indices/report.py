"""The tables and figure of a cardiac-index measurement (``indices.md``, ``indices.json``,
``indices_coverage.png``) from :func:`cardseg_train.indices.fit.measure`'s result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import numpy as np

#: what :func:`write_measurement` writes (fit-indices --measure-test OUT)
MEASUREMENT_FILES = ("indices.md", "indices.json", "indices_coverage.png")


def _fmt_width(x: float) -> str:
    return "inf" if not np.isfinite(x) else f"{x:.1f}"


def markdown(result: dict, title: str = "") -> str:
    """``indices.md`` of a measurement (:func:`cardseg_train.indices.fit.measure`'s result with the
    settings, baselines and validation figures ``fit-indices`` adds)."""
    fit = result["settings"].get("fit", {})
    lines = _header_lines(result, title) + _index_lines(result) + _lvef_lines(result) + _model_lines(result)
    lines += _split_check_lines(fit.get("training_split_check") or {}) + _previous_lines(result.get("versus_previous"))
    lines += _closing_lines(result)
    return "\n".join(lines) + "\n"


def _header_lines(result: dict, title: str) -> list:
    """The title, what was fitted on what and measured on what, and the model's assumptions."""
    s = result["settings"]
    fit = s.get("fit", {})
    pool = ", ".join(f"{g}: {n}" for g, n in (fit.get("pool_subjects") or {}).items()) or "none"
    return [
        f"# Cardiac indices: {title}" if title else "# Cardiac indices",
        "",
        f"Nominal level **{result['nominal']:.0%}**, method `{s['block']['method']}`: per index, bias and sd from the "
        f"{fit.get('subjects', '?')} {fit.get('split', 'val')} subjects' errors, the pivot from the standardised "
        f"shape pool ({pool} "
        f"subjects, plus the validation errors), fitted {fit.get('date', '?')}. Measured on "
        f"{result['subjects']} test subjects (ED = frame01, ES = frame02), nothing fitted or chosen on them. "
        f"Truth: the indices from the ground-truth labels on the same grid. Volumes: {_volumes(s['block'])}. "
        f"{s['geometry']}.",
        "",
        f"Assumptions: {s['block']['assumptions']}.",
    ]


def _index_lines(result: dict) -> list:
    """The test table: per index coverage, widths, errors and the split-conformal baseline."""
    from cardseg.cohort import indices as ix

    base = result["split_conformal_baseline"]
    lines = [
        "",
        "| Index | unit | coverage | 95% CI of coverage | median width | mean width | MAE | 95% CI of MAE "
        "(patient bootstrap) | MAE without the volume corrections | mean error (seg - labels) | mean truth | "
        "Spearman(CARD spread, abs error) | "
        "split-conformal (abs. errors) coverage | its width |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in ix.INDEX_NAMES:
        m, b = result["indices"][n], base[n]
        rho = "n/a" if m["spearman_spread_abs_error"] is None else f"{m['spearman_spread_abs_error']:.2f}"
        lines.append(
            f"| {n} | {m['unit']} | {m['covered']}/{m['n']} = {m['coverage']:.2f} | "
            f"{m['coverage_ci95'][0]:.2f}-{m['coverage_ci95'][1]:.2f} | {m['median_width']:.1f} | "
            f"{m['mean_width']:.1f} | {m['mae']:.2f} | {_ci(m.get('mae_ci95'))} | "
            f"{result['uncorrected_volumes'][n]:.2f} | "
            f"{m['mean_error']:+.2f} | {m['truth_mean']:.1f} | {rho} | {b['coverage']:.2f} | "
            f"{_fmt_width(b['median_width'])} |"
        )
    return lines


def _lvef_lines(result: dict) -> list:
    """The LVEF categories: how many intervals straddle a threshold, and every test patient's row."""
    c = result["lvef_categories"]
    lines = [
        "",
        f"LVEF categories (reduced <= 40 %, mildly reduced 41-49 %, preserved >= 50 %, on whole percent, "
        f"half up): {c['straddling']} of {c['n']} intervals straddle a threshold; {c['implies_true_category']} "
        f"of {c['n']} imply the category of the label-derived LVEF; the point value falls in the true category "
        f"for {c['value_in_true_category']} of {c['n']}.",
        "",
        "| patient | LVEF (seg) | interval | label | true LVEF | true category |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        e = r["LVEF"]
        lines.append(
            f"| {r['patient']} | {e['value']:.1f} | {e['low']:.1f}-{e['high']:.1f} | {e['label']} | "
            f"{e['truth']:.1f} | {e['true_category']} |"
        )
    return lines


def _model_lines(result: dict) -> list:
    """The model per index with its validation figures (in-sample and leave-one-out)."""
    from cardseg.cohort import indices as ix

    s = result["settings"]
    loo = s.get("fit", {}).get("validation_leave_one_out", {})
    val = result["validation_in_sample"]
    lines = [
        "",
        "The model per index (errors: `absolute` = truth - value in the index's unit, `relative` = truth / "
        "value - 1), and on validation: in-sample coverage and each subject predicted from the others "
        "(leave one out):",
        "",
        "| Index | errors | bias | sd | pivot | half width | validation coverage (in-sample) | "
        "leave-one-out coverage | leave-one-out median width (model units) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in ix.INDEX_NAMES:
        m = s["block"]["models"][n]
        lo = loo.get(n) or {}
        lines.append(
            f"| {n} | {m['errors']} | {m['bias']:+.4g} | {m['sd']:.4g} | {m['pivot']:.3f} | "
            f"{m['half_width']:.4g} | {val['indices'][n]['coverage']:.2f} | "
            f"{lo.get('coverage', float('nan')):.2f} | {lo.get('median_width', float('nan')):.4g} |"
        )
    return lines


def _closing_lines(result: dict) -> list:
    """The mean absolute errors in words and how to read the split-conformal baseline."""
    from cardseg.cohort import indices as ix

    fit = result["settings"].get("fit", {})
    idx = result["indices"]
    return [
        "",
        f"Mean absolute error: LVEF {idx['LVEF']['mae']:.2f} points, RVEF {idx['RVEF']['mae']:.2f} points; "
        + ", ".join(f"{n} {idx[n]['mae']:.1f} ml" for n in ix.VOLUME_NAMES)
        + f"; LVM {idx['LVM_g']['mae']:.1f} g.",
        "",
        f"Split-conformal baseline: the same point values with the ceil((n + 1) level)-th smallest absolute "
        f"validation error as half width (n = {fit.get('subjects', '?')}: the largest one at 90 %). With "
        f"{result['subjects']} test subjects one index's coverage moves in steps of "
        f"{1 / max(result['subjects'], 1):.2f}; read the 95% intervals of coverage, not the point values.",
    ]


def _ci(ci) -> str:
    return "n/a" if not ci else f"{ci[0]:.2f}-{ci[1]:.2f}"


def _split_check_lines(checks: dict) -> list:
    """The procedure fitted on ``n`` training patients (in-sample errors) and measured on the rest."""
    items = [(n, c) for n, c in checks.items() if c]
    if not items:
        return []
    c0 = items[0][1]
    lines = [
        "",
        f"Cross-fitting check on the training patients' in-sample errors (exchangeable among themselves): "
        f"{c0['repeats']} times, bias and sd from {c0['n_fit']} of them, the other {c0['n_held']} predicted "
        "(widths are in-sample ones, smaller than on new subjects; the coverage is the procedure's):",
        "",
        "| Index | mean held-out coverage | 10th-90th percentile over repeats | mean median width (model units) |",
        "|---|---|---|---|",
    ]
    for n, c in items:
        lines.append(
            f"| {n} | {c['coverage']:.3f} | {c['coverage_p10']:.2f}-{c['coverage_p90']:.2f} | {c['median_width']:.4g} |"
        )
    return lines


def _previous_lines(prev) -> list:
    """New minus previous measurement, paired by patient, with patient-bootstrap 95 % intervals."""
    if not prev:
        return []
    lines = [
        "",
        f"Against the previous measurement (`{prev['folder']}`, method `{prev['method']}`), new minus "
        "previous on the same patients, 95% paired patient-bootstrap intervals:",
        "",
        "| Index | patients | MAE difference | its 95% CI | coverage difference | its 95% CI | mean width difference "
        "| its 95% CI |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, d in prev["differences"].items():
        lines.append(
            f"| {n} | {d['patients']} | "
            + " | ".join(
                f"{d[k]['difference']:+.2f} | [{d[k]['ci95'][0]:+.2f}, {d[k]['ci95'][1]:+.2f}]"
                for k in ("mae", "coverage", "mean_width")
            )
            + " |"
        )
    return lines


def _volumes(block: dict) -> str:
    v = block.get("volumes") or {}
    parts = []
    if v.get("islands"):
        parts.append(f"stray islands of {', '.join(v['islands'])} dropped (largest 3D component kept)")
    if v.get("gaps"):
        parts.append(
            f"slice gaps of {', '.join(v['gaps'])} filled (area below {v.get('gap_fraction')} of both neighbours)"
        )
    return "; ".join(parts) or "as segmented"


def write_measurement(result: dict, out: Path, title: str = "") -> Dict[str, Path]:
    """``indices.md``, ``indices.json`` and ``indices_coverage.png`` into ``out``."""
    from cardseg_train.base.report_files import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "indices.md", "json": out / "indices.json", "png": out / "indices_coverage.png"}
    atomic_write(paths["md"], markdown(result, title).encode("utf-8"))
    atomic_write(paths["json"], json.dumps({"title": title, **result}, indent=1).encode("utf-8"))
    plot_intervals(result, paths["png"], title)
    return paths


def plot_intervals(result: dict, path: Path, title: str = "") -> Path:
    """Predicted index with its interval against the label-derived one, one panel per index; the
    LVEF panel shades the category thresholds."""
    from cardseg.cohort import indices as ix

    from cardseg_train.base.report_files import pyplot, save_titled

    plt = pyplot()
    fig, axes = plt.subplots(2, 5, figsize=(16, 6.6))
    for ax, name in zip(axes.ravel(), ix.INDEX_NAMES):
        items = [r[name] for r in result["rows"]]
        t = np.array([i["truth"] for i in items])
        v = np.array([i["value"] for i in items])
        lo, hi = np.array([i["low"] for i in items]), np.array([i["high"] for i in items])
        inside = (lo <= t) & (t <= hi)
        for ok, colour in ((True, "C0"), (False, "C3")):
            sel = inside == ok  # the interval need not hold the value (it is shifted by the validation bias)
            ax.vlines(t[sel], lo[sel], hi[sel], color=colour, lw=1)
            ax.plot(
                t[sel], v[sel], "o", ms=4, color=colour, label="truth inside the interval" if ok else "truth outside"
            )
        both = np.concatenate([t, lo, hi])
        a, b = float(np.nanmin(both)), float(np.nanmax(both))
        ax.plot([a, b], [a, b], color="0.5", lw=0.8, ls="--")
        if name == "LVEF":
            for cut in (40.5, 49.5):
                ax.axhline(cut, color="C2", lw=0.8, ls=":")
        m = result["indices"][name]
        ax.set_title(f"{name}: {m['covered']}/{m['n']} inside, median width {m['median_width']:.1f}", fontsize=9)
        ax.set_xlabel(f"from labels ({m['unit']})", fontsize=8)
        ax.set_ylabel(f"from segmentation ({m['unit']})", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper left")
    ax = axes.ravel()[-1]
    names = list(ix.INDEX_NAMES)
    cov = [result["indices"][n]["coverage"] for n in names]
    ci = np.array([result["indices"][n]["coverage_ci95"] for n in names])
    base = [result["split_conformal_baseline"][n]["coverage"] for n in names]
    x = np.arange(len(names))
    ax.bar(x - 0.18, cov, 0.36, color="C0", label="location-scale pivot")
    ax.errorbar(
        x - 0.18, cov, yerr=[np.array(cov) - ci[:, 0], ci[:, 1] - np.array(cov)], fmt="none", color="k", capsize=3, lw=1
    )
    ax.bar(x + 0.18, base, 0.36, color="0.7", label="split-conformal")
    ax.axhline(result["nominal"], color="C3", ls="--", lw=1, label=f"nominal {result['nominal']:.0%}")
    ax.set_xticks(x, [n.replace("_ml", "").replace("_g", "") for n in names], fontsize=6, rotation=45)
    ax.set(ylim=(0, 1.05), ylabel="test coverage", title="coverage per index (95% CI)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="lower left")
    return save_titled(fig, Path(path), title)
