"""Fitting the calibrators on a pool of source-validation pixels (paper Sec. IV-B).

One interface: a *fitter* takes a pool (a list of :class:`~cardseg_train.calibration.pool.PoolItem`) and returns a fitted
engine :class:`~cardseg.method.calibration.Calibrator`; ``FITTERS[method](pool)`` or
:func:`fit_calibrator`. Every fitter minimises the mean pixel-wise NLL over all pool pixels
(each pixel weighs the same, whichever volume or perturbation it came from) with analytic
gradients, in float64 numpy:

* ``ts``: one ``T``, bounded scalar search on ``log T`` (``T ∈ [0.05, 100]``).
* ``ets``: ``t`` and mixture weights ``(w0, w1, w2)``: ``t`` first fitted as TS, then SLSQP over
  ``(t, w0, w1, w2)`` jointly with ``w_i ∈ [0, 1]``, ``Σ w_i = 1``, started at ``(t_TS, 1, 0, 0)``
  (the TS solution, so ETS never ends worse than TS on the pool).
* ``hts``: ``(w, b)`` by L-BFGS-B from the authors' initialisation ``w = 0.1, b = 0.8``, both
  bounded to the range ``bundle.json`` accepts (:data:`cardseg.bundle.calibration_schema.HTS_RANGE`).
* ``card``: ``{τ_min, τ_max, w_b, w_k}`` of Eq. 8: the best point of a coarse grid (evaluated on
  a seeded subsample of at most ``CARD_GRID_PIXELS`` pixels) initialises SLSQP on the whole
  pool under ``1 ≤ τ_min ≤ τ_max ≤ 100``, ``0 ≤ w_b ≤ ln 2``, ``w_k`` between
  ``W_K_SHARE`` of a TAC scale (the pool's 99th TAC percentile; never below the schema's
  ``1e-6``) and ``ln 2``. Internally ``w_b`` and ``w_k`` are divided by that scale so that SLSQP
  sees variables of comparable size. The floor follows the scale because the TAC of a step
  subset is far smaller than the whole trajectory's (the last step's JS: 99th percentile about
  1e-3 nats on validation); a fixed floor of 1e-3 held the TAC-last and TAC-mid fits of 2.2.0 at
  that bound, towards one temperature for every pixel.

The pool and its thresholds live in :mod:`cardseg_train.calibration.pool`, the objectives in
:mod:`cardseg_train.calibration.objectives`, the small-network calibrators (PTS, LTS, CalibNet)
in :mod:`cardseg_train.calibration.fit_nets`.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import optimize

from cardseg.bundle.calibration_schema import HTS_RANGE, W_K_RANGE
from cardseg.method.calibration import (
    CARD,
    Calibrator,
    EnsembleTemperatureScaling,
    EntropyTemperatureScaling,
    TemperatureScaling,
    Uncalibrated,
)

from cardseg_train.calibration.objectives import (
    TEMPERATURE_BOUNDS,
    card_objective,
    ets_objective,
    fit_temperature,
    hts_objective,
    log_entropy,
)
from cardseg_train.calibration.pool import PoolItem, concat_pool

LN2 = math.log(2.0)

TAU_MAX_BOUND = 100.0
#: smallest CARD transition width w_k (TAC units, nats): the bundle schema's lowest
W_K_MIN = W_K_RANGE[0]
#: smallest w_k as a share of the pool's TAC scale (its 99th percentile): a sharper transition is a step
W_K_SHARE = 1e-3
#: the TAC scale's floor (a pool whose TAC is all 0, one network on both paths: w_b, w_k do not matter)
TAC_SCALE_FLOOR = 1e-5
#: pixels the CARD grid search evaluates (a seeded subsample of the pool)
CARD_GRID_PIXELS = 20_000
#: coarse CARD grid: τ_min values, τ_max - τ_min values, w_b as TAC quantiles, w_k as
#: multiples of the TAC scale
CARD_GRID = {
    "tau_min": (1.0, 1.5, 2.5, 4.0),
    "tau_span": (0.0, 1.0, 3.0, 6.0, 12.0, 25.0),
    "w_b_quantile": (0.05, 0.25, 0.5, 0.75, 0.95),
    "w_k_scale": (0.03, 0.1, 0.3),
}


def fit_uc(pool: Sequence[PoolItem]) -> Uncalibrated:
    return Uncalibrated()


def fit_ts(pool: Sequence[PoolItem]) -> TemperatureScaling:
    """TS: the scalar ``T`` minimising the pool's mean NLL."""
    z, y, _ = concat_pool(pool)
    return TemperatureScaling(fit_temperature(z, y))


