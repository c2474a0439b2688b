"""Files of a calibration evaluation: the table (Markdown, CSV, JSON) and the figures.

:func:`write_report` takes the dictionary of
:func:`cardseg_train.calibration.harness.calibration_table` and writes into one folder:

* ``calibration.md`` / ``calibration.csv`` / ``calibration.json``: the paper's Table I form
  (ECE / SCE / ACE per condition in %, pooled over the ROI pixels; mean NLL over the conditions
  and over the ACDC-C block), NLL per condition, segmentation quality per condition;
* ``nll_by_condition.png`` (paper Fig. 1b), ``reliability.png`` and
  ``confidence_histograms.png`` (one panel per condition and method),
  ``agreement_vs_dice.png`` (paper Fig. 2b, with Pearson r);

:func:`plot_case_panel` draws the qualitative panel of one slice (paper Fig. 4).
Every file is written to a temporary name first and renamed, so nothing is left half written.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from cardseg_train.base.report_files import atomic_write, format_value, pyplot, save_figure, save_titled


def _label(t: dict, method: str) -> str:
    """The method's name in this table (``labels``, written by the harness from the calibrators)."""
    return (t.get("labels") or {}).get(method, method)


def markdown_table(t: dict, title: str = "") -> str:
    """The report as Markdown: the Table I form, NLL per condition, segmentation per condition."""
    conds, methods = t["conditions"], t["methods"]
    lines = [f"# {title}" if title else "# Calibration", ""]
    lines += [
        f"{t['volumes']} volumes x {len(conds)} conditions. ECE / SCE / ACE in %, 10 bins, pooled over the "
        "ROI pixels (ground truth dilated by 10 px per slice, at each volume's own grid); NLL is the mean over "
        "ROI pixels. *Block NLL* is the paper's ACDC-C block: the mean of the per-condition NLLs over all "
        f"{len(conds)} conditions, clean included, each weighing the same; *artifacts-only NLL* leaves clean "
        "out.",
        "",
    ]
    artifacts = t.get("artifacts_only_nll")
    head = "| Method | " + " | ".join(f"{c} ECE | {c} SCE | {c} ACE" for c in conds) + " | block NLL |"
    if artifacts:
        head += " artifacts-only NLL |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for m in methods:
        cells = [
            f"{format_value(t['pooled'][c][m]['ece'], 100, 2)} | {format_value(t['pooled'][c][m]['sce'], 100, 2)} | "
            f"{format_value(t['pooled'][c][m]['ace'], 100, 2)}"
            for c in conds
        ]
        row = f"| {_label(t, m)} | " + " | ".join(cells) + f" | {format_value(t['mean_nll'][m])} |"
        if artifacts:
            row += f" {format_value(artifacts[m])} |"
        lines.append(row)
    lines += ["", "NLL per condition (pooled over ROI pixels):", ""]
    head = "| Method | " + " | ".join(conds) + " | block (mean) |"
    lines += [head, "|" + "---|" * (len(conds) + 2)]
    for m in methods:
        lines.append(
            f"| {_label(t, m)} | "
            + " | ".join(format_value(t["pooled"][c][m]["nll"]) for c in conds)
            + f" | {format_value(t['mean_nll'][m])} |"
        )
    ratio = t.get("card_vs_best_post_hoc")
    lines += ["", f"Lowest block NLL: **{_label(t, t['lowest_mean_nll'])}**."]
    if ratio:
        lines.append(
            f"CARD / best post-hoc baseline ({_label(t, ratio['best_baseline'])}): "
            f"**{ratio['card_over_best']:.3f}x** block NLL."
        )
    lines += bootstrap_lines(t)
    names = t["classes"][1:]
    lines += [
        "",
        "Segmentation (primary, same for every method) per condition:",
        "",
        "| Condition | " + " | ".join(f"Dice {n}" for n in names) + " | Dice mean | LCC ratio primary | "
        "LCC ratio reference | agreement | r(agreement, slice Dice) |",
        "|" + "---|" * (len(names) + 6),
    ]
    for c in conds:
        s = t["segmentation"][c]
        lines.append(
            f"| {c} | "
            + " | ".join(format_value(s["dice"][n]) for n in names)
            + f" | {format_value(s['dice']['mean'])} | "
            f"{format_value(s['lcc'])} | {format_value(s.get('lcc_reference'))} | {format_value(s['agreement'])} | "
            f"{format_value(t['agreement_vs_dice']['per_condition'][c]['r'])} |"
        )
    lines += [
        "",
        "LCC ratio: largest connected component over all foreground, per 2D slice, averaged over slices "
        "with predicted foreground (paper Fig. 2a).",
        "",
        f"Pearson r of slice agreement against slice Dice over all conditions: "
        f"{format_value(t['agreement_vs_dice']['r_all'])}.",
        "",
    ]
    return "\n".join(lines)


