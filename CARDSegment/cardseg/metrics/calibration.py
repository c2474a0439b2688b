"""Calibration metrics (paper Sec. V-C): ECE, SCE, ACE, NLL and reliability-diagram data.

Every function takes calibrated class probabilities ``probs (N, K)`` and integer ground-truth
labels ``(N,)`` pooled over the pixels of the region of interest (numpy arrays or torch
tensors; computed in float64 numpy). ``roi_pixels`` gathers them from ``(Z, K, Y, X)`` maps.

Binning conventions (``M = R = 10`` by default):

* **Equal-width bins** (ECE, SCE, reliability diagram): bin ``m`` holds values in
  ``[m/M, (m+1)/M)``, the last bin also holds exactly 1, i.e. ``m = min(floor(M·p), M-1)``.
  (MONAI's ``calibration_binning`` uses ``(left, right]`` instead; the two differ only for
  values that sit exactly on an edge.)
* **ECE**: top-label. ``c = max_k q_k``, ``a = 1[argmax_k q_k = g]`` (ties: the lowest class
  index wins, as numpy's argmax), ``ECE = Σ_m |B_m|/N · |acc(B_m) - conf(B_m)|``.
* **SCE** (Nixon et al. 2019): class-wise over all class probabilities,
  ``SCE = (1/K) Σ_k Σ_m |B_mk|/N · |acc(B_mk) - conf(B_mk)|`` where ``acc`` averages
  ``1[g = k]`` and ``conf`` averages ``q_k`` in the bin.
* **ACE** (Nixon et al. 2019): class-wise adaptive bins of equal mass. For class ``k`` the N
  values ``q_k`` are sorted ascending (``s_0 ≤ … ≤ s_{N-1}``); the ``R - 1`` inner edges are
  ``e_r = s_{floor(r·N/R)}``, ``r = 1..R-1``, and a pixel goes to bin ``r`` = the number of
  edges ``≤ q_k`` (so bin ``r`` is ``[e_r, e_{r+1})``). With distinct values this is exactly
  the split of the sorted list into the R chunks ``[floor(rN/R), floor((r+1)N/R))``; equal
  values always share a bin, so the result does not depend on pixel order, and a run of ties
  can leave bins empty. ``ACE = mean over the non-empty (k, r) bins of |acc - conf|``, which
  is the paper's ``1/(KR) Σ_k Σ_r`` whenever no bin is empty (N ≥ R and no large ties).
* **NLL**: ``mean(-log max(q_g, 1e-12))``.

:class:`CalibrationAccumulator` pools many volumes without keeping every pixel: ECE, SCE,
NLL and the reliability diagram are exact from running per-bin sums; ACE needs per-class
quantiles of the pooled values, so it keeps the pooled probabilities and labels (float32)
up to ``ace_max_pixels`` and beyond that a seeded uniform random subsample of that size
(each pixel carries a random key; the ``ace_max_pixels`` smallest keys are kept), so ACE is
exact for pools up to the cap and a deterministic estimate above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np

N_BINS = 10
NLL_FLOOR = 1e-12
#: default cap on the pixels the accumulator keeps for ACE (2e6 x K=4 float32 = 32 MB)
ACE_MAX_PIXELS = 2_000_000


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _check(probs, labels) -> Tuple[np.ndarray, np.ndarray]:
    p = _to_numpy(probs).astype(np.float64, copy=False)
    y = _to_numpy(labels).astype(np.int64, copy=False).reshape(-1)
    if p.ndim != 2:
        raise ValueError(f"probs must be (N, K), got shape {p.shape}")
    if p.shape[0] != y.shape[0]:
        raise ValueError(f"probs has {p.shape[0]} rows but labels has {y.shape[0]}")
    if y.size and (y.min() < 0 or y.max() >= p.shape[1]):
        raise ValueError(f"labels must lie in [0, {p.shape[1] - 1}]")
    return p, y


def roi_pixels(maps, roi) -> np.ndarray:
    """Class maps ``(Z, K, Y, X)`` (or ``(K, Y, X)``) and a bool ROI ``(Z, Y, X)`` → ``(N, K)``."""
    m = _to_numpy(maps)
    m = np.moveaxis(m, 1 if m.ndim == 4 else 0, -1)
    return m[np.asarray(roi, dtype=bool)]


def equal_width_bins(values: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Bin index ``min(floor(n_bins · v), n_bins - 1)`` of values in ``[0, 1]``."""
    return np.clip(np.floor(np.asarray(values) * n_bins).astype(np.int64), 0, n_bins - 1)