def fit_ets(pool: Sequence[PoolItem]) -> EnsembleTemperatureScaling:
    """ETS: TS temperature, then SLSQP over ``(t, w0, w1, w2)`` on the weight simplex."""
    z, y, _ = concat_pool(pool)
    t0 = fit_temperature(z, y)
    x0 = np.array([t0, 1.0, 0.0, 0.0])
    res = optimize.minimize(
        ets_objective,
        x0,
        args=(z, y),
        jac=True,
        method="SLSQP",
        bounds=[TEMPERATURE_BOUNDS, (0.0, 1.0), (0.0, 1.0), (0.0, 1.0)],
        constraints=[
            {"type": "eq", "fun": lambda x: x[1:].sum() - 1.0, "jac": lambda x: np.array([0.0, 1.0, 1.0, 1.0])}
        ],
        options={"maxiter": 200, "ftol": 1e-10},
    )
    x = res.x if np.all(np.isfinite(res.x)) and ets_objective(res.x, z, y)[0] <= ets_objective(x0, z, y)[0] else x0
    w = np.clip(x[1:], 0.0, 1.0)
    w = w / w.sum()
    return EnsembleTemperatureScaling(float(np.clip(x[0], *TEMPERATURE_BOUNDS)), *(float(v) for v in w))


def fit_hts(pool: Sequence[PoolItem], init: Tuple[float, float] = (0.1, 0.8)) -> EntropyTemperatureScaling:
    """HTS: ``(w, b)`` by L-BFGS-B from the authors' initialisation, each kept in the schema's
    :data:`HTS_RANGE` (a fit outside it could not be written into ``bundle.json``)."""
    z, y, _ = concat_pool(pool)
    ell = log_entropy(z)
    x0 = np.clip(np.asarray(init, float), *HTS_RANGE)
    res = optimize.minimize(
        hts_objective,
        x0,
        args=(z, y, ell),
        jac=True,
        method="L-BFGS-B",
        bounds=[HTS_RANGE, HTS_RANGE],
        options={"maxiter": 500},
    )
    w, b = np.clip(res.x, *HTS_RANGE)  # L-BFGS-B keeps to its bounds; the clip only guards float rounding
    return EntropyTemperatureScaling(float(w), float(b))


def w_k_floor(scale: float) -> float:
    """The smallest transition width ``w_k`` the CARD fit allows for a pool of TAC ``scale``."""
    return max(W_K_MIN, W_K_SHARE * scale)


