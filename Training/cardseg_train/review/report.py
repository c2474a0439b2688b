"""``cardseg fit-review`` and the review section of ``cardseg evaluate``: files and figures.

* :func:`fit_bundle_review` collects the clean validation volumes' maps, chooses how regions
  are formed and fits ``p_error`` (:mod:`cardseg_train.review.errmap`), and builds the ``regions``
  block of ``bundle.json`` (the rule it replaces kept as ``regions.previous``).
* :func:`review_tables` measures the bundle's rule and the previous one per condition
  (:mod:`cardseg_train.review.measure`); :func:`write_review` writes ``review.md`` /
  ``review.json`` and ``review.png`` (covered errors against burden for the rule and every
  baseline, per condition; reliability of ``p_error`` over regions).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np

from cardseg.review.regions import DEFAULTS, ErrorModel

from cardseg_train.base.report_files import atomic_write, format_value, pyplot, save_titled
from cardseg_train.review.errmap import display_max, fit_error_map_rule
from cardseg_train.review.fit import BUDGET, MAX_BURDEN, two_pass
from cardseg_train.review.measure import BURDENS, VOXEL_MAPS, pooled_reliability, regions_of, reliability, study

#: every setting of a rule (the rest of a regions block is its model and notes)
RULE_KEYS = (
    "map",
    "smooth_px",
    "connectivity",
    "flag_threshold",
    "grow_threshold",
    "neighbourhood_px",
    "merge_px",
    "fill_holes",
    "max_ml",
    "min_voxels",
    "ranking",
    "max_regions",
    "voxel_model",
)
BASELINE_NAMES = {**VOXEL_MAPS, "boundary": "random boundary pixels", "random_regions": "random regions, same sizes"}


def rule_of(block: dict) -> tuple:
    """``(settings, model or None)`` of a ``regions`` block."""
    settings = {k: block.get(k, DEFAULTS.get(k)) for k in RULE_KEYS}
    model = ErrorModel.from_dict(block["model"]) if block.get("model") else None
    return settings, model


#: the rule families ``cardseg fit-review --rule`` chooses from (``auto``: the best held out)
RULES = ("auto", "error-map", "tac", "tac-flips")
#: the first pass's flag thresholds of the ``tac-flips`` family (the sum runs on a larger scale than the TAC:
#: Training/results/acdc-2.3.0/flip-study)
FLIP_FLAGS = (0.1, 0.2, 0.3, 0.4, 0.5)


def needs_flips(rule: str) -> bool:
    """Whether fitting ``rule`` needs the flipped runs' disagreement (three more primary runs a volume)."""
    return rule in ("auto", "tac-flips")


def fit_tac_rule(maps, progress=None, max_burden: float = MAX_BURDEN) -> dict:
    """The TAC rule (regions cut from the disagreement itself, :func:`cardseg_train.review.fit.two_pass`),
    as :func:`fit_error_map_rule` returns a fit."""
    fit = two_pass(maps, progress=progress, max_burden=max_burden)
    fit["settings"] = {**fit["settings"], "map": "tac"}
    fit["display_max_disagreement"] = display_max(maps)
    return fit


def fit_tac_flips_rule(maps, progress=None, max_burden: float = MAX_BURDEN) -> dict:
    """The TAC + flips rule: the TAC family's search (:func:`cardseg_train.review.fit.two_pass`) on
    the sum of each volume's TAC and flipped runs' disagreement, the first pass over
    :data:`FLIP_FLAGS`; the overlay's display maximum stays the TAC's."""
    from cardseg_train.review.data import rule_map
    from cardseg_train.review.fit import GRID, select_settings

    summed = [rule_map(m, {"map": "tac_flips"}) for m in maps]
    first = select_settings(
        summed, grid={**GRID, "flag_threshold": FLIP_FLAGS}, progress=progress, max_burden=max_burden
    )
    fit = two_pass(summed, first=first, progress=progress, max_burden=max_burden)
    fit["settings"] = {**fit["settings"], "map": "tac_flips"}
    fit["display_max_disagreement"] = display_max(maps)
    return fit


