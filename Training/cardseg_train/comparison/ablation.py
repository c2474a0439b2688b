"""The paper's component ablation (its Table II) on one ACDC-C condition, spike by default.

Rows (ECE / SCE / ACE in %, pooled over the ROI pixels of the split's volumes under the
condition, NLL beside them):

* ``Primary only``: the diffusion primary's terminal logits, uncalibrated.
* ``Logit Mix``: primary and reference logits averaged at every reverse step (the mix advances
  the state and is the output; uncalibrated, as the paper's fusion control).
* ``Dual U-Net``: two discriminative U-Nets (seeds 0 and 1); their softmax JS through CARD's
  fitted sigmoid temperature on the first one's logits (read from that bundle's evaluation).
* ``w/o Ref. Contrast``: the primary on both paths, so the JS and the TAC are 0 everywhere and
  Eq. 8 is one temperature for every pixel; fitted by NLL on the validation pool, that is the
  pool's temperature-scaling fit, so the row applies the bundle's fitted TS.
* ``TAC-last`` / ``TAC-mid``: CARD refitted on the validation pool with the TAC over ``{0}`` /
  ``{24, 12, 0}`` (``fit-calibration`` keeps each set's fit), applied to the TAC over the
  same steps, formed from the per-step JS each evaluated case keeps.
* ``Proposed``: CARD as shipped (TAC over the bundle's step set).

Every row reads the evaluation cache of ``cardseg evaluate`` (same key, so an evaluated split
is not run again); only Logit Mix needs its own trajectories, cached beside them.

Intervals: a paired bootstrap over patients (:mod:`cardseg_train.comparison.ablation_bootstrap`), every row
computed from pixels resampled with the same draws as ``cardseg compare``'s, and ``Proposed -
variant`` for each; the Dual U-Net row, read from its evaluation's pooled table, has none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from cardseg.method.calibration import CARD, TemperatureScaling, Uncalibrated
from cardseg.metrics.calibration import CalibrationAccumulator
from cardseg.base.errors import CardsegError

from cardseg_train.comparison.ablation_bootstrap import VariantPixels, bootstrap_markdown, bootstrap_variants
from cardseg_train.calibration.harness import CaseResult, calibrated_probs as _probs
from cardseg_train.base.stats import BOOTSTRAP_RESAMPLES

ROWS = ("Primary only", "Logit Mix", "Dual U-Net", "w/o Ref. Contrast", "TAC-last", "TAC-mid", "Proposed")
#: the paper's Table II (spike): ECE, SCE, ACE in %
PAPER = {
    "Primary only": (20.19, 10.10, 9.48),
    "Logit Mix": (19.62, 9.82, 9.03),
    "Dual U-Net": (19.22, 11.49, 11.10),
    "w/o Ref. Contrast": (17.78, 9.02, 8.51),
    "TAC-last": (17.62, 8.96, 8.47),
    "TAC-mid": (17.45, 8.89, 8.42),
    "Proposed": (13.81, 7.61, 7.42),
}


def step_set_calibrators(config: dict) -> Dict[str, tuple]:
    """CARD fitted per TAC step set, from ``calibration.fit.tac_step_sets.params`` of a bundle
    fitted with ``--tac-steps auto`` → ``{"mid": (CARD, [24, 12, 0]), "last": (CARD, [0]), ...}``."""
    sets = (((config.get("calibration") or {}).get("fit") or {}).get("tac_step_sets") or {}).get("params") or {}
    return {name: (CARD(**{k: v for k, v in p.items() if k != "steps"}), p.get("steps")) for name, p in sets.items()}


def _metrics(pairs, pixels: Optional[VariantPixels] = None) -> dict:
    """Pooled ECE / SCE / ACE / NLL over ``[(probs (n, K), labels (n,), patient)]``; with ``pixels``,
    each volume is also kept there by patient for the bootstrap."""
    pairs = list(pairs)
    acc = CalibrationAccumulator(pairs[0][0].shape[1])
    for p, y, patient in pairs:
        acc.add(p, y)
        if pixels is not None:
            pixels.add(patient, p, y)
    return acc.result()


def ablation_table(
    card_results: Sequence[CaseResult],
    mix_results: Sequence[CaseResult],
    config: dict,
    dual_table: Optional[dict] = None,
    condition: str = "spike",
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    dual_run: Optional[Tuple[Sequence[CaseResult], dict]] = None,
) -> dict:
    """Every row of :data:`ROWS` that the inputs allow, JSON-able.

    card_results / mix_results: the condition's cases from the card and logit-mix trajectories;
    config: the CARD bundle's ``bundle.json`` (fitted CARD, TS and the step-set fits); dual_table:
    the Dual U-Net bundle's ``calibration.json`` (its ``card`` method under ``condition``; pooled
    numbers only); dual_run: instead, ``(cases, bundle.json)`` of the Dual U-Net bundle's own card
    trajectories, calibrated by its fitted CARD, so that row is measured from pixels too.
    The result's ``bootstrap``: the paired patient bootstrap of every row computed from pixels
    (:func:`cardseg_train.comparison.ablation_bootstrap.bootstrap_variants`, ``resamples`` draws, ``seed``;
    none with ``resamples=0``).
    """
    card_results = [r for r in card_results if r.condition == condition and r.labels.size]
    mix_results = [r for r in mix_results if r.condition == condition and r.labels.size]
    if not card_results:
        raise CardsegError(f"no evaluated cases under {condition!r}")
    cal = config.get("calibration") or {}
    card = CARD(**{k: cal[k] for k in ("tau_min", "tau_max", "w_b", "w_k")})
    ts = (config.get("baselines") or {}).get("ts")
    k = card_results[0].logits.shape[0]
    rows: Dict[str, dict] = {}
    pixels: Dict[str, VariantPixels] = {}

    def measure(label: str, results: Sequence[CaseResult], cal_probs) -> None:
        if resamples:
            pixels[label] = VariantPixels(k)
        rows[label] = _metrics(((cal_probs(r), r.labels, r.patient) for r in results), pixels.get(label))

    measure("Primary only", card_results, lambda r: _probs(Uncalibrated(), r))
    if mix_results:
        measure("Logit Mix", mix_results, lambda r: _probs(Uncalibrated(), r))
    if dual_run is not None:
        dual_cal = dual_run[1].get("calibration") or {}
        dual_card = CARD(**{key: dual_cal[key] for key in ("tau_min", "tau_max", "w_b", "w_k")})
        measure(
            "Dual U-Net",
            [r for r in dual_run[0] if r.condition == condition and r.labels.size],
            lambda r: _probs(dual_card, r),
        )
    elif dual_table is not None and "card" in dual_table.get("methods", ()):
        rows["Dual U-Net"] = {m: dual_table["pooled"][condition]["card"][m] for m in ("ece", "sce", "ace", "nll")}
    if ts is not None:
        measure("w/o Ref. Contrast", card_results, lambda r: _probs(TemperatureScaling(ts["temperature"]), r))
    fits = step_set_calibrators(config)
    for name, label in (("last", "TAC-last"), ("mid", "TAC-mid")):
        fitted, steps = fits.get(name, (None, None))
        if fitted is not None and steps:
            measure(label, card_results, lambda r, f=fitted, s=steps: _probs(f, r, r.tac_over(s)))
    measure("Proposed", card_results, lambda r: _probs(card, r))
    out = _table(rows, condition, len({r.case for r in card_results}))
    if resamples:
        out["bootstrap"] = bootstrap_variants(
            {lab: pixels[lab] for lab in ROWS if lab in pixels},
            "Proposed",
            resamples,
            seed,
            without=[lab for lab in ROWS if lab in rows and lab not in pixels],
        )
    return out


def _table(rows: Dict[str, dict], condition: str, volumes: int) -> dict:
    """The measured ``rows`` (``{label: pooled metrics}``) in :data:`ROWS`' order, each beside the
    paper's figures, and the labels not measured."""
    ordered = [
        {
            "label": lab,
            **{m: float(rows[lab][m]) for m in ("ece", "sce", "ace", "nll")},
            "paper_ece_sce_ace": PAPER[lab],
        }
        for lab in ROWS
        if lab in rows
    ]
    return {
        "condition": condition,
        "volumes": volumes,
        "rows": ordered,
        "missing": [lab for lab in ROWS if lab not in rows],
    }


