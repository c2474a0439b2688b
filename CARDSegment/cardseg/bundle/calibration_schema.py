"""The ``calibration`` and ``baselines`` blocks of ``bundle.json``: a known method with every
parameter present and in range, network calibrators with a valid architecture and exactly its
tensors.

Every numeric parameter has a closed range, wide enough for any fitted or hand-set value that
makes sense and narrow enough that the arithmetic stays finite in float32 (``tau_max = 1e39``
would give an infinite temperature map, a denormal ``w_k`` a division by zero); the message of
a refusal states the range:

* ``card`` (paper Eq. 8): ``1 <= tau_min <= tau_max <= 1000`` (the fitter searches up to 100),
  ``w_b`` in ``[0, ln 2]`` (the TAC map's own range), ``w_k`` in ``[1e-6, ln 2]``;
* ``ts`` and ``ets``: ``temperature`` in ``[0.01, 1000]`` (the fitter searches ``[0.05, 100]``);
  ETS mixture weights in ``[0, 1]`` summing to 1;
* ``hts``: ``w`` and ``b`` in ``[-100, 100]`` (temperatures ``softplus(w * l + b)`` with the
  log-entropy ``l`` in ``[-9, 0]`` stay below about 1000);
* network calibrators (``pts``, ``lts``, ``calibnet``): every weight finite with
  ``|value| <= 1e6``.
"""

from __future__ import annotations

import math
from typing import Dict, Sequence, Tuple

from cardseg.base.errors import show
from cardseg.bundle.fields import Where, choice_value, is_int, number_value, required_object, required_value
from cardseg.method.calibrator_arch import NET_CALIBRATOR_ARCH, net_arch_problem, net_weight_shapes

#: the parameters each calibration method needs, all of them required (kept in sync by a test)
CALIBRATION_PARAMS: Dict[str, Tuple[str, ...]] = {
    "uc": (),
    "ts": ("temperature",),
    "ets": ("temperature", "w0", "w1", "w2"),
    "hts": ("w", "b"),
    "card": ("tau_min", "tau_max", "w_b", "w_k"),
    "pts": ("arch", "weights"),
    "lts": ("arch", "weights"),
    "calibnet": ("arch", "weights"),
}
#: keys of the "calibration" block that describe the fit rather than parameterise it
CALIBRATION_META = ("fitted", "fit", "tac_steps")
#: ETS weights may miss [0, 1] and their sum may miss 1 by this much (as ``calibration.ets`` allows)
ETS_WEIGHT_TOL = 1e-6
#: CARD's temperatures tau_min and tau_max (at least 1: CARD only ever softens)
TAU_RANGE = (1.0, 1000.0)
#: the TAC map lies in [0, ln 2]; a fitted w_b or w_k may exceed ln 2 by float rounding
LN2 = math.log(2.0)
TAC_RANGE = (0.0, LN2 + 1e-6)
#: CARD's transition width: below 1e-6 float32 rounding divides by zero
W_K_RANGE = (1e-6, LN2 + 1e-6)
#: TS and ETS temperature
TEMPERATURE_RANGE = (0.01, 1000.0)
#: HTS's w and b
HTS_RANGE = (-100.0, 100.0)
#: largest |weight| of a network calibrator
NET_WEIGHT_MAX = 1e6


def check_calibration(where: Where, cal: dict, sampled_steps: Sequence[int]) -> None:
    """The calibration method with all its parameters, and the optional fit description."""
    if cal.get("method") in NET_CALIBRATOR_ARCH:
        where.fail(
            "calibration.method",
            f"{show(cal['method'])} is a comparison baseline (store it under "
            f"baselines); the engine calibrates with {', '.join(_ENGINE_METHODS)}",
        )
    _check_calibrator(where, cal, "calibration", allowed_extra=CALIBRATION_META)
    if "fitted" in cal and not isinstance(cal["fitted"], bool):
        where.fail("calibration.fitted", f"must be true or false (got {show(cal['fitted'])})")
    if "fit" in cal and not isinstance(cal["fit"], dict):
        where.fail("calibration.fit", f"must be an object (got {show(cal['fit'])})")
    tac = cal.get("tac_steps")
    if tac is not None:
        if not isinstance(tac, list) or not tac:
            where.fail("calibration.tac_steps", f"must be null or a non-empty list of sampled steps (got {show(tac)})")
        for i, t in enumerate(tac):
            if not is_int(t) or t not in sampled_steps:
                where.fail(
                    f"calibration.tac_steps[{i}]",
                    f"must be one of the sampled steps {show(list(sampled_steps))} (got {show(t)})",
                )


def check_baselines(where: Where, baselines: dict, num_classes: int) -> None:
    """Fitted baseline calibrators, each stored under its own method name (a network calibrator
    fitted for the bundle's class count)."""
    for name, cal in baselines.items():
        key = f"baselines.{name}"
        if not isinstance(cal, dict):
            where.fail(key, f"must be an object (got {show(cal)})")
        method = _check_calibrator(where, cal, key)
        if method != name:
            where.fail(f"{key}.method", f"must be {show(name)}, the key it is stored under (got {show(method)})")
        if method in NET_CALIBRATOR_ARCH and cal["arch"]["num_classes"] != num_classes:
            where.fail(
                f"{key}.arch.num_classes",
                f"must be the bundle's class count {num_classes} (got {cal['arch']['num_classes']})",
            )


