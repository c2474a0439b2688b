"""``cardseg fit-review`` and the review section of ``cardseg evaluate``: files and figures.

* :func:`fit_bundle_review` collects the clean validation volumes' maps, chooses how regions
  are formed and fits ``p_error`` (:mod:`cardseg_train.review_fit`), and writes the ``regions``
  block of ``bundle.json``.
* :func:`write_review` writes ``review.md`` / ``review.json`` and ``review.png`` (caught fraction
  against the number of regions reviewed, per condition, for the bundle's rule and today's
  baseline rule; reliability of ``p_error`` over regions).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np

from cardseg.review.regions import ErrorModel

from .report_files import atomic_write, format_value, pyplot, save_titled
from .review_fit import evaluate_review, select_settings

#: the rule before the review model (1.2.0): 3D components of TAC above the bundle's
#: ``baseline_flag_threshold`` (1.2.0: the 0.99 quantile of clean validation TAC), by summed TAC
BASELINE_RULE = {"connectivity": "3d", "merge_px": 0, "min_voxels": 10, "max_regions": None}


def bundle_rule(config: dict) -> tuple:
    """``(settings, model or None)`` of a bundle's ``regions`` block."""
    reg = dict(config["regions"])
    model = ErrorModel.from_dict(reg["model"]) if reg.get("model") else None
    settings = {"connectivity": reg.get("connectivity", "3d"), "flag_threshold": float(reg["flag_threshold"]),
                "merge_px": int(reg.get("merge_px", 0)), "min_voxels": int(reg["min_voxels"]),
                "max_regions": reg.get("max_regions")}
    return settings, model


def fit_bundle_review(bundle, data: str, cache_dir: Optional[Path], write: bool = True, device="cpu",
                      batch_size: int = 8, progress=None) -> dict:
    """Choose the region rule and fit ``p_error`` on the clean validation volumes; write them into
    the bundle (unless ``write`` is False). Returns the fit summary."""
    from cardseg.bundle.loading import update_config

    from .evaluation import acdc_h5_volumes
    from .review_data import cache_key, collect_maps

    t0 = time.perf_counter()
    cases = acdc_h5_volumes(data, "val")
    key = cache_key(bundle, "val", 0)
    maps = collect_maps(bundle, cases, ["clean"], None if cache_dir is None else Path(cache_dir) / key, 0, device,
                        batch_size, progress)
    fit = select_settings(maps, progress=progress)
    block = {**fit["settings"], "model": fit["model"].to_dict(),
             "fit": {"split": "val", "condition": "clean", "volumes": len(maps),
                     "objective": "substantial errors caught by the first 3 regions per volume, leave-one-patient-out",
                     "validation": fit["validation"], "date": time.strftime("%Y-%m-%d"),
                     "seconds": round(time.perf_counter() - t0, 1)}}
    old = bundle.config["regions"]
    block["baseline_flag_threshold"] = float(old.get("baseline_flag_threshold", old["flag_threshold"]))
    if write:
        update_config(bundle.path, {"regions": block})
    return {"block": block, "candidates": fit["candidates"]}


def review_tables(maps, config: dict) -> dict:
    """The bundle's rule and the baseline rule, evaluated per condition on ``maps``."""
    settings, model = bundle_rule(config)
    baseline = {**BASELINE_RULE, "flag_threshold": settings["flag_threshold"] if not config["regions"].get("model")
                else float(config["regions"].get("baseline_flag_threshold", settings["flag_threshold"]))}
    per_condition = evaluate_review(maps, settings, model)
    return {"rule": {**settings, "ranking": "p_error" if model else "summed_disagreement"},
            "bundle": per_condition, "pooled_region_ece": pooled_ece(per_condition),
            "baseline_rule": baseline, "baseline": evaluate_review(maps, baseline, None)}


def pooled_ece(per_condition: dict) -> Optional[float]:
    """ECE of ``p_error`` over the regions of every condition together (from the per-bin counts)."""
    n = err = 0.0
    for s in per_condition.values():
        rel = s["reliability"]
        for count, mp, obs in zip(rel["count"], rel["mean_p"], rel["observed"]):
            if count:
                n += count
                err += count * abs(obs - mp)
    return err / n if n else None


