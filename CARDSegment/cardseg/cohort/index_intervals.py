"""Prediction intervals for a cardiac index from a location-scale pivot with an empirical shape.

Pure arithmetic (numpy only; no I/O). Used by :mod:`cardseg.cohort.indices` (applying a fitted
model) and by ``cardseg fit-indices`` (fitting it).

**The model.** For one index (say LVEF), the error of a subject is ``e = truth - value`` (points,
ml or g). For the subjects a bundle is used on we assume

    e = mu + sigma * eps,    eps i.i.d. with a fixed standardised shape F (mean 0, sd 1),

with ``mu`` (the segmentation's bias) and ``sigma`` (its spread) unknown. The **validation
subjects** are ``n`` further draws of this model: they are exchangeable with the new subject
(same scanner population, same engine, same bundle) and are the only ones used for ``mu`` and
``sigma``. The **shape** F is estimated from a larger pool that is *not* exchangeable in scale
(training patients' in-sample errors are smaller, perturbed validation volumes' larger): each
pool group is standardised by its own mean and sd (:func:`standardised_pool`), so only its shape
enters. The assumption is thus two-fold: (1) validation and new subjects are exchangeable, and
(2) the pool's errors share the shape of theirs up to location and scale.

**The pivot.** With ``m`` and ``s`` the mean and sd of the ``n`` validation errors,
``T = |e_new - m| / s`` has a distribution that depends on F and ``n`` only, not on ``mu`` or
``sigma``. Its ``level`` quantile ``c`` (:func:`pivot_quantile`, Monte Carlo over draws from the
shape sample) makes ``value + m +- c * s`` a ``level`` prediction interval for the new subject's
truth, exact when the shape is right (for a Gaussian shape ``c`` is Student's
``t_{(1+level)/2, n-1} * sqrt(1 + 1/n)``, :func:`gaussian_pivot`). Unlike split-conformal with
``n = 10``, which must take the largest residual for 90 %, ``c`` comes from the shape pool and the
width from all ``n`` validation errors. The interval's width, ``2 c s``, is thus fixed when it is
fitted. Checks: :func:`leave_one_out` (each validation subject predicted from the others) and
:func:`split_check` (the procedure fitted on ``n`` subjects of a larger exchangeable sample, e.g.
the training patients' in-sample errors, and measured on the rest, many times).

Arrays are 1-D; shapes are stated where it matters.
"""

from __future__ import annotations

import math
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

#: Monte Carlo draws for the pivot quantile (at 90 % and n = 10 the quantile's Monte Carlo sd is
#: about 0.006, 0.3 % of it; 40,000 draws left about 0.015)
PIVOT_DRAWS = 200_000


def location_scale(errors: Sequence[float]) -> Tuple[float, float]:
    """``(mean, sd)`` of the finite errors (sd with ``n - 1``); needs at least two."""
    e = np.asarray(errors, dtype=float)
    e = e[np.isfinite(e)]
    if e.size < 2:
        raise ValueError(f"a location and scale need at least 2 finite errors, got {e.size}")
    return float(e.mean()), float(e.std(ddof=1))


def standardised_pool(groups: Mapping[str, Sequence[float]], min_size: int = 5) -> np.ndarray:
    """The shape sample: every group's finite errors minus its mean, over its sd, pooled ``(N,)``.

    groups: ``{name: errors}``, each group one source of evidence (e.g. training in-sample, one
    perturbation of the validation volumes); a group with fewer than ``min_size`` errors or no
    spread is left out. Each standardised group is rescaled by ``sqrt(k / (k - 1))`` so that a
    group of ``k`` draws from a distribution with sd 1 keeps its population scale (the sample sd
    shrinks it otherwise).
    """
    parts = []
    for errors in groups.values():
        e = np.asarray(errors, dtype=float)
        e = e[np.isfinite(e)]
        if e.size < max(2, min_size):
            continue
        m, s = e.mean(), e.std(ddof=1)
        if s > 0:
            parts.append((e - m) / s * math.sqrt(e.size / (e.size - 1)))
    if not parts:
        raise ValueError("the shape pool is empty (no group with enough errors and some spread)")
    return np.concatenate(parts)