def _binned_sums(values: np.ndarray, targets: np.ndarray, n_bins: int) -> np.ndarray:
    """``(3, n_bins)``: count, Σ value, Σ target per equal-width bin of ``values``."""
    idx = equal_width_bins(values, n_bins)
    return np.stack(
        [
            np.bincount(idx, minlength=n_bins).astype(np.float64),
            np.bincount(idx, weights=values, minlength=n_bins),
            np.bincount(idx, weights=targets, minlength=n_bins),
        ]
    )


def _top_label_sums(p: np.ndarray, y: np.ndarray, n_bins: int) -> np.ndarray:
    pred = p.argmax(axis=1)
    conf = p[np.arange(p.shape[0]), pred]
    return _binned_sums(conf, (pred == y).astype(np.float64), n_bins)


def _classwise_sums(p: np.ndarray, y: np.ndarray, n_bins: int) -> np.ndarray:
    """``(K, 3, n_bins)``: per class, count / Σ q_k / Σ 1[g = k] per equal-width bin."""
    return np.stack([_binned_sums(p[:, k], (y == k).astype(np.float64), n_bins) for k in range(p.shape[1])])


def _weighted_gap(sums: np.ndarray, total: float) -> float:
    """``Σ_bins |count|/total · |acc - conf|`` from ``(..., 3, bins)`` sums."""
    s_conf, s_acc = sums[..., 1, :], sums[..., 2, :]
    # |acc - conf| · count / total = |Σ target - Σ value| / total
    return float(np.abs(s_acc - s_conf).sum() / total) if total > 0 else float("nan")


def ece(probs, labels, n_bins: int = N_BINS) -> float:
    """Top-label expected calibration error (paper Eq. 9), in ``[0, 1]``; NaN when N = 0."""
    p, y = _check(probs, labels)
    return _weighted_gap(_top_label_sums(p, y, n_bins), p.shape[0])