def markdown(t: dict, title: str) -> str:
    lines = [f"# {title}", "",
             "Substantial error: per slice, a connected component of wrong voxels of at least 30 pixels after a "
             "one-pixel opening. A region catches it when one of its voxels lies within 2 pixels of it on its slice. "
             "Fractions are pooled over the volumes of a condition.", "",
             f"Rule: `{json.dumps(t['rule'])}`; baseline: `{json.dumps(t['baseline_rule'])}` ranked by summed "
             "disagreement.", "",
             "Review burden: voxels of the first three regions over the predicted heart (foreground) voxels, "
             "mean over volumes.", "",
             "| condition | rule | errors | top 1 | top 3 | top 5 | all | regions / volume | regions catching nothing "
             "| review burden | p_error ECE |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for cond in t["bundle"]:
        for name, key in (("bundle", "bundle"), ("baseline", "baseline")):
            s = t[key][cond]
            lines.append(f"| {cond} | {name} | {s['substantial_errors']} | {format_value(s['caught_top1'], 100, 0)}% | "
                         f"{format_value(s['caught_top3'], 100, 0)}% | {format_value(s['caught_top5'], 100, 0)}% | "
                         f"{format_value(s['caught_all'], 100, 0)}% | {format_value(s['regions_per_volume'], 1, 1)} | "
                         f"{format_value(s['empty_region_fraction'], 100, 0)}% | "
                         f"{format_value(s['top3_size_over_foreground'], 100, 0)}% | {format_value(s.get('region_ece'), 1, 3)} |")
    if t.get("pooled_region_ece") is not None:
        lines += ["", f"p_error ECE over the regions of all conditions together: {t['pooled_region_ece']:.3f} "
                      "(10 equal-width bins)."]
    return "\n".join(lines) + "\n"


def plot_review(t: dict, path: Path) -> Path:
    """Left: caught fraction for the top 1/3/5/all regions per condition (bundle solid, baseline
    dashed). Right: observed error frequency against ``p_error`` over regions, per condition."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    xs = ["1", "3", "5", "all"]
    for i, cond in enumerate(t["bundle"]):
        colour = f"C{i}"
        for key, style in (("bundle", "-o"), ("baseline", "--x")):
            s = t[key][cond]
            ys = [s["caught_top1"], s["caught_top3"], s["caught_top5"], s["caught_all"]]
            a.plot(xs, [np.nan if y is None else y for y in ys], style, color=colour,
                   label=f"{cond} ({key})" if key == "bundle" else None, alpha=1.0 if key == "bundle" else 0.5)
        rel = t["bundle"][cond]["reliability"]
        pts = [(m, o, n) for m, o, n in zip(rel["mean_p"], rel["observed"], rel["count"]) if n]
        if pts:
            b.scatter([p[0] for p in pts], [p[1] for p in pts], s=[8 + 4 * p[2] for p in pts], color=colour,
                      alpha=0.6, label=cond)
    a.set_xlabel("regions reviewed per volume")
    a.set_ylabel("substantial errors caught")
    a.set_ylim(0, 1)
    a.legend(fontsize=7)
    a.set_title("caught fraction (dashed: baseline rule)", fontsize=9)
    b.plot([0, 1], [0, 1], "k:", lw=1)
    b.set_xlabel("p_error (bin mean)")
    b.set_ylabel("regions holding an error")
    b.set_xlim(0, 1)
    b.set_ylim(0, 1)
    if b.get_legend_handles_labels()[0]:
        b.legend(fontsize=7)
    b.set_title("reliability of p_error over regions (dot size: count)", fontsize=9)
    return save_titled(fig, path)


def write_review(t: dict, out: Path, title: str) -> Dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "review.md", "json": out / "review.json", "png": out / "review.png"}
    atomic_write(paths["md"], markdown(t, title).encode("utf-8"))
    atomic_write(paths["json"], (json.dumps(t, indent=1) + "\n").encode("utf-8"))
    plot_review(t, paths["png"])
    return paths


def summary_line(t: dict, conditions: Sequence[str]) -> str:
    parts = []
    for cond in conditions:
        s = t["bundle"].get(cond)
        if s:
            parts.append(f"{cond} top3 {format_value(s['caught_top3'], 100, 0)}% all {format_value(s['caught_all'], 100, 0)}% "
                         f"({format_value(s['regions_per_volume'], 1, 1)}/vol)")
    return "review: " + "; ".join(parts)
