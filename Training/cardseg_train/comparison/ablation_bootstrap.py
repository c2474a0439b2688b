"""Paired patient bootstrap of the component ablation: ECE / SCE / ACE / NLL of each variant.

The ablation's metrics pool every ROI pixel of the split's volumes under one condition, so a
resample of patients pools again rather than averaging per-patient metrics. Each variant keeps,
per patient, the sums the pooled metrics are made of (a
:class:`~cardseg.metrics.calibration.CalibrationAccumulator` per patient: count, sum of
confidence and sum of hits in every equal-width bin, top-label and class-wise, and the NLL sum),
and the ROI pixels themselves for ACE, whose equal-mass bins are cut again in every resample
from the drawn pixels. A patient drawn ``w`` times counts ``w`` times, so a resample's value is
exactly the metric of the pooled pixels with that multiplicity.

The draws are :func:`cardseg_train.base.stats.resample_weights` over the patients in sorted-name
order, with the resample count and seed ``cardseg evaluate`` and ``cardseg compare`` use, so a
resample here holds the same patients as theirs; every variant sees the same draws, which makes
``Proposed - variant`` a paired difference.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from cardseg.base.errors import CardsegError
from cardseg.metrics.calibration import N_BINS, CalibrationAccumulator

from cardseg_train.base.stats import BOOTSTRAP_LEVEL, BOOTSTRAP_RESAMPLES, interval, resample_weights

METRICS = ("ece", "sce", "ace", "nll")


class VariantPixels:
    """One variant's ROI pixels grouped by patient (bin sums for ECE / SCE / NLL, the pixels for ACE)."""

    def __init__(self, num_classes: int, n_bins: int = N_BINS):
        self.k, self.n_bins = int(num_classes), int(n_bins)
        self.sums: Dict[str, CalibrationAccumulator] = {}
        self.pixels: Dict[str, List[tuple]] = {}

    def add(self, patient: str, probs: np.ndarray, labels: np.ndarray) -> None:
        """probs ``(n, K)``, labels ``(n,)`` of one volume of ``patient``."""
        if patient not in self.sums:
            # every pixel kept for ACE here, so the accumulator itself never needs to
            self.sums[patient] = CalibrationAccumulator(self.k, self.n_bins, ace_max_pixels=1)
            self.pixels[patient] = []
        self.sums[patient].add(probs, labels)
        self.pixels[patient].append((np.asarray(probs, np.float32), np.asarray(labels, np.int64).reshape(-1)))

    def samples(self, patients: Sequence[str], weights: np.ndarray) -> np.ndarray:
        """``(R, 4)``: ECE, SCE, ACE, NLL of the pooled pixels under each row of ``weights (R, P)``
        (multiplicity of each of ``patients``; a patient this variant lacks adds nothing)."""
        w = np.asarray(weights, dtype=np.float64)
        acc = [self.sums.get(p) for p in patients]
        top = np.stack([a.top if a else np.zeros((3, self.n_bins)) for a in acc])  # (P, 3, M)
        cls = np.stack([a.cls if a else np.zeros((self.k, 3, self.n_bins)) for a in acc])  # (P, K, 3, M)
        n = np.array([a.n if a else 0 for a in acc], dtype=np.float64)
        nll_sum = np.array([a.nll_sum if a else 0.0 for a in acc])
        total = w @ n
        with np.errstate(invalid="ignore", divide="ignore"):
            top_w = np.einsum("rp,pjm->rjm", w, top)
            cls_w = np.einsum("rp,pkjm->rkjm", w, cls)
            ece = np.abs(top_w[:, 2] - top_w[:, 1]).sum(-1) / total
            sce = np.abs(cls_w[:, :, 2] - cls_w[:, :, 1]).sum((-1, -2)) / total / self.k
            nll = (w @ nll_sum) / total
        return np.stack([ece, sce, self._ace(patients, w), nll], axis=1)

    def _ace(self, patients: Sequence[str], w: np.ndarray) -> np.ndarray:
        """ACE (:func:`cardseg.metrics.calibration.ace`) of the pooled pixels with multiplicities."""
        chunks = [(i, p, y) for i, name in enumerate(patients) for p, y in self.pixels.get(name, [])]
        if not chunks:
            return np.full(w.shape[0], np.nan)
        probs = np.concatenate([c[1] for c in chunks])
        labels = np.concatenate([c[2] for c in chunks])
        owner = np.concatenate([np.full(c[2].size, c[0]) for c in chunks])
        gap_sum, gap_n = np.zeros(w.shape[0]), np.zeros(w.shape[0])
        for k in range(self.k):
            g, m = weighted_adaptive_gaps(
                probs[:, k].astype(np.float64), (labels == k).astype(np.float64), owner, w, self.n_bins
            )
            gap_sum += g
            gap_n += m
        with np.errstate(invalid="ignore", divide="ignore"):
            return gap_sum / gap_n


