"""The review frontier on validation: how many substantial errors the first regions can cover at
each review burden, held out by patient (issue 22's question, asked without a test patient).

For every variant of the bundle's region rule (its map, ``tac`` or ``tac_flips``), the regions of
each clean validation volume are formed as the engine forms them, ``p_error`` is fitted leave one
patient out (:func:`cardseg_train.review.fit.cross_validated`) and three figures are kept: the
substantial errors covered by the first :data:`~cardseg_train.review.fit.BUDGET` regions, their
median burden (voxels over the predicted heart's), and the :data:`QUANTILE` quantile of that
median over patient resamples of the validation set (how far the median may move on another draw
of as many patients: a margin that comes from validation, not from a test split). The frontier
keeps, per burden budget, the variant that covers most within it, by either burden figure.

The variants reach past ``cardseg fit-review``'s grid: the heart neighbourhood, the smoothing,
the flag threshold, the size cap in ml *or* as a share of the volume's predicted heart (the study
sets each volume's cap in ml from its heart; the engine has no such setting), and both rankings;
regions are 3D components, as in the shipped rule (chosen by fit-review).

``python -m cardseg_train.studies.review_frontier --out DIR`` writes ``frontier.json``, ``frontier.md``
and ``frontier.png``; only validation volumes are read.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from cardseg.review import coverage as cv

from cardseg_train.review.fit import BUDGET, MAX_BURDEN, MAX_REGIONS, candidate_settings, cross_validated, volume_errors
from cardseg_train.review.fit import patient_of, volume_regions, volume_scores

#: the resampled median burden's quantile the frontier also reads
QUANTILE = 0.9
#: burden budgets (share of the predicted heart) the frontier is read at
BUDGETS = (0.05, 0.075, 0.10, 0.125, 0.15, 0.20)
#: issue 22's target: covered share of the substantial errors at a median burden of at most MAX_BURDEN
TARGET_COVERED = 0.60
#: the variants: every combination; a cap is ``("ml", v)`` or ``("share", v)`` of the predicted heart
VARIANTS = {
    "neighbourhood_px": (4, 10),
    "smooth_px": (1.0, 2.0),
    "flag_threshold": {"tac": (0.03, 0.04, 0.05, 0.06, 0.08), "tac_flips": (0.15, 0.175, 0.2, 0.225, 0.25)},
    "cap": (
        ("ml", 30.0),
        ("ml", 45.0),
        ("ml", 60.0),
        ("ml", 120.0),
        ("share", 0.04),
        ("share", 0.06),
        ("share", 0.08),
        ("share", 0.10),
    ),
    "ranking": ("p_error", "p_error_per_ml"),
}


def resampled_burden(
    patients: Sequence[str], burdens: Sequence[float], draws: int = 1000, quantile: float = QUANTILE, seed: int = 0
) -> float:
    """The ``quantile`` of the median burden over ``draws`` resamples of the patients (with
    replacement, each drawn patient bringing all its volumes). ``patients``, ``burdens``: ``(V,)``."""
    names = sorted(set(patients))
    by = {n: [b for p, b in zip(patients, burdens) if p == n] for n in names}
    rng = np.random.default_rng(seed)
    medians = [
        np.median([b for i in rng.integers(0, len(names), len(names)) for b in by[names[i]]]) for _ in range(draws)
    ]
    return float(np.quantile(medians, quantile))


def variant_settings(map_name: str, variants: Optional[dict] = None) -> List[dict]:
    """Every combination of ``variants`` (default :data:`VARIANTS`) for the rule cut from ``map_name``."""
    v = variants or VARIANTS
    flags = v["flag_threshold"][map_name] if isinstance(v["flag_threshold"], dict) else v["flag_threshold"]
    out = []
    for nb, sm, flag, cap in itertools.product(v["neighbourhood_px"], v["smooth_px"], flags, v["cap"]):
        s = candidate_settings({"smooth_px": float(sm), "connectivity": "3d", "flag_threshold": float(flag)})
        out.append({**s, "neighbourhood_px": int(nb), "cap": [cap[0], float(cap[1])]})
    return out


def capped(settings: dict, maps) -> dict:
    """``settings`` with the volume's ``max_ml``: the cap itself, or its share of the predicted heart."""
    kind, value = settings["cap"]
    if kind == "share":
        value = value * cv.heart_voxels(maps.pred) * float(np.prod(maps.spacing)) / 1000.0
    return {**{k: x for k, x in settings.items() if k != "cap"}, "max_ml": float(value)}


def evaluate_variant(
    maps: Sequence, errors: Sequence, settings: dict, rankings: Sequence[str], draws: int = 1000
) -> List[dict]:
    """One row per ranking: the variant's held-out covered share, median and resampled burden."""
    vols = [volume_regions(m, e, capped(settings, m)) for m, e in zip(maps, errors)]
    models = cross_validated(vols)
    rows = []
    for ranking in rankings:
        per = volume_scores(vols, models, MAX_REGIONS, ranking)
        errs = sum(r["errors"] for r in per)
        burdens = [r["burden"] for r in per]
        rows.append(
            {
                **settings,
                "ranking": ranking,
                "covered_top3": sum(r["covered_top"] for r in per) / errs if errs else None,
                "median_burden_top3": float(np.median(burdens)),
                "resampled_burden": resampled_burden([r["patient"] for r in per], burdens, draws),
            }
        )
    return rows