def markdown(t: dict, title: str = "") -> str:
    lines = [
        f"# {title or 'Component ablation'} ({t['condition']})",
        "",
        f"{t['volumes']} volumes under {t['condition']}; ECE / SCE / ACE in %, pooled over the ROI pixels; the "
        "paper's Table II beside ours.",
        "",
        "| Variant | ECE | SCE | ACE | NLL | paper ECE / SCE / ACE |",
        "|---|---|---|---|---|---|",
    ]
    for r in t["rows"]:
        lines.append(
            f"| {r['label']} | {100 * r['ece']:.2f} | {100 * r['sce']:.2f} | {100 * r['ace']:.2f} | "
            f"{r['nll']:.3f} | {' / '.join(f'{v:.2f}' for v in r['paper_ece_sce_ace'])} |"
        )
    if any(r["label"] == "w/o Ref. Contrast" for r in t["rows"]):
        lines += [
            "",
            "w/o Ref. Contrast equals Primary+TS by construction: with the primary on both paths the TAC "
            "is 0 everywhere, so the temperature is one fitted constant.",
        ]
    if t["missing"]:
        lines += ["", "Not computed: " + ", ".join(t["missing"]) + "."]
    lines += bootstrap_markdown(t.get("bootstrap"))
    return "\n".join(lines) + "\n"


def plot(t: dict, path) -> None:
    """ECE per variant: ours with its paired patient bootstrap interval (left) and, on its own axis,
    the paper's Table II (right): other data, networks and corruptions, so the panels share the
    variants' order, not a scale."""
    from cardseg_train.base.report_files import pyplot, save_figure

    plt = pyplot()
    rows: List[dict] = t["rows"]
    y = np.arange(len(rows))[::-1]
    labels = [r["label"] for r in rows]
    fig, (ours, paper) = plt.subplots(1, 2, figsize=(9.0, 3.6), sharey=True)
    ours.barh(y, [100 * r["ece"] for r in rows], 0.6, color="tab:blue")
    intervals = (t.get("bootstrap") or {}).get("interval", {})
    for i, r in zip(y, rows):
        if r["label"] in intervals:  # the paired patient bootstrap's 95 % interval
            lo, hi = intervals[r["label"]]["ece"]
            err = [[100 * max(r["ece"] - lo, 0.0)], [100 * max(hi - r["ece"], 0.0)]]
            ours.errorbar(100 * r["ece"], i, xerr=err, color="k", capsize=3, linewidth=1)
    ours.set_yticks(y, labels)
    ours.set_xlabel(f"ECE (%) under {t['condition']}, 95% patient interval")
    ours.set_title("ours (ACDC test)", fontsize=10)
    paper.barh(y, [r["paper_ece_sce_ace"][0] for r in rows], 0.6, color="tab:grey")
    paper.set_xlabel("ECE (%)")
    paper.set_title("the paper's Table II (its own data and setup)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, Path(path), dpi=120)