def _card_grid(d: np.ndarray, scale: float) -> List[Tuple[float, float, float, float]]:
    w_bs = sorted(set(float(np.clip(np.quantile(d, q), 0.0, LN2)) for q in CARD_GRID["w_b_quantile"]))
    w_ks = [max(w_k_floor(scale), f * scale) for f in CARD_GRID["w_k_scale"]]
    points = []
    for tmin, span in itertools.product(CARD_GRID["tau_min"], CARD_GRID["tau_span"]):
        tmax = min(tmin + span, TAU_MAX_BOUND)
        if span == 0.0:  # w_b and w_k do not matter: one point
            points.append((tmin, tmax, w_bs[len(w_bs) // 2], w_ks[0]))
            continue
        points += [(tmin, tmax, wb, wk) for wb, wk in itertools.product(w_bs, w_ks)]
    return points


def fit_card(
    pool: Sequence[PoolItem], seed: int = 0, grid_pixels: int = CARD_GRID_PIXELS, info: Optional[dict] = None
) -> CARD:
    """CARD: coarse grid (on a subsample) → SLSQP on the whole pool (see the module docstring).

    ``info``, if given, is filled with the grid's best point, the SLSQP result and timings.
    """
    z, y, d = concat_pool(pool)
    n = z.shape[0]
    scale = max(float(np.quantile(d, 0.99)), TAC_SCALE_FLOOR)
    w_k_min = w_k_floor(scale)
    t0 = time.perf_counter()
    sub = np.random.default_rng(seed).choice(n, size=grid_pixels, replace=False) if n > grid_pixels else slice(None)
    zs, ys, ds = z[sub], y[sub], d[sub]
    grid = _card_grid(ds, scale)
    values = [card_objective(p, zs, ys, ds)[0] for p in grid]
    start = np.array(grid[int(np.argmin(values))])
    t_grid = time.perf_counter() - t0

    # SLSQP in x = (τ_min, τ_max, w_b / scale, w_k / scale)
    sx = np.array([1.0, 1.0, scale, scale])

    def fun(x):
        f, g = card_objective(x * sx, z, y, d)
        return f, g * sx

    t0 = time.perf_counter()
    x0 = start / sx
    res = optimize.minimize(
        fun,
        x0,
        jac=True,
        method="SLSQP",
        bounds=[(1.0, TAU_MAX_BOUND), (1.0, TAU_MAX_BOUND), (0.0, LN2 / scale), (w_k_min / scale, LN2 / scale)],
        constraints=[{"type": "ineq", "fun": lambda x: x[1] - x[0], "jac": lambda x: np.array([-1.0, 1.0, 0.0, 0.0])}],
        options={"maxiter": 300, "ftol": 1e-10},
    )
    t_slsqp = time.perf_counter() - t0
    f0 = fun(x0)[0]
    x = res.x if np.all(np.isfinite(res.x)) and fun(res.x)[0] <= f0 else x0
    p = x * sx
    tau_min = float(max(p[0], 1.0))
    tau_max = float(max(p[1], tau_min))
    w_b = float(np.clip(p[2], 0.0, LN2))
    w_k = float(min(max(p[3], w_k_min), LN2))
    if info is not None:
        info.update(
            {
                "grid_points": len(grid),
                "grid_best": start.tolist(),
                "grid_pixels": int(zs.shape[0]),
                "grid_s": t_grid,
                "slsqp_s": t_slsqp,
                "slsqp_iterations": int(res.nit),
                "slsqp_message": str(res.message),
                "nll_start": float(f0),
                "nll": float(fun(x)[0]),
                "tac_scale": scale,
                "pixels": int(n),
            }
        )
    return CARD(tau_min, tau_max, w_b, w_k)


FITTERS: Dict[str, Callable[[Sequence[PoolItem]], Calibrator]] = {
    "uc": fit_uc,
    "ts": fit_ts,
    "ets": fit_ets,
    "hts": fit_hts,
    "card": fit_card,
}


#: the small-network calibrators, fitted by :mod:`cardseg_train.calibration.fit_nets`
NETWORK_METHODS = ("pts", "lts", "calibnet")


def fit_calibrator(method: str, pool: Sequence[PoolItem], **kwargs) -> Calibrator:
    """Fit ``method`` (one of :data:`FITTERS` or :data:`NETWORK_METHODS`) on the pool."""
    if method in NETWORK_METHODS:
        from cardseg_train.calibration.fit_nets import fit_network

        return fit_network(method, pool, **kwargs)
    if method not in FITTERS:
        raise ValueError(f"no fitter for {method!r} (choose from {', '.join((*FITTERS, *NETWORK_METHODS))})")
    return FITTERS[method](pool, **kwargs)


def pool_nll(calibrator: Calibrator, pool: Sequence[PoolItem]) -> float:
    """Mean NLL of an engine calibrator on the pool, through its own ``log_probs``
    (``log q`` floored at ``log 1e-12``, as the NLL metric)."""
    import torch

    total, count = 0.0, 0
    for it in pool:
        z = torch.from_numpy(it.logits.T.astype(np.float64))[:, :, None]  # (n, K, 1)
        tac = torch.from_numpy(it.tac.astype(np.float64))[:, None]  # (n, 1)
        logp = calibrator.log_probs(z, tac if calibrator.needs_tac else None)[:, :, 0]
        lp = logp[torch.arange(z.shape[0]), torch.from_numpy(it.labels)].clamp_min(math.log(1e-12))
        total += float(-lp.sum())
        count += z.shape[0]
    return total / count