def held_out_objective(fit: dict) -> tuple:
    """What the rules are chosen by: errors covered by the first regions, then by all (held out)."""
    v = fit["validation"]["cross_validated"]
    return (v.get("covered_top3") or 0.0, v.get("covered_all") or 0.0)


def choose_rule(maps, rule: str = "auto", progress=None, fitters=None, max_burden: Optional[float] = None) -> dict:
    """Fit the asked rule family, or every one (``auto``) and keep the one whose first regions cover
    the most substantial errors held out (each keeps the median burden within the budget,
    ``max_burden``, default :data:`~cardseg_train.review.fit.MAX_BURDEN`); the fit gains ``rule``,
    ``families`` (each family's held-out figures) and ``max_burden``."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r} (choose from {', '.join(RULES)})")
    fitters = fitters or {"error-map": fit_error_map_rule, "tac": fit_tac_rule, "tac-flips": fit_tac_flips_rule}
    names = [r for r in RULES[1:] if rule in ("auto", r)]
    budget = {} if max_burden is None else {"max_burden": float(max_burden)}
    fits = {name: fitters[name](maps, progress=progress, **budget) for name in names}
    best = max(names, key=lambda name: held_out_objective(fits[name]))
    fit = fits[best]
    fit["rule"] = best
    fit["families"] = {name: f["validation"]["cross_validated"] for name, f in fits.items()}
    fit["candidates"] = [{"rule": name, **row} for name, f in fits.items() for row in f["candidates"]]
    fit["max_burden"] = MAX_BURDEN if max_burden is None else float(max_burden)
    return fit


@dataclass(frozen=True)
class ReviewFitOptions:
    """What :func:`fit_bundle_review` fits.

    rule: the rule family (one of :data:`RULES`; ``auto``: the best held out); flip_steps: the
    steps the flipped copies run on for the new rule (``None``: those of the bundle's rule,
    ``regions.flip_steps``, else its sampled steps); flip_copies: the copies it runs (``None``: the
    bundle's rule's, ``regions.flip_copies``, else all three); pool: whether ``p_error`` is fitted again on
    the clean volumes and on the same volumes under the calibration pool's perturbations
    (:mod:`cardseg_train.review.pool`); max_burden: the first regions' median burden the rule may
    reach (``None``: :data:`~cardseg_train.review.fit.MAX_BURDEN`)."""

    rule: str = "auto"
    flip_steps: Optional[Sequence[int]] = None
    flip_copies: Optional[Sequence[str]] = None
    pool: bool = False
    max_burden: Optional[float] = None


def fit_bundle_review(
    bundle,
    data: str,
    cache_dir: Optional[Path],
    device="cpu",
    batch_size: int = 8,
    progress=None,
    options: ReviewFitOptions = ReviewFitOptions(),
) -> dict:
    """Choose the region rule (:func:`choose_rule`) and fit ``p_error`` on the clean validation
    volumes (:class:`ReviewFitOptions`). Returns the new ``regions`` block and every candidate's
    figures (the caller writes them); the replaced rule keeps its own flip steps."""
    from dataclasses import replace

    from cardseg.method.flips import with_flip_copies, with_flip_steps

    from cardseg_train.evaluation.segmentation import acdc_h5_volumes
    from cardseg_train.review.data import MapOptions, cache_key, collect_maps

    old = bundle.config["regions"]
    if options.flip_steps is not None:  # the maps are made as the new rule will run
        bundle = replace(bundle, config=with_flip_steps(bundle.config, options.flip_steps))
    if options.flip_copies is not None:
        bundle = replace(bundle, config=with_flip_copies(bundle.config, options.flip_copies))
    t0 = time.perf_counter()
    cases = acdc_h5_volumes(data, "val")
    key = cache_key(bundle, "val", 0)
    folder = None if cache_dir is None else Path(cache_dir) / key
    map_options = MapOptions(0, device, batch_size, flips=needs_flips(options.rule))
    maps = collect_maps(bundle, cases, ["clean"], folder, map_options, progress)
    fit = choose_rule(maps, options.rule, progress, max_burden=options.max_burden)
    if options.pool:
        from cardseg_train.review.pool import POOL_CONDITIONS, refit_p_error

        map_options = replace(map_options, flips=fit["settings"].get("map") == "tac_flips")
        extra = collect_maps(bundle, cases, list(POOL_CONDITIONS), folder, map_options, progress)
        fit = refit_p_error(
            fit, {"clean": maps, **{c: [m for m in extra if m.condition == c] for c in POOL_CONDITIONS}}
        )
    block = regions_block(fit, old, len(maps), time.perf_counter() - t0)
    if block["map"] == "tac_flips":  # fitted on those copies' maps
        for key in ("flip_steps", "flip_copies"):
            if bundle.config["regions"].get(key):
                block[key] = list(bundle.config["regions"][key])
    return {"block": block, "candidates": fit["candidates"]}


def regions_block(fit: dict, old: dict, volumes: int, seconds: float) -> dict:
    """The ``regions`` block of a fit (:func:`cardseg_train.review.errmap.fit_error_map_rule`),
    keeping the rule it replaces (``old``'s settings and model) as ``previous``. It holds every
    rule key, so merged into ``old`` (as ``update_config`` does) it leaves nothing of the old rule."""

    def rule(block: dict) -> dict:  # what a kept rule needs to run again
        return {k: v for k, v in block.items() if k in RULE_KEYS or k in ("model", "flip_steps", "flip_copies")}

    previous = rule(old)
    # the newest earlier rule of each other map stays too, however deep in old's chain (--review-map)
    tail, seen = previous, {fit["settings"].get("map", "tac"), old.get("map", "tac")}
    older = old.get("previous")
    while isinstance(older, dict):
        if older.get("map", "tac") not in seen:
            tail["previous"] = rule(older)
            tail = tail["previous"]
            seen.add(older.get("map", "tac"))
        older = older.get("previous")
    voxel = {"voxel_model": fit["voxel_model"].to_dict()} if fit.get("voxel_model") is not None else {}
    if fit.get("display_max_disagreement") is not None:
        voxel["display_max_disagreement"] = fit["display_max_disagreement"]
    platt = fit["model"].platt if getattr(fit["model"], "platt", None) is not None else None
    # every rule key written (defaults where the fit is silent): the block is merged into the old one,
    # and a key of the replaced rule (fill_holes, voxel_model) must not carry over into the new rule
    block = {
        **{k: v for k, v in DEFAULTS.items() if k in RULE_KEYS},
        **fit["settings"],
        **voxel,
        "model": fit["model"].to_dict(),
        "flag_rule": "chosen on clean validation volumes by cardseg fit-review (see fit)",
        "fit": {
            "split": "val",
            "condition": "clean",
            "volumes": volumes,
            **({"p_error_conditions": fit["p_error_conditions"]} if fit.get("p_error_conditions") else {}),
            "objective": f"substantial errors covered (at least half their pixels) by the first {BUDGET} "
            f"regions per volume, cross-fitted by patient, median burden at most "
            f"{fit.get('max_burden', MAX_BURDEN) * 100:g}% of the predicted heart",
            "p_error": "probability that the region holds at least half of a substantial error "
            "(logistic region model" + (", Platt step fitted on held-out logits)" if platt else ")"),
            **({"rule_family": fit["rule"], "families_held_out": fit["families"]} if "rule" in fit else {}),
            "validation": fit["validation"],
            "date": time.strftime("%Y-%m-%d"),
            **(
                {
                    "display_max_disagreement": "99th percentile of the TAC within 10 px of the predicted "
                    "heart, clean validation volumes (the overlays' brightest)"
                }
                if "display_max_disagreement" in voxel
                else {}
            ),
            "seconds": round(seconds, 1),
        },
        "previous": previous,
    }
    return block


def review_tables(maps, config: dict, seed: int = 0, progress=None) -> dict:
    """The bundle's rule and, when the bundle keeps it, the rule it replaced, per condition."""
    block = config["regions"]
    settings, model = rule_of(block)
    out = {"rule": settings, "bundle": study(maps, settings, model, seed, True, progress)}
    if block.get("previous"):
        prev_settings, prev_model = rule_of(block["previous"])
        out["previous_rule"] = prev_settings
        out["previous"] = study(maps, prev_settings, prev_model, seed, False, progress)
    return out


def _pct(v) -> str:
    return f"{format_value(v, 100, 0)}%"


def _ci(iv) -> str:
    """`` [lo-hi%]`` of an interval of fractions, empty without one."""
    return "" if not iv else f" [{format_value(iv[0], 100, 0)}-{format_value(iv[1], 100, 0)}%]"


def markdown(t: dict, title: str) -> str:
    """``review.md`` of a review result (:func:`review_tables`): the rule, its figures per
    condition beside the previous rule's and the baselines', detection, ``p_error`` calibration
    and the covered errors against burden per map."""
    lines = _intro_lines(t, title) + _rule_lines(t) + _same_burden_lines(t) + _detection_lines(t)
    lines += p_error_lines(t)
    lines += _curve_lines(t)
    return "\n".join(lines) + "\n"


def _intro_lines(t: dict, title: str) -> list:
    """The title, what the measures mean, and the rule (and the previous one) measured."""
    lines = [
        f"# {title}",
        "",
        "Substantial error: per slice, a connected component of wrong voxels of at least 30 pixels after a "
        "one-pixel opening. **Covered**: at least half of its pixels lie inside the flagged voxels. **Burden**: "
        "flagged voxels over the predicted heart's (RV+MYO+LV) voxels of the same volume. Fractions pooled over "
        "the volumes of a condition; burdens are medians over volumes.",
        "",
        f"Rule: `{json.dumps({k: v for k, v in t['rule'].items() if k != 'voxel_model'})}`"
        + (" (voxel error model: bundle.json regions.voxel_model)." if t["rule"].get("voxel_model") else "."),
    ]
    if "previous_rule" in t:
        lines += ["", f"Previous rule (today's before this fit): `{json.dumps(t['previous_rule'])}`."]
    return lines


def _rule_lines(t: dict) -> list:
    """Per condition, this fit's rule and the previous one: errors, coverage, burden, regions, ECE."""
    lines = [
        "",
        f"Each baseline flags, in each volume, as many voxels as the rule's first {BUDGET} regions hold "
        "(the highest values of a map inside the predicted heart's 10-pixel neighbourhood, random pixels "
        "of the predicted boundary, or the first regions moved to random places; random ones averaged "
        "over 5 draws). 'touched' is the retired measure (a flagged voxel within 2 pixels of the error), "
        "shown beside the same for random boundary pixels.",
        "",
        "| condition | rule | errors | covered, top 3 | covered, all | median burden top 3 | median ml top 3 "
        "| touched top 3 | touched, boundary pixels | regions / volume | regions holding no error "
        "| p_error ECE |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cond in t["bundle"]:
        for name in ("bundle", "previous"):
            if name not in t:
                continue
            s = t[name][cond]
            lines.append(
                f"| {cond} | {'this fit' if name == 'bundle' else 'previous'} | {s['substantial_errors']} | "
                f"{_pct(s['covered_top3'])} | {_pct(s['covered_all'])} | {_pct(s['median_burden_top3'])} | "
                f"{format_value(s['median_ml_top3'], 1, 1)} | {_pct(s['touched_top3'])} | "
                f"{_pct(s['touched_boundary_same_burden'])} | {format_value(s['regions_per_volume'], 1, 1)} | "
                f"{_pct(s['regions_holding_nothing'])} | {format_value(s['p_error_ece'], 1, 3)} |"
            )
    return lines


def _same_burden_lines(t: dict) -> list:
    """Covered errors of the rule's first regions and of every baseline at the same burden."""
    keys = list(BASELINE_NAMES)
    lines = [
        "",
        f"Covered errors at the same per-volume burden as the first {BUDGET} regions of this fit:",
        "",
        "| condition | rule, top 3 | " + " | ".join(BASELINE_NAMES[k] for k in keys) + " |",
        "|---|---|" + "---|" * len(keys),
    ]
    for cond, s in t["bundle"].items():
        ci = s.get("intervals") or {}
        lines.append(
            f"| {cond} | {_pct(s['covered_top3'])}{_ci(ci.get('covered_top3'))} | "
            + " | ".join(_pct(s["same_burden"].get(k)) + _ci((ci.get("same_burden") or {}).get(k)) for k in keys)
            + " |"
        )
    return lines + [
        "",
        "In brackets: 95% patient-bootstrap intervals (2000 resamples of the patients, a patient's volumes together).",
    ]


def _detection_lines(t: dict) -> list:
    """Voxel-level detection of wrong voxels (AUROC / AUPRC) per condition and score."""
    det_keys = list(next(iter(t["bundle"].values()))["detection"])
    lines = [
        "",
        "Voxel-level detection of wrong voxels inside the predicted heart's 10-pixel neighbourhood, "
        "AUROC / AUPRC (MONAI); 'regions' scores a voxel by its region's rank (first highest, 0 outside), "
        "'boundary' is 1 on the predicted boundary:",
        "",
        "| condition | wrong voxels | " + " | ".join(det_keys) + " |",
        "|---|---|" + "---|" * len(det_keys),
    ]
    for cond, s in t["bundle"].items():
        d = s["detection"]
        first = next(iter(d.values()))
        lines.append(
            f"| {cond} | {_pct(first['prevalence'])} | "
            + " | ".join(f"{format_value(d[k]['auroc'], 1, 3)} / {format_value(d[k]['auprc'], 1, 3)}" for k in det_keys)
            + " |"
        )
    return lines


def _curve_lines(t: dict) -> list:
    """Covered errors against burden, per condition and map."""
    lines = [
        "",
        "Covered errors against burden (share of the predicted heart), per map:",
        "",
        "| condition | map | " + " | ".join(f"{b:.0%}" for b in BURDENS) + " |",
        "|---|---|" + "---|" * len(BURDENS),
    ]
    for cond, s in t["bundle"].items():
        for k in s["curves"]:
            if k != "burdens":
                lines.append(
                    f"| {cond} | {BASELINE_NAMES.get(k, k)} | " + " | ".join(_pct(v) for v in s["curves"][k]) + " |"
                )
    return lines


def p_error_consistency(t: dict) -> Dict[str, Optional[dict]]:
    """``{condition or "all conditions": reliability with its calibrated figures}`` of the rule in
    ``t`` (a review result; one written before these figures is read from its bins,
    :func:`cardseg_train.review.measure.regions_of`)."""
    rows = {}
    for cond, s in t["bundle"].items():
        rel = s.get("reliability")  # its calibrated figures, or (written before them) made from its bins
        rows[cond] = rel if rel is None or "calibrated_median" in rel else reliability(*regions_of(rel))
    rows["all conditions"] = pooled_reliability(t["bundle"])
    return rows


def write_p_error_consistency(review_json: str, out_json: str) -> Path:
    """:func:`p_error_consistency` of a written ``review.json`` (of this rule and, when there, the
    previous one) into ``out_json``; nothing is evaluated again."""
    t = json.loads(Path(review_json).read_text())
    keep = ("ece", "calibrated_median", "calibrated_q90", "consistency_p", "count", "mean_p", "observed")
    out = {
        "source": str(review_json),
        "from_bins": not any("p" in (s.get("reliability") or {}) for s in t["bundle"].values()),
    }
    for key in ("bundle", "previous"):
        if key in t:
            rows = p_error_consistency({"bundle": t[key]})
            out[key] = {
                c: None if r is None else {**{k: r[k] for k in keep}, "regions": sum(r["count"])}
                for c, r in rows.items()
            }
    path = Path(out_json)
    atomic_write(path, (json.dumps(out, indent=1) + "\n").encode())
    return path


def p_error_lines(t: dict) -> list:
    """The ``p_error`` calibration table: per condition and pooled, the ECE beside what a perfectly
    calibrated ``p_error`` shows on as many regions (results written before these figures: ECE only)."""
    rows = p_error_consistency(t)
    lines = [
        "",
        "Calibration of `p_error` over regions. With a few dozen regions a perfectly calibrated `p_error` "
        "shows an ECE far from 0: 'calibrated' is the median (90th percentile) ECE of outcomes drawn as "
        "Bernoulli(p_error) on the same regions, 'consistency p' the share of those draws whose ECE is at "
        "least the observed one (small: miscalibrated beyond chance).",
        "",
        "| condition | regions | p_error ECE | calibrated: median (90%) | consistency p |",
        "|---|---|---|---|---|",
    ]
    for cond, rel in rows.items():
        if rel is None:
            continue
        n = sum(rel["count"])
        cal = f"{format_value(rel['calibrated_median'], 1, 3)} ({format_value(rel['calibrated_q90'], 1, 3)})"
        lines.append(
            f"| {cond} | {n} | {format_value(rel['ece'], 1, 3)} | {cal} | "
            f"{format_value(rel.get('consistency_p'), 1, 3)} |"
        )
    return lines


def plot_review(t: dict, path: Path) -> Path:
    """One panel per condition: covered errors against median burden, the rule's first 1..k
    regions (points joined), the previous rule (dashed) and the baseline maps' curves; last panel:
    reliability of ``p_error`` over regions."""
    plt = pyplot()
    conds = list(t["bundle"])
    fig, axes = plt.subplots(1, len(conds) + 1, figsize=(3.2 * (len(conds) + 1), 3.4), squeeze=False)
    for ax, cond in zip(axes[0], conds):
        s = t["bundle"][cond]
        for i, k in enumerate(kk for kk in s["curves"] if kk != "burdens"):
            ax.plot(
                BURDENS,
                [np.nan if v is None else v for v in s["curves"][k]],
                ":",
                color=f"C{i + 2}",
                label=BASELINE_NAMES.get(k, k),
            )
        for key, style, label in (("bundle", "-o", "rule, first k regions"), ("previous", "--x", "previous rule")):
            if key in t:
                pts = t[key][cond]["by_regions"]
                ax.plot(
                    [p["median_burden"] for p in pts],
                    [p["covered"] for p in pts],
                    style,
                    color="C0" if key == "bundle" else "C1",
                    label=label,
                    ms=4,
                )
        ax.axvline(MAX_BURDEN, color="k", lw=0.6, alpha=0.4)
        ax.set_xscale("log")
        ax.set_ylim(0, 1)
        ax.set_title(f"{cond}: {s['substantial_errors']} errors", fontsize=9)
        ax.set_xlabel("burden (share of predicted heart)", fontsize=8)
    axes[0][0].set_ylabel("substantial errors covered (half their pixels)", fontsize=8)
    axes[0][0].legend(fontsize=6)
    b = axes[0][-1]
    for i, cond in enumerate(conds):
        rel = t["bundle"][cond]["reliability"] or {"mean_p": [], "observed": [], "count": []}
        pts = [(m, o, n) for m, o, n in zip(rel["mean_p"], rel["observed"], rel["count"]) if n]
        if pts:
            b.scatter(
                [p[0] for p in pts],
                [p[1] for p in pts],
                s=[8 + 2 * p[2] for p in pts],
                alpha=0.6,
                color=f"C{i}",
                label=cond,
            )
    b.plot([0, 1], [0, 1], "k:", lw=1)
    b.set_xlim(0, 1)
    b.set_ylim(0, 1)
    b.set_xlabel("p_error (bin mean)", fontsize=8)
    b.set_ylabel("regions holding half an error", fontsize=8)
    b.set_title("reliability of p_error", fontsize=9)
    if b.get_legend_handles_labels()[0]:
        b.legend(fontsize=6)
    return save_titled(fig, path)


def write_review(t: dict, out: Path, title: str, stem: str = "review") -> Dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / f"{stem}.md", "json": out / f"{stem}.json", "png": out / f"{stem}.png"}
    atomic_write(paths["md"], markdown(t, title).encode("utf-8"))
    atomic_write(paths["json"], (json.dumps(t, indent=1) + "\n").encode("utf-8"))
    plot_review(t, paths["png"])
    return paths


def summary_line(t: dict, conditions: Sequence[str]) -> str:
    parts = []
    for cond in conditions:
        s = t["bundle"].get(cond)
        if s:
            parts.append(
                f"{cond} covered top3 {_pct(s['covered_top3'])} at median burden {_pct(s['median_burden_top3'])}"
            )
    return "review: " + "; ".join(parts)
