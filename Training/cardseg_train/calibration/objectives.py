"""The calibrators' objectives: the mean pixel-wise NLL of each closed-form calibrator and its
analytic gradient, in float64 numpy (``z (n, K)`` logits, ``y (n,)`` labels, ``d (n,)`` TAC),
and the scalar temperature fit they share (:func:`fit_temperature`).
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple

import numpy as np
from scipy import optimize
from scipy.special import expit, log_softmax, softmax

from cardseg.method.calibration.hts import LOG_ENTROPY_FLOOR, TEMPERATURE_FLOOR

#: bounds of the temperature-type parameters
TEMPERATURE_BOUNDS = (0.05, 100.0)


def scaled_nll(z: np.ndarray, y: np.ndarray, temperature) -> Tuple[float, np.ndarray]:
    """Mean NLL of ``Softmax(z / T)`` and its gradient with respect to each pixel's ``T``.

    z ``(n, K)``, y ``(n,)``, temperature scalar or ``(n,)`` → ``(nll, dnll_dT (n,))``; the
    gradient is already divided by n (``d mean / d T_i``).
    """
    n = z.shape[0]
    t = np.broadcast_to(np.asarray(temperature, dtype=np.float64), (n,))
    s = z / t[:, None]
    m = s.max(axis=1, keepdims=True)
    e = np.exp(s - m)
    se = e.sum(axis=1)
    zy = z[np.arange(n), y]
    nll_i = m[:, 0] + np.log(se) - zy / t
    ez = (e * z).sum(axis=1) / se
    return float(nll_i.mean()), (zy - ez) / (t * t) / n


def card_objective(params: Sequence[float], z: np.ndarray, y: np.ndarray, d: np.ndarray) -> Tuple[float, np.ndarray]:
    """Mean NLL of CARD with ``params = (τ_min, τ_max, w_b, w_k)`` and its gradient ``(4,)``."""
    tau_min, tau_max, w_b, w_k = (float(p) for p in params)
    u = (d - w_b) / w_k
    s = expit(u)
    span = tau_max - tau_min
    nll, g = scaled_nll(z, y, tau_min + s * span)
    gs = g * span * s * (1.0 - s)
    grad = np.array([np.sum(g * (1.0 - s)), np.sum(g * s), -np.sum(gs) / w_k, -np.sum(gs * u) / w_k])
    return nll, grad


def ets_objective(params: Sequence[float], z: np.ndarray, y: np.ndarray) -> Tuple[float, np.ndarray]:
    """Mean NLL of ETS with ``params = (t, w0, w1, w2)`` (probabilities floored at 1e-12) and
    its gradient ``(4,)``."""
    t, w0, w1, w2 = (float(p) for p in params)
    n, k = z.shape
    rows = np.arange(n)
    a = softmax(z / t, axis=1)
    b = softmax(z, axis=1)
    ay, by = a[rows, y], b[rows, y]
    p = w0 * ay + w1 * by + w2 / k
    live = p > 1e-12
    pc = np.maximum(p, 1e-12)
    nll = float(-np.log(pc).mean())
    inv = np.where(live, 1.0 / pc, 0.0) / n
    ez = (a * z).sum(axis=1)
    da_dt = ay * (ez - z[rows, y]) / (t * t)
    grad = -np.array([np.sum(inv * w0 * da_dt), np.sum(inv * ay), np.sum(inv * by), np.sum(inv) / k])
    return nll, grad


def log_entropy(z: np.ndarray) -> np.ndarray:
    """HTS input ``ℓ = clip(log(H / log K), -9, 0)`` per pixel, ``z (n, K)`` → ``(n,)``."""
    lp = log_softmax(z, axis=1)
    h = np.maximum(-(np.exp(lp) * lp).sum(axis=1), 0.0)
    with np.errstate(divide="ignore"):
        return np.clip(np.log(h / math.log(z.shape[1])), LOG_ENTROPY_FLOOR, 0.0)


def hts_objective(params: Sequence[float], z: np.ndarray, y: np.ndarray, ell: np.ndarray) -> Tuple[float, np.ndarray]:
    """Mean NLL of HTS with ``params = (w, b)``, given ``ell = log_entropy(z)``, and its gradient."""
    w, b = (float(p) for p in params)
    a = w * ell + b
    t_raw = np.logaddexp(0.0, a)  # softplus
    t = np.maximum(t_raw, TEMPERATURE_FLOOR)
    nll, g = scaled_nll(z, y, t)
    g = np.where(t_raw > TEMPERATURE_FLOOR, g * expit(a), 0.0)
    return nll, np.array([np.sum(g * ell), np.sum(g)])


def fit_temperature(z: np.ndarray, y: np.ndarray) -> float:
    """The scalar ``T`` minimising the mean NLL of ``Softmax(z / T)`` (bounded search on ``log T``)."""
    lo, hi = (math.log(v) for v in TEMPERATURE_BOUNDS)
    res = optimize.minimize_scalar(
        lambda lt: scaled_nll(z, y, math.exp(lt))[0], bounds=(lo, hi), method="bounded", options={"xatol": 1e-5}
    )
    return float(math.exp(res.x))