def csv_rows(t: dict):
    """One row per (condition, method): pooled and per-volume-mean ECE/SCE/ACE/NLL."""
    for c in t["conditions"]:
        for m in t["methods"]:
            p, v = t["pooled"][c][m], t["per_volume_mean"][c][m]
            yield {
                "condition": c,
                "method": m,
                "ece": p["ece"],
                "sce": p["sce"],
                "ace": p["ace"],
                "nll": p["nll"],
                "pixels": p["n"],
                "ece_volume_mean": v["ece"],
                "sce_volume_mean": v["sce"],
                "ace_volume_mean": v["ace"],
                "nll_volume_mean": v["nll"],
            }


def bootstrap_lines(t: dict) -> list:
    """The paired patient-bootstrap table of a calibration table (none for older tables)."""
    bs = t.get("bootstrap")
    if not bs:
        return []
    ref = bs.get("reference")
    lines = [
        "",
        f"Block NLL with {100 * bs['level']:.0f}% intervals from a paired bootstrap over the "
        f"{bs['patients']} patients ({bs['resamples']} resamples; every method on the same draws)"
        + (f", and {_label(t, ref)} against each method:" if ref else ":"),
        "",
        "| Method | block NLL | interval | "
        + (f"{_label(t, ref)} - method | {_label(t, ref)} / method |" if ref else ""),
        "|---|---|---|" + ("---|---|" if ref else ""),
    ]
    for m in t["methods"]:
        lo, hi = bs["block_nll"][m]
        row = f"| {_label(t, m)} | {format_value(t['mean_nll'][m])} | {lo:.3f} to {hi:.3f} |"
        if ref:
            d, r = bs["difference"].get(m), bs["ratio"].get(m)
            row += f" {d[0]:+.3f} to {d[1]:+.3f} | {r[0]:.3f}x to {r[1]:.3f}x |" if d else " | |"
        lines.append(row)
    return lines


def write_tables(t: dict, out: Path, title: str = "") -> Dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "calibration.md", "csv": out / "calibration.csv", "json": out / "calibration.json"}
    atomic_write(paths["md"], markdown_table(t, title).encode("utf-8"))
    buf = io.StringIO()
    rows = list(csv_rows(t))
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    atomic_write(paths["csv"], buf.getvalue().encode("utf-8"))
    atomic_write(paths["json"], json.dumps({"title": title, **t}, indent=1).encode("utf-8"))
    return paths


# --------------------------------------------------------------------------------------------
# figures


