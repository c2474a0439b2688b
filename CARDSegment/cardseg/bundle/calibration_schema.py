"""The ``calibration`` and ``baselines`` blocks of ``bundle.json``: a known method with every
parameter present and in range (paper Eq. 7's bounds for CARD), network calibrators with a
valid architecture and exactly its tensors."""

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


def check_calibration(where: Where, cal: dict, sampled_steps: Sequence[int]) -> None:
    """The calibration method with all its parameters, and the optional fit description."""
    if cal.get("method") in NET_CALIBRATOR_ARCH:
        where.fail("calibration.method", f"{show(cal['method'])} is a comparison baseline (store it under "
                                         f"baselines); the engine calibrates with {', '.join(_ENGINE_METHODS)}")
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
                where.fail(f"calibration.tac_steps[{i}]",
                           f"must be one of the sampled steps {show(list(sampled_steps))} (got {show(t)})")


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
            where.fail(f"{key}.arch.num_classes", f"must be the bundle's class count {num_classes} "
                                                  f"(got {cal['arch']['num_classes']})")


def _check_calibrator(where: Where, cal: dict, key: str, allowed_extra: Sequence[str] = ()) -> str:
    """A ``{"method": name, **params}`` block: known method, every parameter present and in range."""
    method = choice_value(where, f"{key}.method", required_value(where, cal, "method", f"{key}."), tuple(CALIBRATION_PARAMS))
    needed = CALIBRATION_PARAMS[method]
    for name in needed:
        required_value(where, cal, name, f"{key}.")
    for name in cal:
        if name != "method" and name not in needed and name not in allowed_extra:
            where.fail(f"{key}.{name}", f"is not a parameter of the {method} calibration "
                                        f"(it takes {', '.join(needed) or 'none'})")
    _CALIBRATOR_RANGES[method](where, cal, key)
    return method


def _card_ranges(where: Where, cal: dict, key: str) -> None:
    """Paper Eq. 7 needs ``1 <= tau_min <= tau_max``, ``w_b >= 0``, ``w_k > 0``."""
    tau_min = number_value(where, f"{key}.tau_min", cal["tau_min"], low=1.0)
    tau_max = number_value(where, f"{key}.tau_max", cal["tau_max"])
    if tau_max < tau_min:
        where.fail(f"{key}.tau_max", f"must be >= tau_min ({show(tau_min)}) (got {show(tau_max)})")
    number_value(where, f"{key}.w_b", cal["w_b"], low=0.0)
    number_value(where, f"{key}.w_k", cal["w_k"], low=0.0, low_open=True)


def _ts_ranges(where: Where, cal: dict, key: str) -> None:
    number_value(where, f"{key}.temperature", cal["temperature"], low=0.0, low_open=True)


def _ets_ranges(where: Where, cal: dict, key: str) -> None:
    """Temperature > 0 and mixture weights in [0, 1] summing to 1 (within ``ETS_WEIGHT_TOL``)."""
    number_value(where, f"{key}.temperature", cal["temperature"], low=0.0, low_open=True)
    weights = [number_value(where, f"{key}.{w}", cal[w]) for w in ("w0", "w1", "w2")]
    for name, w in zip(("w0", "w1", "w2"), weights):
        if not -ETS_WEIGHT_TOL <= w <= 1.0 + ETS_WEIGHT_TOL:
            where.fail(f"{key}.{name}", f"must be in [0, 1] (got {show(w)})")
    if abs(sum(weights) - 1.0) > ETS_WEIGHT_TOL:
        where.fail(key, f"weights w0 + w1 + w2 must sum to 1 (got {sum(weights)!r})")


def _hts_ranges(where: Where, cal: dict, key: str) -> None:
    number_value(where, f"{key}.w", cal["w"])
    number_value(where, f"{key}.b", cal["b"])


def _no_ranges(where: Where, cal: dict, key: str) -> None:
    """UC has no parameters."""


def _net_ranges(where: Where, cal: dict, key: str) -> None:
    """A network calibrator: a valid ``arch`` and exactly its tensors, each with its shape and
    that many finite numbers."""
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


_CALIBRATOR_RANGES = {"uc": _no_ranges, "ts": _ts_ranges, "ets": _ets_ranges, "hts": _hts_ranges,
                      "card": _card_ranges, "pts": _net_ranges, "lts": _net_ranges, "calibnet": _net_ranges}
#: the methods a bundle's own ``calibration`` block may name
_ENGINE_METHODS = tuple(m for m in CALIBRATION_PARAMS if m not in NET_CALIBRATOR_ARCH)