def weighted_adaptive_gaps(
    values: np.ndarray, hits: np.ndarray, owner: np.ndarray, weights: np.ndarray, n_bins: int = N_BINS
):
    """One class's equal-mass bins when pixel ``i`` counts ``weights[r, owner[i]]`` times.

    values, hits, owner ``(N,)`` (owner: patient index into ``weights (R, P)``, integer
    multiplicities) → ``(sum over non-empty bins of |acc - conf|, number of non-empty bins)``,
    each ``(R,)`` (NaN sum for a resample without any of these pixels). The cut is
    :func:`cardseg.metrics.calibration.adaptive_bins` applied to the pixels repeated by their
    multiplicity: inner edge ``r`` is the value at position ``floor(r·N_w/R)`` of that sorted
    repeated list (``N_w`` its length), found by bisection on per-patient cumulative counts, so no
    repeated list is built.
    """
    order = np.argsort(values, kind="stable")
    s, t, o = values[order], hits[order], owner[order]
    n, (resamples, patients) = s.size, weights.shape
    pos = [np.flatnonzero(o == p) for p in range(patients)]
    cum_s = [np.concatenate([[0.0], np.cumsum(s[i])]) for i in pos]
    cum_t = [np.concatenate([[0.0], np.cumsum(t[i])]) for i in pos]

    def before(idx: np.ndarray) -> np.ndarray:
        """``(..., P)``: each patient's pixels among the first ``idx`` sorted ones."""
        return np.stack([np.searchsorted(i, idx, side="left") for i in pos], axis=-1)

    total = weights @ np.array([i.size for i in pos], dtype=np.float64)  # (R,)
    target = np.floor(np.arange(1, n_bins)[None, :] * total[:, None] / n_bins)  # (R, M-1)
    target[total == 0] = -1  # a resample that drew none of these pixels: no edges, NaN below
    lo = np.zeros(target.shape, dtype=np.int64)
    hi = np.full(target.shape, n - 1, dtype=np.int64)
    while np.any(lo < hi):  # smallest i whose inclusive weighted count exceeds the target position
        mid = (lo + hi) // 2
        above = (before(mid + 1) * weights[:, None, :]).sum(-1) > target
        lo, hi = np.where(above, lo, mid + 1), np.where(above, mid, hi)
    cut = np.searchsorted(s, s[lo], side="left")  # first pixel >= edge
    bounds = np.concatenate([np.zeros((resamples, 1), np.int64), cut, np.full((resamples, 1), n)], axis=1)
    c = before(bounds)  # (R, M+1, P)
    count = (c * weights[:, None, :]).sum(-1)
    conf = sum(cum_s[p][c[..., p]] * weights[:, None, p] for p in range(patients))
    hit = sum(cum_t[p][c[..., p]] * weights[:, None, p] for p in range(patients))
    count, conf, hit = (np.diff(a, axis=1) for a in (count, conf, hit))
    full = count > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        gaps = np.where(full, np.abs(hit - conf) / np.where(full, count, 1.0), 0.0)
    return np.where(total > 0, gaps.sum(1), np.nan), full.sum(1).astype(np.float64)