def pivot_quantile(shape: Sequence[float], n: int, level: float, draws: int = PIVOT_DRAWS, seed: int = 0) -> float:
    """The ``level`` quantile of ``T = |e_new - mean(e_1..n)| / sd(e_1..n)`` for ``n + 1`` i.i.d.
    draws from the shape sample ``shape`` ``(N,)`` (with replacement), by Monte Carlo.

    Deterministic for a given ``seed``; draws whose ``n`` errors have no spread are dropped.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n < 2:
        raise ValueError(f"the pivot needs at least 2 validation errors, got {n}")
    pool = np.asarray(shape, dtype=float)
    pool = pool[np.isfinite(pool)]
    if pool.size < 2 or np.ptp(pool) == 0:
        raise ValueError("the shape sample needs at least 2 distinct finite values")
    rng = np.random.default_rng(seed)
    sample = rng.choice(pool, size=(draws, n + 1), replace=True)
    cal, new = sample[:, :n], sample[:, n]
    sd = cal.std(axis=1, ddof=1)
    ok = sd > 0
    t = np.abs(new[ok] - cal[ok].mean(axis=1)) / sd[ok]
    return float(np.quantile(t, level))


def gaussian_pivot(n: int, level: float) -> float:
    """The exact pivot quantile for Gaussian errors: ``t_{(1+level)/2, n-1} * sqrt(1 + 1/n)``."""
    from scipy.stats import t

    return float(t.ppf((1.0 + level) / 2.0, n - 1) * math.sqrt(1.0 + 1.0 / n))


def fit_index_model(errors: Sequence[float], shape: Sequence[float], level: float, seed: int = 0) -> Dict[str, float]:
    """``{"bias", "sd", "pivot", "half_width", "n"}`` for one index.

    errors: the validation subjects' ``truth - value`` ``(n,)`` (normalised by a per-subject
    scale first if the interval is to be, see :func:`model_interval`); shape: the standardised
    pool ``(N,)`` from :func:`standardised_pool`. ``half_width = pivot * sd``.
    """
    e = np.asarray(errors, dtype=float)
    e = e[np.isfinite(e)]
    bias, sd = location_scale(e)
    if sd <= 0:
        raise ValueError("the validation errors have no spread")
    c = pivot_quantile(shape, e.size, level, seed=seed)
    return {"bias": bias, "sd": sd, "pivot": c, "half_width": c * sd, "n": int(e.size)}


def model_interval(value: float, model: Mapping[str, float], unit_scale: float = 1.0) -> Tuple[float, float]:
    """``value + u * (bias -+ half_width)``: the interval for the truth, ``u`` the subject's
    normaliser (1 for errors in the index's own unit, the value itself for relative errors)."""
    u = float(unit_scale)
    centre = float(value) + u * float(model["bias"])
    half = abs(u) * float(model["half_width"])
    return centre - half, centre + half


def interval_coverage(truth: Sequence[float], low: Sequence[float], high: Sequence[float]) -> float:
    """Fraction of finite ``truth`` inside ``[low, high]`` (arrays of one shape); NaN if none."""
    t, lo, hi = (np.asarray(a, dtype=float).ravel() for a in (truth, low, high))
    ok = np.isfinite(t) & np.isfinite(lo) & np.isfinite(hi)
    if not ok.any():
        return float("nan")
    return float(np.mean((lo[ok] <= t[ok]) & (t[ok] <= hi[ok])))


def leave_one_out(
    errors: Sequence[float],
    shape: Sequence[float],
    level: float,
    seed: int = 0,
    unit_scale: Optional[Sequence[float]] = None,
) -> Dict[str, float]:
    """Each validation error predicted from the others: ``{"coverage", "median_width"}`` of the
    intervals ``m_(-i) +- c_(n-1) s_(-i)`` for ``e_i`` (a check on validation, nothing fitted on test).

    unit_scale: per-subject normalisers ``u`` ``(n,)`` (errors modelled as ``e / u``, widths
    ``2 c s |u_i|``; default 1)."""
    e = np.asarray(errors, dtype=float)
    u = np.ones_like(e) if unit_scale is None else np.asarray(unit_scale, dtype=float)
    ok = np.isfinite(e) & np.isfinite(u) & (u != 0)
    e, u = e[ok] / u[ok], u[ok]
    if e.size < 4:
        raise ValueError(f"leave-one-out needs at least 4 errors, got {e.size}")
    c = pivot_quantile(shape, e.size - 1, level, seed=seed)
    inside, widths = [], []
    for i in range(e.size):
        m, s = location_scale(np.delete(e, i))
        inside.append(abs(e[i] - m) <= c * s)
        widths.append(2 * c * s * abs(u[i]))
    return {"coverage": float(np.mean(inside)), "median_width": float(np.median(widths))}


def split_check(
    errors: Sequence[float],
    shape: Sequence[float],
    n_fit: int,
    level: float,
    unit_scale: Optional[Sequence[float]] = None,
    repeats: int = 500,
    seed: int = 0,
    pivot: Optional[float] = None,
) -> Dict[str, float]:
    """The whole procedure repeated on a larger exchangeable sample (cross-fitting): ``repeats``
    times, ``n_fit`` of the ``(N,)`` ``errors`` (drawn without replacement) give bias and sd, the
    other ``N - n_fit`` are predicted with ``c = pivot_quantile(shape, n_fit, level)``.

    unit_scale: per-subject normalisers ``u`` ``(N,)`` (errors modelled as ``e / u``, widths
    ``2 c s |u|``; default 1); pivot: a given ``c`` instead of the shape's quantile. Returns ``{"coverage"`` (mean over repeats of the held-out
    fraction inside), ``"coverage_p10", "coverage_p90"`` (its spread over repeats),
    ``"median_width"`` (mean over repeats of the held-out subjects' median width), ``"n_fit",
    "n_held", "repeats"}``. With in-sample training errors the widths are in-sample ones; the
    coverage is the procedure's own, if those errors are exchangeable among themselves.
    """
    e = np.asarray(errors, dtype=float)
    u = np.ones_like(e) if unit_scale is None else np.asarray(unit_scale, dtype=float)
    ok = np.isfinite(e) & np.isfinite(u) & (u != 0)
    e, u = e[ok], u[ok]
    if n_fit < 2 or e.size < n_fit + 2:
        raise ValueError(f"a split check needs more than {n_fit + 1} errors, got {e.size}")
    z = e / u
    c = pivot_quantile(shape, n_fit, level, seed=seed) if pivot is None else float(pivot)
    rng = np.random.default_rng(seed)
    cover, widths = [], []
    for _ in range(int(repeats)):
        idx = rng.permutation(e.size)
        fit, held = idx[:n_fit], idx[n_fit:]
        m, s = location_scale(z[fit])
        cover.append(float(np.mean(np.abs(z[held] - m) <= c * s)))
        widths.append(float(np.median(2 * c * s * np.abs(u[held]))))
    lo, hi = np.quantile(cover, [0.1, 0.9])
    return {
        "coverage": float(np.mean(cover)),
        "coverage_p10": float(lo),
        "coverage_p90": float(hi),
        "median_width": float(np.mean(widths)),
        "n_fit": int(n_fit),
        "n_held": int(e.size - n_fit),
        "repeats": int(repeats),
        "pivot": float(c),
    }


def spearman(x: Sequence[float], y: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation of two equal-length samples, ``None`` without variation."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).correlation)