def frontier(rows: Sequence[dict], key: str, budgets: Sequence[float] = BUDGETS) -> List[dict]:
    """Per budget, the row of most covered errors whose ``key`` burden is within it (``None``: none is)."""
    out = []
    for b in budgets:
        within = [r for r in rows if r[key] <= b and r["covered_top3"] is not None]
        best = max(within, key=lambda r: (r["covered_top3"], -r[key]), default=None)
        out.append(
            {"budget": float(b), "covered_top3": None if best is None else best["covered_top3"], "variant": best}
        )
    return out


def by_dimension(rows: Sequence[dict], budget: float = MAX_BURDEN) -> Dict[str, Optional[dict]]:
    """For each value of each varied dimension (``cap`` by its kind), the most covered row whose
    median burden is within ``budget``: ``{"ranking=p_error": {covered_top3, median_burden_top3}, ...}``."""

    def value(r, dim):
        return r["cap"][0] if dim == "cap" else r[dim]

    out: Dict[str, Optional[dict]] = {}
    for dim in ("neighbourhood_px", "smooth_px", "cap", "ranking"):
        for v in sorted({value(r, dim) for r in rows}, key=str):
            best = frontier([r for r in rows if value(r, dim) == v], "median_burden_top3", (budget,))[0]["variant"]
            out[f"{dim}={v:g}" if isinstance(v, float) else f"{dim}={v}"] = (
                None
                if best is None
                else {"covered_top3": best["covered_top3"], "median_burden_top3": best["median_burden_top3"]}
            )
    return out


def study(maps: Sequence, map_name: str, variants: Optional[dict] = None, draws: int = 1000, progress=None) -> dict:
    """Every variant on the clean validation ``maps`` (already holding the rule's map as ``tac``)."""
    errors = [volume_errors(m) for m in maps]
    settings = variant_settings(map_name, variants)
    rankings = (variants or VARIANTS)["ranking"]
    if progress is not None:
        progress.stage("rule variants", len(settings))
    rows = []
    for s in settings:
        rows.extend(evaluate_variant(maps, errors, s, rankings, draws))
        if progress is not None:
            progress.advance(1)
    return {
        "map": map_name,
        "volumes": len(maps),
        "patients": len({patient_of(m.case) for m in maps}),
        "substantial_errors": int(sum(e[1] for e in errors)),
        "budget_regions": BUDGET,
        "quantile": QUANTILE,
        "draws": draws,
        "target": {"covered_top3": TARGET_COVERED, "median_burden_top3": MAX_BURDEN},
        "frontier": {"median": frontier(rows, "median_burden_top3"), "resampled": frontier(rows, "resampled_burden")},
        "within_target_burden": by_dimension(rows),
        "variants": rows,
    }


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _describe(r: Optional[dict]) -> str:
    if r is None:
        return "-"
    cap = f"{r['cap'][1]:g} ml" if r["cap"][0] == "ml" else f"{100 * r['cap'][1]:g}% of the heart"
    return (
        f"flag {r['flag_threshold']:g}, smooth {r['smooth_px']:g} px, neighbourhood {r['neighbourhood_px']} px, "
        f"cap {cap}, by {r['ranking']}"
    )


def markdown(t: dict, title: str) -> str:
    lines = [
        f"# {title}",
        "",
        f"Clean validation volumes: {t['volumes']} ({t['patients']} patients, {t['substantial_errors']} "
        f"substantial errors); regions cut from `{t['map']}`; {len(t['variants'])} rule variants, each "
        f"scored with `p_error` fitted leave one patient out. Covered: at least half of an error's pixels "
        f"inside the first {t['budget_regions']} regions. Resampled burden: the {t['quantile']:.0%} quantile "
        f"of the median burden over {t['draws']} patient resamples. No test patient was read.",
        "",
        f"Target (issue 22): {_pct(t['target']['covered_top3'])} covered at a median burden of at most "
        f"{_pct(t['target']['median_burden_top3'])}.",
        "",
        "| burden budget | most covered, median burden within | its variant | most covered, resampled "
        "burden within | its variant |",
        "|---|---|---|---|---|",
    ]
    for a, b in zip(t["frontier"]["median"], t["frontier"]["resampled"]):
        lines.append(
            f"| {_pct(a['budget'])} | {_pct(a['covered_top3'])} | {_describe(a['variant'])} | "
            f"{_pct(b['covered_top3'])} | {_describe(b['variant'])} |"
        )
    lines += [
        "",
        f"Most covered within a median burden of {_pct(MAX_BURDEN)}, per value of each varied setting:",
        "",
        "| setting | covered | median burden |",
        "|---|---|---|",
    ]
    for k, r in t["within_target_burden"].items():
        lines.append(f"| {k} | {_pct(r and r['covered_top3'])} | {_pct(r and r['median_burden_top3'])} |")
    return "\n".join(lines) + "\n"