def bootstrap_variants(
    variants: Dict[str, VariantPixels],
    reference: str = "Proposed",
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    without: Optional[Sequence[str]] = None,
) -> dict:
    """95 % patient-bootstrap intervals of every variant's ECE / SCE / ACE / NLL and of
    ``reference - variant`` (paired: the same draws for every variant). JSON-able.

    without: variants that have a value but no pixels (named, no interval)."""
    covered = {label: sorted(v.sums) for label, v in variants.items()}
    if len({tuple(c) for c in covered.values()}) > 1:
        raise CardsegError(
            "the ablation's variants cover different patients: no paired bootstrap ("
            + "; ".join(f"{label}: {', '.join(c)}" for label, c in covered.items())
            + ")"
        )
    patients = next(iter(covered.values()), [])
    weights = resample_weights(len(patients), resamples, seed)
    boot = {label: v.samples(patients, weights) for label, v in variants.items()}
    out = {
        "unit": "patient",
        "patients": len(patients),
        "resamples": int(resamples),
        "level": BOOTSTRAP_LEVEL,
        "seed": int(seed),
        "metrics": list(METRICS),
        "interval": {label: {m: interval(b[:, j]) for j, m in enumerate(METRICS)} for label, b in boot.items()},
        "reference": reference if reference in boot else None,
        "difference": {},
        "without_pixels": list(without or []),
    }
    if reference in boot:
        for label, b in boot.items():
            if label != reference:
                d = boot[reference] - b
                out["difference"][label] = {m: interval(d[:, j]) for j, m in enumerate(METRICS)}
    # every ordered pair, for claims about the variants' order: pairwise[a][b] is a - b
    out["pairwise"] = {
        a: {b: {m: interval(boot[a][:, j] - boot[b][:, j]) for j, m in enumerate(METRICS)} for b in boot if b != a}
        for a in boot
    }
    return out


def bootstrap_markdown(bs: Optional[dict]) -> List[str]:
    """The intervals of :func:`bootstrap_variants` as a table (nothing without them)."""
    if not bs:
        return []
    ref = bs.get("reference")
    lines = [
        "",
        f"{100 * bs['level']:.0f}% intervals from a paired bootstrap over the {bs['patients']} patients "
        f"({bs['resamples']} resamples, the same draws for every variant; pooled metrics recomputed from "
        "each resample's pixels)"
        + (f", and ({ref} - variant) in the columns marked - (negative: {ref} lower):" if ref else ":"),
        "",
        "| Variant | ECE | SCE | ACE | NLL |" + (" - ECE | - SCE | - ACE | - NLL |" if ref else ""),
        "|---|---|---|---|---|" + ("---|---|---|---|" if ref else ""),
    ]
    pct = {"ece": 100.0, "sce": 100.0, "ace": 100.0, "nll": 1.0}
    dig = {"ece": 2, "sce": 2, "ace": 2, "nll": 3}

    def cell(iv, m, sign=False):
        f = "+" if sign else ""
        return f"{pct[m] * iv[0]:{f}.{dig[m]}f} to {pct[m] * iv[1]:{f}.{dig[m]}f}"

    for label, iv in bs["interval"].items():
        d = bs["difference"].get(label)
        lines.append(
            f"| {label} | "
            + " | ".join(cell(iv[m], m) for m in METRICS)
            + " |"
            + ((" " + " | ".join(cell(d[m], m, True) for m in METRICS) + " |") if d else (" | | | |" if ref else ""))
        )
    labels = list(bs["interval"])
    if len(labels) > 1 and bs.get("pairwise"):
        lines += [
            "",
            "Each variant against the one above it (row - row above; the paper's Table II orders them "
            "from worst to best):",
            "",
            "| Variant | minus | ECE | SCE | ACE | NLL |",
            "|---|---|---|---|---|---|",
        ]
        for above, label in zip(labels, labels[1:]):
            d = bs["pairwise"][label][above]
            lines.append(f"| {label} | {above} | " + " | ".join(cell(d[m], m, True) for m in METRICS) + " |")
    if bs.get("without_pixels"):
        lines.append("")
        lines.append(
            f"No interval for {', '.join(bs['without_pixels'])}: its value is read from another "
            "evaluation's pooled table, which kept no pixels."
        )
    return lines


__all__: Sequence[str] = (
    "METRICS",
    "VariantPixels",
    "weighted_adaptive_gaps",
    "bootstrap_variants",
    "bootstrap_markdown",
)