def plot_nll_by_condition(t: dict, path: Path) -> Path:
    """Grouped bars: pooled NLL per condition, one bar per method (paper Fig. 1b)."""
    plt = pyplot()
    conds, methods = t["conditions"], t["methods"]
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(conds), 3.6))
    width = 0.8 / len(methods)
    x = np.arange(len(conds))
    for i, m in enumerate(methods):
        vals = [t["pooled"][c][m]["nll"] for c in conds]
        ax.bar(
            x + (i - (len(methods) - 1) / 2) * width,
            vals,
            width,
            label=f"{_label(t, m)} (mean {t['mean_nll'][m]:.3f})",
            color=f"C{i}",
        )
    ax.set_xticks(x, conds)
    ax.set(ylabel="NLL (ROI pixels)", title="NLL per condition")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def _condition_method_grid(t: dict, path: Path, draw, ylabel: str, row_height: float) -> Path:
    """One panel per (condition, method): rows = conditions, columns = methods;
    ``draw(ax, condition, method, column)`` fills a panel."""
    plt = pyplot()
    conds, methods = t["conditions"], t["methods"]
    fig, axes = plt.subplots(
        len(conds),
        len(methods),
        figsize=(2.3 * len(methods), row_height * len(conds)),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    for i, c in enumerate(conds):
        for j, m in enumerate(methods):
            ax = axes[i][j]
            draw(ax, c, m, j)
            if i == 0:
                ax.set_title(_label(t, m), fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{c}\n{ylabel}", fontsize=8)
            if i == len(conds) - 1:
                ax.set_xlabel("confidence", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def _bin_centres(t: dict, c: str, m: str):
    edges = np.asarray(t["reliability"][c][m]["edges"])
    return (edges[:-1] + edges[1:]) / 2, edges[1] - edges[0]


def plot_reliability(t: dict, path: Path) -> Path:
    """Top-label reliability diagrams (accuracy per confidence bin, gap to the diagonal shaded)."""

    def draw(ax, c, m, j):
        d = t["reliability"][c][m]
        centres, w = _bin_centres(t, c, m)
        acc = np.nan_to_num(np.array([np.nan if a is None else a for a in d["accuracy"]]))
        conf = np.nan_to_num(np.array([np.nan if a is None else a for a in d["confidence"]]))
        ax.bar(centres, acc, w, color="C0", edgecolor="k", lw=0.3)
        seen = np.asarray(d["count"]) > 0
        ax.bar(centres[seen], np.abs(conf - acc)[seen], w, bottom=np.minimum(acc, conf)[seen], color="C3", alpha=0.35)
        ax.plot([0, 1], [0, 1], "k--", lw=0.8)
        ax.text(0.03, 0.9, f"ECE {100 * t['pooled'][c][m]['ece']:.1f}%", fontsize=7, transform=ax.transAxes)

    return _condition_method_grid(t, path, draw, "accuracy", 2.2)


def plot_confidence_histograms(t: dict, path: Path) -> Path:
    """Share of ROI pixels per top-label confidence bin (log scale)."""

    def draw(ax, c, m, j):
        centres, w = _bin_centres(t, c, m)
        counts = np.asarray(t["confidence_histogram"][c][m], dtype=np.float64)
        ax.bar(centres, counts / max(1.0, counts.sum()), w, color=f"C{j}", edgecolor="k", lw=0.3)
        ax.set_yscale("log")

    return _condition_method_grid(t, path, draw, "share of pixels", 2.0)


def plot_agreement_vs_dice(t: dict, path: Path) -> Path:
    """Slice agreement (Eq. 5 over the ROI) against slice Dice, one colour per condition."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    for i, c in enumerate(t["conditions"]):
        s = t["agreement_vs_dice"]["per_condition"][c]
        ax.scatter(
            s["agreement"], s["dice"], s=9, alpha=0.6, color=f"C{i}", label=f"{c} (r = {format_value(s['r'], 1, 2)})"
        )
    ax.set(
        xlabel="slice agreement (Eq. 5, ROI)",
        ylabel="slice Dice (mean over classes)",
        title=f"agreement vs Dice, r = {format_value(t['agreement_vs_dice']['r_all'], 1, 2)}",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def write_figures(t: dict, out: Path) -> Dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {
        "nll": plot_nll_by_condition(t, out / "nll_by_condition.png"),
        "reliability": plot_reliability(t, out / "reliability.png"),
        "histograms": plot_confidence_histograms(t, out / "confidence_histograms.png"),
        "agreement": plot_agreement_vs_dice(t, out / "agreement_vs_dice.png"),
    }


def write_report(t: dict, out: Path, title: str = "") -> Dict[str, Path]:
    """Tables and figures of one evaluation into ``out``."""
    return {**write_tables(t, out, title), **write_figures(t, out)}


def plot_case_panel(
    image: np.ndarray,
    truth: np.ndarray,
    primary: np.ndarray,
    reference: np.ndarray,
    tac: np.ndarray,
    path: Path,
    title: str = "",
    temperature: Optional[np.ndarray] = None,
) -> Path:
    """Paper Fig. 4 for one 2D slice ``(Y, X)``: input with the ground-truth contour, primary and
    reference predictions, TAC map, primary error map (and CARD's temperature when given)."""
    plt = pyplot()
    from matplotlib.colors import ListedColormap

    k = int(max(truth.max(), primary.max(), reference.max(), 3)) + 1
    labels_cmap = ListedColormap([(0, 0, 0, 0)] + [plt.get_cmap("tab10")(i) for i in range(k - 1)])
    panels = 5 + (temperature is not None)
    fig, axes = plt.subplots(1, panels, figsize=(2.6 * panels, 3.0))
    axes[0].imshow(image, cmap="gray")
    axes[0].contour(truth > 0, levels=[0.5], colors="lime", linewidths=0.8)
    for kk in range(1, k):
        if (truth == kk).any():
            axes[0].contour(truth == kk, levels=[0.5], colors=[labels_cmap(kk)], linewidths=0.6)
    axes[0].set_title("input + ground truth", fontsize=9)
    for ax, lab, name in ((axes[1], primary, "primary"), (axes[2], reference, "reference")):
        ax.imshow(image, cmap="gray")
        ax.imshow(lab, cmap=labels_cmap, vmin=0, vmax=k - 1, alpha=0.6, interpolation="nearest")
        ax.set_title(f"{name} prediction", fontsize=9)
    im = axes[3].imshow(tac, cmap="inferno", vmin=0, vmax=max(1e-6, float(np.quantile(tac, 0.995))))
    axes[3].set_title("TAC (disagreement)", fontsize=9)
    fig.colorbar(im, ax=axes[3], fraction=0.046)
    err = (primary != truth).astype(np.float32)
    axes[4].imshow(image, cmap="gray")
    axes[4].imshow(np.ma.masked_where(err == 0, err), cmap="autumn", alpha=0.8, interpolation="nearest")
    axes[4].set_title(f"primary errors ({int(err.sum())} px)", fontsize=9)
    if temperature is not None:
        im = axes[5].imshow(temperature, cmap="viridis")
        axes[5].set_title("CARD temperature", fontsize=9)
        fig.colorbar(im, ax=axes[5], fraction=0.046)
    for ax in axes:
        ax.set_axis_off()
    return save_titled(fig, Path(path), title)


def plot_conditions(images: Dict[str, np.ndarray], truth: np.ndarray, path: Path, title: str = "") -> Path:
    """One 2D slice under each condition, with the ground-truth outline: the picture that shows
    an artifact is what it claims (motion rings and blurs inside the field of view rather than
    shifting the heart off its mask). images: condition -> ``(Y, X)``."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(images), figsize=(2.6 * len(images), 2.9), squeeze=False)
    for ax, (name, img) in zip(axes[0], images.items()):
        ax.imshow(img, cmap="gray")
        ax.contour(truth > 0, levels=[0.5], colors="lime", linewidths=0.7)
        ax.set_title(name, fontsize=9)
        ax.set_axis_off()
    return save_titled(fig, Path(path), title)