def plot(t: dict, path: Path, shipped: Optional[dict] = None) -> Path:
    """Covered share against median burden for every variant, the two frontiers, the target."""
    from cardseg_train.base.report_files import pyplot, save_titled

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for ranking, marker in (("p_error", "o"), ("p_error_per_ml", "^")):
        rs = [r for r in t["variants"] if r["ranking"] == ranking and r["covered_top3"] is not None]
        ax.scatter(
            [100 * r["median_burden_top3"] for r in rs],
            [100 * r["covered_top3"] for r in rs],
            s=10,
            marker=marker,
            alpha=0.35,
            label=f"variants, by {ranking}",
        )
    for key, style, label in (
        ("median", "-", "frontier (median burden)"),
        ("resampled", "--", f"frontier ({t['quantile']:.0%} resampled burden)"),
    ):
        pts = [
            (100 * f["budget"], 100 * f["covered_top3"]) for f in t["frontier"][key] if f["covered_top3"] is not None
        ]
        if pts:
            ax.step(*zip(*pts), style, where="post", color="k", label=label)
    tgt = t["target"]
    ax.plot([100 * tgt["median_burden_top3"]], [100 * tgt["covered_top3"]], "r*", ms=12, label="issue 22 target")
    if shipped is not None:
        ax.plot(
            [100 * shipped["median_burden_top3"]],
            [100 * shipped["covered_top3"]],
            "gs",
            ms=7,
            label="shipped rule (held out)",
        )
    ax.set_xlabel("burden, % of the predicted heart (variants: their median; frontiers: the budget)", fontsize=9)
    ax.set_ylabel(f"substantial errors covered by the first {t['budget_regions']} (%)")
    ax.set_xlim(0, 30)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return save_titled(fig, path, "Review frontier on validation (held out by patient)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    import json

    from cardseg.base.argparsing import CommandLineParser
    from cardseg.base.errors import CardsegError
    from cardseg.base.progress import Progress
    from cardseg.bundle.loading import load_bundle

    from cardseg_train.base.cli_options import DEFAULT_DATA, add_cache, add_overwrite, out_record, write_recorded
    from cardseg_train.evaluation.segmentation import acdc_h5_volumes
    from cardseg_train.base.report_files import atomic_write
    from cardseg_train.review.data import MapOptions, cache_key, collect_maps, rule_map

    ap = CommandLineParser(prog="python -m cardseg_train.studies.review_frontier", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--bundle", default=None, help="the bundle whose networks and rule map are studied (default: shipped)"
    )
    ap.add_argument("--data", default=DEFAULT_DATA)
    add_cache(ap, "review", "whole-volume map cache (fit-review's own)")
    ap.add_argument("--draws", type=int, default=1000, help="patient resamples for the resampled burden (default 1000)")
    ap.add_argument("--out", required=True, metavar="DIR")
    add_overwrite(ap)
    a = ap.parse_args(argv)
    try:
        if a.draws < 1:
            raise CardsegError(f"--draws must be at least 1 (got {a.draws})")
        record = out_record(a.out, ap.prog, ("frontier.json", "frontier.md", "frontier.png"), a.overwrite)
        bundle = load_bundle(a.bundle, device="cpu")
        block = bundle.config["regions"]
        map_name = block.get("map", "tac")
        if map_name not in ("tac", "tac_flips"):
            raise CardsegError(f"the frontier studies rules cut from tac or tac_flips, not {map_name!r}")
        cases = acdc_h5_volumes(a.data, "val")
        progress = Progress()
        maps = collect_maps(
            bundle,
            cases,
            ["clean"],
            Path(a.cache) / cache_key(bundle, "val", 0) if a.cache else None,
            MapOptions(0, "cpu", 8, flips=map_name == "tac_flips"),
            progress,
        )
        maps = [rule_map(m, {"map": map_name}) for m in maps]
        result = study(maps, map_name, draws=a.draws, progress=progress)
    except CardsegError as exc:
        print(f"review_frontier: error: {exc}", file=sys.stderr)
        return 2
    result["bundle"] = bundle.ident
    shipped = (block.get("fit") or {}).get("validation", {}).get("clean_model_cross_validated") or (
        block.get("fit") or {}
    ).get("validation", {}).get("cross_validated")
    result["shipped_rule_held_out"] = shipped
    out = Path(a.out)

    def write() -> None:
        atomic_write(out / "frontier.json", json.dumps(result, indent=1).encode("utf-8"))
        atomic_write(out / "frontier.md", markdown(result, f"Review frontier on validation: {bundle.ident}").encode())
        plot(result, out / "frontier.png", shipped)

    if write_recorded(record, "review_frontier", write):
        return 2
    print(out / "frontier.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