def binary_ece(p, y, n_bins: int = N_BINS) -> float:
    """ECE of probabilities ``p (N,)`` of a yes/no event ``y (N,)`` (e.g. a flagged region's
    ``p_error`` and whether it holds an error): ``Σ_m |B_m|/N · |mean y - mean p|`` over the
    equal-width bins of ``p``; NaN when N = 0."""
    p = np.asarray(p, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if p.shape != y.shape:
        raise ValueError(f"p has {p.size} values, y {y.size}")
    return _weighted_gap(_binned_sums(p, y, n_bins), p.size)


def binary_ece_consistency(p, y, n_bins: int = N_BINS, draws: int = 4000, seed: int = 0) -> Dict[str, float]:
    """How large :func:`binary_ece` is for a perfectly calibrated ``p (N,)`` on these N predictions.

    Outcomes are drawn as ``Bernoulli(p_i)`` (``draws`` times, seeded) and the ECE of each draw
    taken: with few predictions it is far from 0 (about 0.12 for 55 regions spread over the bins),
    so an ECE target below that cannot be told from chance. Returns ``{"ece", "calibrated_median",
    "calibrated_q90", "consistency_p", "n"}``: the observed ECE, the median and 90th percentile of
    the calibrated ones, and the share of calibrated draws whose ECE is at least the observed one
    (small: miscalibrated beyond chance; the consistency resampling of Bröcker and Smith, 2007).
    """
    p = np.asarray(p, dtype=np.float64).ravel()
    n = p.size
    observed = binary_ece(p, y, n_bins)
    if n == 0:
        nan = float("nan")
        return {"ece": nan, "calibrated_median": nan, "calibrated_q90": nan, "consistency_p": nan, "n": 0}
    rng = np.random.default_rng(seed)
    idx = equal_width_bins(p, n_bins)
    gap = np.bincount(idx, weights=p, minlength=n_bins)[None, :] * np.ones((draws, 1))
    for start in range(0, draws, 500):  # (500, N) outcomes at a time
        ys = rng.random((min(500, draws - start), n)) < p[None, :]
        flat = (np.arange(ys.shape[0])[:, None] * n_bins + idx[None, :]).ravel()
        gap[start : start + ys.shape[0]] -= np.bincount(
            flat, weights=ys.ravel(), minlength=ys.shape[0] * n_bins
        ).reshape(-1, n_bins)
    calibrated = np.abs(gap).sum(axis=1) / n
    return {
        "ece": observed,
        "calibrated_median": float(np.median(calibrated)),
        "calibrated_q90": float(np.quantile(calibrated, 0.9)),
        "consistency_p": float(np.mean(calibrated >= observed - 1e-12)),
        "n": int(n),
    }


def sce(probs, labels, n_bins: int = N_BINS) -> float:
    """Static (class-wise, equal-width) calibration error of Nixon et al. (paper Eq. 10), in ``[0, 1]``."""
    p, y = _check(probs, labels)
    return _weighted_gap(_classwise_sums(p, y, n_bins), p.shape[0]) / p.shape[1]


def adaptive_bins(values: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Equal-mass bin index of each value (see the module docstring for the exact cut)."""
    v = np.asarray(values)
    n = v.shape[0]
    if n == 0:
        return np.zeros(0, np.int64)
    s = np.sort(v, kind="stable")
    edges = s[(np.arange(1, n_bins) * n) // n_bins]
    return np.searchsorted(edges, v, side="right").astype(np.int64)


def ace(probs, labels, n_bins: int = N_BINS) -> float:
    """Adaptive calibration error of Nixon et al. (paper Eq. 11), in ``[0, 1]``; NaN when N = 0."""
    p, y = _check(probs, labels)
    if p.shape[0] == 0:
        return float("nan")
    gaps = []
    for k in range(p.shape[1]):
        idx = adaptive_bins(p[:, k], n_bins)
        count = np.bincount(idx, minlength=n_bins)
        s_conf = np.bincount(idx, weights=p[:, k], minlength=n_bins)
        s_acc = np.bincount(idx, weights=(y == k).astype(np.float64), minlength=n_bins)
        full = count > 0
        gaps.append(np.abs(s_acc[full] - s_conf[full]) / count[full])
    return float(np.concatenate(gaps).mean())


def nll(probs, labels, floor: float = NLL_FLOOR) -> float:
    """Mean negative log-likelihood ``mean(-log max(q_g, 1e-12))`` (≥ 0); NaN when N = 0."""
    p, y = _check(probs, labels)
    if p.shape[0] == 0:
        return float("nan")
    return float(-np.log(np.maximum(p[np.arange(p.shape[0]), y], floor)).mean())


@dataclass
class ReliabilityDiagram:
    """Top-label reliability data: per equal-width confidence bin, pixel count, accuracy and
    mean confidence (NaN for empty bins); ``edges`` has ``n_bins + 1`` entries."""

    edges: np.ndarray
    count: np.ndarray
    accuracy: np.ndarray
    confidence: np.ndarray

    @classmethod
    def from_sums(cls, sums: np.ndarray) -> "ReliabilityDiagram":
        count, s_conf, s_acc = sums
        with np.errstate(invalid="ignore", divide="ignore"):
            acc = np.where(count > 0, s_acc / count, np.nan)
            conf = np.where(count > 0, s_conf / count, np.nan)
        return cls(np.linspace(0.0, 1.0, sums.shape[1] + 1), count.astype(np.int64), acc, conf)

    def to_dict(self) -> dict:
        """JSON-able (NaN → None)."""
        clean = lambda a: [None if not np.isfinite(v) else float(v) for v in a]  # noqa: E731
        return {
            "edges": self.edges.tolist(),
            "count": self.count.tolist(),
            "accuracy": clean(self.accuracy),
            "confidence": clean(self.confidence),
        }


def reliability_diagram(probs, labels, n_bins: int = N_BINS) -> ReliabilityDiagram:
    p, y = _check(probs, labels)
    return ReliabilityDiagram.from_sums(_top_label_sums(p, y, n_bins))


def calibration_metrics(probs, labels, n_bins: int = N_BINS) -> Dict[str, float]:
    """``{"ece", "sce", "ace", "nll", "n"}`` of one set of pixels."""
    p, y = _check(probs, labels)
    return {
        "ece": ece(p, y, n_bins),
        "sce": sce(p, y, n_bins),
        "ace": ace(p, y, n_bins),
        "nll": nll(p, y),
        "n": int(p.shape[0]),
    }


class CalibrationAccumulator:
    """Pools ROI pixels of many volumes; :meth:`result` gives the pooled metrics.

    ECE, SCE, NLL and the reliability diagram come from exact running sums; ACE from the kept
    pixels (all up to ``ace_max_pixels``, else a seeded uniform subsample; see the module
    docstring). ``result()["ace_exact"]`` says which.
    """

    def __init__(self, num_classes: int, n_bins: int = N_BINS, ace_max_pixels: int = ACE_MAX_PIXELS, seed: int = 0):
        self.k, self.n_bins, self.cap = int(num_classes), int(n_bins), int(ace_max_pixels)
        self.n = 0
        self.nll_sum = 0.0
        self.top = np.zeros((3, self.n_bins))
        self.cls = np.zeros((self.k, 3, self.n_bins))
        self._rng = np.random.default_rng(seed)
        self._kept = 0
        self._chunks = []  # (keys, probs float32, labels) not yet reduced to the cap

    def add(self, probs, labels) -> None:
        """Add pixels: ``probs (N, K)``, ``labels (N,)``."""
        p, y = _check(probs, labels)
        if p.shape[1] != self.k:
            raise ValueError(f"expected {self.k} classes, got {p.shape[1]}")
        if p.shape[0] == 0:
            return
        self.n += p.shape[0]
        self.nll_sum += float(-np.log(np.maximum(p[np.arange(p.shape[0]), y], NLL_FLOOR)).sum())
        self.top += _top_label_sums(p, y, self.n_bins)
        self.cls += _classwise_sums(p, y, self.n_bins)
        self._chunks.append((self._rng.random(p.shape[0]), p.astype(np.float32), y))
        self._kept += p.shape[0]
        if self._kept > 2 * self.cap:
            self._reduce()

    def _reduce(self) -> Tuple[np.ndarray, np.ndarray]:
        """Concatenate the kept chunks, keeping the ``cap`` pixels with the smallest keys."""
        keys = np.concatenate([c[0] for c in self._chunks])
        probs = np.concatenate([c[1] for c in self._chunks])
        labels = np.concatenate([c[2] for c in self._chunks])
        if keys.shape[0] > self.cap:
            keep = np.sort(np.argpartition(keys, self.cap - 1)[: self.cap])
            keys, probs, labels = keys[keep], probs[keep], labels[keep]
        self._chunks, self._kept = [(keys, probs, labels)], keys.shape[0]
        return probs, labels

    def add_volume(self, probs, labels, roi) -> None:
        """Add the ROI pixels of one volume: ``probs (Z, K, Y, X)``, ``labels``/``roi (Z, Y, X)``."""
        roi = np.asarray(roi, dtype=bool)
        self.add(roi_pixels(probs, roi), np.asarray(labels)[roi])

    def reliability(self) -> ReliabilityDiagram:
        return ReliabilityDiagram.from_sums(self.top)

    def result(self) -> Dict[str, object]:
        """``{"ece", "sce", "ace", "nll", "n", "ace_exact"}`` over everything added."""
        if self.n == 0:
            nan = float("nan")
            return {"ece": nan, "sce": nan, "ace": nan, "nll": nan, "n": 0, "ace_exact": True}
        return {
            "ece": _weighted_gap(self.top, self.n),
            "sce": _weighted_gap(self.cls, self.n) / self.k,
            "ace": ace(*self._reduce(), self.n_bins),
            "nll": self.nll_sum / self.n,
            "n": self.n,
            "ace_exact": self.n <= self.cap,
        }