def _check_calibrator(where: Where, cal: dict, key: str, allowed_extra: Sequence[str] = ()) -> str:
    """A ``{"method": name, **params}`` block: known method, every parameter present and in range."""
    method = choice_value(
        where, f"{key}.method", required_value(where, cal, "method", f"{key}."), tuple(CALIBRATION_PARAMS)
    )
    needed = CALIBRATION_PARAMS[method]
    for name in needed:
        required_value(where, cal, name, f"{key}.")
    for name in cal:
        if name != "method" and name not in needed and name not in allowed_extra:
            where.fail(
                f"{key}.{name}",
                f"is not a parameter of the {method} calibration (it takes {', '.join(needed) or 'none'})",
            )
    _CALIBRATOR_RANGES[method](where, cal, key)
    return method


def _card_ranges(where: Where, cal: dict, key: str) -> None:
    """Paper Eq. 8 needs ``1 <= tau_min <= tau_max``, ``w_b >= 0``, ``w_k > 0``; bounded above
    as the module docstring says."""
    tau_min = number_value(where, f"{key}.tau_min", cal["tau_min"], low=TAU_RANGE[0], high=TAU_RANGE[1])
    tau_max = number_value(where, f"{key}.tau_max", cal["tau_max"], low=TAU_RANGE[0], high=TAU_RANGE[1])
    if tau_max < tau_min:
        where.fail(f"{key}.tau_max", f"must be >= tau_min ({show(tau_min)}) (got {show(tau_max)})")
    for name, (low, high) in (("w_b", TAC_RANGE), ("w_k", W_K_RANGE)):
        value = number_value(where, f"{key}.{name}", cal[name])
        if not low <= value <= high:
            where.fail(f"{key}.{name}", f"must be in [{low:g}, ln 2 = {LN2:.4f}] (got {show(cal[name])})")


def _ts_ranges(where: Where, cal: dict, key: str) -> None:
    number_value(where, f"{key}.temperature", cal["temperature"], low=TEMPERATURE_RANGE[0], high=TEMPERATURE_RANGE[1])


def _ets_ranges(where: Where, cal: dict, key: str) -> None:
    """Temperature in ``TEMPERATURE_RANGE`` and mixture weights in [0, 1] summing to 1 (within
    ``ETS_WEIGHT_TOL``)."""
    number_value(where, f"{key}.temperature", cal["temperature"], low=TEMPERATURE_RANGE[0], high=TEMPERATURE_RANGE[1])
    weights = [number_value(where, f"{key}.{w}", cal[w]) for w in ("w0", "w1", "w2")]
    for name, w in zip(("w0", "w1", "w2"), weights):
        if not -ETS_WEIGHT_TOL <= w <= 1.0 + ETS_WEIGHT_TOL:
            where.fail(f"{key}.{name}", f"must be in [0, 1] (got {show(w)})")
    if abs(sum(weights) - 1.0) > ETS_WEIGHT_TOL:
        where.fail(key, f"weights w0 + w1 + w2 must sum to 1 (got {sum(weights)!r})")


def _hts_ranges(where: Where, cal: dict, key: str) -> None:
    number_value(where, f"{key}.w", cal["w"], low=HTS_RANGE[0], high=HTS_RANGE[1])
    number_value(where, f"{key}.b", cal["b"], low=HTS_RANGE[0], high=HTS_RANGE[1])


def _no_ranges(where: Where, cal: dict, key: str) -> None:
    """UC has no parameters."""


def _net_ranges(where: Where, cal: dict, key: str) -> None:
    """A network calibrator: a valid ``arch`` and exactly its tensors, each with its shape and
    that many finite numbers of magnitude at most ``NET_WEIGHT_MAX``."""
    method = cal["method"]
    problem = net_arch_problem(method, cal["arch"])
    if problem is not None:
        where.fail(f"{key}.arch" + (f".{problem[0]}" if problem[0] else ""), problem[1])
    arch, weights = cal["arch"], cal["weights"]
    if not isinstance(weights, dict):
        where.fail(f"{key}.weights", f"must be an object of tensors (got {show(weights)})")
    shapes = net_weight_shapes(method, arch)
    for name in weights:
        if name not in shapes:
            where.fail(f"{key}.weights.{name}", f"is not a tensor of this {method} network")
    for name, shape in shapes.items():
        entry = required_object(where, weights, name, f"{key}.weights.")
        at = f"{key}.weights.{name}"
        for extra in entry:
            if extra not in ("shape", "values"):
                where.fail(f"{at}.{extra}", "is not allowed (a tensor has shape and values)")
        if required_value(where, entry, "shape", f"{at}.") != shape:
            where.fail(f"{at}.shape", f"must be {show(shape)} for this arch (got {show(entry['shape'])})")
        values = required_value(where, entry, "values", f"{at}.")
        size = math.prod(shape)
        if not isinstance(values, list) or len(values) != size:
            got = f"{len(values)} values" if isinstance(values, list) else show(values)
            where.fail(f"{at}.values", f"must be a list of {size} numbers (got {got})")
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                where.fail(f"{at}.values[{i}]", f"must be a finite number (got {show(v)})")
            if abs(v) > NET_WEIGHT_MAX:
                where.fail(f"{at}.values[{i}]", f"must be in [-{NET_WEIGHT_MAX:g}, {NET_WEIGHT_MAX:g}] (got {show(v)})")


_CALIBRATOR_RANGES = {
    "uc": _no_ranges,
    "ts": _ts_ranges,
    "ets": _ets_ranges,
    "hts": _hts_ranges,
    "card": _card_ranges,
    "pts": _net_ranges,
    "lts": _net_ranges,
    "calibnet": _net_ranges,
}
#: the methods a bundle's own ``calibration`` block may name
_ENGINE_METHODS = tuple(m for m in CALIBRATION_PARAMS if m not in NET_CALIBRATOR_ARCH)
